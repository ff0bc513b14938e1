"""GLM-5.3-Flash (glm5_next, Glm5NextForConditionalGeneration) is refused for its text part, in one line that names
both findings: the DSA indexer's boolean pool selection that no trace on fake weights can run (so no learned profile),
and the one setting TRL 1.16 trains the type with (router_aux_loss_coef 0; hpcmem/models/coverage.json "requires" of
glm5_next_text). The slow tests hold both to the real code: TRL's trainer on a tiny model, the trace on the cut."""

from __future__ import annotations

import json
import traceback
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.models.coverage import refusal, required_settings, vision_language_rows
from hpcmem.models.resolve import resolve_model

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "glm5-next-defaults-L4-D2.json"


def test_the_image_text_type_is_refused_in_one_line_naming_the_setting_and_why():
    why = refusal("glm5_next")
    assert why.startswith("refused: vision-language only (image-text-to-text: Glm5NextForConditionalGeneration)")
    assert "\n" not in why
    assert "its text part glm5_next_text is refused" in why and "get_pooled_states" in why
    assert "trains only with router_aux_loss_coef: 0.0" in why and "text_config.num_experts" in why
    with pytest.raises(SpecError) as err:
        resolve_model(str(FIXTURE))
    assert str(err.value).count("\n") == 0 and "router_aux_loss_coef: 0.0" in str(err.value)
    row = next(r for r in vision_language_rows() if r["model_type"] == "glm5_next")
    assert row["status"] == "refused" and row["reason"] == why.removeprefix("refused: ")


def test_the_text_part_is_refused_and_trains_only_without_the_aux_loss():
    assert required_settings("glm5_next_text") == {"router_aux_loss_coef": 0.0}
    assert refusal("glm5_next_text").startswith("refused: DeepSeek Sparse Attention")
    assert required_settings("glm5_next") == {}     # the image-text type's own row: its text part's carries it


def _tiny(layers: int = 4) -> dict:
    """hpcmem.validate.vlm_tiny's shrink of the class defaults with 4 text layers (3 KDA, one DSA; 3 dense MLPs, one
    MoE: Glm5NextTextConfig.__post_init__'s schedules, rebuilt for the cut)."""
    from hpcmem.validate.vlm_tiny import tiny_config

    cfg = tiny_config("glm5_next")
    text = {k: v for k, v in cfg["text_config"].items() if k not in ("layer_types", "mlp_layer_types",
                                                                       "indexer_types")}
    return {**cfg, "text_config": {**text, "num_hidden_layers": layers}}


@pytest.mark.torch
@pytest.mark.slow
def test_trl_trains_the_type_only_with_router_aux_loss_coef_0():
    """TRL 1.16's SFTTrainer on the image-text class (text rows, one CPU step): AttributeError on
    text_config.num_experts at the config's 0.001, and a step at 0."""
    from hpcmem.validate.trl_run import run_trl

    cfg, settings = _tiny(), {"max_length": 32, "per_device_train_batch_size": 1}
    default = run_trl("sft", settings, cfg, steps=1, image_text=True)
    assert default.ran is False and "'Glm5NextTextConfig' object has no attribute 'num_experts'" in default.reason
    assert "_fused_forward" in default.raised_in
    zero = run_trl("sft", {**settings, "router_aux_loss_coef": 0.0}, cfg, steps=1, image_text=True)
    assert zero.ran is True, zero.reason


def _trace(text: dict) -> BaseException | None:
    from hpcmem.models.profile import spec_from_profile
    from hpcmem.trace import run_trace
    from hpcmem.trace.learn import CELLS, learn_job, learning_probe

    probe = learning_probe({"tie_word_embeddings": False, **text}, CELLS)[0]
    try:
        run_trace(learn_job(spec_from_profile(probe, probe.model_type), "bfloat16", "full", False, 512), steps=1)
    except RuntimeError as exc:
        return exc
    return None


@pytest.mark.torch
@pytest.mark.slow
def test_the_trace_stops_in_the_indexer_and_runs_without_it():
    """The text part cut to 4 layers (the fixture's) stops in Glm5NextTextIndexer.get_pooled_states' boolean index;
    the same KDA layers and MoE without the indexed_attention layer trace."""
    text = json.loads(FIXTURE.read_text())["text_config"]
    exc = _trace(text)
    assert exc is not None and "needs values of tensors computed from fake weights" in str(exc)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "modeling_glm5_next" in f.filename]
    assert frames[-1].name == "get_pooled_states" and "keep" in frames[-1].line
    assert _trace({**text, "num_hidden_layers": 2, "layer_types": ["linear_attention"] * 2,
                   "mlp_layer_types": ["dense", "sparse"]}) is None
