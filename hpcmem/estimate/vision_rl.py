"""What images add to a GRPO/RLOO step beyond the policy's tower pass (hpcmem.estimate.vision): the generation batch's
pixel_values, the tower in the no-grad scoring passes, and the tower in generation.

How TRL 1.16 runs it (grpo_trainer.py / rloo_trainer.py `_generate_and_score_completions`, `_prepare_inputs`,
`_get_per_token_logps_and_entropies`; transformers 5.24 modeling_qwen2_5_vl.py):
- The sampler repeats each prompt num_generations times and every repeat carries its images, so the processor makes
  pixel_values for every row of the generation batch (per_device_train_batch_size × steps_per_generation rows): the
  tower sees each image once per completion. After scoring, the batch is split per micro-batch
  (`split_pixel_values_by_grid` / `unsplit_pixel_values_by_grid`: one new tensor per micro-batch) into
  `self._buffered_inputs`, which lives until the next generation batch replaces it — through every phase of the step,
  the optimizer step and the next round's generation and scoring included (`BUFFERED`).
- While scoring, the new batch's pixel_values (`forward_kwargs`) are alive beside the old buffer; the reference pass
  (beta > 0: a second model, or the policy with its adapters disabled under PEFT, `use_adapter(model, None)`) and
  the old-policy pass (RLOO always, GRPO when misaligned: hpcmem.estimate.trainers `computes_old_logps`) run the
  tower under no_grad per chunk of per_device_train_batch_size rows (`tower_no_grad`), the merger's output
  (image embeddings) alive while the language model runs over the chunk.
- Generation (transformers' `generate`, no vLLM): the prefill runs the tower under no_grad over all generation rows
  at once, then the language model's prefill over the prompts, image tokens included (max_prompt_length counts them);
  the generation batch's pixel_values from `_tokenize_prompts` are alive throughout. The text estimate's two
  instants (hpcmem.estimate.trainers `generation_instants`) get those pixel_values and the image embeddings; a third,
  "vision: generation (prefill)", is the tower's own no-grad peak beside the prompts' token embeddings
  (held to `run_trace(..., generation=True)` in tests/trace/test_trace_vlm_grpo.py).
- Gemma 3 (modeling_gemma3.py `Gemma3Model.get_image_features`): pixel_values are [images, 3, side, side], one row per
  image (the same fp32 bytes as its patches' rows, `VisionSpec.patch_dim`); `split_pixel_values_by_grid` splits them
  per image (trl/trainer/utils.py: the flat layout, `pixel_values.size(0) == sum(num_images)`) and
  `_get_per_token_logps_and_entropies` slices them per chunk by image count; the processor's `token_type_ids`,
  extended with zeros over the completion, go with every forward, so the language model builds its image mask
  (hpcmem.job.shape). The tower under no_grad is SigLIP's (`siglip_no_grad`).
"""

from __future__ import annotations

from hpcmem.estimate.breakdown import Component, Phase
from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.names import is_forward
from hpcmem.estimate.trainers import GENERATION_INSTANTS, REFERENCE_FORWARD, scoring_pass
from hpcmem.estimate.vision import FP32, VisionTerms, vision_adapters
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.generation_batch import generation_batch_size
from hpcmem.job.shape import Precision
from hpcmem.job.trainers import entry
from hpcmem.models.vision_spec import VisionLinear, VisionSpec

OLD_LOGPS = "old log-prob pass"     # the phase hpcmem.estimate.trainers names so
TOWER_GENERATION = "vision: " + GENERATION_INSTANTS[0]   # a generation instant (trainers `is_generation_phase`)
BUFFERED = "pixel_values (buffered micro-batches)"
SCORING = "pixel_values (generation batch)"
NO_GRAD = "vision tower, no grad"


def micro_batches_per_generation(job: JobSpec) -> int:
    """Micro-batches one generation batch is split into (grpo_config.py `__post_init__`: generation_batch_size /
    per_device_train_batch_size, per rank)."""
    t = job.train
    return max(1, generation_batch_size(job) // job.parallel.world_size // t.per_device_train_batch_size)


def tower_no_grad(v: VisionSpec, n: int, prec: Precision, adapted: tuple[VisionLinear, ...] = (),
                  lora: LoraLayout | None = None, dropout: bool = False, autocast: bool = False) -> int:
    """Live bytes of the tower's no-grad forward over n patch rows at its widest moment: the rotary embedding of a
    block's keys or, with adapters in the tower, an adapted linear (`adapter_moment`), whichever is larger.

    Throughout: the pixel_values cast to the tower's dtype (`get_image_features`: `pixel_values.type(self.visual.
    dtype)`), the rotary cos and sin (fp32 [n, head_dim] each); Qwen3-VL (modeling_qwen3_vl.py
    `Qwen3VLVisionModel.forward`) also keeps its interpolated position embeddings (`pos_embeds`, fp32 [n, width], a
    local until the forward returns) and the deepstack features made so far (`deepstack_feature_lists`,
    [n / merge², out width] each; at the last block, those of the blocks before it).
    The rotary moment (modeling_qwen2_5_vl.py / modeling_qwen2_vl.py `apply_rotary_pos_emb_vision`: `q.float()`,
    `k.float()`, `q_embed = (q * cos) + (rotate_half(q) * sin)`, then the same for k): the block's input, its norm's
    output and the fused qkv output ([n, 3·width]), and six fp32 [n, width] tensors — q and k upcast, q_embed, and
    k·cos, rotate_half(k) and rotate_half(k)·sin.
    Measured on the towers of the trace (7B / 8B width, 4 blocks, no grad): Qwen2.5-VL and Qwen2-VL at 4,096
    patches 181.76 MiB, this 181.69 MiB; Qwen3-VL at 3,136 patches 160.40 MiB, this 160.25 MiB; Qwen2.5-VL with
    LoRA all-linear at 8,192 patches, eval 444.14 MiB, this 444.1 MiB, train (dropout) 477.58 MiB, this 484.1 MiB."""
    h = v.hidden_size
    if v.family == "siglip":
        return siglip_no_grad(v, n, prec, adapted, lora, dropout, autocast)
    pixels = n * v.patch_dim * prec.weight
    rope = 2 * n * (h // v.num_heads) * FP32
    position = n * h * FP32 if v.num_position_embeddings else 0
    deepstack = sum(1 for i in v.deepstack_visual_indexes if i < v.depth - 1) * (n // v.merge_unit) * \
        v.out_hidden_size * prec.act
    rotary = 5 * n * h * prec.act + 6 * n * h * FP32
    moments = [adapter_moment(v, x, n, prec, lora, dropout) for x in adapted if x.part == "tower" and lora]
    return pixels + rope + position + deepstack + max([rotary, *moments])


def siglip_no_grad(v: VisionSpec, n: int, prec: Precision, adapted: tuple[VisionLinear, ...] = (),
                   lora: LoraLayout | None = None, dropout: bool = False, autocast: bool = False) -> int:
    """Gemma 3's SigLIP tower under no_grad over n patch rows (n / patches-per-image images) at its widest moment:
    a layer's MLP after its activation or, with adapters in the tower, an adapted linear (`adapter_moment`).
    No rotary tables and no pixel copy that outlives the patch embedding (modeling_siglip.py
    `SiglipVisionEmbeddings.forward`: `pixel_values.to(dtype=target_dtype)` is a temporary of the Conv2d call, and the
    position table is added once). The MLP moment (`SiglipEncoderLayer.forward`, `SiglipMLP.forward`: `fc1` →
    `activation_fn` → `fc2`): the embeddings (`SiglipEncoder.forward`'s `inputs_embeds`, alive until the encoder
    returns), the layer's input (held by the encoder's loop), the residual sum after the attention ([n, width]
    each), layer_norm2's output (fp32 under autocast — the scoring passes run in `accelerator.autocast()`, where
    layer_norm is an fp32 op; generate runs outside it), fc1's output and the GELU's ([n, intermediate] each). The
    attention's moment (layer_norm1's output, q, k, v, the attention output and its transposed copy: six [n, width])
    and the projector's (post_layernorm's output and Gemma3MultiModalProjector's contiguous copy) are smaller at
    every published SigLIP width (intermediate ≈ 3.7 × width)."""
    h, i = v.hidden_size, v.intermediate_size
    norm = FP32 if autocast and prec.amp else prec.act
    mlp = 3 * n * h * prec.act + n * h * norm + 2 * n * i * prec.act
    moments = [adapter_moment(v, x, n, prec, lora, dropout) + n * h * prec.act
               for x in adapted if x.part == "tower" and lora]
    return max([mlp, *moments])


def adapter_moment(v: VisionSpec, x: VisionLinear, n: int, prec: Precision, lora: LoraLayout, dropout: bool) -> int:
    """An adapted tower linear under no_grad (peft/tuners/lora/layer.py `Linear.forward`: `result =
    self.base_layer(x)`, x cast to the adapter dtype (`_cast_input_dtype`), `lora_B(lora_A(dropout(x))) * scaling`
    added to result): the caller's block input, the residual sum after the attention and the second norm's output
    ([n, width] each: the tower's loop holds the block's input while the block runs), what the linear's own input
    keeps alive beside it (for up_proj, act(gate_proj(x)); for a linear after the MLP's activation or the attention,
    that input), the base output, the input in the adapter dtype (twice with dropout active: the scoring passes run
    in train mode, generation's measured like eval), lora_B's output and its product with the scaling (adapter
    dtype)."""
    a, name = lora.adapter_bytes, x.name.rsplit(".", 1)[-1]
    if name == "up_proj":
        alive = n * v.intermediate_size * prec.act
    elif x.in_features != v.hidden_size or name in ("proj", "out_proj"):     # out_proj: SigLIP's
        alive = n * x.in_features * prec.act
    else:
        alive = 0
    return 3 * n * v.hidden_size * prec.act + alive + n * x.out_features * prec.act + \
        n * x.in_features * a * (2 if dropout and lora.dropout else 1) + 2 * n * x.out_features * a


def image_embeds(job: JobSpec, n: int, prec: Precision) -> int:
    """The merger's output over n patch rows ([n / merge², language-model width]), alive while the language model
    runs (Qwen2_5_VLModel.forward keeps `image_embeds` until it returns)."""
    return n // job.model.vision.merge_unit * job.model.hidden_size * prec.act


def token_embeds(job: JobSpec, rows: int, seq: int, prec: Precision) -> int:
    """The token embeddings of `rows` × `seq` tokens, which Qwen2_5_VLModel.forward (also Qwen2-VL's, Qwen3-VL's)
    makes before it runs the tower (`inputs_embeds = self.get_input_embeddings()(input_ids)`)."""
    return rows * seq * job.model.hidden_size * prec.act


def with_rl_vision(job: JobSpec, terms: VisionTerms | None, phases: list[Phase], prec: Precision,
                   lora: LoraLayout) -> list[Phase]:
    """The phases of a GRPO/RLOO job with images (after hpcmem.estimate.vision `with_vision`, which counts one
    micro-batch's pixel_values in the policy's forward and backward): the rest of the buffered generation batch in
    every phase, the tower in the scoring passes and in generation."""
    if terms is None or not terms.patches or not entry(job.train.trainer).generates:
        return phases
    v, t = job.model.vision, job.train
    adapted = vision_adapters(job, v) if lora.enabled else ()
    steps = micro_batches_per_generation(job)
    batch = terms.pixels * steps
    n = terms.patches                   # one chunk of per_device_train_batch_size rows
    gen_n = n * steps
    out = []
    for p in phases:
        policy = is_forward(p.name) or p.name.startswith("backward")
        extra = [Component(name=BUFFERED, bytes=batch - terms.pixels if policy else batch,
                           note=f"{steps} micro-batch(es) of the generation batch, fp32, until the next one")]
        if p.name == REFERENCE_FORWARD:     # a second model, or the policy with its adapters disabled
            extra += scoring(job, v, n, batch, prec)
        elif p.name == OLD_LOGPS:           # the policy, adapters on, in train mode
            extra += scoring(job, v, n, batch, prec, adapted, lora)
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
        Component(name="token embeddings", bytes=token_embeds(job, generation_batch_size(job), t.max_prompt_length, prec),
                  note="the prompts' embeddings, made before the tower runs"),
        Component(name=NO_GRAD, bytes=tower_no_grad(v, gen_n, prec, adapted, lora),
                  note=f"{gen_n:,} patches of all {generation_batch_size(job)} generation rows at once"))))
    if t.beta != 0.0 and t.use_peft and not any(p.name == REFERENCE_FORWARD for p in phases):
        # PEFT: the reference pass is the policy with its adapters disabled (grpo_trainer.py `use_adapter`)
        out.append(Phase(name=REFERENCE_FORWARD, components=(
            *resident, Component(name=BUFFERED, bytes=batch),
            Component(name="no-grad pass", bytes=scoring_pass(job, prec), note="adapters disabled"),
            *scoring(job, v, n, batch, prec))))
    return out


def scoring(job: JobSpec, v: VisionSpec, n: int, batch: int, prec: Precision, adapted: tuple[VisionLinear, ...] = (),
            lora: LoraLayout | None = None) -> list[Component]:
    """What a no-grad scoring pass adds with images: the new batch's pixel_values, and the tower over one chunk —
    its own peak or, after it, the image embeddings beside the language model's pass, whichever is larger over the
    language model's pass alone."""
    rows, seq = job.train.per_device_train_batch_size, job.train.max_prompt_length + job.train.max_completion_length
    lm = scoring_pass(job, prec)
    own = tower_no_grad(v, n, prec, adapted, lora, dropout=True, autocast=True) + token_embeds(job, rows, seq, prec)
    tower = max(own - lm, 0, image_embeds(job, n, prec))
    return [Component(name=SCORING, bytes=batch, note="forward_kwargs, beside the old buffer"),
            Component(name=NO_GRAD, bytes=tower, note=f"{n:,} patches per chunk")]
