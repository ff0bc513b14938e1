"""Each discrepancy of the random oracle carries a `class` read off its score (never stale), and a cause named in an
earlier file is kept only where it names one — a note that begins "unexplained" is a placeholder, not a cause."""

from __future__ import annotations

from hpcmem.validate.random_report import UNEXPLAINED, cases, discrepancy_class


def _scored(**kw):
    base = {"id": "s9-1", "verdict": "over 3 %", "job": {"trainer": "sft", "model_type": "llama", "settings": {}},
            "estimate": {"phase": "backward (layer 2)", "not_held": [], "made": "derived"},
            "traced_phase": "step 2 / backward / layer 2"}
    return {**base, **kw}


def test_the_class_reads_the_score():
    # allocated within 3 %, reserved 5 % under: the allocator's slack rule missed, nothing else
    assert discrepancy_class(_scored(err_pct=0.4, reserved_err_pct=-5.0)) == \
        "reserved only (under): the allocator slack rule"
    # allocated 6 % over at the trace's instant (both backward), and 5 % under at another (reference vs backward)
    assert discrepancy_class(_scored(err_pct=6.0, reserved_err_pct=1.0)) == \
        "allocated over, at the trace's peak"
    assert discrepancy_class(_scored(err_pct=-5.0, traced_phase="step 2 / forward / reference forward / layer 1")) \
        == "allocated under, at another instant than the trace's peak"
    # a learned profile outside the rows it was held at: the estimate's own warning names the range
    held = ["learned profile of olmo: held at 1–4 rows per micro-batch (its rows check: hpcmem validate coverage "
            "--rows-checks); this job's 8 rows scale its terms per row past that: not held"]
    assert discrepancy_class(_scored(verdict="outside held range", err_pct=8.0,
                                     estimate={"phase": "backward (layer 2)", "not_held": held})) == \
        "outside held range: rows per micro-batch"
    # outside two ranges (s1-537, jais2: 8 rows, and bf16 off): both named, in one order whichever warning came first
    no_amp = ("learned profile of jais2: its cells were traced under autocast (bf16 on); this job computes without it "
              "(bf16 and fp16 off), where 16-bit and fp32 operands promote to fp32 and LoRA adapters compute in fp32: "
              "not held")
    for lines in ([held[0], no_amp], [no_amp, held[0]]):
        assert discrepancy_class(_scored(verdict="outside held range", err_pct=15.3,
                                         estimate={"phase": "backward (layer 2)", "not_held": lines})) == \
            "outside held range: rows per micro-batch + no autocast"
    # the technique warning quotes where the profile is held ("≤ 8,192 tokens per row"): a technique, not a length
    technique = ("learned profile of olmo held within 3 % at ≤ 8,192 tokens per row (full gc 8,192); this job's "
                 "technique (dora no gc) is not among them (not learned, or its check was not within): not held")
    assert discrepancy_class(_scored(verdict="outside held range", err_pct=4.0,
                                     estimate={"phase": "backward (layer 2)", "not_held": [technique]})) == \
        "outside held range: technique"
    assert discrepancy_class(_scored(verdict="missed refusal")) == "missed refusal"


def test_a_named_cause_is_kept_and_a_placeholder_is_not():
    old = [{"id": "s9-1", "oracle": "trace", "cause": "eager attention in fp32 at the softmax's backward"},
           {"id": "s9-2", "oracle": "trace", "cause": "unexplained; class: something an earlier file guessed"}]
    scored = [_scored(id="s9-1", err_pct=5.0, reserved_err_pct=0.0),
              _scored(id="s9-2", err_pct=0.1, reserved_err_pct=-7.0)]
    got = {c["id"]: c for c in cases(scored, "trace", old)}
    assert got["s9-1"]["cause"] == "eager attention in fp32 at the softmax's backward"
    assert got["s9-2"]["cause"] == UNEXPLAINED
    assert got["s9-2"]["class"] == "reserved only (under): the allocator slack rule"


def test_the_estimate_s_own_rows_warning_is_classed_whatever_its_span():
    """The warning `learned_warnings` writes for a job past its profile's rows, read back by the class: a range of one
    row count ("held at 2 rows only per micro-batch") too, whose words the class once did not match (it matched
    "rows per micro-batch", which only a span of two counts writes)."""
    from dataclasses import replace

    from hpcmem.estimate.learned_range import learned_warnings
    from hpcmem.job.shape import micro_batch
    from tests.helpers.trace_helpers import stored_random_job

    spec = stored_random_job("s3-27-cpmant-kto-no-grad-pass.json")          # learned cpmant, 4 rows per micro-batch
    p = spec.model.learned
    for rows in ([2, 2], [1, 2]):
        profile = replace(p, provenance={**p.provenance, "held": {**p.held, "rows_held": rows}})
        job = replace(spec, model=replace(spec.model, learned=profile))
        lines = learned_warnings(job, micro_batch(job))
        assert any("rows" in line and "per micro-batch" in line for line in lines), lines
        got = discrepancy_class(_scored(verdict="outside held range", err_pct=5.0,
                                        estimate={"phase": "backward (layer 2)", "not_held": lines}))
        assert got.startswith("outside held range: rows per micro-batch"), (rows, got)
