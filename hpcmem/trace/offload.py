"""Activation offloading as TRL 1.16 does it, re-implemented for the trace (host copies counted apart).

TRL's `OffloadActivations` (trl/models/activation_offloading.py) cannot be built without a CUDA/XPU accelerator
(`torch.accelerator.current_accelerator().type`), and on the fake CPU every tensor would already be "on the host".
This class keeps its policy and its lifetimes, step by step, with the default arguments of
`get_act_offloading_ctx_manager` (use_streams=True, min_offload_size=1024, max_fwd_stash_size=5):

- pack (forward): a saved tensor stays on the GPU if it is smaller than 1 KiB, a parameter or buffer (or shares a
  parameter's storage), or a storage already offloaded in this pass; otherwise a non-contiguous or offset view is
  first copied, a pinned host copy is made, and the GPU tensor is kept in a forward stash until five newer tensors
  have been offloaded.
- unpack (backward): a tensor still in the forward stash comes back as is; otherwise it is copied back to the GPU and
  held until the autograd node after the one that used it starts; the forward stash is emptied after the first
  backward node, and everything at the end of backward.
- the output head runs without offloading (a `NoOpManager` around `lm_head.forward`). With TRL's fused LM head,
  `lm_head.forward` is never called, so the head's saved tensors ARE offloaded — as in TRL.

Host copies carry the tracker category "host": kept out of the device total, reported as the offloaded host peak.
"""

from __future__ import annotations

from typing import Any

MIN_OFFLOAD_BYTES = 1024
MAX_FWD_STASH = 5


def _hooks_base() -> type:
    from torch.autograd.graph import saved_tensors_hooks

    return saved_tensors_hooks


class OffloadEmulation:
    """Context manager standing in for `SFTTrainer.maybe_activation_offload_context` in the trace."""

    NOTE = ("activation offloading: trl.models.activation_offloading.OffloadActivations re-implemented (same policy "
            "and stash lifetimes; TRL's class needs a CUDA/XPU accelerator); host copies counted apart")

    def __init__(self, trainer: Any, tracker: Any) -> None:
        import torch

        self.tracker = tracker
        model = trainer.model
        self.param_storages = {id(p.untyped_storage()) for p in model.parameters()}
        self.saved: dict[int, tuple[Any, bool, Any]] = {}   # id -> (tensor, on host?, (shape, stride, offset))
        self.storage_to_id: dict[tuple[int, int, Any], int] = {}
        self.fwd_stash: dict[int, Any] = {}
        self.bwd_stash: dict[int, Any] = {}
        self.next_id = 0
        self.first_backward = True
        self.current_node: Any = None
        self._noop = 0
        self._torch = torch
        head = getattr(model.get_base_model() if hasattr(model, "get_base_model") else model, "lm_head", None)
        if head is not None:
            head.register_forward_pre_hook(lambda *a: self._set_noop(+1))
            head.register_forward_hook(lambda *a: self._set_noop(-1), always_call=True)
        trainer.maybe_activation_offload_context = self
        self._hooks: Any = None

    def _set_noop(self, delta: int) -> None:
        self._noop += delta

    # -- context manager (entered around each `training_step`) ----------------------------------------------------
    def __enter__(self) -> OffloadEmulation:
        self.saved.clear()
        self.storage_to_id.clear()
        self.fwd_stash.clear()
        self.bwd_stash.clear()
        self.next_id = 0
        self.first_backward = True
        self._hooks = _hooks_base()(self.pack, self.unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.fwd_stash.clear()
        self.bwd_stash.clear()
        self._hooks.__exit__(*exc)

    # -- forward -------------------------------------------------------------------------------------------------
    def pack(self, t: Any) -> Any:
        if self._noop:
            return ("kept", t)
        self.next_id += 1
        tid = self.next_id
        key = (id(t.untyped_storage()), t.storage_offset(), t.dtype)
        if (key in self.storage_to_id or t.element_size() * t.nelement() < MIN_OFFLOAD_BYTES
                or isinstance(t, self._torch.nn.Parameter) or id(t.untyped_storage()) in self.param_storages):
            self.saved[tid] = (t, False, None)
            if key in self.storage_to_id:       # TRL tracks the storage under the newest id (`track_storage_key`)
                self.storage_to_id[key] = tid
            return tid
        if 0 not in t.stride() and (not t.is_contiguous() or t.storage_offset() != 0):
            t = t.clone(memory_format=self._torch.contiguous_format)
        for old in [i for i in self.fwd_stash if i <= tid - MAX_FWD_STASH]:
            del self.fwd_stash[old]
            self._release_key(old)
        layout = (t.shape, t.stride(), t.storage_offset())
        with self.tracker.label("host"):
            if 0 in t.stride():
                host = self._torch.empty(t.untyped_storage().nbytes() // t.element_size(), dtype=t.dtype)
            else:
                host = self._torch.empty_like(t)
        self.saved[tid] = (host, True, layout)
        self.fwd_stash[tid] = t
        self.storage_to_id[key] = tid
        return tid

    def _release_key(self, tid: int) -> None:
        for key, owner in list(self.storage_to_id.items()):
            if owner == tid:
                del self.storage_to_id[key]

    # -- backward ------------------------------------------------------------------------------------------------
    def unpack(self, tid: Any) -> Any:
        if isinstance(tid, tuple):
            return tid[1]
        torch = self._torch
        if self.first_backward:
            self.first_backward = False
            torch.autograd.variable.Variable._execution_engine.queue_callback(self.bwd_stash.clear)
        tensor, on_host, layout = self.saved.pop(tid)
        if not on_host:
            return tensor
        node = torch._C._current_autograd_node()
        previous = list(self.bwd_stash) if node is not self.current_node else []
        self.current_node = node
        if tid in self.fwd_stash:
            out = self.fwd_stash[tid]
        else:
            shape, stride, offset = layout
            out = torch.as_strided(tensor.clone(), size=shape, stride=stride, storage_offset=offset)
            self.bwd_stash[tid] = out
        if node is not None:
            node.register_hook(self._after_node(previous))
        return out

    def _after_node(self, previous: list[int]) -> Any:
        def hook(outputs: Any, inputs: Any) -> Any:
            self.fwd_stash.clear()
            for tid in previous:
                self.bwd_stash.pop(tid, None)
            return outputs
        return hook
