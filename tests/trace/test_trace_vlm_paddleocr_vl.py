"""PaddleOCR-VL (paddleocr_vl) traced now against its estimate: TRL's SFTTrainer with its vision collator and
PaddleOCRVLProcessor on a 1024×768 image (smart_resize to 1,036×756: 3,996 patches, 999 image tokens), the cut of
estimator/cases/vlm-paddleocr-vl.yaml. LoRA all-linear with checkpointing: the step's peak and the tower's own backward
within 3 %. LoRA all-linear without checkpointing: the last vision layer's forward, at fc2's adapter (peft's fp32 copy
of its input and the dropout's output beside every layer's saved tensors), is the estimate's "forward (vision tower)"
within 3 %, and the first layer keeps less than the second (its input requires no grad). And what TRL's collator hands
the model."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import collated_image_row, estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def test_the_trace_of_today_agrees_with_the_estimate():
    estimate_holds_vision_trace(shipped_case_job("vlm-paddleocr-vl.yaml", "pocr1024-lora-all-gc"), 3.0)


def test_the_last_layers_forward_instant_is_the_traces():
    from hpcmem.estimate import estimate
    from hpcmem.estimate.vision import TOWER_FORWARD
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.trace.run import run_trace

    job = shipped_case_job("vlm-paddleocr-vl.yaml", "pocr1024-lora-all-nogc")
    timeline = run_trace(job, timeline=True).timeline
    traced = max(p.current_bytes for p in timeline if p.phase == "step 2 / forward / vision block 1")
    phase = next(p for p in estimate(job).phases if p.name == TOWER_FORWARD)
    assert abs(tensor_bytes(phase) - traced) <= 0.03 * traced, (tensor_bytes(phase), traced)


def test_the_collator_fills_the_row_with_the_images_tokens():
    from hpcmem.trace.vision import VISION_END, VISION_START

    job = shipped_case_job("vlm-paddleocr-vl.yaml", "pocr1024-lora-all-gc")
    proc, batch = collated_image_row(job, 2048)
    ids = batch["input_ids"][0]
    assert ids.shape == (2048,)
    assert int((ids == proc.image_token_id).sum()) == 54 * 74 // 4
    assert [int((ids == m).sum()) for m in proc.tokenizer.convert_tokens_to_ids([VISION_START, VISION_END])] == [1, 1]
    assert tuple(batch["pixel_values"].shape) == (54 * 74, 3, 14, 14)
    assert batch["image_grid_thw"].tolist() == [[1, 54, 74]]
