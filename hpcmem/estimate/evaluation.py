"""Evaluation as a phase of the job: what TRL 1.16 computes on the GPU when `eval_strategy` is not "no".

`Trainer.evaluate` → `evaluation_loop` → `prediction_step` runs under `torch.no_grad` (transformers 5.24 trainer.py).
TRL's scripts pass no `compute_metrics`, so `evaluate` asks for the loss only (`prediction_loss_only=True`) and no
logits are kept across batches. What each trainer runs per eval batch of `per_device_eval_batch_size` rows, shaped
like its training rows (SFT's `eval_packing` follows `packing`):
- sft: one forward through the fused LM head: loss, entropy, token accuracy (sft_trainer.py `compute_loss`);
- dpo: chosen + rejected rows through the policy, then the reference (dpo_trainer.py `prediction_step`);
- reward: chosen + rejected through the score head;
- grpo / rloo: generation of the eval completions, then the scoring forward (`_prepare_inputs` generates in eval mode
  too); with vLLM the generation runs in vLLM's pool, counted at the device level.
Alive meanwhile: the resident states (weights, adapters, optimizer states, fp32 master, reference model) and the
ZeRO-3 / FSDP units gathered as in training. Gradients are not: evaluation runs between optimizer steps, after the
training loop's `zero_grad` (set_to_none) has freed them.
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate.breakdown import Component, Phase
from hpcmem.estimate.names import EVALUATION
from hpcmem.estimate.parallel import local_micro_batch
from hpcmem.estimate.states import ParamParts
from hpcmem.estimate.trainers import generation_phases, no_grad_pass
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision, micro_batch
from hpcmem.job.trainers import entry


def eval_phase(job: JobSpec, parts: ParamParts, prec: Precision, held: tuple[Component, ...]) -> Phase | None:
    """The worst instant of one eval batch, beside `held` (resident states and gathered units); None without eval."""
    t = job.train
    if t.eval_strategy == "no":
        return None
    eval_job = replace(job, train=replace(t, per_device_train_batch_size=t.per_device_eval_batch_size),
                       tokens_per_micro_batch=None, label_tokens_per_micro_batch=None)
    mb = local_micro_batch(job, micro_batch(eval_job), evaluation=True)
    score = Component(name="eval forward (no grad)", bytes=no_grad_pass(job, mb.rows, mb.seq, prec),
                      note=f"per_device_eval_batch_size {t.per_device_eval_batch_size}: {mb.source}")
    candidates = [(score,)]
    if entry(t.trainer).generates and not t.use_vllm:     # its eval step generates before it scores
        candidates += [p.components for p in generation_phases(job, parts, prec, t.per_device_eval_batch_size)]
    worst = max(candidates, key=lambda comps: sum(c.bytes for c in comps))
    return Phase(name=EVALUATION, components=(*held, *worst))
