"""The rows check at 8 and 16 rows per micro-batch (TRL's default per_device_train_batch_size, and a preference
trainer's chosen and rejected rows at it), added to a stored profile without learning it again (hpcmem.trace.learn
`missing_rows`, `add_rows`).

Known answers: two-step traces of the real trainer on the learner's cut at those rows (the check itself), and
stored random jobs at more than four rows (estimator/random/trace.jsonl), which the check never traced."""

from __future__ import annotations

import copy
import json

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.slow]
pytest.importorskip("trl")

from tests.helpers.random_records import stored_trace_record  # noqa: E402


def _stored(model_type: str) -> dict:
    from hpcmem.datapath import estimator_dir

    return json.loads((estimator_dir() / "coverage-profiles" / f"{model_type}.json").read_text())


def test_a_profile_checked_at_1_and_4_rows_gains_8_and_16() -> None:
    from hpcmem.models.profile import profile_from_dict
    from hpcmem.trace.learn import HELD_PCT, ROWS_CHECKED, add_rows, missing_rows
    from hpcmem.validate.coverage import reference_config

    doc = _stored("olmo")
    ((name, errors),) = doc["provenance"]["held"]["rows_err_pct"].items()
    old = copy.deepcopy(doc)
    old["provenance"]["held"]["rows_err_pct"] = {name: {k: v for k, v in errors.items() if k in ("1", "4")}}
    old["provenance"]["held"]["rows_held"] = [1, 4]
    stored = profile_from_dict(old)
    assert missing_rows(stored) == (8, 16)
    got = add_rows(reference_config("olmo")[0], stored)
    new = got.held["rows_err_pct"][name]
    assert {k: new[k] for k in ("1", "4")} == {k: errors[k] for k in ("1", "4")}      # not traced again
    assert all(abs(new[k]) <= HELD_PCT for k in ("8", "16")), new
    assert got.held["rows_held"] == [1, 16] and missing_rows(got) == ()
    assert got.cells.keys() == stored.cells.keys()
    # a profile whose rows check never ran: every row count, on its first held technique
    bare = copy.deepcopy(old)
    del bare["provenance"]["held"]["rows_err_pct"], bare["provenance"]["held"]["rows_held"]
    assert missing_rows(profile_from_dict(bare)) == ROWS_CHECKED


@pytest.mark.parametrize("job_id", ["s2-46", "s4-138"])
def test_jobs_past_four_rows_are_held_and_within_three_percent(job_id: str) -> None:
    """OLMo jobs at 6 rows per micro-batch, outside the held range while the check stopped at 4 rows."""
    from hpcmem.validate.random_trace import score

    got = score(stored_trace_record(job_id))
    assert got["verdict"] != "outside held range", got["why"]
    assert abs(got["err_pct"]) <= 3.0, got["why"]
