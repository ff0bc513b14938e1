"""IDEFICS (idefics, IdeficsForVisionText2Text) is refused in one line that says what TRL 1.16 does with its images
(hpcmem.models.coverage_vlm `TRL_WITH_IMAGES`). The slow tests hold that line to the real code: TRL's trainers with
transformers' IdeficsProcessor (the PIL image processor, the word tokenizer stand-in with IDEFICS' special tokens) on
a tiny model, one CPU step each: SFT on messages with images trains (every part: the loader undoes the freeze
IdeficsConfig's flags set at init); prompt-completion SFT and DPO raise where the line says."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.models.coverage import refusal, vision_language_rows
from hpcmem.models.resolve import resolve_model

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "idefics-defaults-L2-D2.json"
IMAGE, FAKE, BOS = "<image>", "<fake_token_around_image>", "<s>"      # processing_idefics.py's tokens
TILE = 28                                                              # the tiny tower's image_size (2 × 2 patches)


def test_the_type_is_refused_in_one_line_naming_what_trl_does_with_its_images():
    why = refusal("idefics")
    assert why.startswith("refused: vision-language only (image-text-to-text: IdeficsForVisionText2Text)")
    assert "\n" not in why
    assert "only as SFT on language-modeling rows" in why and "prompt-completion SFT and DPO raise" in why
    assert "freeze_text_layers and freeze_vision_layers" in why
    with pytest.raises(SpecError) as err:
        resolve_model(str(FIXTURE))
    assert str(err.value).count("\n") == 0 and "IdeficsProcessor.__call__" in str(err.value)
    row = next(r for r in vision_language_rows() if r["model_type"] == "idefics")
    assert row["status"] == "refused" and row["reason"] == why.removeprefix("refused: ")


def _processor():
    """IdeficsProcessor around IdeficsImageProcessorPil at the tiny tower's size; the word tokenizer gains a BOS token
    (the processor starts each row with `tokenizer.bos_token`), <image> and <fake_token_around_image>. The class
    drops a chat_template given to __init__ (IdeficsProcessor.__init__ passes only the image processor and tokenizer
    on), so the template is set on the instance."""
    from transformers.models.idefics.image_processing_pil_idefics import IdeficsImageProcessorPil
    from transformers.models.idefics.processing_idefics import IdeficsProcessor

    from hpcmem.trace.pieces import chat_template, tokenizer

    tok = tokenizer()
    tok.add_special_tokens({"bos_token": BOS, "additional_special_tokens": [IMAGE, FAKE]})
    proc = IdeficsProcessor(image_processor=IdeficsImageProcessorPil(image_size=TILE), tokenizer=tok)
    proc.chat_template = chat_template(IMAGE)
    return proc


def _model(proc, tmp_path: Path) -> str:
    """A tiny IdeficsForVisionText2Text (2 decoder layers, a gated cross-attention layer before each, a perceiver
    resampler of 4 latents, a 2-layer tower) saved where TRL loads it; IdeficsConfig's freeze flags at their
    defaults."""
    import transformers

    cfg = transformers.IdeficsConfig(
        vocab_size=len(proc.tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, use_resampler=True, pad_token_id=0, bos_token_id=4, eos_token_id=1,
        vision_config={"embed_dim": 16, "image_size": TILE, "patch_size": 14, "num_hidden_layers": 2,
                       "num_attention_heads": 2, "intermediate_size": 32},
        perceiver_config={"use_resampler": True, "resampler_n_latents": 4, "resampler_depth": 1,
                          "resampler_n_heads": 2, "resampler_head_dim": 8})
    path = tmp_path / "idefics-tiny"
    transformers.IdeficsForVisionText2Text(cfg).save_pretrained(path)
    return str(path)


def _user(words: int = 10) -> list[dict]:
    from hpcmem.trace.pieces import WORD

    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " ".join([WORD] * words)}]}]


def _assistant() -> list[dict]:
    from hpcmem.trace.pieces import WORD

    return [{"role": "assistant", "content": [{"type": "text", "text": f"{WORD} {WORD}"}]}]


def _images(rows: int) -> list:
    from PIL import Image

    return [[Image.new("RGB", (2 * TILE, TILE))]] * rows


def _sft(tmp_path: Path, data: dict, rows: int, **kw):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    proc = _processor()
    args = SFTConfig(output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=rows, max_length=64,
                     bf16=False, report_to=[], save_strategy="no", use_cpu=True, **kw.pop("args", {}))
    return SFTTrainer(model=_model(proc, tmp_path), args=args, train_dataset=Dataset.from_dict(data),
                      processing_class=proc, **kw)


def _parts(model) -> set[str]:
    """The top-level parts (below IdeficsModel, or the head) with a parameter that requires grad."""
    return {n.split(".")[1] if n.startswith("model.") else n.split(".")[0]
            for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.torch
@pytest.mark.slow
def test_the_freeze_flags_hold_at_init_and_the_loader_undoes_them(tmp_path):
    """IdeficsModel.__init__ (freeze_relevant_params, at IdeficsConfig's default freeze_text_layers and
    freeze_vision_layers True) leaves only the gated cross-attention layers, the perceiver resampler and lm_head
    trainable; from_pretrained, as TRL loads a model path (trl/trainer/utils.py create_model_from_path), sets every
    loaded weight as a new nn.Parameter with requires_grad (core_model_loading.py `set_param_for_module`), so all of
    them train."""
    import transformers

    path = _model(_processor(), tmp_path)
    config = transformers.AutoConfig.from_pretrained(path)
    assert config.freeze_text_layers and config.freeze_vision_layers and not config.freeze_lm_head
    built = _parts(transformers.IdeficsForVisionText2Text(config))
    assert built == {"gated_cross_attn_layers", "perceiver_resampler", "lm_head"}
    loaded = _parts(transformers.AutoModelForImageTextToText.from_pretrained(path))
    assert loaded == built | {"embed_tokens", "layers", "norm", "vision_model"}


@pytest.mark.torch
@pytest.mark.slow
def test_sft_on_messages_with_images_trains(tmp_path):
    """The batch carries pixel_values [rows, 1, 3, 28, 28] (every image resized to the tower's image_size) and
    image_attention_mask [rows, tokens, 1]; the row is BOS, the template's <image>, the words, then the
    <fake><image><fake> IdeficsProcessor appends after the text. Full fine-tuning from the model path trains every
    part."""
    proc = _processor()
    ids = {t: proc.tokenizer.convert_tokens_to_ids(t) for t in (IMAGE, FAKE, BOS)}
    rows = 2
    trainer = _sft(tmp_path, {"images": _images(rows), "messages": [_user() + _assistant()] * rows}, rows)
    batch = next(iter(trainer.get_train_dataloader()))
    assert tuple(batch["pixel_values"].shape) == (rows, 1, 3, TILE, TILE)
    assert tuple(batch["image_attention_mask"].shape) == (*batch["input_ids"].shape, 1)
    row = batch["input_ids"][0].tolist()
    assert row[:2] == [ids[BOS], ids[IMAGE]] and row[-3:] == [ids[FAKE], ids[IMAGE], ids[FAKE]]
    assert "layers" in _parts(trainer.model) and "vision_model" in _parts(trainer.model)
    assert trainer.train().training_loss > 0


@pytest.mark.torch
@pytest.mark.slow
def test_sft_with_lora_and_checkpointing_trains(tmp_path):
    from peft import LoraConfig

    rows = 2
    trainer = _sft(tmp_path, {"images": _images(rows), "messages": [_user() + _assistant()] * rows}, rows,
                   args={"gradient_checkpointing": True}, peft_config=LoraConfig(r=4, target_modules="all-linear"))
    adapted = {n.split(".lora_A")[0] for n, p in trainer.model.named_parameters() if ".lora_A" in n}
    assert any(".gated_cross_attn_layers.0.cross_attn.k_proj" in a for a in adapted)
    assert any(".vision_model.encoder.layers.0.mlp.fc1" in a for a in adapted)
    assert trainer.train().training_loss > 0


def _raises(trainer) -> str:
    with pytest.raises(RuntimeError) as err:
        trainer.train()
    return str(err.value)


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("rows", [1, 2])
def test_prompt_completion_sft_raises(tmp_path, rows):
    """One row: the prompt's image_attention_mask (15 tokens) beside input_ids of 18; two rows: the completions,
    processed without images, come back as one row."""
    data = {"images": _images(rows), "prompt": [_user()] * rows, "completion": [_assistant()] * rows}
    message = _raises(_sft(tmp_path, data, rows))
    assert ("must match the size of tensor b" in message) if rows == 1 else ("Sizes of tensors must match" in message)


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("rows", [1, 2])
def test_dpo_with_images_raises(tmp_path, rows):
    """LoRA all-linear (no reference copy): with one row the first gated cross-attention layer's SDPA raises on the
    prompt-length mask (through TRL's fused head, trl/trainer/utils.py _fused_forward); with two, the vision
    preference collator's torch.cat of the prompts and the one joined completion row raises."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer

    proc = _processor()
    data = {"images": _images(rows), "prompt": [_user()] * rows, "chosen": [_assistant()] * rows,
            "rejected": [_assistant()[:1]] * rows}
    args = DPOConfig(output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=rows, max_length=64,
                     bf16=False, report_to=[], save_strategy="no", use_cpu=True)
    trainer = DPOTrainer(model=_model(proc, tmp_path), args=args, train_dataset=Dataset.from_dict(data),
                         processing_class=proc, peft_config=LoraConfig(r=4, target_modules="all-linear"))
    message = _raises(trainer)
    assert ("must match the size of tensor b" in message) if rows == 1 else ("Sizes of tensors must match" in message)
