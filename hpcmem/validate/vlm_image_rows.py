"""TRL's trainer on image rows made by the type's own processor: one CPU step of TRL's SFTTrainer (or DPOTrainer) on a
tiny model of the type, a dataset of rows with an image each, and the processor class transformers pairs with the type
(models/auto/processing_auto.py) as the processing_class, as a real job hands it over.

    rec = image_rows("pp_formulanet")    # {"ran": False, "reason": "KeyError: 'input_ids'", "raised_in": "trl/…"}

For the types whose forward runs under TRL's fused LM head once it has image inputs (hpcmem.validate.vlm_image_call)
but whose processor may not make the rows TRL's collators need: TRL's vision collators read the processor's
`input_ids` and `attention_mask` (trl/trainer/sft_trainer.py `DataCollatorForVisionLanguageModeling.
_collate_language_modeling`, dpo_trainer.py `DataCollatorForVisionPreference`). The rows are TRL's standard
and conversational ones with an "images" column (`ROW_KINDS`); the tokenizer is the word tokenizer
(hpcmem.trace.pieces) and a torchvision-only image processor has a PIL stand-in (`PROCESSORS`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcmem.trace import pieces
from hpcmem.validate.trl_run import WORDS, build_model, kept_autocast, one_line, raised_in_frames, trl_args
from hpcmem.validate.vlm_tiny import MAX_LENGTH, tiny_config

ROWS = 8
SETTINGS = {"max_length": MAX_LENGTH, "per_device_train_batch_size": 1, "gradient_checkpointing": False}


def _pp_formulanet(config: dict[str, Any]) -> Any:
    """PPFormulaNetProcessor (processing_pp_formulanet.py; processing_auto.py's pp_formulanet row) around a PIL
    stand-in for its torchvision-only PPFormulaNetImageProcessor (image_processing_pp_formulanet.py, a
    TorchvisionBackend; image_processing_auto.py names no PIL one): NougatImageProcessorPil
    (image_processing_pil_nougat.py, the same crop-margin, resize, thumbnail and pad steps) at PPFormulaNet's class
    attributes (size 768 × 768, mean 0.7931, std 0.1738). Its `__call__` takes images only: what the rows' text
    becomes is the question, the pixels are not."""
    from transformers.models.nougat.image_processing_pil_nougat import NougatImageProcessorPil
    from transformers.models.pp_formulanet.processing_pp_formulanet import PPFormulaNetProcessor

    image = NougatImageProcessorPil(size={"height": 768, "width": 768}, image_mean=[0.7931] * 3,
                                    image_std=[0.1738] * 3)
    return PPFormulaNetProcessor(image_processor=image, tokenizer=pieces.tokenizer(WORDS))


# the rows an image job hands TRL: SFT's conversational language-modeling rows ("messages", a chat template given)
# and standard prompt-completion rows (a standard "text" column is dropped by SFTTrainer's unused-column filter for a
# vision dataset, sft_trainer.py `_set_signature_columns_if_needed`), DPO's standard preference rows
ROW_KINDS = {"messages": "sft", "prompt_completion": "sft", "preference": "dpo"}
# model_type → its processor from the tiny config
PROCESSORS: dict[str, Callable[[dict[str, Any]], Any]] = {"pp_formulanet": _pp_formulanet}


def image_rows(model_type: str, rows: str = "messages") -> dict[str, Any]:
    """{"ran", "reason", "raised_in"} of one step of TRL's trainer on a tiny `model_type` with image rows of the kind
    `rows` (`ROW_KINDS`) through `PROCESSORS`' processor. Raises KeyError for a type without one here."""
    import trl

    make, trainer = PROCESSORS[model_type], ROW_KINDS[rows]
    config = tiny_config(model_type)
    with tempfile.TemporaryDirectory(prefix="hpcmem-trl-rows-") as tmp, kept_autocast():
        path = Path(tmp) / "model"
        build_model(config, image_text=True).save_pretrained(path)
        pieces.tokenizer(WORDS).save_pretrained(path)
        _, args = trl_args(trainer, SETTINGS, str(path), Path(tmp) / "out", 1)
        processor = make(config)
        if rows == "messages":      # the trace's chat template (hpcmem.trace.pieces): the page is the encoder's input
            processor.chat_template = pieces.chat_template("")
        cls = trl.SFTTrainer if trainer == "sft" else trl.DPOTrainer
        try:
            cls(model=str(path), args=args, train_dataset=_rows(rows), processing_class=processor).train()
        except Exception as exc:  # noqa: BLE001 — the verdict: TRL (or the processor or model under it) raised
            return {"ran": False, "reason": f"{type(exc).__name__}: {one_line(exc)}",
                    "raised_in": raised_in_frames(exc)}
    return {"ran": True, "reason": "", "raised_in": ""}


def _rows(kind: str) -> Any:
    """ROWS rows of `kind` (TRL's "Dataset formats and types"), each with one white RGB page in "images" with a black
    box on it (Nougat's crop_margin crops to what is not white)."""
    from datasets import Dataset
    from PIL import Image, ImageDraw

    page = Image.new("RGB", (256, 128), "white")
    ImageDraw.Draw(page).rectangle((32, 32, 224, 96), fill="black")

    def words(n: int, shift: int = 0) -> str:
        return " ".join(f"t{pieces.FIRST_TOKEN_ID + (i + shift) % WORDS}" for i in range(n))

    images = [[page] for _ in range(ROWS)]
    if kind == "preference":
        return Dataset.from_dict({"images": images, "prompt": [words(8)] * ROWS, "chosen": [words(12, 1)] * ROWS,
                                  "rejected": [words(11, 2)] * ROWS})
    if kind == "prompt_completion":
        return Dataset.from_dict({"images": images, "prompt": [words(8)] * ROWS, "completion": [words(12, 1)] * ROWS})
    turns = [[{"role": "user", "content": words(8)}, {"role": "assistant", "content": words(12, 1)}]] * ROWS
    return Dataset.from_dict({"images": images, "messages": turns})
