"""Where a learned profile is held, without torch: a phase's highest instant as an envelope of instants solved one by
one (the hand-written instants below), the profile format that carries it, and the warning an estimate outside the
held range carries (an older-format profile included)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from hpcmem.estimate import estimate
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.spec import TrainSpec
from hpcmem.models.profile import Envelope, Poly, profile_from_dict, profile_to_dict, spec_from_profile
from hpcmem.models.profile import fit_poly
from hpcmem.trace.learn import envelope

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "learned-profile-tiny.json"
SEQS, ROWS = (512, 2048, 8192), 2


# Three instants of one phase, as a trace would read them at each length (T = rows·seq tokens, Q = rows·seq²):
#   a: 4 MB of weight gradient + 4 B per token      b: 64 B per token + a bf16 mask, 2 B·Q      c: 1 B per token
# (c is always below b: never the highest). The highest is a at 512 tokens, b from ~2,000 on.
def _instants(seq: int) -> list[int]:
    t, q = ROWS * seq, ROWS * seq * seq
    return [4_000_000 + 4 * t, 64 * t + 2 * q, t]


def _highest(seq: int) -> int:
    return max(_instants(seq))


def test_envelope_of_instants_holds_past_the_learned_lengths():
    env = envelope([_instants(s) for s in SEQS], SEQS)
    assert len(env.pieces) == 2                                  # c never leads: dropped
    for seq in (256, 1024, 8192, 32768, 131072):
        assert env.at(ROWS * seq, ROWS * seq * seq) == _highest(seq)
    # one polynomial through the highest instant of the three lengths bends where a and b cross
    poly = fit_poly([_highest(s) for s in SEQS], SEQS, ROWS)
    at = 32768
    assert abs(poly.at(ROWS * at, ROWS * at * at) - _highest(at)) > 0.01 * _highest(at)


def test_envelope_arithmetic_is_instant_by_instant_when_the_instants_line_up():
    a = Envelope((Poly(10, 1, 0), Poly(0, 2, 0)))
    b = Envelope((Poly(1, 0, 0), Poly(2, 0, 0)))
    assert (a + b).pieces == (Poly(11, 1, 0), Poly(2, 2, 0))
    assert (a - Poly(1, 1, 0)).pieces == (Poly(9, 0, 0), Poly(-1, 1, 0))


def test_format_3_round_trips_envelopes_and_the_held_field():
    doc = json.loads(FIXTURE.read_text())
    old = profile_from_dict(doc)
    cell = old.cells["w2a2/full/gc"]
    env = Envelope((Poly(1.0, 2.0, 0.0), Poly(3.0, 0.5, 0.25)))
    held = {"max_length": 32768, "techniques": {"full gc": 32768}, "rows": 2, "within_pct": 3.0}
    new = replace(old, cells={"w2a2/full/gc": replace(cell, peak=(env,) * len(cell.peak), head_with_loss=True)},
                  provenance={**old.provenance, "held": held})
    back = profile_from_dict(json.loads(json.dumps(profile_to_dict(new))))
    assert back.cells["w2a2/full/gc"].peak[0] == env and back.cells["w2a2/full/gc"].head_with_loss
    assert back.held == held


def _job(profile, seq: int, **train) -> JobSpec:
    return JobSpec(model=spec_from_profile(profile, "tiny"), train=TrainSpec(
        trainer="sft", dtype="bfloat16", max_length=seq, per_device_train_batch_size=2, **train))


def _held_warnings(profile, seq: int, **train) -> list[str]:
    return [w for w in estimate(_job(profile, seq, **train)).warnings if "held" in w]


def test_format_2_loads_held_at_the_length_validate_coverage_checked():
    old = profile_from_dict(json.loads(FIXTURE.read_text()))
    assert old.held["max_length"] == 1024
    assert _held_warnings(old, 1024) == []
    (warning,) = _held_warnings(old, 4096)
    assert "format 2" in warning and "≤ 1,024 tokens per row" in warning and "4,096" in warning
    (dora,) = _held_warnings(old, 1024, use_peft=True, use_dora=True, lora_target_modules=("all-linear",))
    assert "DoRA was not traced" in dora


def test_estimate_outside_the_held_range_says_so():
    doc = json.loads(FIXTURE.read_text())
    doc["format"] = "hpcmem-learned-profile/3"
    doc["provenance"]["held"] = {"max_length": 2048, "techniques": {"full gc": 4096, "full no gc": 2048},
                                 "rows": 2, "within_pct": 3.0}
    p = profile_from_dict(doc)
    assert _held_warnings(p, 4096, gradient_checkpointing=True) == []
    (longer,) = _held_warnings(p, 8192, gradient_checkpointing=True)
    assert "8,192 tokens" in longer and "full gc 4,096" in longer
    (other,) = _held_warnings(p, 1024, use_peft=True, lora_target_modules=("all-linear",), gradient_checkpointing=False)
    assert "lora no gc" in other and "not held" in other
    no_dropout = _held_warnings(p, 1024, use_peft=True, lora_target_modules=("all-linear",),
                                gradient_checkpointing=True, lora_dropout=0.0)
    assert any("no LoRA dropout" in w and "not held" in w for w in no_dropout)
    doc["provenance"]["held"] = {"max_length": 0, "techniques": {}, "rows": 2, "learned_to": 8192}
    (unchecked,) = _held_warnings(profile_from_dict(doc), 1024)
    assert "not held" in unchecked


def test_the_held_column_reads_each_sweep_profile():
    from hpcmem.datapath import estimator_dir
    from hpcmem.models.coverage import held_label

    folder = estimator_dir() / "coverage-profiles"
    doc = json.loads((folder / "smollm3.json").read_text())
    lengths = set(doc["provenance"]["held"]["techniques"].values())
    assert doc["format"] == "hpcmem-learned-profile/3" and held_label("smollm3").startswith(f"≤ {max(lengths):,}: ")
    assert json.loads((folder / "qwen4_exp.json").read_text())["format"] == "hpcmem-learned-profile/2"
    assert held_label("qwen4_exp") == "≤ 1,024 (format 2)"
    assert held_label("llama") == ""                       # derived: no profile


def test_rows_outside_the_rows_check_are_not_held():
    doc = json.loads(FIXTURE.read_text())
    doc["format"] = "hpcmem-learned-profile/3"
    doc["provenance"]["held"] = {"max_length": 8192, "techniques": {"full gc": 8192}, "rows": 2, "within_pct": 3.0,
                                 "rows_held": [2, 4]}
    p = profile_from_dict(doc)

    def rows_warnings(rows: int) -> list[str]:
        job = JobSpec(model=spec_from_profile(p, "tiny"), train=TrainSpec(
            trainer="sft", dtype="bfloat16", max_length=2048, per_device_train_batch_size=rows))
        return [w for w in estimate(job).warnings if "per micro-batch" in w]

    assert rows_warnings(2) == [] and rows_warnings(4) == []
    (one,) = rows_warnings(1)
    assert "held at 2–4 rows" in one and "1 rows" in one and "not held" in one
    assert rows_warnings(8) != []
    del doc["provenance"]["held"]["rows_held"]          # no rows check ran: the estimate is as before
    p = profile_from_dict(doc)
    assert rows_warnings(1) == []


def test_the_glm_moe_dsa_sweep_profile_is_held_at_one_row_by_its_one_row_cells():
    """Its rows check (a two-step trace at 1, 4, 8 and 16 rows × 32,768 tokens against the profile's estimate) missed
    at one row both ways — the padded rows' rows·seq² terms dropped and kept —, so the learner traced each cell on one
    row (hpcmem/trace/learn.py `one_row_cells`) and checked them at one unpadded row and at one packed row."""
    from hpcmem.datapath import estimator_dir
    from hpcmem.models.coverage import held_label

    held = json.loads((estimator_dir() / "coverage-profiles" / "glm_moe_dsa.json").read_text())["provenance"]["held"]
    (errors,) = held["rows_err_pct"].values()
    assert errors["1"] < -3.0 and errors["1 with rows·seq²"] > 3.0
    assert all(abs(errors[rows]) <= 3.0 for rows in ("4", "8", "16")), errors
    assert abs(errors["1 with one-row cells"]) <= 3.0 and abs(errors["1 packed with one-row cells"]) <= 3.0
    assert held["rows_held"] == [1, 16] and held["one_row_packed"] is True
    assert held_label("glm_moe_dsa").endswith("; 1–16 rows")
    assert held_label("smollm3").endswith("; 2 rows (rows not checked)") or "rows_held" in json.loads(
        (estimator_dir() / "coverage-profiles" / "smollm3.json").read_text())["provenance"]["held"]


def test_a_profile_traced_with_dropout_on_is_not_held_where_trl_turns_it_off():
    doc = json.loads(FIXTURE.read_text())
    doc["format"] = "hpcmem-learned-profile/3"
    doc["provenance"]["held"] = {"max_length": 8192, "techniques": {"full gc": 8192}, "rows": 2, "within_pct": 3.0}
    doc["provenance"]["dropout"] = True

    def dropout_warnings(p, trainer: str, **train) -> list[str]:
        job = JobSpec(model=spec_from_profile(p, "tiny"), train=TrainSpec(
            trainer=trainer, dtype="bfloat16", max_length=1024, per_device_train_batch_size=2, **train))
        return [w for w in estimate(job).warnings if "model's dropout" in w]

    p = profile_from_dict(doc)
    assert dropout_warnings(p, "sft") == []                      # SFTTrainer keeps the dropout, as the profile's
    (kto,) = dropout_warnings(p, "kto", disable_dropout=True)     # KTOConfig's default
    assert "not held" in kto
    doc["provenance"]["dropout"] = False
    assert dropout_warnings(profile_from_dict(doc), "kto", disable_dropout=True) == []
