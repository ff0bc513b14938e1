"""Qwen3-Omni thinker SFT and DPO with images (tests/fixtures/vlm/qwen3-omni-30b-thinker-width-L2-D2.json: the released
Qwen3-Omni-30B-A3B-Instruct thinker_config's widths, 2 Qwen3-MoE decoder layers, 2 Qwen3-VL tower blocks with
deepstack mergers after both, 2 audio encoder layers) against the trace of TRL's SFTTrainer and DPOTrainer with their
vision collators and transformers' Qwen3OmniMoeProcessor on blank 448×448 and 896×896 images
(estimator/traces/vlm-qwen3-omni.jsonl, written by `hpcmem validate trace --cases estimator/cases/vlm-qwen3-omni.yaml
--reserved`, the estimate untouched after); and the idle audio encoder, which the trace shows gets no gradient and no
optimizer state."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import estimated_tensor_peak, grpo_with_images_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-qwen3-omni")
CUT = ROOT / "tests" / "fixtures" / "vlm" / "qwen3-omni-30b-thinker-width-L2-D2.json"
# the cut's parameters by part, from the meta model (tests/models/test_qwen3_omni_params.py holds hpcmem's to them):
# the audio encoder's, and everything else (tower, mergers, decoder, head)
AUDIO = 57_603_968
REST = 1_996_054_560


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    assert abs(estimated_tensor_peak(RECORDS[case_id], ROOT) - traced) <= 0.03 * traced


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in RECORDS.values()} == {(448, 448),
                                                                                               (896, 896)}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}


@pytest.mark.parametrize("case_id", ["q3omni-full-gc-448", "q3omni-full-nogc-896", "q3omni-dpo-full-gc-896"])
def test_the_audio_encoder_gets_no_gradient_and_no_optimizer_state(case_id):
    """Full fine-tuning: the trace's gradients are the bf16 gradients of every parameter but the audio encoder's
    (2 bytes · 1,996,054,560, up to the allocator's 512-byte rounding of each tensor), and AdamW's two bf16 states of
    the same parameters (4 bytes each, and its step counters) — with the audio encoder's they would be 2 · 57,603,968
    and 4 · 57,603,968 bytes more."""
    traced = RECORDS[case_id]["traced_components"]
    assert 0 <= traced["grad"] - 2 * REST < 2 * AUDIO // 1000
    assert 0 <= traced["optimizer"] - 4 * REST < 4 * AUDIO // 1000


def test_the_idle_audio_encoder_s_weights_by_hand():
    """The tower's weights component under full fine-tuning: the image path's parameters and the audio encoder's in
    bf16 (2 · 57,603,968) and its fp32 sinusoid buffer (4 · 1500 · 1280) — the audio encoder adds nothing else."""
    job = case_job({**RECORDS["q3omni-full-gc-448"]["case"], "model_name_or_path": str(CUT)})
    v = job.model.vision
    weights = next(c for p in estimate(job).phases for c in p.components if c.name == "vision tower weights")
    assert v.idle_params == AUDIO
    assert weights.bytes == 2 * v.image_path.num_params + 2 * AUDIO + 4 * 1500 * 1280
    assert "audio encoder loaded and idle" in weights.note


def test_the_audio_adapters_load_and_get_no_state():
    """LoRA on the cases' named targets: the audio encoder's adapters (9 linear kinds, r = 16: 2 layers · 16 ·
    (4 · 2560 + 2 · 6400) + 16 · (7680 + 1280) + 16 · 2560 + 16 · 3328 = 974,848) load in fp32 beside the weights; the
    trace's optimizer states cover the other adapters only (tower 570,368, merger 253,952, deepstack mergers 507,904,
    decoder 557,056: 1,889,280 · 8 bytes, plus the allocator's rounding)."""
    job = case_job({**RECORDS["q3omni-lora-lin-gc-448"]["case"], "model_name_or_path": str(CUT)})
    audio = 2 * 16 * (4 * 2560 + 2 * 6400) + 16 * (7680 + 1280) + 16 * 2560 + 16 * 3328
    assert audio == 974_848
    weights = next(c for p in estimate(job).phases for c in p.components if c.name == "vision tower weights")
    assert weights.bytes == 2 * job.model.vision.num_params + 4 * 1500 * 1280 + 4 * (audio + 570_368 + 253_952
                                                                                      + 507_904)
    assert 0 <= RECORDS["q3omni-lora-lin-gc-448"]["traced_components"]["optimizer"] - 8 * 1_889_280 < 8 * audio // 10


def test_grpo_with_images_is_refused():
    """SFT and DPO with images hold (the stored traces above); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on qwen3_omni_moe_thinker: hpcmem models "
                                        "qwen3_omni_moe_thinker's images for sft, dpo only"):
        estimate(grpo_with_images_job(CUT, 448, 448))
