"""What one rank holds under ZeRO-1/2/3 or FSDP2, measured by walking the live objects (for sharded probes).

Each snapshot counts unique storages (views and flat buffers once) in a fixed order, so no byte is counted twice:
  weights      the model's parameters as they rest between uses: `ds_tensor` partitions (+ persistent small params)
               under ZeRO-3, the local shard of each DTensor under FSDP2, else the full `.data`
  master       the optimizer's parameters that are not the weights (DeepSpeed's fp32 master partitions)
  optimizer    the optimizer's state tensors (Adam exp_avg, exp_avg_sq, step)
  grads        `.grad` of weights and master, and DeepSpeed optimizer attributes named *grad* (partitioned buffers)
  buffers      the model's registered buffers (rotary tables)
Snapshots: "pre_step" (inside DeepSpeed's engine.step before it runs, or at on_pre_optimizer_step), "resident"
(step end) and, under gradient accumulation, "between_micro_batches" (at on_substep_end: what a rank keeps from one
micro-batch to the next; FSDP2's unsharded gradients are counted in grads). Inside backward the DeepSpeed
optimizer's bucket methods are wrapped to record every tensor attribute's bytes (`attributes`: ipg buffers, partition
buffers — the bucket sizes); forward hooks record the gathered-parameter bytes that are live (ZeRO-3 `ds_status`
available, FSDP2 unsharded views): `live_gathered_peak_bytes`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# Methods DeepSpeed's ZeRO optimizers run once a gradient bucket is full (stage_1_and_2.py, stage3.py, 0.19).
BUCKET_METHODS = ("reduce_ipg_grads", "_DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads",
                  "reduce_independent_p_g_buckets_and_remove_grads", "partition_grads")

# DeepSpeed's fp32 master partitions (stage_1_and_2.py, stage3.py, bf16_optimizer.py), should the wrapped torch
# optimizer not list them.
MASTER_ATTRIBUTES = ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups_flat_partition")
ZERO_KEYS = ("stage", "reduce_bucket_size", "allgather_bucket_size", "prefetch_bucket_size",
             "param_persistence_threshold", "max_live_parameters", "max_reuse_distance", "overlap_comm",
             "contiguous_gradients", "reduce_scatter", "sub_group_size")


class ShardInventory:
    def __init__(self, trainer: Any, clock: Any) -> None:
        self.trainer, self.clock = trainer, clock
        self.step = -1
        self.attached = False
        self.snapshots: dict[str, dict[str, Any]] = {}
        self.attributes: dict[str, int] = {}
        self.live_gathered_peak = 0
        self.deepspeed = False

    # -- hooks -----------------------------------------------------------------------------------------------------
    def attach(self, step: int) -> None:
        self.step = step
        if self.attached:
            return
        self.attached = True
        engine = self.trainer.model_wrapped
        self.deepspeed = type(engine).__name__ == "DeepSpeedEngine"
        if self.deepspeed:
            self._wrap_engine_step(engine)
            for name in BUCKET_METHODS:
                if hasattr(engine.optimizer, name):
                    self._wrap_bucket(engine.optimizer, name)
        for module in self.trainer.model.modules():
            module.register_forward_pre_hook(lambda *_: self._gathered())
            module.register_forward_hook(lambda *_: self._gathered())

    def _wrap_engine_step(self, engine: Any) -> None:
        original = engine.step

        def step(*args: Any, **kwargs: Any) -> Any:
            self.snapshot("pre_step")
            self.clock.switch("optimizer")
            out = original(*args, **kwargs)
            self.clock.switch("after_step")
            return out

        engine.step = step

    def _wrap_bucket(self, optimizer: Any, name: str) -> None:
        original = getattr(optimizer, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self._note_attributes(optimizer)
            out = original(*args, **kwargs)
            self._note_attributes(optimizer)
            return out

        setattr(optimizer, name, wrapped)

    def _note_attributes(self, optimizer: Any) -> None:
        for name, value in _attribute_items(optimizer):
            nbytes = _bytes_of(value, set())
            if nbytes:
                self.attributes[name] = max(self.attributes.get(name, 0), nbytes)

    def _gathered(self) -> None:
        seen: set[int] = set()
        total = 0
        for p in self.trainer.model.parameters():
            if _is_dtensor(p) or p.device.type == "meta":
                continue
            if hasattr(p, "ds_tensor"):
                if getattr(p, "ds_persist", False) or p.data.numel() == 0:
                    continue
            elif not _fsdp_managed(self.trainer):
                continue
            total += _add_storage(p.data, seen)
        self.live_gathered_peak = max(self.live_gathered_peak, total)

    # -- snapshots -------------------------------------------------------------------------------------------------
    def snapshot(self, tag: str) -> None:
        if self.deepspeed and tag == "pre_step" and tag in self.snapshots.get(self.step, {}):
            return          # the engine wrapper took it before DeepSpeed stepped; HF's callback comes after
        model = self.trainer.model
        base = base_optimizer(self.trainer.optimizer)
        seen: set[int] = set()
        cats = {"weights": 0, "master": 0, "optimizer": 0, "grads": 0, "buffers": 0}
        for p in model.parameters():
            if hasattr(p, "ds_tensor"):
                cats["weights"] += _add_storage(p.ds_tensor, seen)
                if getattr(p, "ds_persist", False):
                    cats["weights"] += _add_storage(p.data, seen)
            else:
                cats["weights"] += _add_storage(_local(p), seen)
        params = [q for g in (base.param_groups if base else []) for q in g["params"]]
        for q in params:
            cats["master"] += _add_storage(_local(q), seen)
        ds_opt = getattr(self.trainer.model_wrapped, "optimizer", None) if self.deepspeed else None
        for name in MASTER_ATTRIBUTES:
            cats["master"] += _bytes_of(getattr(ds_opt, name, None), seen)
        for state in (base.state.values() if base else []):
            cats["optimizer"] += _bytes_of(state, seen)
        for q in list(model.parameters()) + params:
            if q.grad is not None:
                cats["grads"] += _add_storage(_local(q.grad), seen)
        for g in fsdp2_unsharded_grads(model):
            cats["grads"] += _add_storage(g, seen)
        for name, value in (vars(ds_opt).items() if ds_opt is not None else ()):
            if "grad" in name.lower():
                cats["grads"] += _bytes_of(value, seen)
        for b in model.buffers():
            cats["buffers"] += _add_storage(b, seen)
        tracker = getattr(self.clock.meter, "tracker", None)
        snap = {**{f"{k}_bytes": v for k, v in cats.items()},
                "live_bytes": tracker.current_bytes if tracker is not None else None}
        if ds_opt is not None:
            self._note_attributes(ds_opt)
        self.snapshots.setdefault(self.step, {})[tag] = snap

    def summary(self) -> dict[str, Any]:
        import torch.distributed as dist

        last = max(self.snapshots) if self.snapshots else None
        model = self.trainer.model
        num_params = sum(_full_numel(p) for p in model.parameters())
        trainable = sum(_full_numel(p) for p in model.parameters() if p.requires_grad)
        return {
            "rank": dist.get_rank() if dist.is_initialized() else 0,
            "world_size": dist.get_world_size() if dist.is_initialized() else 1,
            "num_params": num_params, "trainable_params": trainable,
            "param_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "step": last, "snapshots": self.snapshots.get(last, {}) if last is not None else {},
            "attributes_peak_bytes": dict(sorted(self.attributes.items())),
            "live_gathered_peak_bytes": self.live_gathered_peak,
            "zero_config": _zero_config(self.trainer.model_wrapped) if self.deepspeed else None,
        }


def _attribute_items(obj: Any) -> list[tuple[str, Any]]:
    """An object's attributes; a dict of dataclasses (DeepSpeed's `ipg_buckets`) is split by field
    ("ipg_buckets.buffer", "ipg_buckets.grads") so that a bucket's own buffers show apart from what it points to."""
    out = []
    for name, value in vars(obj).items():
        if isinstance(value, dict) and value and all(dataclasses.is_dataclass(v) for v in value.values()):
            for field in dataclasses.fields(next(iter(value.values()))):
                out.append((f"{name}.{field.name}", [getattr(v, field.name) for v in value.values()]))
        else:
            out.append((name, value))
    return out


def base_optimizer(opt: Any) -> Any:
    """The innermost torch.optim.Optimizer behind accelerate's and DeepSpeed's wrappers (accelerate's wrapper is an
    Optimizer subclass whose param_groups proxy DeepSpeed's 16-bit groups, so descend as far as `.optimizer` goes)."""
    import torch

    found = None
    for _ in range(6):
        if opt is None:
            break
        if isinstance(opt, torch.optim.Optimizer):
            found = opt
        opt = getattr(opt, "optimizer", None)
    return found


def fsdp2_unsharded_grads(model: Any) -> list[Any]:
    """The gradients FSDP2 keeps unsharded, beside the registered (sharded) parameters: a unit's `_unsharded_param.grad`
    and `unsharded_accumulated_grad` after a backward that did not reduce-scatter (`set_requires_gradient_sync(False)`,
    torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py `post_backward`)."""
    out = []
    for module in model.modules():
        state = module._get_fsdp_state() if hasattr(module, "_get_fsdp_state") else None
        for group in getattr(state, "_fsdp_param_groups", ()) if state is not None else ():
            for fp in group.fsdp_params:
                unsharded = getattr(fp, "_unsharded_param", None)
                out += [g for g in (getattr(unsharded, "grad", None), fp.unsharded_accumulated_grad) if g is not None]
    return out


def _is_dtensor(t: Any) -> bool:
    return type(t).__name__ == "DTensor" or type(getattr(t, "data", None)).__name__ == "DTensor"


def _local(t: Any) -> Any:
    return t.to_local() if _is_dtensor(t) else t


def _full_numel(p: Any) -> int:
    return int(getattr(p, "ds_numel", 0) or p.numel())


def _fsdp_managed(trainer: Any) -> bool:
    return "FSDP" in type(trainer.model_wrapped).__name__


def _add_storage(t: Any, seen: set[int]) -> int:
    if t is None or t.device.type == "meta":
        return 0
    st = t.untyped_storage()
    if id(st) in seen:
        return 0
    seen.add(id(st))
    return st.nbytes()


def _bytes_of(obj: Any, seen: set[int], depth: int = 0) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return _add_storage(_local(obj), seen)
    if depth > 3:
        return 0
    if isinstance(obj, (list, tuple)):
        return sum(_bytes_of(o, seen, depth + 1) for o in obj)
    if isinstance(obj, dict):
        return sum(_bytes_of(o, seen, depth + 1) for o in obj.values())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):     # DeepSpeed's IPGBucket holds the buffers
        return sum(_bytes_of(o, seen, depth + 1) for o in vars(obj).values())
    return 0


def _zero_config(engine: Any) -> dict[str, Any] | None:
    try:
        zero = engine._config.zero_config.model_dump()
        return {k: zero[k] for k in ZERO_KEYS if k in zero}
    except Exception:  # noqa: BLE001 - DeepSpeed internals move between versions; the config is a nice-to-have
        return None
