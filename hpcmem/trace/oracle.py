"""Give fake tensors the values that control flow reads, so the real HF/TRL code takes the path a real run takes.

Fake tensors carry shapes, not values. A training step still reads a few values: the dataloader's seed
(`.item()`), transformers' "is the padding mask all ones?" test that decides between a materialised attention mask
and SDPA's `is_causal` (masking_utils.py `_ignore_causal_mask_sdpa`), packed-sequence detection from `position_ids`,
TRL's metric scalars, the Trainer's NaN check on the loss, and — on the CUDA mapping of TRL's fused LM head — the
boolean gather of the positions whose label is not -100.

`ValueOracle` is a dispatch mode entered inside the `FakeTensorMode`. It keeps a real copy next to every small fake
tensor whose inputs all have real copies (the batch from the collator, `arange`, `tensor(...)`, and everything
computed from them: masks, position ids, label counts, an optimizer's step count); integer and boolean tensors up to
MAX_KNOWN_NUMEL elements, floating ones only up to MAX_KNOWN_FLOAT_NUMEL, so weights and activations never run twice. Ops run on the fake tensors as usual and, when every input is
known and the output is small, once more on the real copies. An op the fake mode cannot run without values (nonzero,
a boolean index, `.item()`) runs on the real copies and its output becomes fake again. A value nobody can know (a
scalar computed from fake weights: the loss, an entropy) reads as 0 / False / 0.0 and is counted in `unknown_reads`
— memory never depends on those values in the supported paths (the Trainer's NaN check wants False).

Expert routing. A mixture-of-experts router's `topk` runs on scores computed from fake weights, so its indices are
unknown. Where the experts are a Python loop over the experts the router hit (modeling_dbrx.py DbrxExperts.forward,
modeling_longcat_flash.py LongcatFlashExperts.forward: `one_hot(top_k_index).sum(...).nonzero()`, then
`torch.where(expert_mask[e])` per expert), the loop needs those indices. The oracle gives every `topk` on unknown
scores a balanced routing (`balanced_routing`: row t takes experts (t·k + j) mod E, j < k — every expert gets T·k/E
rows when E divides T·k) and marks every tensor computed from it. The assumption changes the trace only where such a
value is read (`.item()`, `nonzero`, a boolean index): those reads are counted in `routing_reads` and the trace says
so. MoE code that never reads them (transformers' grouped_mm experts) traces exactly as without the rule. Balance is
what MoE training steers the router to (the Switch Transformer load-balancing loss, transformers' modeling_dbrx.py
`load_balancing_loss_func`; LongCat-Flash's expert-bias controller, which aims every FFN expert at the same share of
the routed rows — with its 256 identity experts beside 512 FFN experts, balance over all 768 gives 8 FFN experts a
token on average: the ~27 B of 18.6–31.3 B activated parameters of the LongCat-Flash Technical Report, Meituan
2025, abstract). The rows a layer routes are T·k for any routing, so the tensors the expert loop saves sum to the same
bytes; what a skewed routing changes is the largest expert's transient (its rows × its intermediate width) and, where
fewer than E experts are hit, the number of per-expert weight-gradient temporaries.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

# Real copies are kept only for tensors up to this many elements (a [B, S] batch row set, a [B, 1, S, S] bool mask
# of 4k tokens is 16 M elements and is not needed as a value: only its `.all()` is read, on the 2-D padding mask).
MAX_KNOWN_NUMEL = 1 << 22


# Floating tensors are kept only as scalars and tiny vectors (an optimizer's `step` count, a learning rate), so
# weights and activations never run twice.
MAX_KNOWN_FLOAT_NUMEL = 64

# Integer and boolean tensors computed from an assumed routing are kept up to this many elements: LongCat-Flash's
# one-hot routing mask is [tokens, 12, 768] (19 M elements at 2,048 tokens) and its `nonzero` needs the values.
MAX_ROUTING_NUMEL = 1 << 25

# What a trace that read the assumed routing says about itself (and a profile learned from it).
ROUTING_NOTE = ("expert routing assumed balanced (topk of unknown router scores: row t takes experts (t*k + j) mod E); "
                "the expert loop's per-expert rows follow from it")


def balanced_routing(rows: int, k: int, experts: int) -> Any:
    """The [rows, k] expert indices of the balanced routing: row t → (t·k + j) mod experts for j < k (k distinct
    experts per row when k ≤ experts; each expert gets rows·k / experts rows when experts divides rows·k)."""
    import torch

    return (torch.arange(rows).unsqueeze(1) * k + torch.arange(k).unsqueeze(0)) % experts


def make_oracle(fake_mode: Any, max_known_numel: int = MAX_KNOWN_NUMEL) -> Any:
    """A `ValueOracle` dispatch mode bound to `fake_mode` (enter it inside the fake mode)."""
    import torch
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensor
    from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
    from torch.utils._pytree import tree_map
    from torch.utils.weak import WeakIdKeyDictionary

    aten = torch.ops.aten
    prim_device = torch.ops.prim.device.default
    data_dependent = (DataDependentOutputException, DynamicOutputShapeException)
    bool_index_ops = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
                      aten._index_put_impl_.default, aten._unsafe_index.Tensor}

    class ValueOracle(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False    # nothing is compiled in the trace; skips a per-op dynamo-disable wrapper

        def __init__(self) -> None:
            super().__init__()
            self.observer: Any = None               # a StorageTracker counting op outputs (saves a second mode)
            self.known = WeakIdKeyDictionary()      # fake tensor -> real tensor
            self.poisoned = WeakIdKeyDictionary()   # fake storage -> True: written with values nobody knows
            self.unknown_reads: Counter[str] = Counter()
            self.routed = WeakIdKeyDictionary()     # fake tensor -> True: computed from an assumed routing
            # fake tensor -> True: a floating batch tensor (pixel_values) or computed from such tensors alone, known
            # whatever its size: SmolVLM reads which tiles are all zeros (modeling_smolvlm.py `get_image_features`,
            # `pixel_values[real_images_inds]`); weights are never known, so nothing past the patch embedding is
            self.batch_floats = WeakIdKeyDictionary()
            # fake tensor -> True: a floating tensor made of known integer or boolean values alone (a cast of a
            # one-hot: modeling_gemma4.py Gemma4VisionPooler `_avg_pool_by_positions` reads which pooled rows its
            # one-hot weights leave empty and drops them by a boolean index), or of such tensors: known up to
            # max_known_numel elements, as integer tensors are
            self.value_floats = WeakIdKeyDictionary()
            self.routing_reads: Counter[str] = Counter()
            self._writes: dict[Any, tuple[int, ...]] = {}
            self._views: dict[Any, bool] = {}

        # -- public helpers ------------------------------------------------------------------------------------
        def fake_of(self, real: Any) -> Any:
            """A fake tensor with the real tensor's value known (for a batch made by the real collator)."""
            if isinstance(real, FakeTensor):
                raise TypeError("fake_of needs a real tensor (make it outside the fake mode)")
            with _disable_current_modes():
                real = real.clone()
            fake = fake_mode.from_tensor(real)
            self.known[fake] = real
            if real.dtype.is_floating_point:
                self.batch_floats[fake] = True
            return fake

        def value_of(self, t: Any) -> Any:
            """The real value of a tensor, or None when unknown."""
            if isinstance(t, FakeTensor):
                real = self.known.get(t)
                if real is not None and self.poisoned and t.untyped_storage() in self.poisoned:
                    del self.known[t]
                    return None
                return real
            return t if isinstance(t, torch.Tensor) else None

        # -- dispatch ---------------------------------------------------------------------------------------------
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is prim_device and type(args[0]) is FakeTensor:
                return args[0].fake_device      # `.device` reads are two thirds of all dispatches; skip the rest
            kwargs = kwargs or {}
            if func is aten._local_scalar_dense.default:
                return self._scalar(args[0])
            if func in bool_index_ops:
                args = self._long_indices(func, args)
            if self.observer is not None:
                func = self.observer.accumulation_op(func, args, kwargs)
            reals = self._reals(args, kwargs)
            try:
                out = func(*args, **kwargs)
            except data_dependent:
                if reals is None:
                    raise RuntimeError(
                        f"hpcmem trace: {func} needs values of tensors computed from fake weights; this code path "
                        "is not supported by the trace") from None
                out = self._from_real(func, reals)
                if self._any_routed(args, kwargs):
                    self.routing_reads[str(func)] += 1
                    self._mark_routed(out)
                if self.observer is not None:
                    self.observer.observe(func, args, kwargs, out)
                return out
            if reals is not None:
                self._propagate(func, out, reals, args, kwargs)
            else:
                self._forget_written(func, args, kwargs)
                if func is aten.topk.default:
                    self._assume_routing(out, args, kwargs)
            if self.observer is not None:
                self.observer.observe(func, args, kwargs, out)
            return out

        def _scalar(self, t: Any) -> Any:
            real = self.value_of(t)
            if real is not None:
                if t in self.routed:
                    self.routing_reads["item"] += 1
                with _disable_current_modes():
                    return real.item()
            self.unknown_reads[str(t.dtype)] += 1
            if t.dtype == torch.bool:
                return False
            return 0 if not t.dtype.is_floating_point else 0.0

        def _reals(self, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
            """Args and kwargs with every tensor replaced by its real copy, or None if one is unknown."""
            missing = False

            def swap(x: Any) -> Any:
                nonlocal missing
                if isinstance(x, torch.Tensor):
                    real = self.value_of(x)
                    if real is None:
                        missing = True
                    return real
                return x

            for a in args:          # fast exit: the first big fake operand settles it
                if isinstance(a, FakeTensor) and a not in self.known:
                    return None
            out = tree_map(swap, (args, kwargs))
            return None if missing else out

        def _run_real(self, func: Any, reals: tuple[Any, Any]) -> Any:
            with _disable_current_modes():
                return func(*reals[0], **reals[1])

        def _propagate(self, func: Any, out: Any, reals: tuple[Any, Any], args: Any, kwargs: Any) -> None:
            fakes = [o for o in _flat(out) if isinstance(o, torch.Tensor)]
            routed = bool(self.routed) and self._any_routed(args, kwargs)
            limit = MAX_ROUTING_NUMEL if routed else max_known_numel
            floats = [x for x in _flat([*args, *kwargs.values()])
                      if isinstance(x, FakeTensor) and x.dtype.is_floating_point]
            from_batch = bool(floats) and all(x in self.batch_floats for x in floats)
            tensors = [x for x in _flat([*args, *kwargs.values()]) if isinstance(x, FakeTensor)]
            from_values = not from_batch and bool(tensors) and all(x in self.value_floats for x in floats) and (
                bool(floats) or any(not (x.dtype.is_floating_point or x.dtype.is_complex) for x in tensors))
            float_limit = limit if from_values else MAX_KNOWN_FLOAT_NUMEL
            # a view of known values (expand, unsqueeze) holds no storage of its own, whatever its size: Gemma4Model
            # indexes the embeddings by its image mask expanded to [rows, seq, width] (modeling_gemma4.py
            # `Gemma4Model.forward`, `inputs_embeds[image_mask]`), past the integer limit at two 1,024-token rows
            if not from_batch and not self._is_view(func) and any(
                    f.numel() > (float_limit if f.dtype.is_floating_point or f.dtype.is_complex else limit)
                    for f in fakes):
                self._forget_written(func, args, kwargs)
                return
            real_out = self._run_real(func, reals)
            if from_batch or from_values:
                for f in fakes:
                    if f.dtype.is_floating_point:
                        (self.batch_floats if from_batch else self.value_floats)[f] = True
            for f, r in zip(_flat(out), _flat(real_out), strict=False):
                if isinstance(f, torch.Tensor) and isinstance(r, torch.Tensor):
                    self.known[f] = r
            if routed:
                self._mark_routed(out)

        def _is_view(self, func: Any) -> bool:
            """Whether every output of `func` aliases an input without writing to it (a view op)."""
            views = self._views.get(func)
            if views is None:
                returns = func._schema.returns
                views = bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write
                                              for r in returns)
                self._views[func] = views
            return views

        # -- the assumed routing ------------------------------------------------------------------------------
        def _assume_routing(self, out: Any, args: Any, kwargs: Any) -> None:
            """topk of unknown scores: its indices take the balanced routing (values stay unknown)."""
            scores, k = args[0], int(args[1])
            dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
            indices = out[1]
            if dim not in (-1, scores.dim() - 1) or indices.numel() > max_known_numel or k > scores.shape[-1]:
                return
            with _disable_current_modes():
                real = balanced_routing(indices.numel() // max(k, 1), k, scores.shape[-1])
                real = real.reshape(indices.shape).to(indices.dtype)
            self.known[indices] = real
            self.routed[indices] = True

        def _any_routed(self, args: Any, kwargs: Any) -> bool:
            return any(isinstance(x, FakeTensor) and x in self.routed
                       for x in _flat([*args, *kwargs.values()]))

        def _mark_routed(self, out: Any) -> None:
            for o in _flat(out):
                if isinstance(o, FakeTensor):
                    self.routed[o] = True

        def _from_real(self, func: Any, reals: tuple[Any, Any]) -> Any:
            real_out = self._run_real(func, reals)

            def to_fake(r: Any) -> Any:
                return self.fake_of(r) if isinstance(r, torch.Tensor) else r

            return tree_map(to_fake, real_out)

        def _long_indices(self, func: Any, args: Any) -> Any:
            """Rewrite known boolean index masks as long index tensors (what nonzero would give)."""
            indices = args[1]
            if not any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices):
                return args
            new: list[Any] = []
            for i in indices:
                if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8):
                    real = self.value_of(i)
                    if real is None:
                        return args     # let the fake mode raise; nothing known to rewrite with
                    if i in self.routed:
                        self.routing_reads[str(func)] += 1
                    with _disable_current_modes():
                        found = real.bool().nonzero(as_tuple=True)
                    found_fake = [self.fake_of(r) for r in found]
                    if i in self.routed:
                        self._mark_routed(found_fake)
                    new.extend(found_fake)
                else:
                    new.append(i)
            return (args[0], new, *args[2:])

        def _forget_written(self, func: Any, args: Any, kwargs: Any) -> None:
            """An op wrote into a tensor with values we do not know: drop its real copy."""
            targets = [args[pos] for pos in self._written_positions(func) if pos < len(args)]
            targets += [v for v in kwargs.values() if isinstance(v, FakeTensor)] if "out" in kwargs else []
            for target in targets:
                if isinstance(target, FakeTensor):
                    self.known.pop(target, None)
                    self.poisoned[target.untyped_storage()] = True

        def _written_positions(self, func: Any) -> tuple[int, ...]:
            pos = self._writes.get(func)
            if pos is None:
                pos = tuple(i for i, a in enumerate(func._schema.arguments)
                            if a.alias_info is not None and a.alias_info.is_write)
                self._writes[func] = pos
            return pos

    return ValueOracle()


def _flat(obj: Any) -> list[Any]:
    if isinstance(obj, (list, tuple)):
        return [x for o in obj for x in _flat(o)]
    return [obj]

