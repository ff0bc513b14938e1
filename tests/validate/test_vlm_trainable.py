"""Image-text types TRL cannot train, held to the real trainer: TRL 1.16's SFTTrainer, one CPU step on a tiny model
of each type (its config class's defaults, widths shrunk) with text rows — or, where the type's forward needs image
inputs before TRL's fused LM head is reached, that head's call given them — raises where hpcmem's reason says, and a
type it trains runs. The stored sweep (estimator/vlm-trainable.jsonl) says what a fresh run says."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from hpcmem.models.coverage import vision_language_rows  # noqa: E402
from hpcmem.models.coverage_vlm import TRL_REFUSES, TRL_REFUSES_TEXT_DECODER  # noqa: E402
from hpcmem.validate.vlm_trainable import load_records, outcome, run_type  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

# where each raise happens and what it says, read off the TRL and transformers sources by hand: the fused LM head
# (trl/trainer/utils.py add_fused_lm_head._fused_forward) reads `last_hidden_state` off a backbone that is the model
# itself (base_model_prefix ''), slices one decoder position to nothing (Florence-2), calls a decoder without its
# inputs (T5Gemma 2) or Llama-4's own forward; SFTTrainer.__init__ sets generation_config's pad token (PI0)
RAISES = {
    "kosmos-2.5": ("trl/utils.py:_fused_forward", "AttributeError", "last_hidden_state"),
    "nemotron_h_omni": ("trl/utils.py:_fused_forward", "AttributeError", "last_hidden_state"),
    "florence2": ("trl/utils.py:", "RuntimeError", "is invalid for input of size 0"),
    "t5gemma2": ("trl/utils.py:_fused_forward > modeling_t5gemma2.py:forward", "ValueError",
                 "exactly one of input_ids or inputs_embeds"),
    "pi0": ("trl/sft_trainer.py:__init__", "AttributeError", "generation_config"),
    # the decoder's states cover a random canvas of canvas_length (256 by default) positions, the labels the row's 32
    "diffusion_gemma": ("trl/chunked_logprob.py:_forward_tile", "RuntimeError",
                        "The size of tensor a (31) must match the size of tensor b (255)"),
    "llama4": ("trl/utils.py:_fused_forward", "AttributeError", "object has no attribute"),
    # given image inputs (hpcmem.validate.vlm_image_call: their forwards need them to reach TRL's head)
    "blip": ("trl/utils.py:_fused_forward", "AttributeError", "'NoneType' object has no attribute 'weight'"),
    "blip-2": ("trl/utils.py:_fused_forward", "AttributeError", "last_hidden_state"),
    "instructblip": ("trl/utils.py:_fused_forward", "AttributeError", "last_hidden_state"),
    "instructblipvideo": ("trl/utils.py:_fused_forward", "AttributeError", "last_hidden_state"),
    "kosmos-2": ("trl/utils.py:_fused_forward", "AttributeError", "last_hidden_state"),
    "pix2struct": ("trl/utils.py:_fused_forward > modeling_pix2struct.py:forward", "ValueError", "decoder_input_ids"),
    "udop": ("trl/utils.py:_fused_forward > modeling_udop.py:forward", "ValueError", "decoder_input_ids"),
    "vision-encoder-decoder": ("trl/utils.py:_fused_forward > modeling_bert.py:forward", "ValueError",
                               "exactly one of input_ids or inputs_embeds"),
    # given image rows through its own processor (hpcmem.validate.vlm_image_rows: its forward runs under TRL's head
    # given input ids and pixel values, the processor gives no input ids): the conversational rows
    "pp_formulanet": ("trl/sft_trainer.py:_collate_language_modeling", "KeyError", "input_ids"),
}


def test_every_named_refusal_has_its_raise_here():
    assert set(RAISES) == set(TRL_REFUSES) | set(TRL_REFUSES_TEXT_DECODER)


@pytest.fixture(scope="module")
def fresh() -> dict[str, dict]:
    return {t: run_type(t) for t in [*RAISES, "aria", "llava"]}


@pytest.mark.parametrize("model_type", sorted(RAISES))
def test_the_real_trainer_raises_where_the_reason_says(fresh, model_type):
    rec = fresh[model_type]
    where, exc, text = RAISES[model_type]
    assert rec["built"] and rec["ran"] is False, rec
    rec = rec.get("image_call") or rec            # where the text rows stop before TRL's head: with image inputs
    rec = (fresh[model_type].get("image_rows") or {}).get("messages") or rec   # where that ran: TRL's image rows
    assert rec["ran"] is False, rec
    assert rec["raised_in"].startswith(where) and rec["reason"].startswith(exc + ":") and text in rec["reason"], rec
    if model_type in TRL_REFUSES:                     # hpcmem's reason names the exception the trainer raised
        assert exc in TRL_REFUSES[model_type], TRL_REFUSES[model_type]


def test_a_type_trl_trains_runs(fresh):
    """Aria (not estimated with images) and LLaVA (estimated, its traces ran TRL with images) take the step."""
    assert fresh["aria"]["ran"] is True and fresh["llava"]["ran"] is True, (fresh["aria"], fresh["llava"])


def test_the_stored_sweep_says_what_a_fresh_run_says(fresh):
    stored = {r["model_type"]: r for r in load_records() if r["trainer"] == "sft"}
    for t in RAISES:
        assert outcome(stored[t]) == outcome(fresh[t]) and stored[t]["raised_in"] == fresh[t]["raised_in"], t
        assert (stored[t].get("image_call") or {}).get("raised_in") == (fresh[t].get("image_call") or {}).get(
            "raised_in"), t
        stored_rows, fresh_rows = stored[t].get("image_rows") or {}, fresh[t].get("image_rows") or {}
        assert {k: r.get("raised_in") for k, r in stored_rows.items()} == \
            {k: r.get("raised_in") for k, r in fresh_rows.items()}, t
    assert outcome(stored["aria"]) == "ran"


def test_pp_formulanets_forward_runs_under_trls_head_and_every_row_kind_raises_in_trls_collators(fresh):
    """PP-FormulaNet: TRL's head given input ids and pixel values runs (its decoder takes the right-shifted ids,
    modeling_pp_formulanet.py PPFormulaNetModel.forward), and each kind of image row raises in TRL's collators, which
    read the input ids PPFormulaNetProcessor.__call__ (images only) never returns: read off trl/trainer/sft_trainer.py
    and dpo_trainer.py by hand."""
    rec = fresh["pp_formulanet"]
    assert rec["image_call"]["ran"] is True, rec["image_call"]
    rows = rec["image_rows"]
    assert rows["messages"]["reason"] == "KeyError: 'input_ids'", rows
    assert rows["prompt_completion"]["raised_in"] == "trl/sft_trainer.py:_collate_prompt_completion", rows
    assert rows["preference"]["raised_in"] == "trl/dpo_trainer.py:torch_call", rows
    for kind in ("prompt_completion", "preference"):
        assert rows[kind]["reason"].startswith("TypeError: PPFormulaNetProcessor.__call__() missing 1 required "
                                               "positional argument: 'images'"), rows


def test_the_coverage_rows_say_trl_cannot_train_them():
    rows = {r["model_type"]: r for r in vision_language_rows()}
    for t in TRL_REFUSES:
        assert rows[t]["status"] == "refused" and rows[t]["reason"].startswith("TRL cannot train it: "), rows[t]


def test_a_run_that_raises_leaves_autocast_as_it_was(fresh):
    """BLIP, Kosmos-2.5 and Llama 4 re-enter their own autocast-wrapped forward through TRL's head and raise: the
    torch.autocast instance accelerate wraps the forward in then left CPU autocast on for the rest of the process
    (every later trace in a test worker ran under bf16 autocast), until hpcmem.validate.trl_run `kept_autocast`."""
    import torch

    assert {fresh[t]["ran"] for t in ("blip", "kosmos-2.5", "llama4")} == {False}
    assert not torch.is_autocast_enabled("cpu")
