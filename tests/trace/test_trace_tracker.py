"""StorageTracker on small real (and fake) tensors, against bytes computed by hand."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hpcmem.trace.tracker import StorageTracker, round_up  # noqa: E402

pytestmark = pytest.mark.torch


def test_round_up():
    assert round_up(0, 512) == 0
    assert round_up(1, 512) == 512
    assert round_up(512, 512) == 512
    assert round_up(513, 512) == 1024
    assert round_up(7, 1) == 7


def test_counts_births_and_frees_of_real_tensors():
    tr = StorageTracker()
    with tr:
        a = torch.empty(1000)                        # 4000 B
        b = torch.ones(3, dtype=torch.bfloat16)      # 6 B
        assert tr.current_bytes == 4006
        del a
        assert tr.current_bytes == 6
        c = torch.zeros(10, dtype=torch.int64)       # 80 B
        assert tr.current_bytes == 86
    assert tr.peak_bytes == 4006
    assert tr.peak_by_category == {"temporary": 4006}
    del b, c


def test_views_share_their_base_storage():
    tr = StorageTracker()
    with tr:
        a = torch.empty(100)
        v = a.view(10, 10)[2:5]
        t = a.t() if a.dim() == 2 else a.unsqueeze(0)
        assert tr.current_bytes == 400
    del a, v, t


def test_in_place_ops_add_nothing():
    tr = StorageTracker()
    with tr:
        a = torch.zeros(64)
        a.add_(1).mul_(2)
        assert tr.current_bytes == 256
    del a


def test_labels_tags_phases_and_peak_breakdown():
    tr = StorageTracker()
    w = torch.ones(256)                              # born before the tracker: counted once tagged
    with tr:
        tr.tag(w, "param")
        assert tr.current_bytes == 1024
        with tr.phase("step 1 / forward"), tr.label("activation"):
            act = torch.empty(128)                   # 512 B
        with tr.phase("step 1 / backward"):
            tmp = torch.empty(64)                    # 256 B, default category
            grad = torch.empty(256)                  # 1024 B, peak here
        assert tr.peak_bytes == 1024 + 512 + 256 + 1024
        assert tr.peak_phase == "step 1 / backward"
        del tmp
        tr.tag(grad, "grad")                         # alive at the peak: the peak breakdown follows the relabel
    assert tr.peak_by_category == {"param": 1024, "activation": 512, "temporary": 256, "grad": 1024}
    assert sum(tr.peak_by_category.values()) == tr.peak_bytes
    assert tr.by_category["grad"] == 1024 and tr.by_category["temporary"] == 0
    del act, grad


def test_detail_and_nested_phase_names():
    tr = StorageTracker()
    with tr, tr.phase("step 2"), tr.phase("backward"):
        tr.set_detail("layer 3")
        keep = torch.empty(10)
        assert tr.current_phase == "step 2 / backward / layer 3"
    assert tr.peak_phase == "step 2 / backward / layer 3"
    del keep


def test_cuda_rounding_counts_blocks_of_512_bytes():
    tr = StorageTracker(round_to=512)
    with tr:
        a = torch.empty(3)                           # 12 B -> 512
        b = torch.empty(129)                         # 516 B -> 1024
        assert tr.current_bytes == 1536
    del a, b


def test_uncounted_host_category_is_kept_apart():
    tr = StorageTracker()
    with tr:
        with tr.label("host"):
            h = torch.empty(1000)
        d = torch.empty(10)
        assert tr.current_bytes == 40
        assert tr.by_category["host"] == 4000
    assert tr.peak_uncounted_bytes == 4000
    assert "host" not in tr.peak_by_category
    del h, d


def test_workspace_reservation_shows_in_the_peak_only():
    tr = StorageTracker()
    tr.workspace[torch.ops.aten.mm.default] = lambda args, kwargs, out: 1000
    with tr:
        a = torch.ones(2, 2)
        c = a @ a
        assert tr.current_bytes == 32
    assert tr.peak_bytes == 32 + 1000
    del a, c


def test_timeline_records_every_change():
    tr = StorageTracker(timeline=True)
    with tr:
        a = torch.empty(4)
        del a
    assert [p.current_bytes for p in tr.timeline] == [16, 0]


def test_live_bytes_by_birth_phase_name_what_a_backward_leaves_behind():
    """A module that keeps a tensor made in its backward (as RecurrentGemma's RG-LRU keeps its recomputed scan's final
    state, and with it that graph, in an attribute): what is alive when backward ends, by the phase it was born in."""
    keep = {}
    w = torch.ones(4, requires_grad=True)

    def stash(grad):
        keep["t"] = torch.ones(25)                   # 100 B, born in backward and kept past it
        return grad * 2                              # 16 B, consumed by w's gradient

    tr = StorageTracker(timeline=True)
    with tr:
        with tr.phase("forward"):
            y = w * 3                                # 16 B, the graph's output
            y.register_hook(stash)
            out = y.sum()                            # 4 B
        with tr.phase("backward"):
            out.backward()
            tr.tag(w.grad, "grad")                   # 16 B, left out as a gradient
        left = tr.live_by_birth_phase()
    assert left == {"backward": 100, "forward": 16 + 4}
    assert StorageTracker().live_by_birth_phase() == {}     # no timeline: nothing to date a birth by
    del y, out


def test_backward_and_optimizer_on_a_real_linear():
    lin = torch.nn.Linear(8, 4)                      # weight 128 B, bias 16 B
    opt = torch.optim.AdamW(lin.parameters(), foreach=False)
    tr = StorageTracker()
    with tr:
        tr.tag(list(lin.parameters()), "param")
        x = torch.ones(2, 8)
        lin(x).sum().backward()
        tr.tag([p.grad for p in lin.parameters()], "grad")
        opt.step()
        states = [t for s in opt.state.values() for t in s.values()]
        tr.tag(states, "optimizer")
        assert tr.by_category["grad"] == 144
        # exp_avg + exp_avg_sq per parameter, plus one float32 scalar `step` each
        assert tr.by_category["optimizer"] == 2 * 144 + 2 * 4
    del x, states


def test_fake_tensors_are_counted_like_real_ones():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        tr = StorageTracker()
        with tr:
            a = torch.empty(4096, 4096, dtype=torch.bfloat16)
            b = a @ a
            assert tr.current_bytes == 2 * 4096 * 4096 * 2
            del b
            assert tr.current_bytes == 4096 * 4096 * 2
        del a
    assert tr.peak_bytes == 2 * 4096 * 4096 * 2


V, H, T = 4096, 64, 64          # a tied [V, H] bf16 weight: 512 KiB


class _FreshGradHead(torch.autograd.Function):
    """An LM head that returns a fresh, dense weight gradient, as TRL's fused head does."""

    @staticmethod
    def forward(ctx, h, w):
        ctx.save_for_backward(h, w)
        return (h @ w.t()).float().sum()

    @staticmethod
    def backward(ctx, g):
        h, w = ctx.saved_tensors     # one op per gradient, so the embedding's backward is the step's peak
        return torch.full_like(h, 0.5), torch.full_like(w, 0.25)


def _tied_loss():
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(V, H, dtype=torch.bfloat16))
    x = torch.nn.functional.embedding(torch.randint(0, V, (T,)), weight) * 2
    return _FreshGradHead.apply(x, weight), weight


def _backward_peak(monkeypatch, make_loss, undone: str | None):
    """The tracker's peak over `make_loss()`'s backward and the leaf's gradient; `undone` names the tracker's table of
    nodes whose op it keeps in place, emptied for this run (autograd's out-of-place op under a dispatch mode)."""
    import hpcmem.trace.tracker as tracker_module

    if undone is not None:
        monkeypatch.setattr(tracker_module, undone, frozenset())
    loss, leaf = make_loss()
    tr = StorageTracker()
    with tr:
        loss.backward()
    return tr.peak_bytes, leaf.grad.clone()


def test_unobserved_autograd_sums_a_tied_weights_gradients_in_place():
    """The independent reference, taken with torch's profiler and no dispatch mode: the input buffer adds the
    embedding's gradient into the head's in place (`aten::add_`, no bytes), never an out-of-place [V, H] sum."""
    from torch.profiler import ProfilerActivity, profile

    loss, _ = _tied_loss()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss.backward()
    events = [(e.name, e.cpu_memory_usage) for e in prof.events() if e.name in ("aten::add", "aten::add_")]
    assert ("aten::add_", 0) in events and ("aten::add", V * H * 2) not in events, events


def test_tracker_keeps_that_sum_in_place(monkeypatch):
    """Under the tracker (a dispatch mode) autograd would sum out of place; `accumulation_op` restores the in-place
    sum. By hand (the weight was born before the tracker; 4 B is the fp32 seed gradient of the loss):
    in place, the peak is at the embedding's backward: head gradient + embedding gradient + the incoming [T, H];
    out of place, at the sum: head gradient + embedding gradient + their sum. The gradient is the same."""
    peak_in_place, grad_in_place = _backward_peak(monkeypatch, _tied_loss, None)
    peak_out_of_place, grad_out_of_place = _backward_peak(monkeypatch, _tied_loss, "ACCUMULATE_IN_PLACE_UNDER")
    assert peak_in_place == 2 * V * H * 2 + T * H * 2 + 4
    assert peak_out_of_place == 3 * V * H * 2 + 4
    assert torch.equal(grad_in_place, grad_out_of_place)


# An MoE layer's routed copy of its input: x [N, D] indexed by N·K row numbers (transformers' grouped experts:
# `hidden_states[perm // num_top_k]`), its gradient scattered back by IndexBackward0
N, D, K = 64, 32, 4


def _routed_loss():
    torch.manual_seed(0)
    x = torch.randn(N, D, requires_grad=True)
    rows = torch.randint(0, N, (N * K,))
    return (x[rows] * 3).sum(), x


def test_unobserved_index_backward_scatters_into_its_zeros_in_place():
    """The independent reference, torch's profiler and no dispatch mode: the gradient of x[rows] is one zeros tensor
    of x's size with the gradient added into it in place (`aten::_index_put_impl_`), no out-of-place index_put."""
    from torch.profiler import ProfilerActivity, profile

    loss, _ = _routed_loss()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loss.backward()
    names = {e.name for e in prof.events()}
    assert "aten::_index_put_impl_" in names and "aten::index_put" not in names, sorted(names)


def test_tracker_keeps_the_index_backward_in_place(monkeypatch):
    """Under the tracker autograd would scatter out of place (`index_put`: a second [N, D]); `accumulation_op`
    restores the in-place scatter. By hand: the loss's backward holds the fp32 seed (4 B), the expanded ones of the
    sum's backward are a view; the mul's backward makes grad [N·K, D] fp32, IndexBackward0 its zeros [N, D] — and,
    out of place, one more [N, D]. The gradient is the same."""
    peak_in_place, grad_in_place = _backward_peak(monkeypatch, _routed_loss, None)
    peak_out_of_place, grad_out_of_place = _backward_peak(monkeypatch, _routed_loss, "INDEX_PUT_IN_PLACE_UNDER")
    assert peak_out_of_place - peak_in_place == N * D * 4
    assert torch.equal(grad_in_place, grad_out_of_place)


def test_a_collated_batch_is_host_memory_until_its_step_takes_it():
    """accelerate's DataLoaderShard collates the next micro-batch before it yields the current one; on a GPU that next
    batch waits on the host. The trace counts a collated batch from the moment the trainer's get_batch_samples takes
    it: 4 × 256 int64 ids (8,192 B) and a 3 × 224 × 224 fp32 image (602,112 B), by hand."""
    from hpcmem.trace.fakeenv import fake_collator, fake_world, sent_to_device

    def collator(rows):
        return {"input_ids": torch.zeros(4, 256, dtype=torch.int64), "pixel_values": torch.zeros(1, 3, 224, 224)}

    class Trainer:
        def __init__(self, loader):
            self.loader = loader

        def get_batch_samples(self, epoch_iterator, num_batches, device):
            return [next(epoch_iterator) for _ in range(num_batches)], None

    tr = StorageTracker()
    with fake_world() as (_, oracle), tr:
        collate = fake_collator(collator, oracle, tr)
        loader = iter([collate([0]), collate([1])])       # both collated: the second one ahead, as the shard does
        trainer = Trainer(loader)
        assert tr.current_bytes == 0
        with sent_to_device(trainer, tr):
            first, _ = trainer.get_batch_samples(loader, 1, "cpu")
            assert tr.current_bytes == 8192 + 602112      # the step's batch only; the next one is still host memory
            second, _ = trainer.get_batch_samples(loader, 1, "cpu")
            assert tr.current_bytes == 2 * (8192 + 602112)
        del first, second
    assert tr.peak_uncounted_bytes == 0          # a waiting batch is not an offloaded activation copy
