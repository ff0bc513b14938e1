"""ShieldGemma 2's and Cosmos3-Omni's parts as hpcmem counts them (Gemma 3's layout and Qwen3-VL's, reused) against
`AutoModelForImageTextToText.from_config` on the meta device: the cut fixtures, the tiny ones and each config class's
own defaults; and the class transformers builds for each type, which is why the parent's layout applies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError

from hpcmem.models.resolve import resolve_model
from tests.helpers.meta_models import meta_image_text_model

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"


def _config(name: str) -> dict:
    if name in ("shieldgemma2", "cosmos3_omni"):        # the config class's own defaults
        return transformers.AutoConfig.for_model(name).to_dict()
    return json.loads((FIXTURES / name).read_text())


def _spec(cfg: dict, tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return resolve_model(str(tmp_path / "config.json"))


def test_transformers_builds_the_parent_types_classes():
    """modeling_auto.py maps shieldgemma2 to Gemma3ForConditionalGeneration; Cosmos3OmniForConditionalGeneration's
    tower and decoder are Qwen3-VL's classes (AutoModel.from_config of qwen3_vl_vision / qwen3_vl_text)."""
    sg2 = meta_image_text_model(_config("shieldgemma2-tiny.json"))
    assert type(sg2).__name__ == "Gemma3ForConditionalGeneration"
    c3o = meta_image_text_model(_config("cosmos3_omni-tiny.json"))
    assert type(c3o).__name__ == "Cosmos3OmniForConditionalGeneration"
    assert (type(c3o.model.visual).__name__, type(c3o.model.language_model).__name__) == \
        ("Qwen3VLVisionModel", "Qwen3VLTextModel")


@pytest.mark.parametrize("name", ["shieldgemma2-4b-width-L2-D4.json", "shieldgemma2-tiny.json", "shieldgemma2"])
def test_shieldgemma2_parts_equal_the_meta_model(name, tmp_path):
    cfg = _config(name)
    model = meta_image_text_model(cfg)
    count = {"tower": 0, "projector": 0, "language": 0}
    for param_name, p in model.named_parameters():
        part = ("tower" if ".vision_tower." in f".{param_name}" else
                "projector" if ".multi_modal_projector." in f".{param_name}" else "language")
        count[part] += p.numel()
    spec = _spec(cfg, tmp_path)
    assert count == {"tower": spec.vision.tower_params, "projector": spec.vision.merger_params,
                     "language": spec.num_params}
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)


@pytest.mark.parametrize("name", ["cosmos3_omni-8b-width-L3-D4.json", "cosmos3_omni-tiny.json", "cosmos3_omni"])
def test_cosmos3_omni_parts_equal_the_meta_model(name, tmp_path):
    cfg = _config(name)
    if name == "cosmos3_omni":
        # the class defaults pair Qwen3VLTextConfig's 4,096-wide text with a 3,584-wide merger: a run of them fails as
        # transformers places the image features (hpcmem.models.resolve `_placeable`); the parts are counted at the
        # text width the merger hands
        with pytest.raises(SpecError, match="out_hidden_size 3584 is not the language model's hidden_size 4096"):
            _spec(cfg, tmp_path)
        cfg["vision_config"]["out_hidden_size"] = cfg["text_config"]["hidden_size"]
    model = meta_image_text_model(cfg)
    count = {"tower": 0, "merger": 0, "deepstack": 0, "language": 0}
    for param_name, p in model.named_parameters():
        part = ("merger" if ".visual.merger." in param_name else
                "deepstack" if ".visual.deepstack_merger_list." in param_name else
                "tower" if ".visual." in param_name else "language")
        count[part] += p.numel()
    spec = _spec(cfg, tmp_path)
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "deepstack": spec.vision.deepstack_params, "language": spec.num_params}
    linear_names = {n.rsplit("visual.", 1)[-1] for n, m in model.named_modules()
                    if isinstance(m, torch.nn.Linear) and ".visual." in f".{n}."}
    ours = {f"blocks.{i}.{x.name}" for x in spec.vision.linears() if x.part == "tower" for i in range(x.count)}
    ours |= {f"merger.{x.name}" for x in spec.vision.linears() if x.part == "merger"}
    ours |= {f"deepstack_merger_list.{i}.{x.name}" for x in spec.vision.linears() if x.part == "deepstack"
             for i in range(x.count)}
    assert linear_names == ours


@pytest.mark.parametrize(("outer", "inner", "tied"), [(None, None, True), (False, None, True), (None, False, False),
                                                      (False, False, False), (True, False, True)])
def test_shieldgemma2_ties_the_head_from_the_text_config(outer, inner, tied, tmp_path):
    """ShieldGemma2Config's tie_word_embeddings defaults to False, and `__post_init__` sets it when the text config's
    flag is true (Gemma3TextConfig's default True); Gemma3Config's own default is True. Expected by hand from
    configuration_shieldgemma2.py, and the meta model agrees."""
    cfg = _config("shieldgemma2-tiny.json")
    if outer is not None:
        cfg["tie_word_embeddings"] = outer
    if inner is not None:
        cfg["text_config"]["tie_word_embeddings"] = inner
    model = meta_image_text_model(cfg)
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) is tied
    assert _spec(cfg, tmp_path).tie_word_embeddings is tied
