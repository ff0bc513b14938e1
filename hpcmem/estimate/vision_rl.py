"""What images add to a GRPO/RLOO step beyond the policy's tower pass (hpcmem.estimate.vision): the generation batch's
pixel_values, the tower in the no-grad scoring passes, and the tower in generation.

How TRL 1.16 runs it (grpo_trainer.py / rloo_trainer.py `_generate_and_score_completions`, `_prepare_inputs`,
`_get_per_token_logps_and_entropies`; transformers 5.24 modeling_qwen2_5_vl.py):
- The sampler repeats each prompt num_generations times and every repeat carries its images, so the processor makes
  pixel_values for every row of the generation batch (per_device_train_batch_size × steps_per_generation rows): the
  tower sees each image once per completion. After scoring, the batch is split per micro-batch
  (`split_pixel_values_by_grid` / `unsplit_pixel_values_by_grid`: one new tensor per micro-batch) into
  `self._buffered_inputs`, which lives until the next generation batch replaces it — through every phase of the step,
  the optimizer step and the next round's generation and scoring included (`buffered_pixels`).
- While scoring, the new batch's pixel_values (`forward_kwargs`) are alive beside the old buffer; the reference pass
  (beta > 0: a second model, or the policy with its adapters disabled under PEFT, `use_adapter(model, None)`) and
  the old-policy pass (RLOO always, GRPO when misaligned: hpcmem.estimate.trainers `computes_old_logps`) run the
  tower under no_grad per chunk of per_device_train_batch_size rows (`tower_no_grad`), the merger's output
  (image embeddings) alive while the language model runs over the chunk.
- Generation (transformers' `generate`, no vLLM): the prefill runs the tower under no_grad over all generation rows
  at once, then the language model's prefill over the prompts, image tokens included (max_prompt_length counts them);
  the generation batch's pixel_values from `_tokenize_prompts` are alive throughout. The text estimate's two
  instants (hpcmem.estimate.trainers `generation_instants`) get those pixel_values and the image embeddings; a third,
  "vision tower, generation (prefill)", is the tower's own no-grad peak. Not traced (the trace replaces generation).
"""

from __future__ import annotations

from hpcmem.estimate.breakdown import Component, Phase
from hpcmem.estimate.names import is_forward
from hpcmem.estimate.trainers import GENERATION_INSTANTS, REFERENCE_FORWARD, no_grad_pass
from hpcmem.estimate.vision import FP32, VisionTerms
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.rules import generation_batch_size
from hpcmem.job.shape import Precision
from hpcmem.job.trainers import entry
from hpcmem.models.vision import VisionSpec

OLD_LOGPS = "old log-prob pass"
TOWER_GENERATION = "vision tower, " + GENERATION_INSTANTS[0]   # a generation instant (trainers `is_generation_phase`)
BUFFERED = "pixel_values (buffered micro-batches)"
SCORING = "pixel_values (generation batch)"
NO_GRAD = "vision tower, no grad"


def micro_batches_per_generation(job: JobSpec) -> int:
    """Micro-batches one generation batch is split into (grpo_config.py `__post_init__`: generation_batch_size /
    per_device_train_batch_size, per rank)."""
    t = job.train
    return max(1, generation_batch_size(job) // job.parallel.world_size // t.per_device_train_batch_size)


def tower_no_grad(v: VisionSpec, n: int, prec: Precision) -> int:
    """Live bytes of the tower's no-grad forward over n patch rows (modeling_qwen2_5_vl.py
    `Qwen2_5_VisionTransformerPretrainedModel.forward`): the rotary cos/sin (fp32 [n, head_dim] each), the hidden
    state in and out of a block, and its MLP's widest moment — a gated MLP's gate, up and act(gate) ([n, intermediate]
    each), an fc MLP's fc1 output and its activation."""
    rope = 2 * n * (v.hidden_size // v.num_heads) * FP32
    hidden = 2 * n * v.hidden_size * prec.act
    mlp = (3 if v.mlp == "gated" else 2) * n * v.intermediate_size * prec.act
    return rope + hidden + mlp


def image_embeds(job: JobSpec, n: int, prec: Precision) -> int:
    """The merger's output over n patch rows ([n / merge², language-model width]), alive while the language model
    runs (Qwen2_5_VLModel.forward keeps `image_embeds` until it returns)."""
    return n // job.model.vision.merge_unit * job.model.hidden_size * prec.act


def with_rl_vision(job: JobSpec, terms: VisionTerms | None, phases: list[Phase], prec: Precision) -> list[Phase]:
    """The phases of a GRPO/RLOO job with images (after hpcmem.estimate.vision `with_vision`, which counts one
    micro-batch's pixel_values in the policy's forward and backward): the rest of the buffered generation batch in
    every phase, the tower in the scoring passes and in generation."""
    if terms is None or not terms.patches or not entry(job.train.trainer).generates:
        return phases
    v, t = job.model.vision, job.train
    steps = micro_batches_per_generation(job)
    batch = terms.pixels * steps
    n = terms.patches                   # one chunk of per_device_train_batch_size rows
    gen_n = n * steps
    out = []
    for p in phases:
        policy = is_forward(p.name) or p.name.startswith("backward")
        extra = [Component(name=BUFFERED, bytes=batch - terms.pixels if policy else batch,
                           note=f"{steps} micro-batch(es) of the generation batch, fp32, until the next one")]
        if p.name in (REFERENCE_FORWARD, OLD_LOGPS):
            extra += scoring(job, v, n, batch, prec)
        elif p.name.endswith(GENERATION_INSTANTS[0]):
            extra += [Component(name=SCORING, bytes=batch, note="generate's inputs"),
                      Component(name="image embeddings", bytes=image_embeds(job, gen_n, prec))]
        elif p.name.endswith(GENERATION_INSTANTS[1]):
            extra += [Component(name=SCORING, bytes=batch, note="generate's inputs")]
        out.append(Phase(name=p.name, components=(*p.components, *[c for c in extra if c.bytes])))
    prefill = next((p for p in phases if p.name.endswith(GENERATION_INSTANTS[0])), None)
    # the resident states as generation sees them: its prefill's components less the prefill's own
    if prefill is None:     # vLLM generates: no generate on the trainer's side to take the resident states from
        return out
    resident = tuple(c for c in prefill.components if c.name not in ("KV cache", "prefill activations"))
    out.append(Phase(name=TOWER_GENERATION, components=(
        *resident, Component(name=BUFFERED, bytes=batch),
        Component(name=SCORING, bytes=batch, note="generate's inputs"),
        Component(name=NO_GRAD, bytes=tower_no_grad(v, gen_n, prec),
                  note=f"{gen_n:,} patches of all {generation_batch_size(job)} generation rows at once"))))
    if t.beta != 0.0 and t.use_peft and not any(p.name == REFERENCE_FORWARD for p in phases):
        # PEFT: the reference pass is the policy with its adapters disabled (grpo_trainer.py `use_adapter`)
        rows, seq = t.per_device_train_batch_size, t.max_prompt_length + t.max_completion_length
        out.append(Phase(name=REFERENCE_FORWARD, components=(
            *resident, Component(name=BUFFERED, bytes=batch),
            Component(name="no-grad pass", bytes=no_grad_pass(job, rows, seq, prec), note="adapters disabled"),
            *scoring(job, v, n, batch, prec))))
    return out


def scoring(job: JobSpec, v: VisionSpec, n: int, batch: int, prec: Precision) -> list[Component]:
    """What a no-grad scoring pass adds with images: the new batch's pixel_values, and the tower over one chunk —
    its own peak or, after it, the image embeddings beside the language model's pass, whichever is larger over the
    language model's pass alone."""
    lm = no_grad_pass(job, job.train.per_device_train_batch_size,
                      job.train.max_prompt_length + job.train.max_completion_length, prec)
    tower = max(tower_no_grad(v, n, prec) - lm, 0, image_embeds(job, n, prec))
    return [Component(name=SCORING, bytes=batch, note="forward_kwargs, beside the old buffer"),
            Component(name=NO_GRAD, bytes=tower, note=f"{n:,} patches per chunk")]
