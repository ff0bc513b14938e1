"""Muse Spark SFT and DPO with images on a learned MoE text part (tests/fixtures/vlm/muse-spark-defaults-L2-D2.json:
two muse_spark_text layers of the text config class's widths, both sparse, their terms from the learned profile in
hpcmem/profiles/; Muse Glimmer's tower cut to 2 layers under its adapter and projection; the audio tower at its
defaults, loaded and idle) against the trace of TRL's SFTTrainer and DPOTrainer with their vision collators and
transformers' MuseSparkProcessor (around hpcmem.trace.vision_muse_glimmer's PIL stand-in) on blank 448×448 and 896×672
images (estimator/traces/vlm-muse-spark.jsonl, written once by `hpcmem validate trace --cases
estimator/cases/vlm-muse-spark.yaml --reserved`, the estimate untouched after)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.vision_muse_glimmer import muse_glimmer_terms
from hpcmem.job.shape import Precision
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import (assert_learned_case_holds, estimated_tensor_peak, grpo_with_images_job,
                                       trace_records)

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-muse-spark")
CUT = "tests/fixtures/vlm/muse-spark-defaults-L2-D2.json"
PREC = Precision(weight=2, act=2, residual=2, autocast=False, amp=True)
# hand counts at the cut (tests/models/test_muse_spark_params.py holds them to the meta model): Muse Glimmer's tower
# (2 layers), the adapter and the projection to 8192, the audio tower
TOWER = 1176 * 1536 + 1024 * 1536 + 4 * 1536 + 2 * (4 * (1536 ** 2 + 1536) + 2 * 1536 * 8960 + 8960 + 1536 + 4 * 1536)
MERGER = 6144 * 4096 + 4096 * 4096 + 4096 * 8192
AUDIO = 117_840_384


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in RECORDS.values()} == {(448, 448),
                                                                                               (672, 896)}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}


def test_the_audio_tower_loads_and_gets_no_gradient():
    """Full fine-tuning: every image-path parameter gets a bf16 gradient and AdamW's two states (torch/optim/adamw.py
    `zeros_like(p)`: bf16 like the bf16 parameters, 2 · 2 bytes); the audio
    tower's 117,840,384 parameters load in bf16 and get neither (MuseSparkModel.forward runs it on input_values
    only; torch/optim/adamw.py keeps state only for a parameter with a gradient)."""
    job = case_job({**RECORDS["mspark-full-gc-448"]["case"], "model_name_or_path": str(ROOT / CUT)})
    terms = muse_glimmer_terms(job, PREC, LoraLayout(enabled=False))
    assert terms.weights == 2 * (TOWER + MERGER + AUDIO)
    assert terms.gradients == 2 * (TOWER + MERGER)
    assert terms.optimizer == 4 * (TOWER + MERGER)


@pytest.mark.parametrize("cell", ["full-nogc", "full-gc", "lora-all-nogc", "lora-all-gc"])
def test_the_tower_s_growth_from_448_to_896_is_the_trace_s(cell):
    """2,048 more patches leave the text part's 1,536 tokens as they are: the peak grows by what the image path keeps
    for them (full fine-tuning: at the backward's end, by the batch's larger pixel_values alone), held to the traces'
    own growth within 0.1 MiB — Muse Glimmer's terms, unchanged for Muse Spark's trace."""
    small, large = RECORDS[f"mspark-{cell}-448"], RECORDS[f"mspark-{cell}-896"]
    traced = large["traced"] - small["traced"]
    estimated = estimated_tensor_peak(large, ROOT) - estimated_tensor_peak(small, ROOT)
    assert abs(estimated - traced) < 2 ** 20


def test_grpo_with_images_is_refused():
    with pytest.raises(SpecError, match="with trainer grpo on muse_spark: hpcmem models muse_spark's images for "
                                        "sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 448, 448))
