"""Coverage, torch tier: the mapping read from transformers' source equals the imported one, and every stored
coverage record (estimator/coverage.jsonl, traced by `hpcmem validate --against coverage`) re-estimated with today's
estimator against its stored trace stays within 3 % (no tracing: the CI subset of the sweep)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.torch
transformers = pytest.importorskip("transformers")


def test_source_mapping_equals_imported_mapping():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from hpcmem.models.coverage import installed_mapping

    assert installed_mapping() == dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def test_stored_coverage_records_rescore_within_3_percent():
    from hpcmem.validate.coverage import load_records, rescore

    stored = {(r["model_type"], r["technique"]): r for r in load_records() if "err_pct" in r}
    if not stored:
        pytest.skip("no coverage records in estimator/coverage.jsonl")
    worse = []
    for rec in rescore():
        if "err_pct" not in rec:
            continue
        before = stored[(rec["model_type"], rec["technique"])]["err_pct"]
        bound = max(3.0, abs(before) + 0.5)        # a case stored above 3 % may not get worse
        if abs(rec["err_pct"]) > bound:
            worse.append(f"{rec['model_type']} {rec['technique']}: {before:+.2f} → {rec['err_pct']:+.2f} %")
    assert not worse, "\n".join(worse)
