"""The planner's load-dtype knob, its reasons' mechanisms, twins, host RAM per node and the headroom floor — the
expected numbers come from `hpcmem.estimate.estimate` on jobs built here from TRL settings, or by hand."""

import json
from itertools import combinations as pairs

import pytest
from click.testing import CliRunner

from hpcmem.cli import cli, run
from hpcmem.estimate import estimate
from hpcmem.gpus.lookup import gpu_spec
from hpcmem.job.trl_config import build_job
from hpcmem.plan import apply, search
from hpcmem.plan.explain import reasons
from hpcmem.plan.ranking import parse_headroom
from hpcmem.plan.twins import FAMILIES

LLAMA8B, LLAMA70B, SMALL = "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B", "Qwen/Qwen2.5-0.5B"
GIB = 1024**3


def job(model=LLAMA8B, gpu="L4", **settings):
    built, _ = build_job("sft", {"model_name_or_path": model, "max_length": 2048, "gpu": gpu, **settings})
    return built


def trl_settings(k) -> dict:
    """A plan's knobs as the TRL / accelerate settings a user would type (no DeepSpeed / FSDP fields: ddp only)."""
    assert k.sharding == "ddp"
    return {"dtype": k.dtype, "use_peft": k.peft != "none", "load_in_4bit": k.peft == "qlora",
            "per_device_train_batch_size": k.batch, "gradient_accumulation_steps": k.accum,
            "gradient_checkpointing": k.gc != "off", "gradient_checkpointing_kwargs": {"selective": k.gc == "selective"},
            "activation_offloading": k.activation_offloading, "packing": k.pack == "packing",
            "packing_strategy": "bfd", "padding_free": k.pack == "padding_free"}


def test_l4_offers_a_bf16_load_without_deepspeed_and_credits_the_cast_not_zero():
    report = search(job(), gpu_spec("L4"), allow_peft=True, top=10)
    plain = [p for p in report.plans if p.knobs.sharding == "ddp" and p.knobs.dtype == "bfloat16"]
    assert plain, [p.knobs.label() for p in report.plans]
    own = estimate(job(**trl_settings(plain[0].knobs)))         # the same job typed as TRL flags, estimated alone
    assert own.fits and own.device_peak_bytes == plain[0].device_peak_bytes
    for p in report.plans:
        k = p.knobs
        if not k.sharding.startswith("zero"):
            continue
        line = next(r for r in reasons(report, p) if r.startswith(k.sharding + ":"))
        assert "shard:" not in line.replace("no shard:", ""), line        # one GPU: nothing is sharded
        if k.dtype == "float32" and "memory" in line:
            assert "cast:" in line, line
            # "without it": the same knobs without DeepSpeed, a float32 load — estimated here from TRL settings
            without = estimate(job(**trl_settings(k._replace(sharding="ddp"))))
            assert f"needs {without.device_peak_bytes / GIB:.1f} GiB" in line, line


def test_h100_at_2048_tokens_does_not_offload_when_a_bf16_load_fits():
    h100 = gpu_spec("H100-80GB")
    # a bf16 load, no DeepSpeed and no offload: full checkpointing, 8 packed rows — fits by the estimate alone
    bf16 = estimate(job(gpu="H100-80GB", dtype="bfloat16", packing=True, packing_strategy="bfd",
                        per_device_train_batch_size=8, gradient_checkpointing=True))
    assert bf16.fits
    best = search(job(gpu="H100-80GB"), h100, top=3).plans[0]
    assert "offload" not in best.knobs.sharding and not best.knobs.activation_offloading, best.knobs.label()


GRID = [(m, g, n) for m in (SMALL, LLAMA8B) for g in ("L4", "H100-80GB") for n in (1, 8)]


@pytest.mark.parametrize("model,gpu,processes", GRID)
def test_no_twins_in_a_top_ten(model, gpu, processes):
    """No two plans of a top 10 have knobs equal up to the declared equivalence (sharding within one family, load
    dtype) while the estimate and the speed model give them the same numbers — checked by estimating both again."""
    report = search(job(model=model, gpu=gpu, num_processes=processes), gpu_spec(gpu), allow_peft=True, top=10)
    assert report.plans
    for a, b in pairs(report.plans, 2):
        ka, kb = a.knobs, b.knobs
        if ka._replace(sharding=kb.sharding, dtype=kb.dtype) != kb or \
                FAMILIES.get(ka.sharding, ka.sharding) != FAMILIES.get(kb.sharding, kb.sharding):
            continue
        ea, eb = (estimate(apply(report.base, k)) for k in (ka, kb))
        same = (ea.device_peak_bytes, ea.verdict.safe_device_peak_bytes, ea.host.per_node_bytes) == \
            (eb.device_peak_bytes, eb.verdict.safe_device_peak_bytes, eb.host.per_node_bytes)
        assert not (same and a.speed.tokens_per_s_per_gpu == b.speed.tokens_per_s_per_gpu), (ka, kb)
    if processes == 1:
        assert all(" ddp" not in p.knobs.label(True) for p in report.plans)


def plan_json(*args):
    out = CliRunner().invoke(cli, ["plan", "sft", *args, "--json"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


def test_70b_on_eight_h100_holds_every_plan_to_the_dgx_node():
    args = ["--model_name_or_path", LLAMA70B, "--dtype", "bfloat16", "--max_length", "4096", "--gpu", "H100-80GB",
            "--num_processes", "8"]
    data = plan_json(*args)
    assert data["host_capacity_bytes"] == 2048 * GIB       # DGX H100: 2 TB for 8 GPUs, all 8 used
    assert data["assumed"] and "DGX H100" in data["assumed"][0]
    assert data["plans"] and all(p["host_per_node_bytes"] <= 2048 * GIB for p in data["plans"])
    tight = plan_json(*args, "--host_ram_per_node", "1100")
    assert tight["host_capacity_bytes"] == 1100 * GIB and not tight["assumed"]
    assert all(p["host_per_node_bytes"] <= 1100 * GIB for p in tight["plans"])
    table = CliRunner().invoke(cli, ["plan", "sft", *args], catch_exceptions=False).output
    assert "host/node" in table and "host RAM per node ≤ 2048.0 GiB, assumed" in table


def test_one_l4_is_assumed_an_eighth_of_its_reference_node():
    data = plan_json("--model_name_or_path", SMALL, "--gpu", "L4")
    assert data["host_capacity_bytes"] == 768 * GIB // 8      # AWS g6.48xlarge: 768 GiB for 8 L4, one used


@pytest.mark.parametrize("flag,value", [("--host_ram_per_node", "-3"), ("--host_ram_per_node", "lots"),
                                        ("--headroom", "abc"), ("--headroom", "120%")])
def test_bad_host_ram_or_headroom_is_one_line_naming_flag_value_rule(flag, value, capsys):
    code = run(["plan", "sft", "--model_name_or_path", SMALL, "--gpu", "L4", flag, value, "--json"])
    err = capsys.readouterr()
    assert code == 2 and err.out == ""
    line = err.err.strip()
    assert "\n" not in line and flag in line and value in line and "must" in line


def test_headroom_floor_drops_plans_that_leave_less_free():
    gpu = gpu_spec("H100-80GB")
    report = search(job(gpu="H100-80GB", dtype="bfloat16"), gpu, top=10, headroom=parse_headroom("15%"))
    floor = 0.15 * gpu.usable_bytes
    assert report.plans
    for p in report.plans:
        v = estimate(apply(report.base, p.knobs)).verdict
        assert v.capacity_bytes - v.safe_device_peak_bytes >= floor
    dropped = [v for v in report.walked if v.how == "headroom"]
    assert dropped and all(not v.fits for v in dropped)
    for v in dropped[:3]:
        e = estimate(apply(report.base, v.knobs)).verdict
        assert e.fits and e.capacity_bytes - e.safe_device_peak_bytes < floor


def test_plan_picture_axes_hold_the_plans_and_the_capacity():
    pytest.importorskip("matplotlib")
    from hpcmem.plots.plan_plot import figure

    base = build_job("sft", {"model_name_or_path": LLAMA70B, "dtype": "bfloat16", "max_length": 4096,
                             "gpu": "H100-80GB", "num_processes": 8})[0]
    report = search(base, gpu_spec("H100-80GB"), top=10)
    fig = figure(report)
    ax = fig.axes[0]
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    capacity = report.gpu.usable_bytes / GIB
    assert capacity <= x1 <= 1.2 * capacity                  # not the 1 TiB an unsharded 70B would need
    for p in report.plans:
        assert x0 <= p.device_peak_bytes / GIB and p.safe_device_peak_bytes / GIB <= x1
        assert y0 <= p.speed.tokens_per_s_per_gpu <= y1
    for coll in ax.collections:                              # every class drawn has its points inside the axes
        offsets = coll.get_offsets()
        assert all(x0 <= x <= x1 and y0 <= y <= y1 for x, y in offsets), coll.get_label()
    segments = [line for line in ax.lines if line.get_label().startswith(("device peak", "headroom"))]
    assert len(segments) == 2                                 # margin and headroom bars are in the legend once
    assert len(ax.lines) >= 2 * len(report.plans)


def test_eight_bit_adamw_only_when_allowed_and_its_reason_is_the_quantized_states():
    """bf16 8B on one H100 at 4,096 tokens: with --allow_optim, a plan using 8-bit AdamW names the quantized states,
    and its counterfactual (fused AdamW, same knobs, typed as TRL settings) is estimated here."""
    base = job(gpu="H100-80GB", max_length=4096, dtype="bfloat16")
    h100 = gpu_spec("H100-80GB")
    assert all(p.knobs.optim == "adamw_torch_fused" for p in search(base, h100, fixed={"dtype"}, top=5).plans)
    report = search(base, h100, fixed={"dtype"}, allow_optim=True, top=10)
    eight = [p for p in report.plans if p.knobs.optim == "adamw_8bit" and p.knobs.sharding == "ddp"]
    assert eight
    p = eight[0]
    fused = estimate(job(gpu="H100-80GB", max_length=4096, **trl_settings(p.knobs), optim="adamw_torch_fused"))
    own = estimate(job(gpu="H100-80GB", max_length=4096, **trl_settings(p.knobs), optim="adamw_8bit"))
    assert own.device_peak_bytes == p.device_peak_bytes < fused.device_peak_bytes
    line = next(r for r in reasons(report, p) if r.startswith("optim adamw_8bit"))
    assert "quantize" in line
    free = (fused.headroom_bytes or 0) / GIB if fused.fits else None
    assert (f"fits with {free:.1f} GiB free" if free is not None else
            f"needs {fused.device_peak_bytes / GIB:.1f} GiB") in line or "tight" in line, line


def test_host_ram_comes_from_preset_then_flag_then_the_reference_node():
    from hpcmem.errors import SpecError
    from hpcmem.plan.host_ram import host_ram

    assert host_ram("H100-80GB", 8, preset_bytes=1000 * GIB, preset_name="p").bytes == 1000 * GIB
    assert host_ram("H100-80GB", 8, flag_gib=512).bytes == 512 * GIB
    assert host_ram("H100-80GB", 2).bytes == 2048 * GIB * 2 // 8          # 2 of DGX H100's 8 GPUs
    assert host_ram("A100-40GB", 16).bytes == 1024 * GIB                  # a node holds 8 of them at most
    # GB200: 2 superchips of up to 480 GB LPDDR5X per 4-GPU compute tray (NVIDIA GB200 NVL72 datasheet)
    assert host_ram("GB200", 4).bytes == 2 * 480 * GIB and host_ram("GB200", 2).bytes == 480 * GIB
    assert host_ram("MI300X", 8).bytes == 1850 * GIB                      # Azure ND MI300X v5: 1,850 GiB for 8
    for no_stated_figure in ("B300", "H20", "RTX-4090", "RTX-5090", "RTX-PRO-6000"):
        assert host_ram(no_stated_figure, 8).bytes is None and "not checked" in host_ram(no_stated_figure, 8).source
    unknown = host_ram("MyGPU", 1)
    assert unknown.bytes is None and "not checked" in unknown.source
    with pytest.raises(SpecError, match="memory_per_node_gb"):
        host_ram("H100-80GB", 8, preset_bytes=1000 * GIB, flag_gib=512, preset_name="p")


def test_of_twins_the_row_keeps_the_users_load_dtype():
    """A bfloat16-loaded job's plans under DeepSpeed have float32-load twins (DeepSpeed casts either to bf16): the
    row shown keeps bfloat16, so a suggested fix never adds --dtype float32 to what the user wrote."""
    report = search(job(model=SMALL, gpu="L4", dtype="bfloat16"), gpu_spec("L4"), allow_peft=True, top=10)
    with_twins = [p for p in report.plans if any(e.dtype == "float32" for e in p.equivalents)]
    assert with_twins, [p.knobs.label() for p in report.plans]          # the case this test is about occurs
    for p in report.plans:
        if any(e.dtype != p.knobs.dtype for e in p.equivalents):
            assert p.knobs.dtype == "bfloat16", (p.knobs.label(), [e.dtype for e in p.equivalents])
