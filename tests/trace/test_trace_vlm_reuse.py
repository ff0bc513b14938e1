"""ShieldGemma 2 and Cosmos3-Omni run for real: a tiny config of each through TRL's SFTTrainer on the CPU against the
trace of the same job (`--kernels cpu`), the check that the fake-tensor trace sees what the real step allocates; and
what ShieldGemma2Processor does with the text TRL's vision collator hands it (why the estimate and the trace hold a
Gemma3Processor)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")

from hpcmem.job.trl_config import build_job  # noqa: E402
from tests.helpers.trace_helpers import trace_matches_cpu  # noqa: E402

pytestmark = pytest.mark.torch
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"


def sft_job(config: Path, **kw):
    settings = {"model_name_or_path": str(config), "dtype": "bfloat16", "bf16": True, "per_device_train_batch_size": 1,
                "images_per_example": 1, "image_height": 64, "image_width": 64, "max_length": 64, **kw}
    return build_job("sft", settings)[0]


@pytest.mark.parametrize("name", ["shieldgemma2-tiny.json", "cosmos3_omni-tiny.json"])
def test_a_real_sft_trainer_runs_it_as_traced(name):
    """Random weights, two steps, the vision collator on one image per row; a few seconds each."""
    trace_matches_cpu(sft_job(FIXTURES / name), name)


def test_shieldgemma2_processor_replaces_the_text_by_policy_prompts():
    """processing_shieldgemma2.py `ShieldGemma2Processor.__call__`: what apply_chat_template hands it (TRL's collator
    path) becomes one row per image and policy (3 default policies) of the policy prompt, whatever the row's text;
    text without images (the completions of a prompt-completion row, DPO's chosen and rejected) raises."""
    from PIL import Image
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    from transformers.models.shieldgemma2.processing_shieldgemma2 import ShieldGemma2Processor
    from trl.data_utils import prepare_multimodal_messages

    from hpcmem.trace.pieces import WORD
    from hpcmem.trace.vision_gemma3 import CHAT_TEMPLATE, gemma3_tokenizer

    proc = ShieldGemma2Processor(image_processor=Gemma3ImageProcessorPil(size={"height": 224, "width": 224}),
                                 tokenizer=gemma3_tokenizer(), chat_template=CHAT_TEMPLATE, image_seq_length=16)
    image = Image.new("RGB", (224, 224))
    rows = {}
    for words in (40, 400):
        messages = [prepare_multimodal_messages([{"role": "user", "content": " ".join([WORD] * words)}], images=[image])
                    for _ in range(2)]
        out = proc.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="pt",
                                       processor_kwargs={"padding": True, "add_special_tokens": False})
        rows[words] = tuple(out["input_ids"].shape)
    assert rows[40] == rows[400] and rows[40][0] == 2 * 3
    with pytest.raises(ValueError, match="needs images"):
        proc(text=["a b c"], return_tensors="pt")
