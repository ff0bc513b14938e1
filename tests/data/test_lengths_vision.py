"""Image-text length profiles: a tiny dataset of PNG images drawn here, a processor built offline (a WordLevel
tokenizer with the image tokens and a chat template, and the real PaddleOCR-VL image processor: the Qwen2-VL rules,
patch 14, merge 2, buildable without torchvision). Expected counts come from a hand calculation of smart_resize and
of the template, and from TRL's own vision collators run on the same rows."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytestmark = pytest.mark.torch
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import datasets  # noqa: E402

from hpcmem.data.errors import LengthsError, ProcessorUnfit, ProfileError  # noqa: E402
from hpcmem.data.processor import Resolution  # noqa: E402
from hpcmem.data.profile import (SCHEMA, SCHEMA_VISION, check_profile, decode_lengths,  # noqa: E402
                                 tokens_per_micro_batch, vision_per_micro_batch)
from hpcmem.data.profiler import build_profile, profile_dataset  # noqa: E402
from hpcmem.data.render import report  # noqa: E402
from tests.helpers.cli_main import run_main  # noqa: E402
from tests.helpers.grid_processor import CHAT, save_grid_processor, word_tokenizer  # noqa: E402

MIN_PIXELS, MAX_PIXELS = 28 * 28 * 4, 28 * 28 * 64          # 3,136 and 50,176
# (width, height) of the images drawn
SIZES = {"A": (100, 60), "B": (300, 500), "C": (20, 30), "D": (300, 100)}


def hand_resize(height: int, width: int, min_pixels: int, max_pixels: int, factor: int = 28) -> tuple[int, int]:
    """Qwen2-VL's resize rule as its model card states it: each side rounded to a multiple of 28 (patch 14 × merge
    2); if the area passes max_pixels, both sides scaled down by sqrt(area / max_pixels) and floored to 28; if under
    min_pixels, scaled up by sqrt(min_pixels / area) and ceiled to 28."""
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h, w = math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def hand_tokens(name: str, max_pixels: int = MAX_PIXELS) -> int:
    w, h = SIZES[name]
    h2, w2 = hand_resize(h, w, MIN_PIXELS, max_pixels)
    return (h2 // 28) * (w2 // 28)


def hand_patches(name: str, max_pixels: int = MAX_PIXELS) -> int:
    return 4 * hand_tokens(name, max_pixels)       # merge 2: four 14-pixel patches per token; one frame (t = 1)


def test_the_hand_rule_on_the_images_drawn():
    """The arithmetic written out (height × width): A 60×100 → 56×112 (2 × 4 tokens); B 500×300 → 504×308 =
    155,232 px > 50,176, beta = sqrt(150,000 / 50,176) = 1.729 → 280×168 (10 × 6); C 30×20 → 28×28 = 784 px
    < 3,136, beta = sqrt(3,136 / 600) = 2.286 → 84×56 (3 × 2)."""
    assert [hand_tokens(n) for n in "ABC"] == [8, 60, 6]
    assert hand_tokens("B", 28 * 28 * 16) == 15       # max 12,544: beta 3.458 → 140×84 (5 × 3)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("vision")


@pytest.fixture(scope="module")
def proc_dir(tmp):
    return save_grid_processor(str(tmp / "proc"), min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)


@pytest.fixture(scope="module")
def pngs(tmp):
    """Three PNGs with a deterministic gradient, written to files and read back through datasets' Image feature."""
    from PIL import Image

    out = {}
    for name, (w, h) in SIZES.items():
        img = Image.new("RGB", (w, h))
        img.putdata([((x * 7) % 256, (y * 5) % 256, (x + y) % 256) for y in range(h) for x in range(w)])
        out[name] = str(tmp / f"{name}.png")
        img.save(out[name])
    return out


def _save(tmp, name, rows, pngs):
    images = [[pngs[n] for n in row.pop("imgs")] for row in rows]
    ds = datasets.Dataset.from_list(rows).add_column("images", images)
    ds = ds.cast_column("images", datasets.Sequence(datasets.Image()))
    ds.save_to_disk(str(tmp / name))
    return str(tmp / name), ds


def _msg(user, assistant):
    return [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]


# (images, user words, assistant words); text tokens per row by the template: 3 per message + its words + 2 per image
SFT_ROWS = [("A", "w1 w2", "w3"), ("AB", "w1 w2 w5", "w3"), ("C", "w4", "w5 w6 w7"), ("", "w1", "w2 w3")]


@pytest.fixture(scope="module")
def sft(tmp, pngs):
    rows = [{"messages": _msg(u, a), "imgs": list(imgs)} for imgs, u, a in SFT_ROWS]
    return _save(tmp, "sft", rows, pngs)


@pytest.fixture(scope="module")
def sft_profile(sft, proc_dir, tmp):
    return profile_dataset(sft[0], None, processor=proc_dir, per_device_train_batch_size=2,
                           cache_dir=str(tmp / "cache"))


def test_sft_counts_match_the_hand_calculation(sft_profile):
    p, v = sft_profile, sft_profile["vision"]
    assert p["schema"] == SCHEMA_VISION and p["source"]["format"] == "conversational"
    parts = {k: decode_lengths(b) for k, b in v["order"]["parts"].items()}
    image_tokens = [sum(hand_tokens(n) for n in imgs) for imgs, _, _ in SFT_ROWS]
    text = [6 + len(u.split()) + len(a.split()) + 2 * len(imgs) for imgs, u, a in SFT_ROWS]
    assert parts["images"] == [1, 2, 1, 0]
    assert parts["image_tokens"] == image_tokens == [8, 68, 6, 0]
    assert parts["patches"] == [sum(hand_patches(n) for n in imgs) for imgs, _, _ in SFT_ROWS] == [32, 272, 24, 0]
    assert decode_lengths(p["order"]["parts"]["length"]) == [t + i for t, i in zip(text, image_tokens)]
    assert v["stats"]["text_tokens"]["max"] == max(text) and v["stats"]["image_tokens"]["p50"] == 6
    assert (v["min_pixels"], v["max_pixels"], v["patch_size"], v["merge_size"]) == (MIN_PIXELS, MAX_PIXELS, 14, 2)
    # batches of two in order: rows 0+1 then 2+3
    assert v["per_micro_batch"] == {"images": 3, "image_tokens": 76, "patches": 304}
    assert all(set(c["strategies"]) == {"padded"} for c in p["candidates"])
    assert p["recommendation"]["packing"] is False


def test_sft_counts_match_trls_vision_collator(sft, sft_profile, proc_dir):
    """Per row: the collator's input_ids length on the row alone; pixel_values rows = its patches; two rows at once:
    the padded batch is what tokens_per_micro_batch says."""
    from transformers import AutoProcessor
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    ds = sft[1]
    collator = DataCollatorForVisionLanguageModeling(processor=AutoProcessor.from_pretrained(proc_dir))
    lengths = decode_lengths(sft_profile["order"]["parts"]["length"])
    patches = decode_lengths(sft_profile["vision"]["order"]["parts"]["patches"])
    for i in range(len(ds)):
        out = collator([ds[i]])
        assert out["input_ids"].shape[1] == lengths[i]
        assert (out["pixel_values"].shape[0] if "pixel_values" in out else 0) == patches[i]
    worst = max(collator([ds[i], ds[i + 1]])["input_ids"].numel() for i in (0, 2))
    assert tokens_per_micro_batch(sft_profile, max_length=None, per_device_train_batch_size=2, packing=False,
                                  packing_strategy="bfd", padding_free=False, pad_to_multiple_of=None) == worst == 164


def test_a_cut_into_image_tokens_packing_and_padding_free_are_refused(sft_profile):
    ask = {"per_device_train_batch_size": 2, "packing_strategy": "bfd", "pad_to_multiple_of": None}
    with pytest.raises(ProfileError, match="cuts into the image tokens of 1 example"):
        tokens_per_micro_batch(sft_profile, max_length=64, packing=False, padding_free=False, **ask)
    for flags in ({"packing": True, "padding_free": False}, {"packing": False, "padding_free": True}):
        with pytest.raises(ProfileError, match="refused for image-text data"):
            tokens_per_micro_batch(sft_profile, max_length=128, **flags, **ask)
    # row 1's last image token is at position 73 (11 text tokens before the placeholders end: 3 + 2 images' starts …)
    assert tokens_per_micro_batch(sft_profile, max_length=80, packing=False, padding_free=False, **ask) == 160
    cuts = {c["max_length"]: c["image_cut_examples"] for c in sft_profile["candidates"]}
    assert cuts[None] == 0 and all(n == (1 if m < 73 else 0) for m, n in cuts.items() if m is not None)


def test_dpo_counts_match_trls_vision_preference_collator(tmp, pngs, proc_dir):
    """Each example's images run once per row (chosen and rejected): pixel_values holds 2 × its patches."""
    from transformers import AutoProcessor
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    rows = [{"prompt": [{"role": "user", "content": u}], "chosen": [{"role": "assistant", "content": c}],
             "rejected": [{"role": "assistant", "content": r}], "imgs": list(imgs)}
            for imgs, u, c, r in [("A", "w1 w2", "w3 w4", "w5"), ("BC", "w6", "w7", "w8 w9 w10 w11")]]
    path, ds = _save(tmp, "dpo", rows, pngs)
    p = profile_dataset(path, None, processor=proc_dir, trainer="dpo", per_device_train_batch_size=1,
                        cache_dir=str(tmp / "cache"))
    collator = DataCollatorForVisionPreference(processor=AutoProcessor.from_pretrained(proc_dir))
    chosen, rejected = (decode_lengths(p["order"]["parts"][k]) for k in ("chosen", "rejected"))
    patches = decode_lengths(p["vision"]["order"]["parts"]["patches"])
    for i in range(len(ds)):
        out = collator([ds[i]])
        assert out["attention_mask"].sum(dim=1).tolist() == [chosen[i], rejected[i]]
        assert out["pixel_values"].shape[0] == 2 * patches[i]
    assert patches == [hand_patches("A"), hand_patches("B") + hand_patches("C")]
    assert vision_per_micro_batch(p, per_device_train_batch_size=1)["patches"] == 2 * patches[1]
    assert p["vision"]["rows_per_example"] == 2


def test_sft_prompt_completion_with_one_image_column_matches_trls_collator(tmp, pngs, proc_dir):
    """An "image" column (one image each) and prompt/completion chats: the collator processes the prompt (with the
    image) and the completion apart and joins them; each row is their sum, the prompt part the first."""
    from PIL import Image
    from transformers import AutoProcessor
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    rows = [{"prompt": [{"role": "user", "content": u}], "completion": [{"role": "assistant", "content": c}],
             "image": pngs[n]} for n, u, c in [("A", "w1", "w2 w3"), ("B", "w4 w5", "w6")]]
    ds = datasets.Dataset.from_list(rows).cast_column("image", datasets.Image())
    ds.save_to_disk(str(tmp / "sft-pc"))
    p = profile_dataset(str(tmp / "sft-pc"), None, processor=proc_dir, cache_dir=str(tmp / "cache"))
    assert p["source"]["format"] == "conversational_prompt_completion" and p["vision"]["image_column"] == "image"
    collator = DataCollatorForVisionLanguageModeling(processor=AutoProcessor.from_pretrained(proc_dir),
                                                     completion_only_loss=True)
    lengths = decode_lengths(p["order"]["parts"]["length"])
    for i in range(len(ds)):
        example = {k: v for k, v in ds[i].items()}
        assert isinstance(example["image"], Image.Image)
        out = collator([example])
        assert out["attention_mask"].sum().item() == lengths[i]
        assert out["pixel_values"].shape[0] == decode_lengths(p["vision"]["order"]["parts"]["patches"])[i]
    # prompt by hand: the user turn (3 + words + 2 for the image), the generation prompt (2), the image tokens
    assert decode_lengths(p["order"]["parts"]["prompt"]) == [3 + 1 + 2 + 2 + hand_tokens("A"),
                                                            3 + 2 + 2 + 2 + hand_tokens("B")]


def test_grpo_prompts_by_hand(tmp, pngs, proc_dir):
    rows = [{"prompt": [{"role": "user", "content": "w1 w2 w3"}], "imgs": ["B"]}]
    path, _ = _save(tmp, "grpo", rows, pngs)
    p = profile_dataset(path, None, processor=proc_dir, trainer="grpo", cache_dir=str(tmp / "cache"))
    # the user turn (3 + 3 words + 2 for the image) and the generation prompt (2), plus B's image tokens
    assert decode_lengths(p["order"]["parts"]["prompt"]) == [3 + 3 + 2 + 2 + hand_tokens("B")]


def _cli(args, capsys):
    return run_main(args, capsys)


def test_cli_max_pixels_changes_the_counts_as_the_rule_says(sft, proc_dir, capsys):
    code, out, err = _cli(["lengths", sft[0], "--processor", proc_dir, "--max_pixels", str(28 * 28 * 16), "--json"],
                          capsys)
    assert code == 0, err
    v = json.loads(out)["vision"]
    assert v["max_pixels"] == 28 * 28 * 16
    small = [sum(hand_tokens(n, 28 * 28 * 16) for n in imgs) for imgs, _, _ in SFT_ROWS]
    assert decode_lengths(v["order"]["parts"]["image_tokens"]) == small == [8, 23, 6, 0]
    code, out, _ = _cli(["lengths", sft[0], "--processor", proc_dir], capsys)
    assert code == 0 and "images / example" in out and "patches / ex" in out


@pytest.mark.parametrize("args, words", [
    (["--min_pixels", "0"], ["--min_pixels", "1..", "0"]),
    (["--min_pixels", "60000", "--max_pixels", "50000"], ["--min_pixels must be ≤ --max_pixels", "60,000"]),
])
def test_cli_bad_resolution_is_one_line(sft, proc_dir, capsys, args, words):
    code, out, err = _cli(["lengths", sft[0], "--processor", proc_dir, "--json", *args], capsys)
    assert code != 0 and not out
    line = err.strip()
    assert "\n" not in line and all(w in line for w in words), line


def test_images_need_the_processor_and_other_processors_are_refused(sft, tmp, proc_dir, capsys):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlavaProcessor, PreTrainedTokenizerFast
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator(["w1"], trainers.WordLevelTrainer(special_tokens=["[UNK]", "<pad>", "<image>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="<pad>")
    fast.save_pretrained(str(tmp / "tok"))
    LlavaProcessor(image_processor=CLIPImageProcessorPil(), tokenizer=fast, patch_size=14,
                   chat_template=CHAT).save_pretrained(str(tmp / "llava"))
    code, _, err = _cli(["lengths", sft[0], "--processor", str(tmp / "llava"), "--json"], capsys)  # --json: no stages
    assert code != 0 and "LlavaProcessor is not one hpcmem lengths counts" in err and err.count("\n") == 1
    code, _, err = _cli(["lengths", sft[0], "--tokenizer", str(tmp / "tok"), "--json"], capsys)
    assert code != 0 and "'images' column" in err and "--processor" in err and err.count("\n") == 1
    with pytest.raises(LengthsError, match="image-text data is profiled for sft, dpo, grpo"):
        profile_dataset(sft[0], None, processor=proc_dir, trainer="kto")
    with pytest.raises(LengthsError, match="--processor is for image-text data"):
        data = tmp / "text.jsonl"
        data.write_text('{"text": "w1 w2"}\n')
        profile_dataset(str(data), None, processor=proc_dir)


def test_a_text_profile_stays_schema_1_and_a_vision_profile_without_vision_is_refused(sft_profile):
    text = build_profile({"length": [3, 5, 9]}, source={"trainer": "sft", "format": "text"},
                         per_device_train_batch_size=2, pad_to_multiple_of=None)
    assert text["schema"] == SCHEMA and "vision" not in text
    assert "image_cut_examples" not in text["candidates"][0] and "padding_free" in text["candidates"][0]["strategies"]
    check_profile(text)
    with pytest.raises(ProfileError, match="vision"):
        check_profile({**sft_profile, "vision": None})
    with pytest.raises(ProfileError, match="vision"):
        check_profile({**text, "vision": sft_profile["vision"]})


def _torchvision_loads() -> bool:
    try:
        import torchvision.transforms.v2.functional  # noqa: F401
    except Exception:  # noqa: BLE001 - absent, or a wheel that does not load next to this torch
        return False
    return True


@pytest.mark.skipif(not _torchvision_loads(), reason="transformers builds Qwen2.5-VL's processor only with torchvision")
def test_qwen2_5_vl_processor_counts_as_the_hand_rule(sft, tmp):
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    Qwen2_5_VLProcessor(image_processor=Qwen2VLImageProcessor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS),
                        tokenizer=word_tokenizer(), video_processor=Qwen2VLVideoProcessor(), chat_template=CHAT) \
        .save_pretrained(str(tmp / "qwen"))
    p = profile_dataset(sft[0], None, processor=str(tmp / "qwen"), cache_dir=str(tmp / "cache"))
    assert decode_lengths(p["vision"]["order"]["parts"]["image_tokens"]) == [8, 68, 6, 0]
    assert decode_lengths(p["vision"]["order"]["parts"]["patches"]) == [32, 272, 24, 0]


@pytest.mark.skipif(_torchvision_loads(), reason="the refusal is what a machine without torchvision says")
def test_a_qwen_processor_without_torchvision_is_one_line_naming_it(proc_dir, sft, tmp, capsys):
    """Qwen2.5-VL's processor config written by hand (its class and image processor); transformers cannot build its
    video processor without torchvision, and the refusal says to install it."""
    import shutil

    qwen = tmp / "qwen-config"
    shutil.copytree(proc_dir, qwen)
    for name in ("processor_config.json", "tokenizer_config.json"):
        cfg = json.loads((qwen / name).read_text())
        cfg["processor_class"] = "Qwen2_5_VLProcessor"
        if "image_processor" in cfg:
            cfg["image_processor"].update(image_processor_type="Qwen2VLImageProcessor", temporal_patch_size=2)
        (qwen / name).write_text(json.dumps(cfg))
    code, _, err = _cli(["lengths", sft[0], "--processor", str(qwen), "--json"], capsys)
    assert code != 0 and err.count("\n") == 1 and "install torchvision" in err


def hand_tiles(name: str, longest: int = 112, side: int = 56) -> int:
    """Idefics3's tiling as its docs state it: the longest side scaled to size.longest_edge (the other by the aspect
    ratio, made even), both sides rounded up to multiples of the tile side, cut into rows × cols tiles plus one global
    tile — one tile alone when the image fits in one."""
    w, h = SIZES[name]
    if w >= h:
        w2, h2 = longest, int(longest * h / w)
    else:
        w2, h2 = int(longest * w / h), longest
    h2, w2 = h2 + h2 % 2, w2 + w2 % 2
    rows, cols = math.ceil(h2 / side), math.ceil(w2 / side)
    return 1 if rows * cols == 1 else rows * cols + 1


def test_idefics3_tiles_match_the_hand_rule_and_trls_collator(tmp, pngs):
    """A: 100×60 → 112×68 → 2 × 2 tiles + global = 5; D: 300×100 → 112×38 → 1 × 2 + global = 3; 4 tokens per
    tile (image_seq_len), (56 / 14)² = 16 patches per tile (the model config's vision patch_size 14)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoProcessor, Idefics3Config, Idefics3Processor, PreTrainedTokenizerFast
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    specials = ["[UNK]", "<pad>", "<|im_start|>", "<|im_end|>", "<fake_token_around_image>", "<image>",
                "<end_of_utterance>", "<global-img>"] + [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)]
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator([" ".join([f"w{i}" for i in range(20)] + ["user", "assistant"])],
                            trainers.WordLevelTrainer(special_tokens=specials))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="<pad>", eos_token="<|im_end|>")
    chat = CHAT.replace("<|vision_start|><|image_pad|><|vision_end|>", "<image>")
    image_processor = Idefics3ImageProcessorPil(size={"longest_edge": 112}, max_image_size={"longest_edge": 56})
    folder = str(tmp / "idefics3")
    Idefics3Processor(image_processor=image_processor, tokenizer=fast, image_seq_len=4, chat_template=chat) \
        .save_pretrained(folder)
    Idefics3Config(vision_config={"patch_size": 14, "image_size": 56}, scale_factor=2).save_pretrained(folder)
    rows = [{"messages": _msg(u, a), "imgs": list(imgs)} for imgs, u, a in [("A", "w1", "w2"), ("DA", "w3", "w4 w5")]]
    path, ds = _save(tmp, "tiles", rows, pngs)
    p = profile_dataset(path, None, processor=folder, cache_dir=str(tmp / "cache"))
    parts = {k: decode_lengths(b) for k, b in p["vision"]["order"]["parts"].items()}
    assert [hand_tiles(n) for n in "AD"] == [5, 3]
    assert parts["tiles"] == [5, 8] and parts["image_tokens"] == [4 * 5, 4 * 8] and parts["patches"] == [80, 128]
    assert p["vision"]["family"] == "tiles" and p["vision"]["patches_per_tile"] == 16
    assert "tiles / ex" in report(p) and "16 patches per tile" in report(p)
    assert vision_per_micro_batch(p, per_device_train_batch_size=2) == {"images": 3, "image_tokens": 52,
                                                                         "patches": 208, "tiles": 13}
    collator = DataCollatorForVisionLanguageModeling(processor=AutoProcessor.from_pretrained(folder))
    lengths = decode_lengths(p["order"]["parts"]["length"])
    for i in range(len(ds)):
        out = collator([ds[i]])
        assert out["input_ids"].shape[1] == lengths[i] and out["pixel_values"].shape[1] == parts["tiles"][i]
    with pytest.raises(ProcessorUnfit, match="min_pixels / --max_pixels bound the Qwen2-VL family"):
        profile_dataset(path, None, processor=folder, resolution=Resolution(max_pixels=50_000))



def test_the_shipped_profile_is_this_datasets(sft_profile):
    """tests/fixtures/vlm/profile-drawn-sft.json (read by the estimate's tests) is the profile of the dataset drawn
    here: everything but where it came from and when."""
    shipped = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "profile-drawn-sft.json")
                         .read_text())
    assert {k: v for k, v in shipped.items() if k != "source"} == \
        {k: v for k, v in json.loads(json.dumps(sft_profile)).items() if k != "source"}
