"""A random job whose estimate lies outside where its learned profile was held is its own verdict: scored (its errors
kept), counted apart from within / over 3 % and from declined. Which jobs are outside is read here from the profile
files themselves (estimator/coverage-profiles: the row length each technique was checked at and the rows per
micro-batch its rows check held, provenance "held"; a format-2 profile is held at the 2 × 1,024 tokens of
`hpcmem validate coverage`), not from the estimate's warnings."""

from __future__ import annotations

import json

from hpcmem.datapath import estimator_dir
from hpcmem.validate.random_report import cases, table
from hpcmem.validate.random_trace import OUTSIDE_HELD, score

FORMAT2_HELD = 1024


def _held_length(model_type: str, gc: bool) -> int | None:
    """The longest row length the sweep profile of the type holds full fine-tuning at; None: no profile."""
    path = estimator_dir() / "coverage-profiles" / f"{model_type}.json"
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    if doc["format"] != "hpcmem-learned-profile/3":
        return FORMAT2_HELD
    return doc["provenance"]["held"]["techniques"].get(f"full {'gc' if gc else 'no gc'}", 0)


def _rows_held(model_type: str, rows: int) -> bool:
    """Whether the profile's rows check (held "rows_held": [fewest, most]) holds this many rows; True without one."""
    doc = json.loads((estimator_dir() / "coverage-profiles" / f"{model_type}.json").read_text())
    lo, hi = doc["provenance"].get("held", {}).get("rows_held") or (rows, rows)
    return lo <= rows <= hi


def _plain_sft_records() -> list[tuple[dict, int]]:
    """Stored trace records of full fine-tuning SFT on a learned type, rows max_length long (no packing, no
    padding-free: the estimate takes every row that long), checkpointed as the profiles' cells are (not reentrant:
    another range of its own), with the length their profile holds."""
    out = []
    for line in (estimator_dir() / "random" / "trace.jsonl").read_text().splitlines():
        rec = json.loads(line)
        job, s = rec.get("job"), (rec.get("job") or {}).get("settings", {})
        if (not job or "trace" not in rec or job["trainer"] != "sft" or s.get("use_peft") or s.get("packing")
                or s.get("padding_free") or s.get("activation_offloading") or s.get("dtype") != "bfloat16"
                or not s.get("bf16") or (s.get("gradient_checkpointing_kwargs") or {}).get("use_reentrant")):
            continue
        held = _held_length(job["model_type"], s.get("gradient_checkpointing", True))
        if held is not None:
            out.append((rec, held))
    return out


def test_jobs_past_the_held_length_are_counted_apart_with_their_errors():
    recs = _plain_sft_records()
    def past(rec: dict, held: int) -> bool:
        s = rec["job"]["settings"]
        return s["max_length"] > held or not _rows_held(rec["job"]["model_type"], s.get("per_device_train_batch_size", 8))

    inside = [r for r in recs if not past(*r)][:6]
    outside = [r for r in recs if past(*r)][:6]
    assert len(inside) == len(outside) == 6, (len(inside), len(outside))
    scored = []
    for rec, held in inside + outside:
        got = score(rec)
        want_outside = past(rec, held)
        assert (got["verdict"] == OUTSIDE_HELD) == want_outside, (rec["id"], held, got["verdict"], got.get("why"))
        assert "err_pct" in got and "traced" in got, got          # scored all the same
        if want_outside:
            assert got["held_within"] == (max(abs(got["err_pct"]), abs(got.get("reserved_err_pct", 0))) <= 3.0)
        scored.append({**got, "job": rec["job"]})
    all_row = table(scored, lambda s: s["job"]["model_type"], "model type").splitlines()[-1].split(" | ")
    n_within = sum(bool(s.get("held_within")) for s in scored if s["verdict"] == OUTSIDE_HELD)
    # | all | jobs | scored | within | over | outside (within) | ...: every job scored, six of them outside
    assert all_row[1:3] == ["12", "12"] and all_row[5] == f"6 ({n_within})", all_row
    # an outside job that missed stays a case (the warning need not be its cause); one that met 3 % is not
    missed = {s["id"] for s in scored if s["verdict"] == "over 3 %"
              or (s["verdict"] == OUTSIDE_HELD and not s["held_within"])}
    assert {c["id"] for c in cases(scored, "trace", [])} == missed


def test_a_format3_sweep_profile_claims_no_length_it_did_not_check():
    """Each technique's held length is a length its learner checked, and every check up to it (each precision) was
    within the profile's own tolerance."""
    for path in sorted((estimator_dir() / "coverage-profiles").glob("*.json")):
        doc = json.loads(path.read_text())
        if doc["format"] != "hpcmem-learned-profile/3":
            continue
        held = doc["provenance"]["held"]
        for name, n in held["techniques"].items():
            # "w2a2 full gc" (one per precision learned), or "full gc" in the first format-3 profiles (bf16 only)
            checks = {k: v for k, v in held["err_pct"].items() if k == name or k.split(" ", 1)[1] == name}
            assert checks, (path.name, name)
            for errs in checks.values():
                assert str(n) in errs, (path.name, name, n, errs)
                assert all(isinstance(e, float) and abs(e) <= held["within_pct"]
                           for length, e in errs.items() if int(length) <= n), (path.name, name, errs)
        assert held["max_length"] == min(held["techniques"].values(), default=0), path.name
