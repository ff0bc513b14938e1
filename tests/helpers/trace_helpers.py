"""Shared pieces of the trace self-check tests: the tiny model, the trace-vs-real-CPU comparison and the shipped
vision-language cases."""

from pathlib import Path

import yaml

from hpcmem.models.spec import ModelSpec

ROOT = Path(__file__).resolve().parents[2]

TOLERANCE = 0.01        # the bar: trace within 1 % of a real CPU step; measured: identical to the byte

TINY_LLAMA = ModelSpec(name="tiny-llama", model_type="llama", vocab_size=1000, hidden_size=128, intermediate_size=256,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                       tie_word_embeddings=False)


def trace_matches_cpu(job, label=""):
    """Run the real CPU step and the `--kernels cpu` trace of the same job; assert the peaks and phases agree."""
    from hpcmem.trace import measure_cpu, run_trace

    real = measure_cpu(job)
    traced = run_trace(job, kernels="cpu")
    delta = (traced.peak_allocated_bytes - real.peak_allocated_bytes) / real.peak_allocated_bytes
    assert abs(delta) <= TOLERANCE, (label, real.peak_allocated_bytes, traced.peak_allocated_bytes, real.phase,
                                     traced.phase)
    assert traced.phase == real.phase
    assert [s["step"] for s in traced.step_peaks] == [1, 2]
    return real, traced


def estimate_holds_vision_trace(job, max_pct: float) -> None:
    """Trace a vision-language job with its timeline; assert the estimate's step peak and its tower backward phase
    are each within max_pct % of the trace's (the tower's: the largest live bytes in step 2's vision blocks past the
    first)."""
    from hpcmem.estimate import estimate
    from hpcmem.estimate.vision import VISION_BACKWARD
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.trace.run import run_trace

    traced = run_trace(job, timeline=True)
    phases = {p.name: tensor_bytes(p) for p in estimate(job).phases}
    peak = max(phases.values())
    assert abs(peak - traced.peak_allocated_bytes) <= max_pct / 100 * traced.peak_allocated_bytes, \
        (peak, traced.peak_allocated_bytes)
    tower = max(p.current_bytes for p in traced.timeline
                if p.phase.startswith("step 2 / backward / vision block ") and not p.phase.endswith(" 0"))
    assert abs(phases[VISION_BACKWARD] - tower) <= max_pct / 100 * tower, (phases[VISION_BACKWARD], tower)


def shipped_case_job(cases_file: str, case_id: str | None, **changes):
    """The JobSpec of one case of estimator/cases/<cases_file> (its defaults under the case's own keys; the defaults
    alone for None) with `changes` over them, its model path taken from the repository root."""
    from hpcmem.validate.cases import case_job

    cases = yaml.safe_load((ROOT / "estimator" / "cases" / cases_file).read_text())
    own = next(c for c in cases["cases"] if c["id"] == case_id) if case_id else {}
    case = {**cases["defaults"], **own, **changes}
    return case_job({**case, "model_name_or_path": str(ROOT / case["model_name_or_path"])})


def stored_random_job(fixture: str):
    """The JobSpec of a random job stored as tests/fixtures/random/<fixture> (its job dict: the job that ran)."""
    import json

    from hpcmem.validate.random_jobs import RandomJob
    from hpcmem.validate.random_model import job_spec

    return job_spec(RandomJob.from_dict(json.loads((ROOT / "tests" / "fixtures" / "random" / fixture).read_text())))


def estimated_peak(spec):
    """(the estimate over the instants the trace runs, its step peak in tensors only — hpcmem.validate.random_trace
    `as_traced`, as the random oracle scores it)."""
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.validate.random_trace import as_traced

    est, _ = as_traced(spec)
    return est, max(tensor_bytes(p) for p in est.phases)


def traced_and_estimated(spec):
    """(the trace's result with TRL's rules off and CUDA's kernels, as the random oracle runs it; `estimated_peak`'s
    estimate and peak)."""
    from hpcmem.trace.run import run_trace
    from hpcmem.validate.random_trace import trl_rules_off

    with trl_rules_off():
        traced = run_trace(spec, kernels="cuda")
    return (traced, *estimated_peak(spec))


def assert_within(estimated: int, traced: int, share: float) -> None:
    """The estimate within `share` (0.03: 3 %) of the traced peak, both numbers in the failure."""
    assert abs(estimated - traced) <= share * traced, (estimated, traced)


def collated_image_row(job, length: int):
    """(the trace's processor for `job`, TRL's vision collator's batch of one image row of `length` tokens the
    trace's dataset makes: hpcmem.trace.vision `make_image_dataset`)."""
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from hpcmem.trace.vision import make_image_dataset, processor

    proc = processor(job)
    row = dict(make_image_dataset(job, (length,), 1)[0])
    return proc, DataCollatorForVisionLanguageModeling(processor=proc)([row])
