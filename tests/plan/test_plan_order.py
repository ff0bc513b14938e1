"""The walk's lazy order is the order its definition states: every combination of the space, fastest first (the
throughput model's tokens/s rounded to 6 decimals), then fewer memory techniques, then enumeration order.

The expected order is built here the slow way — every combination enumerated by `itertools.product` over the axes,
each given `job_throughput` of its own JobSpec (`hpcmem.plan.speed`, the planner's speed for one job), one sort — and
compared element by element with what `hpcmem.plan.order.fastest_first` yields."""

from dataclasses import replace
from itertools import product

import pytest

from hpcmem.errors import SpecError
from hpcmem.gpus.lookup import gpu_spec
from hpcmem.plan.best_first import _parallel_fields
from hpcmem.job.trl_config import build_job
from hpcmem.plan.knobs import Knobs, apply, axes, job_knobs, space
from hpcmem.plan.order import SpeedTable, fastest_first
from hpcmem.plan.speed import Speeds, job_throughput

CASES = [  # (settings, gpu, allow_peft, allow_optim)
    ({"model_name_or_path": "Qwen/Qwen2.5-0.5B", "max_length": 1024}, "L4", True, True),
    ({"model_name_or_path": "Qwen/Qwen2.5-0.5B", "max_length": 512, "num_processes": 4}, "A100-80GB", False, False),
]


def _techniques(k: Knobs) -> int:
    """Memory techniques on, as the planner's ranking counts them (its documented rule, written out here)."""
    return ((k.gc != "off") + k.activation_offloading + (k.sharding != "ddp") + (k.peft != "none")
            + k.expandable_segments + (k.dtype == "bfloat16") + (k.optim == "adamw_8bit"))


@pytest.mark.parametrize("settings,gpu,allow_peft,allow_optim", CASES)
def test_lazy_order_is_the_full_sort(settings, gpu, allow_peft, allow_optim):
    job, _ = build_job("sft", settings)
    spec = gpu_spec(gpu)
    job = replace(job, gpu=spec)
    own = job_knobs(job)
    per_gpu = own.batch * own.accum
    ax = axes(job, (), per_gpu * job.parallel.layout.data_parallel, allow_peft, None, allow_optim)
    combos = [Knobs(gc, off, pack, b, max(1, per_gpu // b), sh, peft, exp, dt, opt)
              for gc, off, pack, b, sh, peft, exp, dt, opt in
              product(ax["gc"], ax["activation_offloading"], ax["pack"], ax["batch"], ax["sharding"], ax["peft"],
                      ax["expandable_segments"], ax["dtype"], ax["optim"])
              # FSDP's sync_each_batch is searched only with accumulation (one micro-batch: the same job)
              if per_gpu // b > 1 or not sh.endswith("+sync")]
    speed = {}
    for k in combos:
        try:
            speed[k] = job_throughput(apply(job, k), spec)
        except SpecError:       # TRL refuses it: no JobSpec to time; the walk orders it by the model's speed all the same
            speed[k] = None
    sp = space(ax)
    assert sp.size() == len(combos)
    par_fields = {name: _parallel_fields(job, name) for name in ax["sharding"]}
    speeds = Speeds(job, spec)
    got = list(fastest_first([sp], speeds, par_fields))
    assert [k for _, k in got] == [k for _, _, k in sorted(
        ((-round((speed[k] or got_speed(got, k)).tokens_per_s_per_gpu, 6), _techniques(k), i), i, k)
        for i, k in enumerate(combos))], "order differs"
    table = SpeedTable(speeds, par_fields, [sp])
    for k in combos:
        if speed[k] is not None:
            assert table[k].tokens_per_s_per_gpu == pytest.approx(speed[k].tokens_per_s_per_gpu, rel=1e-12), k
    outside = combos[0]._replace(batch=10**6)
    assert outside not in table and table.get(outside) is None


def got_speed(got, k):
    return next(s for s, kk in got if kk == k)
