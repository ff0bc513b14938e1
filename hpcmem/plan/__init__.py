"""`hpcmem plan`: enumerate technique combinations, keep those that fit, rank them by a throughput model, explain.

Pure and stdlib-only like hpcmem.estimate. `plan(job, gpu, ...)` returns the ranked plans (for `hpcmem submit --plan`);
`search(...)` also returns what was walked and rejected, and the search statistics (for `--explain` and the bench).
"""

from __future__ import annotations

from hpcmem.plan.knobs import Knobs, apply, job_knobs
from hpcmem.plan.best_first import Plan, PlanReport, SearchStats, Verdict, plan, search
from hpcmem.plan.throughput import Throughput

__all__ = ["Knobs", "Plan", "PlanReport", "SearchStats", "Throughput", "Verdict", "apply", "job_knobs", "plan",
           "search"]
