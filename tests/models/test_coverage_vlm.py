"""Vision-language types: every image-text-to-text type of the installed transformers is listed by `hpcmem models
coverage` with a status, the shipped table is that mapping, and a type transformers builds only as image-text-to-text
is refused — by `estimate` and by `models learn` — in one line that says images are not modelled, never sent to
`models learn` (whose text-only profile would leave the vision tower out)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcmem.models.coverage import installed_mapping, mapping_from_source, vision_language_rows
from hpcmem.models.coverage_vlm import IMAGE_TEXT_MAPPING_NAME, vision_language_types

ROOT = Path(__file__).resolve().parents[2]


def _hpcmem(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcmem", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})


@pytest.mark.torch
def test_the_table_is_the_installed_image_text_mapping():
    transformers = pytest.importorskip("transformers")
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    assert installed_mapping(IMAGE_TEXT_MAPPING_NAME) == dict(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)
    assert vision_language_types() == dict(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES), \
        f"regenerate hpcmem/models/coverage_vlm.json from transformers {transformers.__version__}"


def test_the_image_text_mapping_is_read_by_name():
    text = ('MODEL_FOR_CAUSAL_LM_MAPPING_NAMES = OrderedDict([("a", "A")])\n'
            'MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES = OrderedDict([("v", "VForConditionalGeneration")])\n')
    assert mapping_from_source(text, IMAGE_TEXT_MAPPING_NAME) == {"v": "VForConditionalGeneration"}
    assert mapping_from_source(text) == {"a": "A"}


def test_coverage_lists_every_image_text_type_with_a_status():
    out = _hpcmem("models", "coverage", "--json")
    assert out.returncode == 0, out.stderr
    rows = [r for r in json.loads(out.stdout) if r["task"] == "image-text-to-text"]
    assert {r["model_type"] for r in rows} == set(installed_mapping(IMAGE_TEXT_MAPPING_NAME) or vision_language_types())
    by_type = {r["model_type"]: r for r in rows}
    for name in ("perception_lm",):      # VLMs users fine-tune
        assert by_type[name]["status"] == "refused" and "not modelled" in by_type[name]["reason"], name
    # a learned text part (hpcmem.models.vlm_learned): SFT and DPO traced, GRPO/RLOO refused
    for name in ("aya_vision", "cohere2_vision", "gemma4", "gemma4_unified", "lfm2_vl", "fuyu", "chameleon",
                 "emu3"):
        assert by_type[name]["status"] == "derived" and "traced: SFT, DPO)" in by_type[name]["reason"] \
            and "GRPO/RLOO with images refused" in by_type[name]["reason"], name
    # GLM-4.1V on the glm4 layout, and glm46v / glmga, which build its classes: SFT and DPO traced (their own files)
    for name in ("glm4v", "glm46v", "glmga", "llava", "qwen3_vl_moe"):
        assert by_type[name]["status"] == "derived" and "traced: SFT, DPO)" in by_type[name]["reason"] \
            and "GRPO/RLOO with images refused" in by_type[name]["reason"], name
    # GRPO and RLOO with images traced on two learned-text types (vlm-qwen3-5-grpo.yaml, vlm-qwen3-5-rloo.yaml,
    # vlm-exaone4-5-grpo.yaml, vlm-exaone4-5-rloo.yaml)
    for name in ("qwen3_5", "exaone4_5"):
        assert by_type[name]["status"] == "derived" and "traced: SFT, DPO, GRPO, RLOO)" in by_type[name]["reason"] \
            and "refused" not in by_type[name]["reason"], name
    # DPO traced and refused on its measured result (hpcmem.job.image_rules TRAINER_FAILS): Idefics3, Mllama
    for name in ("idefics3", "mllama"):
        assert "traced: SFT)" in by_type[name]["reason"], name
    # glm4v's tower over GLM-4.5's MoE decoder (learned as glm4_moe), GLM-OCR (glm4v's classes), Cohere Compass
    # (Qwen3-VL's tower over a learned decoder): SFT and DPO traced
    for name in ("glm4v_moe", "glm_ocr", "cohere_compass"):
        assert by_type[name]["status"] == "derived" and "traced: SFT, DPO)" in by_type[name]["reason"], name
    # Qwen3-VL's tower on a learned hybrid text part (Gated DeltaNet and full attention): SFT and DPO traced
    for name in ("qwen3_5_moe", "qwen4_exp"):
        assert by_type[name]["status"] == "derived" and "traced: SFT, DPO)" in by_type[name]["reason"] \
            and "GRPO/RLOO with images refused" in by_type[name]["reason"], name
    assert by_type["qwen2_5_vl"]["status"] == "derived" and "with images" in by_type["qwen2_5_vl"]["reason"]
    assert all(by_type[name]["status"] == "derived" for name in ("qwen2_vl", "qwen3_vl", "gemma3", "llava",
                                                                 "llava_next", "llava_onevision", "llava_next_video",
                                                                 "mistral3", "vipllava", "video_llava"))
    # what each type's case matrices traced (estimator/cases/vlm-*.yaml), and what is refused
    assert "traced: SFT, DPO, GRPO, RLOO)" in by_type["qwen2_5_vl"]["reason"]
    assert all("traced: SFT, DPO, GRPO, RLOO)" in by_type[name]["reason"] and "not traced" not in
               by_type[name]["reason"] for name in ("qwen2_vl", "qwen3_vl"))
    assert "traced: SFT, DPO, GRPO, RLOO)" in by_type["gemma3"]["reason"] and "refused" not in \
        by_type["gemma3"]["reason"]
    assert "traced: SFT, DPO)" in by_type["llava_next"]["reason"] and "GRPO/RLOO with images refused" in \
        by_type["llava_next"]["reason"]
    assert all("traced: SFT, DPO)" in by_type[name]["reason"] and "GRPO/RLOO with images refused" in
               by_type[name]["reason"] for name in ("llava_onevision", "llava_next_video", "mistral3", "vipllava",
                                                    "video_llava"))
    assert "traced: SFT, DPO)" in by_type["smolvlm"]["reason"] and "GRPO/RLOO with images refused" in \
        by_type["smolvlm"]["reason"]
    assert "traced: SFT)" in by_type["idefics3"]["reason"] and "DPO/GRPO/RLOO with images refused" in \
        by_type["idefics3"]["reason"]
    assert by_type["mllama"]["status"] == "derived" and "traced: SFT)" in by_type["mllama"]["reason"] and \
        "DPO/GRPO/RLOO with images refused" in by_type["mllama"]["reason"]
    assert by_type["internvl"]["status"] == "derived" and "traced: SFT, DPO)" in by_type["internvl"]["reason"] and \
        "GRPO/RLOO with images refused" in by_type["internvl"]["reason"]
    assert by_type["lighton_ocr"]["status"] == "derived" and "traced: SFT, DPO)" in by_type["lighton_ocr"]["reason"] \
        and "GRPO/RLOO with images refused" in by_type["lighton_ocr"]["reason"]
    assert by_type["deepseek_vl"]["status"] == "derived" and "traced: SFT, DPO)" in by_type["deepseek_vl"]["reason"] \
        and "GRPO/RLOO with images refused" in by_type["deepseek_vl"]["reason"]
    hybrid = by_type["deepseek_vl_hybrid"]
    assert hybrid["status"] == "derived" and "traced: SFT, DPO)" in hybrid["reason"] \
        and "GRPO/RLOO with images refused" in hybrid["reason"]
    assert by_type["janus"]["status"] == "derived" and "traced: SFT, DPO)" in by_type["janus"]["reason"] \
        and "GRPO/RLOO with images refused" in by_type["janus"]["reason"]
    assert by_type["ovis2"]["status"] == "derived" and "traced: SFT, DPO)" in by_type["ovis2"]["reason"] \
        and "GRPO/RLOO with images refused" in by_type["ovis2"]["reason"]
    assert by_type["idefics2"]["status"] == "derived" and "traced: SFT, DPO)" in by_type["idefics2"]["reason"] and \
        "GRPO/RLOO with images refused" in by_type["idefics2"]["reason"]
    assert by_type["qianfan_ocr"]["status"] == "derived" and "traced: SFT, DPO)" in by_type["qianfan_ocr"]["reason"] \
        and "GRPO/RLOO with images refused" in by_type["qianfan_ocr"]["reason"]
    assert by_type["hyperclovax_vision_v2"]["status"] == "derived" and \
        "traced: SFT, DPO)" in by_type["hyperclovax_vision_v2"]["reason"] and \
        "GRPO/RLOO with images refused" in by_type["hyperclovax_vision_v2"]["reason"]
    assert by_type["granite_docling"]["status"] == "derived" and \
        "traced: SFT, DPO)" in by_type["granite_docling"]["reason"] and \
        "GRPO/RLOO with images refused" in by_type["granite_docling"]["reason"]
    assert by_type["kimi_k25"]["status"] == "derived" and "traced: SFT, DPO)" in by_type["kimi_k25"]["reason"] \
        and "GRPO/RLOO with images refused" in by_type["kimi_k25"]["reason"]
    assert by_type["aria"]["status"] == "derived" and "traced: SFT, DPO)" in by_type["aria"]["reason"] and \
        "GRPO/RLOO with images refused" in by_type["aria"]["reason"]
    assert by_type["minicpmv4_7"]["status"] == "derived" and "traced: SFT, DPO)" in by_type["minicpmv4_7"]["reason"] \
        and "GRPO/RLOO with images refused" in by_type["minicpmv4_7"]["reason"]
    assert by_type["cosmos3_edge"]["status"] == "derived" and \
        "traced: SFT, DPO)" in by_type["cosmos3_edge"]["reason"] and \
        "GRPO/RLOO with images refused" in by_type["cosmos3_edge"]["reason"]
    assert by_type["muse_glimmer"]["status"] == "derived" and \
        "traced: SFT, DPO)" in by_type["muse_glimmer"]["reason"] and \
        "GRPO/RLOO with images refused" in by_type["muse_glimmer"]["reason"]
    assert by_type["muse_spark"]["status"] == "derived" and \
        "traced: SFT, DPO)" in by_type["muse_spark"]["reason"] and \
        "GRPO/RLOO with images refused" in by_type["muse_spark"]["reason"]
    assert by_type["granite4_vision"]["status"] == "derived" and \
        "traced: SFT, DPO)" in by_type["granite4_vision"]["reason"] and \
        "GRPO/RLOO with images refused" in by_type["granite4_vision"]["reason"]
    assert by_type["mistral_large4"]["status"] == "derived" and \
        "traced: SFT, DPO)" in by_type["mistral_large4"]["reason"] and \
        "GRPO/RLOO with images refused" in by_type["mistral_large4"]["reason"]
    assert by_type["deepseek_ocr2"]["status"] == "derived" and \
        "traced: SFT, DPO)" in by_type["deepseek_ocr2"]["reason"] and \
        "GRPO/RLOO with images refused" in by_type["deepseek_ocr2"]["reason"]
    assert by_type["unlimited_ocr"]["status"] == "derived" and \
        "traced: SFT, DPO)" in by_type["unlimited_ocr"]["reason"] and \
        "GRPO/RLOO with images refused" in by_type["unlimited_ocr"]["reason"]
    assert by_type["qwen2_5_omni_thinker"]["status"] == "derived" and \
        "traced: SFT, DPO, GRPO, RLOO)" in by_type["qwen2_5_omni_thinker"]["reason"] and \
        "refused" not in by_type["qwen2_5_omni_thinker"]["reason"]
    assert by_type["molmo2"]["status"] == "derived" and "traced: SFT, DPO)" in by_type["molmo2"]["reason"] and \
        "GRPO/RLOO with images refused" in by_type["molmo2"]["reason"]
    assert by_type["hunyuan_vl"]["status"] == "derived" and \
        "traced: SFT, DPO)" in by_type["hunyuan_vl"]["reason"] and \
        "GRPO/RLOO with images refused" in by_type["hunyuan_vl"]["reason"]
    assert by_type["hy_v4_vl"]["status"] == "derived" and \
        "traced: SFT, DPO)" in by_type["hy_v4_vl"]["reason"] and \
        "GRPO/RLOO with images refused" in by_type["hy_v4_vl"]["reason"]
    assert by_type["step3p7"]["status"] == "derived" and "traced: SFT, DPO)" in by_type["step3p7"]["reason"] and \
        "GRPO/RLOO with images refused" in by_type["step3p7"]["reason"]
    assert by_type["dots3_note"]["status"] == "derived" and "traced: SFT, DPO)" in by_type["dots3_note"]["reason"] \
        and "GRPO/RLOO with images refused" in by_type["dots3_note"]["reason"]
    assert by_type["apertus1p5"]["status"] == "derived" and \
        "traced: SFT, DPO)" in by_type["apertus1p5"]["reason"] and \
        "GRPO/RLOO with images refused" in by_type["apertus1p5"]["reason"]
    assert by_type["inkling2"]["status"] == "derived" and "traced: SFT, DPO)" in by_type["inkling2"]["reason"] and \
        "GRPO/RLOO with images refused" in by_type["inkling2"]["reason"]
    assert by_type["inkling_mm_model"]["status"] == "derived" and \
        "traced: SFT, DPO)" in by_type["inkling_mm_model"]["reason"] and \
        "GRPO/RLOO with images refused" in by_type["inkling_mm_model"]["reason"]
    assert by_type["pp_chart2table"]["status"] == "derived" and \
        "traced: SFT)" in by_type["pp_chart2table"]["reason"] and \
        "DPO/GRPO/RLOO with images refused" in by_type["pp_chart2table"]["reason"]
    assert by_type["ernie4_5_vl_moe"]["status"] == "derived" and \
        "traced: SFT)" in by_type["ernie4_5_vl_moe"]["reason"] and \
        "DPO/GRPO/RLOO with images refused" in by_type["ernie4_5_vl_moe"]["reason"]
    assert by_type["minimax_m3_vl"]["status"] == "derived" and \
        "traced: SFT, DPO)" in by_type["minimax_m3_vl"]["reason"] and \
        "GRPO/RLOO with images refused" in by_type["minimax_m3_vl"]["reason"]
    assert by_type["video_llama_3"]["status"] == "derived" and "traced: SFT)" in by_type["video_llama_3"]["reason"] \
        and "DPO/GRPO/RLOO with images refused" in by_type["video_llama_3"]["reason"]
    omni = by_type["qwen3_omni_moe_thinker"]
    assert omni["status"] == "derived" and "traced: SFT, DPO)" in omni["reason"] \
        and "GRPO/RLOO with images refused" in omni["reason"]
    # refused with TRL's reason: PP-FormulaNet's processor gives TRL's collators no input ids
    # (hpcmem.validate.vlm_image_rows; tests/validate/test_vlm_trainable.py holds the raise)
    assert by_type["pp_formulanet"]["status"] == "refused" and by_type["pp_formulanet"]["reason"].startswith(
        "TRL cannot train it: its processor makes no token ids") and "KeyError" in by_type["pp_formulanet"]["reason"]
    # measured: the stored image traces of the types estimated with images, nothing for the others
    assert all(r["reason"] and (r["measured"] is not None) == (r["status"] == "derived") for r in rows)
    assert len(vision_language_rows()) == len(rows)


@pytest.mark.parametrize("command", [["estimate", "sft", "--model_name_or_path"], ["models", "learn"]])
def test_an_image_text_only_type_is_refused_in_one_line(command, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "perception_lm", "text_config": {}}))
    out = _hpcmem(*command, str(tmp_path), *(["--out", str(tmp_path / "out")] if command[0] == "models" else []))
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "vision-language only" in out.stderr and "PerceptionLM" in out.stderr
    assert not (tmp_path / "out").exists()


def test_the_traced_trainers_are_the_case_matrices():
    """IMAGE_TRAINERS_TRACED is what estimator/cases/vlm-*.yaml hold: every (model type, trainer) a case file traces."""
    import yaml

    from hpcmem.datapath import estimator_dir
    from hpcmem.models.vision import IMAGE_TRAINERS_ALLOWED, IMAGE_TRAINERS_TRACED

    root = Path(__file__).resolve().parents[2]
    seen: dict[str, set[str]] = {}
    for path in sorted((estimator_dir() / "cases").glob("vlm*.yaml")):
        data = yaml.safe_load(path.read_text())
        for case in data["cases"]:
            case = {**data.get("defaults", {}), **case}
            model_type = json.loads((root / case["model_name_or_path"]).read_text())["model_type"]
            seen.setdefault(model_type, set()).add(case["trainer"])
    assert seen == {k: set(v) for k, v in IMAGE_TRAINERS_TRACED.items()}
    assert all(set(IMAGE_TRAINERS_TRACED[k]) <= set(v) for k, v in IMAGE_TRAINERS_ALLOWED.items())


@pytest.mark.torch
def test_the_types_without_image_input_are_those_whose_class_takes_no_images():
    """transformers' own `input_modalities` of each image-text-to-text class: the ones with neither images nor video
    (Evolla: protein sequences; Mistral 4: a text decoder) are listed as not applicable with their reason, every other
    type stays applicable."""
    transformers = pytest.importorskip("transformers")
    from hpcmem.models.coverage import refusal
    from hpcmem.models.coverage_vlm import NO_IMAGE_INPUT

    def takes_pixels(cls_name: str) -> bool:
        modalities = getattr(getattr(transformers, cls_name), "input_modalities", ())
        modalities = (modalities,) if isinstance(modalities, str) else tuple(modalities)
        return "image" in modalities or "video" in modalities

    without = {t for t, cls in vision_language_types().items() if not takes_pixels(cls)}
    assert without == set(NO_IMAGE_INPUT) == {"evolla", "mistral4"}
    rows = {r["model_type"]: r for r in vision_language_rows()}
    assert {t for t, r in rows.items() if r["status"] == "not applicable"} >= without
    assert "no images" in rows["evolla"]["reason"] and "no vision tower" in rows["mistral4"]["reason"]
    assert refusal("evolla").startswith("not applicable: protein-text")
    assert refusal("mistral4") is None          # its text jobs: a learned profile, as for any text decoder


@pytest.mark.torch
def test_the_trace_builds_mistral4_as_trl_does():
    """TRL builds getattr(transformers, config.architectures[0]): Mistral4ForCausalLM, which AutoModelForCausalLM does
    not map; the trace's registration makes it build that class (a tiny config on the meta device)."""
    transformers = pytest.importorskip("transformers")
    import torch

    from hpcmem.trace import text_heads

    cfg = transformers.Mistral4Config(hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                                      n_routed_experts=4, num_experts_per_tok=2, vocab_size=128)
    text_heads.register()
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    assert type(model) is transformers.Mistral4ForCausalLM
