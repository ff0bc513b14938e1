"""The analytic estimate: pure, stdlib only (a test proves importing it leaves torch unimported).

`estimate(job)` returns an `Estimate` with named components per phase and the three peaks (allocated, reserved,
device). The sub-modules each hold one idea: shape (micro-batch and precisions), states (weights, gradients,
optimizer, sharding), activations, lora, loss (TRL's fused LM head), step (phases), device (allocator and context).
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcmem.estimate import lora_variants
from hpcmem.estimate.allocator import allocator_slack, spread_block
from hpcmem.estimate.breakdown import Component, Estimate, HostEstimate, Phase
from hpcmem.estimate.checkpoint import save_bytes
from hpcmem.estimate.closing import resident_components
from hpcmem.estimate.device import device_terms
from hpcmem.estimate.evaluation import eval_phase
from hpcmem.estimate.fsdp_units import quantized_unit_warning, stream_pool_extra
from hpcmem.estimate.host import host_estimate
from hpcmem.estimate.learned_range import learned_warnings
from hpcmem.estimate.lora import LoraLayout, lora_layout
from hpcmem.estimate.loss import loss_bytes
from hpcmem.estimate.names import BLOCK_TAILS as TAILS
from hpcmem.estimate.names import CHECKPOINT_SAVE as SAVE_PHASE
from hpcmem.estimate.names import CUBLAS_WORKSPACES as WORKSPACES
from hpcmem.estimate.names import GATHERED, PREFETCHED_UNIT
from hpcmem.estimate.parallel import layout_json, layout_note, local_micro_batch, sequence_buffers
from hpcmem.estimate.recurrent_tail import worst_tail_note
from hpcmem.estimate.shapes import needed_bytes, shapes_bytes, shapes_note
from hpcmem.estimate.states import States, job_param_parts, model_states, optimizer_step_transient
from hpcmem.estimate.step import build_phases
from hpcmem.estimate.tails import block_tails
from hpcmem.estimate.trainers import TrainerExtras, trainer_extras, with_policy_saved
from hpcmem.estimate.vision import VisionTerms, images_note, vision_json, with_vision
from hpcmem.estimate.vision_llava import tower_terms
from hpcmem.estimate.vision_rl import with_rl_vision
from hpcmem.estimate.workspaces import cublas_workspaces, cublaslt_threads
from hpcmem.job.assumptions import describe as describe_assumptions
from hpcmem.gpus.spec import GpuSpec
from hpcmem.job.images import LOADING_NOTES, published_pixels_note
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.rules import job_warnings
from hpcmem.job.shape import MicroBatch, Precision, micro_batch, precision
from hpcmem.job.spec import ParallelSpec, TrainSpec
from hpcmem.job.trainers import entry
from hpcmem.models.spec import ModelSpec
from hpcmem.models.vision import IMAGE_TRAINERS_TRACED

__all__ = ["Component", "Estimate", "Phase", "SharedStep", "estimate", "shared_step"]

NOT_MODELLED = (
    "NCCL's own buffers beyond one communicator (uncalibrated constant)",
    "kernel workspaces other than cuBLAS's and the CUDA context default",
    "dataloader pinned batches; vLLM's host memory",
)
# torch.compile (TrainingArguments.torch_compile → `torch.compile(model)`, inductor): AOTAutograd's min-cut partitioner
# chooses what the compiled forward saves, recomputing cheap pointwise ops instead of keeping them; the eager step
# keeps everything autograd saves.
TORCH_COMPILE_NOTE = ("torch_compile: estimated as the eager step — inductor's partitioner recomputes cheap ops "
                      "instead of saving them, so the compiled step usually keeps less; not traced")
VLLM_NOT_TRACED = "vLLM's pool is modelled from its documented rule (vllm_gpu_memory_utilization × device memory), not traced"


def _summary(job: JobSpec, mb_source: str, lora_note: str) -> str:
    t, par, m = job.train, job.parallel, job.model
    loaded = f" ({job.load_dtype} from {m.dtype_source or 'config.json'})" if t.dtype == "auto" and m.dtype else ""
    size = (f"{m.num_params / 1e9:.2f} B params" if m.vision is None else
            f"{(m.num_params + m.vision.num_params) / 1e9:.2f} B params: language model {m.num_params / 1e9:.2f} B, "
            f"vision tower + merger{'s' if m.vision.deepstack_visual_indexes else ''} "
            f"{m.vision.num_params / 1e9:.2f} B")
    bits = [f"model {m.name} ({size})", t.trainer.upper(), f"dtype {t.dtype}{loaded}"]
    if t.has_images and m.vision is not None:
        bits.append(images_note(job))
    if lora_note:
        bits.append(lora_note)
    if entry(t.trainer).declares("max_length"):
        bits.append(f"max_length {t.max_length}")
    if t.packing:
        bits.append(f"packing {t.packing_strategy}")
    elif t.padding_free:
        bits.append("padding-free")
    gc = "off" if not t.gradient_checkpointing else ("selective" if t.selective_checkpointing else "full")
    bits.append(f"GC {gc}")
    if t.activation_offloading:
        bits.append("activation offloading")
    if par.deepspeed:
        bits.append(f"ZeRO-{par.zero_stage}")
    elif par.fsdp:
        bits.append(f"FSDP{par.fsdp_version}")
    elif par.world_size > 1:
        bits.append("DDP")
    bits.append(f"{par.world_size} GPU{'s' if par.world_size > 1 else ''}" +
                (f" ({par.num_machines} nodes)" if par.num_machines > 1 else ""))
    if layout_note(job):
        bits.append(layout_note(job))
    if job.expandable_segments:
        bits.append("expandable_segments")
    bits.append(f"micro-batch: {mb_source}")
    return " · ".join(bits)


def _job_phases(job: JobSpec, parts, prec, states, base: tuple[Component, ...], save) -> list[Phase]:
    """Phases outside the training step: evaluation (when eval_strategy asks) and checkpoint saving (always: TRL's
    scripts end with save_model), each beside the resident states and the units ZeRO-3 / FSDP keep gathered."""
    par = job.parallel
    kept: tuple[Component, ...] = ()
    if par.deepspeed and par.zero_stage == 3 and states.gradients:
        # ZeRO-3 allocates its 16-bit gradient partition once (stage3.py `grad_partitions_flat_buffer`) and keeps it
        # between steps; torch and ZeRO-1/2 free gradients after the step (measured per rank on CPU, estimator/LOG.md)
        kept = (Component(name="gradient partition", bytes=states.gradients, note="ZeRO-3 keeps it between steps"),)
    gathered = (Component(name=GATHERED, bytes=states.gathered),) if states.gathered else ()
    eval_gathered = gathered
    if par.fsdp and par.fsdp_version == 2 and states.prefetched:
        # FSDP2's eval forward (no grad) holds a second decoder unit beside the running one: measured per rank on CPU
        # (tests/probe/test_probe_lora_jobphases.py, FSDP2 + LoRA: the evaluation phase needs one more unit's bytes
        # than the root and one unit); the mechanism is not named
        eval_gathered += (Component(name=PREFETCHED_UNIT, bytes=states.prefetched, note="a second unit (measured)"),)
    out = []
    evaluation = eval_phase(job, parts, prec, base + kept + eval_gathered)
    if evaluation is not None:
        out.append(evaluation)
    out.append(Phase(name=SAVE_PHASE, components=base + kept + save.gpu))
    return out


@dataclass(frozen=True, kw_only=True)
class SharedStep:
    """What `estimate` works out before the caching allocator's terms: the phases of the step and around it, the
    states, the host RAM. Nothing in it reads `expandable_segments` (only the block tails, the allocator slack and the
    shapes term do: hpcmem.estimate.tails, allocator, shapes), so two jobs that differ only in that setting share
    one (the planner estimates both)."""

    train: TrainSpec            # the job it was worked out for, less the allocator setting (`estimate` checks)
    parallel: ParallelSpec
    model: ModelSpec
    gpu: GpuSpec | None
    tokens_per_micro_batch: int | None
    label_tokens_per_micro_batch: int | None
    teacher: ModelSpec | None
    prec: Precision
    mb: MicroBatch
    lora: LoraLayout
    states: States
    extras: TrainerExtras
    phases: tuple[Phase, ...]   # every phase, with the cuBLAS workspaces, without the block tails
    vision: VisionTerms | None  # the vision tower's terms (None without images' tower), for the JSON
    host: HostEstimate
    host_bytes: int

    def serves(self, job: JobSpec) -> bool:
        """Whether `job` is the job this was worked out for, whatever its expandable_segments."""
        return (job.model is self.model or job.model == self.model) and job.train == self.train and \
            job.parallel == self.parallel and job.gpu == self.gpu and job.teacher == self.teacher and \
            job.tokens_per_micro_batch == self.tokens_per_micro_batch and \
            job.label_tokens_per_micro_batch == self.label_tokens_per_micro_batch


def shared_step(job: JobSpec, lora: LoraLayout | None = None) -> SharedStep:
    """The allocator-independent part of `estimate(job)` (`SharedStep`). `lora`: the job's adapters laid out otherwise
    than `lora_layout(job)` (a published loop whose peft kept them in another dtype: hpcmem.validate.published_adapters)."""
    prec = precision(job)
    mb = local_micro_batch(job, micro_batch(job))
    parts = job_param_parts(job)
    lora = lora if lora is not None else lora_layout(job)
    states = model_states(job, prec, lora)
    loss = loss_bytes(job, mb, prec, head_trains=not lora.enabled or lora.trains_head)
    extras = trainer_extras(job, parts, prec)
    phases, act_host = build_phases(job, mb, prec, parts, states, lora, loss,
                                    optimizer_step_transient(job, states, parts, lora), extras.resident,
                                    sequence_buffers(job, mb, prec))
    base = (*resident_components(states, lora), *extras.resident)
    phases += [Phase(name=p.name, components=base + p.components)
               for p in with_policy_saved(job, extras.phases, phases)]
    save = save_bytes(job, parts, prec, lora, states)
    phases += _job_phases(job, parts, prec, states, base, save)
    embed_grad = parts.embed * prec.weight if parts.lm_head and not lora.enabled else 0
    vision = tower_terms(job, prec, lora)
    phases = with_rl_vision(job, vision, with_vision(job, vision, phases, embed_grad), prec, lora)
    if extras.vllm_pool_asleep:
        phases.append(Phase(name="generation (vLLM awake)", components=base + (
            Component(name="vLLM pool", bytes=extras.vllm_pool_asleep,
                      note="vllm_gpu_memory_utilization × device memory; released by sleep mode while training"),)))
    ws_bytes, ws_note = cublas_workspaces(job.gpu, cublaslt_threads(job), job.env.cublas_workspace_bytes)
    workspaces = Component(name=WORKSPACES, bytes=ws_bytes, note=ws_note)
    return SharedStep(train=job.train, parallel=job.parallel, model=job.model, gpu=job.gpu,
                tokens_per_micro_batch=job.tokens_per_micro_batch,
                label_tokens_per_micro_batch=job.label_tokens_per_micro_batch, teacher=job.teacher, prec=prec, mb=mb,
                lora=lora,
                states=states, extras=extras, phases=tuple(Phase(name=p.name, components=(*p.components, workspaces))
                                                            for p in phases), vision=vision,
                host=host_estimate(job, parts, states, act_host, save), host_bytes=states.host + act_host)


def estimate(job: JobSpec, shared: SharedStep | None = None) -> Estimate:
    """`shared`: `shared_step` of a job that differs from `job` at most in expandable_segments (refused otherwise)."""
    if shared is not None and not shared.serves(job):
        raise ValueError("estimate: the shared step was worked out for another job")
    st = shared or shared_step(job)
    prec, mb, lora, extras = st.prec, st.mb, st.lora, st.extras
    tails_bytes, tails_note = block_tails(job, prec, lora)
    tails = (Component(name=TAILS, bytes=tails_bytes, note=tails_note),) if tails_bytes else ()
    phases = [Phase(name=p.name, components=(*p.components, *tails)) for p in st.phases] if tails else \
        list(st.phases)
    slack, spread = allocator_slack(job, mb, prec, lora, phases)
    pool = stream_pool_extra(job, phases)
    slack += pool
    shapes = shapes_bytes(job, phases)
    dev = device_terms(job, slack, vllm_bytes=extras.vllm_pool)
    lora_note = (f"{'QLoRA' if job.train.quantized else 'LoRA'} r={job.train.lora_r}" if lora.enabled else "")
    not_held = learned_warnings(job, mb)
    warnings = (list(job_warnings(job)) + list(extras.notes) + lora_variants.wrapped_notes(job, lora, prec)
                + not_held)
    warnings += [w for w in (quantized_unit_warning(job), worst_tail_note(job, mb, prec)) if w]
    if job.gpu is None:
        warnings.append("no --gpu given: no fit verdict")
    warnings += [f"not modelled, set in the job's environment: {what}" for what in job.env.unmodelled]
    if job.train.torch_compile:
        warnings.append(TORCH_COMPILE_NOTE)
    if job.model.wrapper_model_type:
        warnings.append(multimodal_note(job.model.wrapper_model_type))
    if job.model.vision is not None and not job.train.has_images:
        warnings.append(VISION_UNUSED_NOTE)
    v, t = job.model.vision, job.train
    if v is not None and t.has_images and \
            t.trainer not in IMAGE_TRAINERS_TRACED.get(v.model_type, ()):
        warnings.append(f"{t.trainer} with {v.model_type}'s images: not traced — estimated by the rules traced on "
                        f"{', '.join(k for k, tr in IMAGE_TRAINERS_TRACED.items() if t.trainer in tr)}")
    if v is not None and t.has_images:
        warnings.append(IMAGE_RESERVED_NOTE)
    if v is not None and t.has_images and v.model_type in WIDER_IMAGE_RESERVED:
        warnings.append(wider_reserved_note(v.model_type))
    if v is not None and t.has_images and v.model_type in LOADING_NOTES:
        warnings.append(LOADING_NOTES[v.model_type])
    if job.model.vision is not None and published_pixels_note(job.train, job.model.vision):
        warnings.append(published_pixels_note(job.train, job.model.vision))
    if job.train.max_length is None and job.tokens_per_micro_batch is None and not entry(job.train.trainer).generates:
        warnings.append("max_length none and no length profile: rows are assumed max_position_embeddings long; "
                        "profile the data (hpcmem lengths --save p.json, then --lengths p.json)")
    return Estimate(
        model_name=job.model.name,
        num_params=job.model.num_params,
        summary=_summary(job, mb.source, lora_note),
        phases=tuple(phases),
        reserved_extra_bytes=dev.reserved_extra,
        reserved_pool_bytes=pool,
        reserved_spread_bytes=spread,
        reserved_spread_note=spread_block(job, mb, prec, lora) if spread else "",
        reserved_shapes_bytes=shapes,
        shapes_needed_bytes=needed_bytes(job, shapes),
        reserved_shapes_note=shapes_note(job) if shapes else "",
        device_extra_bytes=dev.device_extra,
        device_note=dev.note,
        gpu_name=job.gpu.name if job.gpu else None,
        gpu_memory_bytes=job.gpu.memory_bytes if job.gpu else None,
        host_bytes=st.host_bytes,
        host=st.host,
        warnings=tuple(warnings),
        not_held=tuple(not_held),
        not_modelled=NOT_MODELLED + ((VLLM_NOT_TRACED,) if job.train.use_vllm else ())
        + ((MULTIMODAL_NOT_MODELLED,) if job.model.wrapper_model_type else ()) + job.env.unmodelled,
        calibrated=dev.calibrated,
        made=made_by(job),
        gpu=job.gpu,
        extra={"layout": layout_json(job, mb), "vision": vision_json(job, st.vision)},
        assumed=tuple(describe_assumptions(job)),
        world_size=job.parallel.world_size,
    )


MULTIMODAL_NOT_MODELLED = "a multimodal model's vision/audio towers, projector and image tokens"
IMAGE_RESERVED_NOTE = ("reserved with images is not held to 3 %: the allocator's slack terms are fitted on "
                       "text-only jobs and do not count the segments the vision tower's and connector's blocks strand; "
                       "on 640 traced image cases the trace's allocator model reserved up to 14 % more than the "
                       "estimate under default segments (199 beyond 3 %), up to 11 % more under expandable segments "
                       "(estimator/LOG.md) — keep that headroom")
# image types whose traced reserved peak goes past IMAGE_RESERVED_NOTE's figures: (default, expandable) % and why.
# DeepSeek-VL hybrid: SAM's global attention on the trace's SDPA math path (modeling_sam.py SamVisionSdpaAttention)
# makes and frees fp32 [heads, grid², grid²] tensors in the forward and the backward whose cached blocks the allocator
# model keeps and the estimate's slack terms do not (estimator/LOG.md, 12 traced cases)
# PP-Chart2Table: modeling_got_ocr2.py GotOcr2VisionAttention's eager attention keeps [heads, N, N] fp32 and 16-bit
# scores per image on a global layer (hundreds of MiB each), which strand whole segments (estimator/LOG.md, 12 traced
# SFT cases: 8-33 % default, 1-32 % expandable)
# DeepSeek-OCR 2: DeepSeek-VL hybrid's SAM attention (modular_deepseek_ocr2.py, SamVisionSdpaAttention's) run twice,
# on the 1024 px global views and on the 768 px tiles (estimator/LOG.md, 12 traced cases: 7-32 % default, 3-21 %
# expandable); Unlimited-OCR: the same SAM (modular_unlimited_ocr.py) under a CLIP encoder (12 traced cases: 9-24 %
# default, 3-21 % expandable)
# Apertus 1.5: the vision tokenizer (modeling_apertus1p5.py, Chameleon's VQGAN encoder at full resolution, 256
# channels) allocates and frees [256, H, W] tensors per ResNet block (12 traced cases: 2-19 % default, 0-6 %
# expandable)
# Emu3: its VQ-VAE encoder (modeling_emu3.py Emu3VQVAEEncoder) makes and frees GiB-sized fp32 GroupNorm copies and
# outputs and 16-bit conv outputs over every image's frames, level by level, in the forward and again in DPO's
# reference pass (estimator/LOG.md, 12 traced cases: 2-29 % default, up to 19 % expandable)
WIDER_IMAGE_RESERVED = {"deepseek_vl_hybrid": (26, 22, "the SAM tower's global attention makes and frees fp32 "
                                                       "[heads, grid², grid²] tensors"),
                        "pp_chart2table": (33, 32, "the GOT-OCR 2.0 tower's global layers keep eager [heads, N, N] "
                                                   "attention scores, fp32 and 16-bit, per image"),
                        "deepseek_ocr2": (32, 21, "the SAM tower's global attention makes and frees fp32 "
                                                  "[heads, grid², grid²] tensors for the global view and again for "
                                                  "the tiles"),
                        "unlimited_ocr": (25, 21, "the SAM tower's global attention makes and frees fp32 "
                                                  "[heads, grid², grid²] tensors for the global view and again for "
                                                  "the tiles"),
                        "apertus1p5": (19, 6, "the vision tokenizer's first stage makes and frees full-resolution "
                                              "tensors (fp32 GroupNorm copies and outputs, 16-bit convolution "
                                              "outputs) of hundreds of MiB each, per image"),
                        "emu3": (30, 19, "the VQ-VAE encoder makes and frees GiB-sized fp32 GroupNorm tensors and "
                                         "16-bit conv outputs over each image's frames, level by level")}


def wider_reserved_note(model_type: str) -> str:
    default, expandable, why = WIDER_IMAGE_RESERVED[model_type]
    return (f"reserved with {model_type}'s images: {why}, whose cached blocks the allocator's slack terms do not "
            f"count; on its traced cases the trace's allocator model reserved up to {default} % more than the estimate "
            f"under default segments, up to {expandable} % more under expandable segments (estimator/LOG.md) — keep "
            "that headroom")


VISION_UNUSED_NOTE = ("images_per_example 0 on a vision-language model: a text-only job; the vision tower's weights "
                      "are counted, its activations and gradients are not (set images_per_example, image_height and "
                      "image_width for an image dataset)")


def multimodal_note(wrapper: str) -> str:
    """A config that nests its decoder under text_config (gemma3, …): TRL loads the whole model
    (AutoModelForImageTextToText), but only the decoder is counted here."""
    return (f"{wrapper} is a multimodal config: this estimate counts its text decoder (text_config) alone — the "
            "vision/audio towers and projector (their weights, gradients, optimizer states, activations) and the "
            "image tokens are not counted, so the job needs more than this")


def made_by(job: JobSpec) -> str:
    """"derived" (the family's formulas), or how the learned profile the layers' terms come from was made."""
    p = job.model.learned
    if p is None:
        return "derived"
    prov = p.provenance
    return (f"learned profile ({prov.get('summary', 'traced')} by hpcmem models learn, transformers "
            f"{prov.get('versions', {}).get('transformers', '?')}; not derived)")
