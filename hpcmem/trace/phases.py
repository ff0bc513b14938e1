"""Hook a Trainer so the StorageTracker knows the step, the phase, the layer and what each storage is.

Nothing here changes what is allocated: wrappers only push phase names and labels, hooks only relabel storages
(a gradient when it lands in `.grad`, optimizer states after `step()`).

| phase | entered by | storages born inside are |
|---|---|---|
| step N / forward | `Trainer.compute_loss` (SFTTrainer's: backbone + fused LM head + metrics) | activation |
| step N / backward | `Accelerator.backward` | temporary (a gradient becomes grad) |
| step N / optimizer | `Trainer._clip_grad_norm`, then `Optimizer.step` | temporary (states become optimizer) |
| step N / scoring | GRPO/RLOO `_generate_and_score_completions` (prompt+completion batch, no-grad reference / old log-prob passes) | activation |
| step N / scoring / step N / generation | transformers' `generate` (only with `run_trace(..., generation=True)`) | activation |
| step N / forward / reference forward | DPO's / KTO's reference forward inside `compute_loss` (`hpcmem.trace.pref.hook_reference`) | activation |

The decoder layer that runs is the phase detail ("layer 7"): set by a forward pre-hook, which also fires when
gradient checkpointing recomputes a layer in backward, and by a gradient hook on each layer's output.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from hpcmem.trace.layer_map import decoder_layers, vision_blocks
from hpcmem.trace.pref import hook_reference
from hpcmem.trace.tracker import StorageTracker


@dataclass
class StepPeak:
    step: int
    peak_bytes: int
    phase: str
    components: dict[str, int]


@dataclass
class Instrumented:
    """Live hooks on one trainer; `remove()` takes them all off."""

    tracker: StorageTracker
    step_peaks: list[StepPeak] = field(default_factory=list)
    # with a timeline: when each backward ends, the bytes still alive (not parameters, gradients or optimizer
    # states) by the phase they were born in — what a layer's backward leaves behind (hpcmem.trace.learn reads it)
    left_after_backward: dict[str, int] = field(default_factory=dict)
    # the parameters a gradient landed on (their ids), and the decoder layers (`idle_in_layers` reads both)
    graded: set[int] = field(default_factory=set)
    layers: list[Any] = field(default_factory=list)
    _handles: list[Any] = field(default_factory=list)
    _undo: list[Any] = field(default_factory=list)
    _step: int = 0

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        for undo in reversed(self._undo):
            undo()
        self._handles.clear()
        self._undo.clear()

    def idle_in_layers(self) -> list[dict[str, list[int]]]:
        """Per decoder layer: its parameters that require grad and got none in the steps run (the name inside the
        layer → [elements, bytes per element]) — a module run under torch.no_grad (a sparse-attention indexer), or
        one the batch never reaches. AdamW makes no state for them (torch/optim/adamw.py `_init_group` skips a
        parameter whose grad is None)."""
        return [{name: [p.numel(), p.element_size()] for name, p in layer.named_parameters()
                 if p.requires_grad and id(p) not in self.graded} for layer in self.layers]

    def close_step(self) -> None:
        """Record the peak of the step that just ended and start the next one from what is live."""
        tr = self.tracker
        if self._step:
            self.step_peaks.append(StepPeak(self._step, tr.peak_bytes, tr.peak_phase, dict(tr.peak_by_category)))


def instrument(trainer: Any, tracker: StorageTracker) -> Instrumented:
    """Tag the model's tensors and wrap the trainer's forward, backward and optimizer step with phases."""
    inst = Instrumented(tracker)
    model = trainer.model
    tracker.tag(list(model.parameters()) + list(model.buffers()), "param")

    def landed(p: Any) -> None:
        inst.graded.add(id(p))
        tracker.tag(p.grad, "grad")

    for p in model.parameters():
        if p.requires_grad:
            inst._handles.append(p.register_post_accumulate_grad_hook(landed))
    _wrap_method(inst, trainer, trainer, "compute_loss", "forward", "activation")
    if hasattr(trainer, "_generate_and_score_completions"):     # GRPO/RLOO: the batch and its no-grad scoring passes
        _wrap_method(inst, trainer, trainer, "_generate_and_score_completions", "scoring", "activation")
    if hasattr(trainer, "_traced_generate"):    # hpcmem.trace.rl with generation on: transformers' generate
        _wrap_method(inst, trainer, trainer, "_traced_generate", "generation", "activation")
    _wrap_method(inst, trainer, trainer.accelerator, "backward", "backward", "temporary")
    _wrap_method(inst, trainer, trainer, "_clip_grad_norm", "optimizer", "temporary")
    _hook_optimizer(inst, trainer)
    _hook_layers(inst, model)
    inst.layers = decoder_layers(model.get_base_model() if hasattr(model, "get_base_model") else model)
    for other in (getattr(trainer, "ref_model", None), getattr(trainer, "teacher_model", None)):
        if other is not None:       # a reference model, a distillation teacher: frozen weights, counted as params
            tracker.tag(list(other.parameters()) + list(other.buffers()), "param")
            _hook_layers(inst, other)
    if hasattr(trainer, "precompute_ref_logps"):    # DPOTrainer, KTOTrainer
        inst._undo.append(hook_reference(tracker, trainer))
    return inst


def _step_name(inst: Instrumented, trainer: Any) -> str:
    step = trainer.state.global_step + 1
    if step != inst._step:
        inst.close_step()
        inst._step = step
        if step > 1:
            inst.tracker.reset_peak()
    return f"step {step}"


def _wrap_method(inst: Instrumented, trainer: Any, obj: Any, name: str, phase: str, label: str) -> None:
    original = getattr(obj, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with inst.tracker.phase(f"{_step_name(inst, trainer)} / {phase}"), inst.tracker.label(label):
            if phase == "backward":
                inst.tracker.set_detail("lm head / loss")     # backward starts at the loss
            out = original(*args, **kwargs)
            if phase == "backward":
                inst.left_after_backward.update(inst.tracker.live_by_birth_phase())
            return out

    had_own = name in vars(obj)
    setattr(obj, name, wrapper)
    inst._undo.append(lambda: setattr(obj, name, original) if had_own else delattr(obj, name))


def _hook_optimizer(inst: Instrumented, trainer: Any) -> None:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    tracker = inst.tracker

    def pre(optimizer: Any, args: Any, kwargs: Any) -> None:
        tracker.push_phase(f"{_step_name(inst, trainer)} / optimizer")
        tracker.push_label("temporary")

    def post(optimizer: Any, args: Any, kwargs: Any) -> None:
        tracker.pop_label()
        tracker.pop_phase()
        tracker.tag([t for state in optimizer.state.values() for t in state.values()
                     if isinstance(t, torch.Tensor)], "optimizer")

    inst._handles.append(register_optimizer_step_pre_hook(pre))
    inst._handles.append(register_optimizer_step_post_hook(post))


def _hook_layers(inst: Instrumented, model: Any) -> None:
    """Name the decoder layer that runs; "lm head / loss" after the last layer and when backward starts;
    "embeddings" once the gradient has left layer 0."""
    tracker = inst.tracker
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = decoder_layers(base)
    for i, layer in enumerate(layers):
        name = f"layer {i}"
        after = "lm head / loss" if i == len(layers) - 1 else None

        def pre(module: Any, args: Any, kwargs: Any, name: str = name, first: bool = i == 0) -> None:
            tracker.set_detail(name)
            hidden = args[0] if args else kwargs.get("hidden_states")
            if first and getattr(hidden, "requires_grad", False):
                hidden.register_hook(lambda grad: tracker.set_detail("embeddings"))

        def post(module: Any, args: Any, out: Any, name: str = name, after: str | None = after) -> None:
            hidden = out[0] if isinstance(out, (tuple, list)) else out     # OpenAI-GPT's Block returns a list
            if getattr(hidden, "requires_grad", False):
                hidden.register_hook(lambda grad, name=name: tracker.set_detail(name))
            if after:
                tracker.set_detail(after)

        inst._handles.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
        inst._handles.append(layer.register_forward_hook(post))
    _hook_vision(inst, base)


def _hook_vision(inst: Instrumented, model: Any) -> None:
    """Name a vision tower's block that runs ("vision block 3"), in forward, recomputation and backward; what runs
    after the last block (the patch merger) is "vision merger"."""
    tracker = inst.tracker
    blocks = vision_blocks(model)
    for i, block in enumerate(blocks):
        name = f"vision block {i}"
        after = "vision merger" if i == len(blocks) - 1 else None

        def pre(module: Any, args: Any, kwargs: Any, name: str = name) -> None:
            tracker.set_detail(name)

        def post(module: Any, args: Any, out: Any, name: str = name, after: str | None = after) -> None:
            if getattr(out, "requires_grad", False):
                out.register_hook(lambda grad, name=name: tracker.set_detail(name))
            if after:
                tracker.set_detail(after)

        inst._handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
        inst._handles.append(block.register_forward_hook(post))
