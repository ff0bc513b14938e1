"""`hpcmem plan` — the fastest combination that fits, pruned by TRL's rules, memory from `hpcmem estimate`."""

import json
import subprocess
import sys
from dataclasses import replace

import pytest
from click.testing import CliRunner

from hpcmem.cli import cli
from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.verdict import safe_bound
from hpcmem.gpus.lookup import gpu_spec
from hpcmem.job.trl_config import build_job
from hpcmem.plan import apply, plan, search
from hpcmem.plan.best_first import _dominates, _group, _tensor_floor
from hpcmem.plan.knobs import axes, combinations

LLAMA8B = "meta-llama/Llama-3.1-8B"
SMALL = "Qwen/Qwen2.5-0.5B"


def base(trainer="sft", model=SMALL, **settings):
    job, _ = build_job(trainer, {"model_name_or_path": model, **settings})
    return job


def test_plan_core_does_not_import_torch():
    code = "import sys, hpcmem.plan, hpcmem.cli.plan; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_small_model_turns_no_memory_technique_on():
    best = plan(base(), gpu_spec("H100-80GB"))[0]
    k = best.knobs
    assert (k.gc, k.activation_offloading, k.sharding, k.peft, k.expandable_segments) == \
        ("off", False, "ddp", "none", False)
    assert k.batch == 8 and k.accum == 1


def test_more_gpu_memory_never_slower_best_plan():
    """More usable memory never makes the fastest fitting combination slower; the plan ranked first stays within the
    throughput model's uncertainty of it (plans it cannot tell apart are ordered by headroom)."""
    from hpcmem.plan.throughput import THROUGHPUT_UNCERTAINTY

    h100 = gpu_spec("H100-80GB")
    job = base(model=LLAMA8B, max_length=2048)
    last_fastest = last_first = 0.0
    for gib in (24, 32, 48, 80, 141, 192):
        report = search(job, replace(h100, capacity_bytes=gib * 1024**3), top=1)
        fastest = max((v.speed.tokens_per_s_per_gpu for v in report.walked if v.fits), default=0.0)
        first = report.plans[0].speed.tokens_per_s_per_gpu if report.plans else 0.0
        assert fastest >= last_fastest, f"{gib} GiB: fastest {fastest:.0f} tok/s < {last_fastest:.0f} with less memory"
        assert first >= (1 - THROUGHPUT_UNCERTAINTY) * max(fastest, last_first), (gib, first, fastest, last_first)
        last_fastest, last_first = fastest, first
    assert last_fastest > 0


@pytest.mark.parametrize("gpu,settings", [
    ("L4", {"use_peft": True, "dtype": "bfloat16", "max_length": 4096}),
    ("H100-80GB", {"use_peft": True, "dtype": "bfloat16", "max_length": 4096}),
    ("H100-80GB", {"dtype": "bfloat16", "max_length": 4096}),
    ("L4", {"dtype": "bfloat16", "max_length": 4096}),
])
def test_no_plan_whose_safe_bound_exceeds_the_usable_capacity(gpu, settings):
    """Every plan offered leaves its safe bound (device peak · (1 + the device margin of the GPU's calibration, or the
    default one)) inside what torch can use on the GPU — the catalog's capacity, below nvidia-smi's total."""
    import json as _json
    from importlib import resources

    spec = gpu_spec(gpu)
    entry = next(e for e in _json.loads(resources.files("hpcmem").joinpath("gpus.json").read_text())["gpus"]
                 if e["name"] == gpu)
    margin = spec.margin("device").margin
    report = search(base(model=LLAMA8B, **settings), spec, top=10)
    assert report.plans
    for p in report.plans:
        assert p.estimate.verdict.capacity_bytes == entry["capacity_bytes"] < entry["memory_bytes"]
        assert p.safe_device_peak_bytes >= p.device_peak_bytes * (1 + margin)
        assert p.safe_device_peak_bytes <= entry["capacity_bytes"], p.knobs


def test_ranking_puts_headroom_first_only_inside_the_models_uncertainty():
    """rank_plans by hand: speeds 100, 95, 92, 80, 75 tok/s (bands of 10 %: {100, 95, 92}, {80, 75}) on a 100 GiB GPU,
    where free memory counts up to 10 % of capacity (10 GiB) and speed decides past it."""
    from types import SimpleNamespace

    from hpcmem.plan.best_first import Plan, rank_plans

    def fake(name, tps, headroom_gib):
        verdict = SimpleNamespace(headroom_bytes=int(headroom_gib * 2**30), capacity_bytes=100 * 2**30)
        est = SimpleNamespace(headroom_bytes=verdict.headroom_bytes, verdict=verdict)
        return Plan(rank=0, knobs=name, job=None, estimate=est,
                    speed=SimpleNamespace(tokens_per_s_per_gpu=tps))

    plans = [fake("a", 100, 0.5), fake("b", 95, 1.0), fake("c", 92, 9.0), fake("d", 80, 0.1), fake("e", 75, 3.0)]
    # band 1: most headroom first (c 9, b 1, a 0.5); band 2 starts at 80: e 3 before d 0.1 — a plan 10 % faster
    # (d at 80 against c at 92 ... a at 100) always ranks above
    assert [p.knobs for p in rank_plans(plans)] == ["c", "b", "a", "e", "d"]
    assert [p.rank for p in rank_plans(plans)] == [1, 2, 3, 4, 5]
    roomy = [fake("a", 100, 15.0), fake("b", 95, 30.0)]       # both past 10 GiB: speed decides
    assert [p.knobs for p in rank_plans(roomy)] == ["a", "b"]
    short = [fake("a", 100, 5.0), fake("b", 95, 12.0)]        # a has less than enough: b's headroom wins
    assert [p.knobs for p in rank_plans(short)] == ["b", "a"]


def test_only_zero3_with_offload_fits_8b_full_on_one_24gb_gpu():
    report = search(base(model=LLAMA8B), gpu_spec("RTX-4090"), top=None)
    fitting = {p.knobs.sharding for p in report.plans}
    assert fitting and fitting <= {"zero3+offload_all", "fsdp2+offload"}, fitting
    assert report.plans[0].knobs.sharding in ("zero3+offload_all", "fsdp2+offload")
    fixed = search(base(model=LLAMA8B, accelerate_config="zero3"), gpu_spec("RTX-4090"),
                   fixed={"distributed_type", "zero_stage"}, top=3)
    assert not fixed.plans      # ZeRO-3 without offload is given (fixed): nothing fits


def test_plan_memory_is_the_estimate():
    job = base(model=LLAMA8B, num_processes=8)
    report = search(job, gpu_spec("H100-80GB"), top=5)
    for p in report.plans:
        assert estimate(apply(report.base, p.knobs)).device_peak_bytes == p.device_peak_bytes
    k = report.plans[0].knobs
    flags = ["estimate", "sft", "--model_name_or_path", LLAMA8B, "--gpu", "H100-80GB", "--num_processes", "8",
             "--gradient_checkpointing", str(k.gc != "off"), "--activation_offloading", str(k.activation_offloading),
             "--packing", str(k.pack == "packing"), "--per_device_train_batch_size", str(k.batch),
             "--gradient_accumulation_steps", str(k.accum), "--expandable_segments", str(k.expandable_segments),
             "--json"]
    flags += {"zero3": ["--accelerate_config", "zero3"], "fsdp2": ["--accelerate_config", "fsdp2"],
              "zero1": ["--accelerate_config", "zero1"], "zero2": ["--accelerate_config", "zero2"],
              "fsdp2+sync": ["--accelerate_config", "fsdp2", "--accelerator_config",
                             '{"gradient_accumulation_kwargs": {"sync_each_batch": true}}']}[k.sharding]
    if k.gc == "selective":
        flags += ["--gradient_checkpointing_kwargs", '{"selective": true}']
    out = CliRunner().invoke(cli, flags, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["per_gpu"]["device_peak_bytes"] == report.plans[0].device_peak_bytes


@pytest.mark.parametrize("model,gpu,gib,top,peft", [(SMALL, "L4", 12, 5, False), (LLAMA8B, "H100-80GB", 80, 3, False),
                                                    (LLAMA8B, "L4", 22, 1, True)])
def test_rank_bound_keeps_the_exhaustive_top(model, gpu, gib, top, peft):
    """Stopping early (rank bound) gives the same first plans as walking every combination, speed bands and the
    headroom order inside them included."""
    job = base(model=model, max_length=2048)
    gpu = replace(gpu_spec(gpu), capacity_bytes=gib * 1024**3)
    fast = search(job, gpu, top=top, allow_peft=peft)
    full = search(job, gpu, top=None, allow_peft=peft)
    assert [p.knobs for p in fast.plans] == [p.knobs for p in full.plans[:top]]
    assert fast.stats.full_estimates < full.stats.full_estimates


# Jobs where the device peak itself is not monotone in the knobs (its allocator slack): Reward with accumulation on
# Gemma-3-1B (2 × 4 estimated 541 MiB below 1 × 8), short sequences where full checkpointing holds a layer input more
# than none (Phi-3-mini packed, Qwen2.5-7B under FSDP2 at 128 tokens), DPO on two processes.
BOUND_JOBS = [("reward", "google/gemma-3-1b-pt", 1024, 1), ("sft", "microsoft/Phi-3-mini-4k-instruct", 128, 1),
              ("dpo", "Qwen/Qwen2.5-7B", 128, 1), ("dpo", SMALL, 1024, 2), ("sft", SMALL, 1024, 1)]


@pytest.mark.parametrize("trainer,model,max_length,processes", BOUND_JOBS)
def test_monotone_bound_holds_on_the_estimator(trainer, model, max_length, processes):
    """The search rejects combinations that dominate one that does not fit; check that the bound it compares
    (`_tensor_floor`) really never falls along domination — less the checkpoint boundaries across checkpointing
    settings — and stays under the device peak, for every pair of every group."""
    job = base(trainer, model=model, max_length=max_length, num_processes=processes, gpu="H100-80GB")
    mem = {}
    for k in combinations(axes(job, (), 8 * processes, allow_peft=True)):
        try:
            est = estimate(apply(job, k))
        except SpecError:
            continue
        mem[k] = (*_tensor_floor(est), est.device_peak_bytes)
    assert len(mem) > 100
    groups = {}
    for k in mem:
        groups.setdefault(_group(k), []).append(k)
    pairs = 0
    for ks in groups.values():
        for hi in ks:
            assert mem[hi][0] <= mem[hi][2], hi
            for lo in ks:
                if hi != lo and _dominates(hi, lo):
                    floor, held, _ = mem[lo]
                    assert mem[hi][0] >= (floor - held if hi.gc != lo.gc else floor), (hi, lo)
                    pairs += 1
    assert pairs > 100


@pytest.mark.parametrize("trainer,model,max_length,processes", BOUND_JOBS[:2])
def test_what_the_bound_rejects_does_not_fit(trainer, model, max_length, processes):
    """Every combination the search rejects by the bound, estimated on its own, does not fit either — at capacities
    spread over the safe bounds the combinations need, where the bound decides most. With LoRA allowed on a model
    type peft has no default target modules for (Phi-3), the search refuses those combinations instead of failing."""
    job = base(trainer, model=model, max_length=max_length, num_processes=processes)
    gpu = gpu_spec("H100-80GB")
    probe = search(job, replace(gpu, capacity_bytes=1024**4), top=None, allow_peft=True)
    bounds = sorted(safe_bound(v.device_peak_bytes, gpu, v.spread_bytes) for v in probe.walked
                    if v.device_peak_bytes)
    checked = 0
    for q in (0.2, 0.5, 0.8):
        capacity = bounds[int(q * (len(bounds) - 1))]
        small = replace(gpu, capacity_bytes=capacity)
        report = search(job, small, top=None, allow_peft=True)
        for v in report.walked:
            if v.how != "bound":
                continue
            try:
                fits = estimate(apply(replace(job, gpu=small), v.knobs)).fits
            except SpecError:
                continue        # TRL or peft refuses it as well: the bound comes before the rules
            assert not fits, v
            checked += 1
    assert checked > 0


def test_rules_prune_what_trl_refuses():
    sft = search(base(), gpu_spec("L4"), top=None)
    assert sft.stats.rule_rejected > 0
    assert all(p.knobs.pack != "padding_free" for p in sft.plans)   # max_length set: SFTTrainer raises
    dpo = search(base("dpo"), gpu_spec("H100-80GB"), top=None)
    assert all(p.knobs.gc != "selective" and p.knobs.pack != "packing" for p in dpo.plans)


def test_given_flags_are_fixed():
    job = base(gradient_checkpointing=True, per_device_train_batch_size=2, gradient_accumulation_steps=4)
    plans = plan(job, gpu_spec("H100-80GB"), fixed={"gradient_checkpointing", "per_device_train_batch_size",
                                                     "gradient_accumulation_steps"})
    assert plans and all(p.knobs.gc == "full" and (p.knobs.batch, p.knobs.accum) == (2, 4) for p in plans)


def test_peft_only_when_allowed():
    job = base(model=LLAMA8B)
    assert all(p.knobs.peft == "none" for p in plan(job, gpu_spec("L4")))
    best = plan(job, gpu_spec("L4"), allow_peft=True)[0]
    assert best.knobs.peft in ("lora", "qlora")


def test_cli_plan_table_json_and_explain():
    runner = CliRunner()
    args = ["plan", "sft", "--model_name_or_path", LLAMA8B, "--gpu", "RTX-4090"]
    table = runner.invoke(cli, args + ["--explain", "--top", "3"], catch_exceptions=False)
    assert table.exit_code == 0, table.output
    assert "why #1" in table.output and "faster combinations that lost" in table.output
    data = json.loads(runner.invoke(cli, args + ["--json"], catch_exceptions=False).output)
    assert data["plans"] and data["plans"][0]["reasons"] and data["stats"]["combinations"] > 0
    no_gpu = runner.invoke(cli, ["plan", "sft", "--model_name_or_path", SMALL])
    assert no_gpu.exit_code != 0


def test_submit_plan_writes_the_top_plan(tmp_path):
    """`hpcmem submit --plan` takes the planner's top plan: its knobs reach the generated TRL and accelerate files,
    and the fit check passes for it (8B full fine-tuning alone does not fit one L40S)."""
    import yaml
    from click.testing import CliRunner

    from hpcmem.cli import cli

    args = ["submit", "sft", "--model_name_or_path", "meta-llama/Llama-3.1-8B", "--max_length", "2048",
            "--use_peft", "false", "--preset", "example-l40s", "--dry-run", "--runs-dir", str(tmp_path)]
    refused = CliRunner().invoke(cli, args)
    assert refused.exception is not None            # does not fit without a plan
    result = CliRunner().invoke(cli, args + ["--plan"])
    assert result.exception is None, result.output
    run_dir = next(tmp_path.iterdir())
    accel = yaml.safe_load((run_dir / "accelerate.yaml").read_text())
    estimate = __import__("json").loads((run_dir / "estimate.json").read_text())
    assert estimate["fits"] is True
    assert accel["distributed_type"] in ("DEEPSPEED", "FSDP")


def test_plan_flags_reproduce_each_plan_through_the_cli():
    """`hpcmem plan --json` gives each plan as flags; appended to the user's command they must parse and give that
    plan's device peak (the flags are the inverse of the CLI's option generator, not a second spelling)."""
    user = ["sft", "--model_name_or_path", "Qwen/Qwen2.5-7B", "--use_peft", "false", "--max_length", "4096",
            "--num_processes", "4", "--gpu", "L40S"]
    out = CliRunner().invoke(cli, ["plan", *user, "--top", "4", "--json"], catch_exceptions=False)
    plans = json.loads(out.output)["plans"]
    assert len(plans) == 4 and all(p["flags"] for p in plans)
    for p in plans:
        est = CliRunner().invoke(cli, ["estimate", *user, *p["flags"], "--json"], catch_exceptions=False)
        assert est.exit_code == 0, est.output
        assert json.loads(est.output)["per_gpu"]["device_peak_bytes"] == p["device_peak_bytes"], p["flags"]


def test_without_allow_peft_a_lora_job_stays_lora():
    job = base(model=LLAMA8B, use_peft=True)
    assert {p.knobs.peft for p in plan(job, gpu_spec("L40S"), top=5)} == {"lora"}
    assert {p.knobs.peft for p in plan(base(model=LLAMA8B), gpu_spec("H100-80GB"), top=5)} == {"none"}


def test_a_type_without_checkpointing_is_planned_without_it(tmp_path, monkeypatch):
    """CTRL has no gradient checkpointing in transformers (its real trainer raises under TRL's default
    gradient_checkpointing=True): `hpcmem estimate` refuses the default job, `hpcmem plan` starts from GC off, says
    so, and every plan keeps it off — while a user who asks for checkpointing is refused, not overruled."""
    from hpcmem.datapath import estimator_dir
    from hpcmem.models.profile import config_hash, profile_filename

    doc = json.loads((estimator_dir() / "coverage-profiles" / "ctrl.json").read_text())
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / profile_filename("ctrl", config_hash(doc["config"]))).write_text(json.dumps(doc))
    (tmp_path / "config.json").write_text(json.dumps(doc["config"]))
    monkeypatch.setenv("HPCMEM_DATA", str(tmp_path))
    # 256 tokens: CTRL's position table (n_positions) ends there (hpcmem.job.position_limits)
    base = ["sft", "--model_name_or_path", str(tmp_path / "config.json"), "--max_length", "256", "--gpu", "H100-80GB",
            "--dtype", "bfloat16"]          # the sweep learned bf16 weights only
    refused = CliRunner().invoke(cli, ["estimate", *base])
    assert isinstance(refused.exception, SpecError) and "gradient_checkpointing: false" in str(refused.exception)
    res = CliRunner().invoke(cli, ["plan", *base, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert "gradient_checkpointing false" in out["settled"]
    assert out["plans"] and all(p["knobs"]["gc"] == "off" for p in out["plans"])
    asked = CliRunner().invoke(cli, ["plan", *base, "--gradient_checkpointing", "true"])
    assert isinstance(asked.exception, SpecError)
    assert "trains only with gradient_checkpointing: false" in str(asked.exception)


def test_a_combination_refused_only_for_its_spread_bounds_nothing():
    """Qwen3-0.6B SFT, 8 × 1024 packed, expandable segments: full checkpointing's estimate carries a reserved spread
    (the head's [V, H] gradient) and selective checkpointing's none, so selective's safe bound is the lower one. On a
    GPU whose capacity lies between the two, selective fits by its own estimate and the search must say so, not
    refuse it as dominating the group's floor (full checkpointing)."""
    from hpcmem.plan.knobs import Knobs

    job = base(model="Qwen/Qwen3-0.6B", max_length=1024)
    sel = Knobs(gc="selective", activation_offloading=False, pack="packing", batch=8, accum=1, sharding="ddp",
                peft="none", expandable_segments=True)
    h200 = gpu_spec("H200")
    safe = {gc: estimate(apply(replace(job, gpu=h200), sel._replace(gc=gc))).verdict.safe_device_peak_bytes
            for gc in ("selective", "full")}
    # which of the two has the lower safe bound follows the head's terms (since the LM head's backward keeps no second
    # fp32 [V, H] gradient, full checkpointing's spread is the smaller); the one below must fit by its own estimate
    low, high = sorted(safe, key=safe.get)
    assert safe[low] < safe[high]
    gpu = replace(h200, capacity_bytes=(safe[low] + safe[high]) // 2)
    walked = {v.knobs: v for v in search(job, gpu, top=None, global_batch_size=8).walked}
    assert walked[sel._replace(gc=low)].how == "estimate" and walked[sel._replace(gc=low)].fits
