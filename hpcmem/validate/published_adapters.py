"""The adapters' dtype of a published loop whose peft predates the fp32 adapters: the estimate of the source's step
with the LoRA weights in the base weights' dtype.

peft ≥ 0.11 upcasts bf16/fp16 adapter weights to fp32 when it builds them (`get_peft_model(...,
autocast_adapter_dtype=True)`, peft/tuners/tuners_utils.py `BaseTuner._cast_adapter_dtype`, huggingface/peft#1706,
merged 2024-05), and TRL 1.16's estimate keeps them so for a 16-bit base (hpcmem.estimate.lora `lora_layout`: 4 B).
Before it, peft gave each new adapter the dtype of the layer it wraps: peft ≤ 0.10 peft/tuners/lora/layer.py
`LoraLayer.update_layer` ends with `self.to(weight.device, dtype=weight.dtype)` for a floating-point base weight. A
loop run on that peft over a bf16 model (Answer.AI's train.py, February–March 2024, `--precision bf16`: the model cast
to bf16 before get_peft_model, no autocast, no FSDP MixedPrecision) trains bf16 adapters: the adapters, their
gradients and AdamW's two states (torch keeps them in the parameter's dtype) at 2 B, and the adapter backward's
temporaries in bf16 (hpcmem.estimate.lora `backward_bytes_per_input`: 2·2 − 1 B per input element instead of
2·4 − 1). Everything that reads the layout's `adapter_bytes` follows, because the step is worked out again with it.

A source declares it as `source: adapters: base-dtype`.
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate import Estimate, estimate, shared_step
from hpcmem.estimate.lora import lora_layout
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import precision


def base_dtype_lora_estimate(job: JobSpec) -> Estimate:
    """The estimate of `job` with its LoRA adapters in the base weights' dtype (peft ≤ 0.10); `estimate(job)` when
    the job has no adapters or they already are."""
    lora = lora_layout(job)
    weight = precision(job).weight
    if not lora.enabled or lora.adapter_bytes == weight:
        return estimate(job)
    return estimate(job, shared_step(job, lora=replace(lora, adapter_bytes=weight)))
