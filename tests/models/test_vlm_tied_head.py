"""Whether a vision-language model's lm_head is its input embedding's weight, as transformers 5.24 builds the real
class on the meta device: the composite config's tie_word_embeddings decides (its class default when config.json names
none at the top), whatever text_config names — except that llava's, LLaVA-OneVision's, LLaVA-NeXT-Video's and the
Qwen2-VL family's configs forward a true text_config flag to a false outer one, and Mllama never ties. Every covered
type, every combination a config.json can write, against the real class."""

from __future__ import annotations

import copy
import glob
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from hpcmem.models import resolve_model  # noqa: E402
from hpcmem.models.vision import VISION_LANGUAGE, text_part  # noqa: E402
from hpcmem.models.vlm_learned import learned_text  # noqa: E402

pytestmark = pytest.mark.torch
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"


def _first_fixture_per_type() -> dict[str, dict]:
    out: dict[str, dict] = {}
    for path in sorted(glob.glob(str(FIXTURES / "*.json"))):
        cfg = json.loads(Path(path).read_text())
        if cfg.get("model_type") in VISION_LANGUAGE:
            out.setdefault(cfg["model_type"], cfg)
    return out


FIXTURE = _first_fixture_per_type()
CASES = [(t, inner, outer) for t in sorted(FIXTURE) for inner in (None, False, True) for outer in (None, False, True)
         if inner is None or "text_config" in FIXTURE[t]]


def _real_ties(cfg: dict) -> bool:
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(AutoConfig.for_model(**cfg))
    return model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_every_covered_type_has_a_fixture():
    assert set(FIXTURE) == set(VISION_LANGUAGE)


@pytest.mark.parametrize(("model_type", "inner", "outer"), CASES)
def test_the_head_is_tied_as_the_real_class_ties_it(model_type, inner, outer, tmp_path):
    cfg = copy.deepcopy(FIXTURE[model_type])
    cfg.pop("tie_word_embeddings", None)
    text = cfg.get("text_config")
    if isinstance(text, dict):
        text.pop("tie_word_embeddings", None)
        if inner is not None:
            text["tie_word_embeddings"] = inner
    if outer is not None:
        cfg["tie_word_embeddings"] = outer
    if learned_text(cfg):
        # a learned text part (hpcmem.models.vlm_learned) is learned on text_part's config, the tie decided there:
        # each variant is another text config, whose profile the fixture's is not
        assert text_part(cfg)["tie_word_embeddings"] is _real_ties(cfg), (model_type, inner, outer)
        return
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert resolve_model(str(path)).tie_word_embeddings is _real_ties(cfg), (model_type, inner, outer)
