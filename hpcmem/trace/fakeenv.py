"""The fake world the trace runs in: a FakeTensorMode on the fake CPU, the value oracle, and the two patches that
let library code treat fake tensors like real ones.

Why each adjustment (each checked on torch 2.13 / transformers 5.24):

- Fake **cpu**, not meta or fake cuda: meta and fake cuda send SDPA to the math kernel (saves [B, H, S, S]); fake
  cpu picks `_scaled_dot_product_flash_attention_for_cpu` (out + fp32 logsumexp, what CUDA flash saves).
- `allow_non_fake_inputs`: a few real constants (module-level tensors, scalars made by torch itself) meet fake ones.
- `transformers.masking_utils.is_tracing` counts a FakeTensor as "tracing" (utils/import_utils.py `is_tracing`) and
  then always builds the 4-D attention mask and never skips it for SDPA's `is_causal`, which a real run does when
  nothing is padded. The trace answers the padding question with real values from the oracle instead, so the
  patched `is_tracing` ignores fake tensors (dynamo/jit/stream capture still count).
- `nn.Module._apply` (`.to()`, `.float()`) always swaps a FakeTensor parameter, and `torch.utils.swap_tensors`
  refuses a tensor that the fake mode's memo holds a weak reference to; PEFT moves every new adapter with `.to()`.
  For two fake tensors the swap becomes `param.data = new` (what `_apply` does for real tensors).
- MoE experts (transformers' default `grouped_mm` implementation): the meta kernel of `aten._grouped_mm` accepts
  only bf16 operands (a CUDA rule), the CPU kernel also takes fp32. For fp32 weights the fake world routes them to
  transformers' own `grouped_mm_fallback` custom op, whose fake kernel returns the same [tokens·top_k, out] tensor.
- JetMoe's experts split their tokens by routing counts read to Python (modeling_jetmoe.py JetMoeTopKGating.forward
  `expert_size.tolist()`), which fake values give as zeros. JetMoeParallelExperts.forward gets an even split of the
  same tokens instead: the per-expert outputs are concatenated (torch.cat) and the inputs saved are views of one
  tensor, so every split of the same total allocates the same bytes.
- `torch.tensor(list)` reads a list's 0-d tensors through their data pointer, which a fake tensor does not have
  (Qwen2.5-VL's `get_rope_index` builds `mrope_position_deltas` that way). A list holding fake tensors is turned into
  their values first (`.item()`, which the oracle answers: the values are known there).
- The real collator runs on real tensors (its `nonzero`/`int(...)` need values); its batch becomes fake tensors whose
  values the oracle knows. They count as host memory until the trainer takes them for a step (`sent_to_device`):
  with device placement off, nothing else marks the moment a real run sends them to the GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from hpcmem.trace.oracle import make_oracle
from hpcmem.trace.tracker import WAITING_BATCH


@contextlib.contextmanager
def patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    """Set `obj.name` for the duration of the block, then put the original back."""
    original = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, original)


@contextlib.contextmanager
def fake_world() -> Iterator[tuple[Any, Any]]:
    """Enter a FakeTensorMode (fake cpu) with the value oracle on top; yields (fake_mode, oracle)."""
    import transformers.masking_utils as masking_utils
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from transformers.utils.import_utils import is_jit_tracing, is_torchdynamo_compiling

    def is_tracing_real(tensor: Any = None) -> bool:
        return is_torchdynamo_compiling() or is_jit_tracing()

    import torch
    import torch.utils

    original_swap = torch.utils.swap_tensors

    def swap_tensors(t1: Any, t2: Any) -> None:
        if isinstance(t1, FakeTensor) and isinstance(t2, FakeTensor):
            t1.data = t2.data
            return
        original_swap(t1, t2)

    import transformers.integrations.moe as moe

    can_grouped_mm = moe._can_use_grouped_mm

    def can_use_grouped_mm(input: Any, weight: Any, offs: Any) -> bool:
        return weight.dtype == torch.bfloat16 and can_grouped_mm(input, weight, offs)

    from transformers.models.jetmoe.modeling_jetmoe import JetMoeParallelExperts

    experts_forward = JetMoeParallelExperts.forward

    def jetmoe_experts(self: Any, inputs: Any, expert_size: Any) -> Any:
        n, e = inputs.size(0), self.num_experts
        if sum(expert_size) != n:
            expert_size = [n // e + (i < n % e) for i in range(e)]
        return experts_forward(self, inputs, expert_size)

    original_tensor = torch.tensor

    def tensor(data: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(data, (list, tuple)) and any(isinstance(x, FakeTensor) for x in data):
            data = [x.item() if isinstance(x, FakeTensor) else x for x in data]
        return original_tensor(data, *args, **kwargs)

    def deepcopy_in_mode(self: Any, memo: dict[int, Any]) -> Any:
        """`copy.deepcopy` of a fake tensor, in its own fake mode. torch's `Tensor.__deepcopy__` copies the storage
        (torch/_tensor.py, `_typed_storage()._deepcopy`) and the copy comes back bound to a new FakeTensorMode (torch
        2.13), so every later op on it converts it into this mode as a fresh tensor of the whole storage: peft's
        `modules_to_save` copy of the LM head (peft/utils/other.py `ModulesToSaveWrapper.update`, `copy.deepcopy`)
        counted a second [V, H] each time TRL's fused head slices it (trl/kernels/chunked_logprob.py `weight[start:
        end]`), where a GPU run makes a view. A clone in the same mode is what a GPU run allocates for the copy."""
        if id(self) in memo:
            return memo[id(self)]
        new = self.detach().clone()
        if isinstance(self, torch.nn.Parameter):     # a fake parameter is a FakeTensor marked `_is_param`
            new = torch.nn.Parameter(new, requires_grad=self.requires_grad)
        else:
            new.requires_grad_(self.requires_grad)
        memo[id(self)] = new
        return new

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    oracle = make_oracle(fake_mode)
    with patched(masking_utils, "is_tracing", is_tracing_real), patched(torch.utils, "swap_tensors", swap_tensors), \
            patched(FakeTensor, "__deepcopy__", deepcopy_in_mode), \
            patched(moe, "_can_use_grouped_mm", can_use_grouped_mm), \
            patched(JetMoeParallelExperts, "forward", jetmoe_experts), patched(torch, "tensor", tensor), \
            fake_mode, oracle:
        yield fake_mode, oracle


def fake_collator(collator: Any, oracle: Any, tracker: Any) -> Any:
    """Run TRL's collator on real tensors, hand the model fake copies with known values. They are host memory until
    the trainer takes them from the data loader (`sent_to_device`): accelerate's DataLoaderShard collates the next
    micro-batch before it yields the current one (data_loader.py `DataLoaderShard.__iter__`, "iterate one batch
    ahead"), and that next batch stays on the host through the current step."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    def collate(examples: Any) -> Any:
        with _disable_current_modes():
            batch = collator(examples)
        fakes: dict[int, Any] = {}     # the collator hands out one tensor under two keys (cu_seq_lens_q/_k)
        for v in batch.values():
            if isinstance(v, torch.Tensor) and id(v) not in fakes:
                fakes[id(v)] = oracle.fake_of(v)
        fake = {k: fakes[id(v)] if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        tracker.tag([v for v in fake.values() if isinstance(v, torch.Tensor)], WAITING_BATCH)
        return fake

    return collate


def host_collator(collator: Any, tracker: Any) -> Any:
    """TRL's collator, its batch counted as host memory until `sent_to_device` (the real CPU step's counterpart of
    `fake_collator`: it changes what is counted, not what runs)."""

    def collate(examples: Any) -> Any:
        batch = collator(examples)
        tracker.tag(batch, WAITING_BATCH)
        return batch

    return collate


@contextlib.contextmanager
def sent_to_device(trainer: Any, tracker: Any) -> Iterator[None]:
    """Count a step's micro-batches as device memory from the moment the trainer takes them from the data loader
    (transformers trainer.py `Trainer.get_batch_samples`, all of a step's micro-batches at once). In a real run
    accelerate's DataLoaderShard sends each batch to the device as it yields it (its `send_to_device`); the trace turns
    device placement off (fake parameters cannot be moved), so that call does not happen here and this stands in for
    it. The batch the loader collated one ahead stays host memory (`fake_collator`) until its own step takes it."""
    original = trainer.get_batch_samples

    def get_batch_samples(*args: Any, **kwargs: Any) -> Any:
        batches, num_items = original(*args, **kwargs)
        tracker.tag(batches, "activation")
        return batches, num_items

    with patched(trainer, "get_batch_samples", get_batch_samples):
        yield
