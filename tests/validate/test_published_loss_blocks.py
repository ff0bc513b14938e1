"""The full-logits loss's logit-sized blocks: the event order hpcmem replays is the order the real code makes and frees
its tensors (recorded by the tracker's allocator listener on CPU), and the replay's reserved follows the caching
allocator's rules by hand at Answer.AI's sizes."""

from __future__ import annotations

import pytest

from hpcmem.validate.published_loss_blocks import LOSS_EVENTS, event_bytes, loss_blocks

torch = pytest.importorskip("torch")

B, S, H, V = 2, 64, 32, 1000
MIB = 2**20


class _Recorder:
    """An allocator listener (hpcmem.trace.tracker `allocator=`) that writes down every malloc and free."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, int]] = []
        self._n = 0
        self._size: dict[int, int] = {}

    def malloc(self, nbytes: int) -> int:
        self._n += 1
        self._size[self._n] = nbytes
        self.events.append(("malloc", self._n, nbytes))
        return self._n

    def free(self, handle: int) -> None:
        self.events.append(("free", handle, self._size[handle]))


def _traced(step) -> list[tuple[str, int]]:
    """(event, bytes) of the logit-sized tensors the step makes and frees, in order; the output is dropped last."""
    from hpcmem.trace.tracker import StorageTracker

    h = torch.randn(B, S, H, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(V, H, dtype=torch.bfloat16)
    labels = torch.randint(0, V, (B, S))
    rec = _Recorder()
    with StorageTracker(allocator=rec):
        loss, output_logits = step(h, w, labels)
        loss.backward()
        del output_logits, loss
    small = 2 * (B * S - B) * V          # the smallest logit-sized tensor
    return [(e, n) for e, _, n in rec.events if n >= small]


def _expected(kind: str, kept: str) -> list[tuple[str, int]]:
    sizes: dict[str, int] = {}
    out = []
    for event, name, size_kind in LOSS_EVENTS[kind]:
        if event == "malloc":
            sizes[name] = event_bytes(size_kind, B, B * S, V)
        out.append((event, sizes[name]))
    return out + [("free", sizes[kept])]


def test_the_2024_llama_forward_makes_and_frees_its_logits_in_the_replayed_order() -> None:
    def step(h, w, labels):      # transformers 4.36-4.45 LlamaForCausalLM.forward with labels, as written there
        logits = h @ w.t()
        logits = logits.float()
        shift_logits = logits[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:].contiguous()
        loss = torch.nn.CrossEntropyLoss()(shift_logits.view(-1, V), shift_labels.view(-1))
        return loss, logits

    assert _traced(step) == _expected("model-loss-4.4x", "logits.float")


def test_transformers_loss_utils_makes_and_frees_its_logits_in_the_replayed_order() -> None:
    from transformers.loss.loss_utils import ForCausalLMLoss

    def step(h, w, labels):
        logits = h @ w.t()
        return ForCausalLMLoss(logits, labels, V), logits

    assert _traced(step) == _expected("model-loss", "logits")


def test_the_replay_at_answerai_batch_6_strands_the_bf16_block() -> None:
    # by hand, Llama-2 (V 32000), 6 × 2048 tokens: bf16 [T, V] = 750 MiB, fp32 = 1500 MiB, the shifted fp32 is
    # 768,000 B less, so its segment is 1500 MiB too and unsplit (remainder ≤ 1 MiB). Segments: bf16 (750), fp32
    # (1500); the shifted copy, log_softmax, log_softmax's gradient make three more 1500 MiB segments (the freed
    # 750 MiB block fits none); nll's gradient takes the shifted copy's, the slice's gradient the nll's, the cast
    # the 750 MiB one. Allocated at most: fp32 + nll grad + log_softmax + its gradient.
    t, v = 6 * 2048, 32000
    got = loss_blocks("model-loss-4.4x", 6, t, v)
    assert got.reserved == (750 + 4 * 1500) * MIB
    assert got.allocated == 4 * 1500 * MIB        # the shifted blocks are handed out whole
    assert got.stranded == 750 * MIB
    assert got.kept == 4 * t * v


def test_the_replay_of_transformers_loss_utils_strands_nothing() -> None:
    # every fp32 block has one size, and the cast's bf16 gradient splits a freed fp32 block (remainder > 1 MiB)
    got = loss_blocks("model-loss", 6, 6 * 2048, 32000)
    assert got.stranded == 0
    assert got.allocated == (2 + 4 + 4 + 4) * 6 * 2048 * 32000
