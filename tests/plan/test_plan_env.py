"""The planner leaves expandable_segments alone when the job's environment sets the allocator: the job runs what the
variable says, whatever a plan would prefer."""

from __future__ import annotations

from hpcmem.cli.options import job_from_cli
from hpcmem.plan import search
from hpcmem.plan.knobs import axes


def _job(env):
    job, _ = job_from_cli("sft", {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "gpu": "H100-80GB"}, env=env,
                          settle_required=True)
    return job


def test_an_allocator_variable_fixes_expandable_segments():
    assert axes(_job(None), (), 8, False)["expandable_segments"] == [False, True]     # searched when free
    pinned = _job({"PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.8"})
    assert axes(pinned, (), 8, False)["expandable_segments"] == [False]
    on = _job({"PYTORCH_ALLOC_CONF": "expandable_segments:True"})
    assert axes(on, (), 8, False)["expandable_segments"] == [True]
    assert {p.knobs.expandable_segments for p in search(on, on.gpu, top=None).plans} == {True}
