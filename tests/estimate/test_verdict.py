"""The fit verdict (fits · tight · does not fit on the safe bound against torch's usable capacity), the calibration
search path that feeds it its margins, and the gates that act on it (estimate, submit). Fast tier, no torch."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcmem.cli import cli
from hpcmem.estimate.verdict import DOES_NOT_FIT, FITS, TIGHT, judge
from hpcmem.gpus.lookup import gpu_spec
from hpcmem.gpus.spec import GpuSpec, PeakMargin

GIB = 1024**3
PACKAGE_H200 = json.loads(resources.files("hpcmem").joinpath("calibrations/h200.json").read_text())
PACKAGE_MULTI = json.loads(resources.files("hpcmem").joinpath("calibrations/multi-gpu.json").read_text())
PACKAGE_SINGLE = json.loads(resources.files("hpcmem").joinpath("calibrations/single-gpu.json").read_text())
CATALOG = {e["name"]: e for e in json.loads(resources.files("hpcmem").joinpath("gpus.json").read_text())["gpus"]}


@pytest.fixture(autouse=True)
def _no_site_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the package's calibrations unless a test adds a site folder (the user's ~/.config is not read)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("HPCMEM_DATA", raising=False)


def _gpu(margin: float | None, capacity_gib: float = 100.0) -> GpuSpec:
    margins = () if margin is None else (PeakMargin(peak="device", margin=margin, coverage=0.95, n=19,
                                                    calibrated_on="X"),)
    return GpuSpec(name="X", memory_bytes=int(110 * GIB), bf16_tflops=1.0, capacity_bytes=int(capacity_gib * GIB),
                   margins=margins)


@pytest.mark.parametrize("peak_gib,level", [(90.0, FITS), (100 / 1.05, FITS), (96.0, TIGHT), (100.0, TIGHT),
                                            (100.5, DOES_NOT_FIT)])
def test_levels_by_hand(peak_gib: float, level: str) -> None:
    # capacity 100 GiB, margin 5 %: 90 → 94.5 fits; 100/1.05 → exactly 100 fits; 96 → 100.8 is tight
    v = judge(int(peak_gib * GIB), _gpu(0.05))
    assert v.level == level and v.fits == (level == FITS)
    assert v.safe_device_peak_bytes == math.ceil(int(peak_gib * GIB) * 1.05)
    assert v.headroom_bytes == 100 * GIB - v.safe_device_peak_bytes


def test_the_safe_bound_starts_from_the_upper_outcome_of_the_spread() -> None:
    # device peak 90 GiB, spread 4 GiB (± 2), margin 5 %: (90 + 2) · 1.05 = 96.6 > 95 → tight on a 95 GiB GPU,
    # where 90 · 1.05 = 94.5 alone would fit
    v = judge(90 * GIB, _gpu(0.05, capacity_gib=95.0), 4 * GIB)
    assert v.safe_device_peak_bytes == math.ceil(92 * GIB * 1.05) and v.level == TIGHT
    assert v.to_json()["spread_bytes"] == 4 * GIB and "(device peak 90.0 + half spread 2.00, then + 5.0 %)" in v.line()
    assert judge(90 * GIB, _gpu(0.05, capacity_gib=95.0)).level == FITS


def test_no_calibration_anywhere_is_said() -> None:
    v = judge(50 * GIB, _gpu(None))
    assert v.fits and v.margin == 0.0 and v.coverage is None and v.calibration.to_json()["status"] == "none"
    assert "no calibration" in v.line()


def test_calibrated_gpu_uses_its_own_margin_and_states_its_coverage() -> None:
    m = PACKAGE_H200["margins"]["device"]
    spec = gpu_spec("H200")
    v = judge(100 * GIB, spec)
    assert v.margin == m["margin"] and v.coverage == m["coverage"] == round(m["k"] / (m["n"] + 1), 4)
    assert v.capacity_bytes == 150_109_880_320          # torch's total on the H200 of the records, not 150,754,820,096
    assert v.calibration.to_json() == {**v.calibration.to_json(), "status": "calibrated", "gpu": "H200", "n": m["n"]}
    assert v.line().startswith(f"fits with {math.floor(1000 * m['coverage']) / 10} % coverage: safe bound ")


def _site_calibration(folder: Path, name: str, catalog_name: str, margin: float, n: int = 30) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps({
        "catalog_name": catalog_name, "gpu": name, "context_bytes": 1_000_000_000, "source": "test",
        "margins": {"device": {"margin": margin, "n": n, "k": n, "coverage": round(n / (n + 1), 4)}}}))


def test_uncalibrated_gpu_borrows_the_largest_calibrated_margin_and_says_so(tmp_path, monkeypatch) -> None:
    assert gpu_spec("L4").margin("device").margin == PACKAGE_H200["margins"]["device"]["margin"]
    _site_calibration(tmp_path / "site" / "calibrations", "h100-80gb", "H100-80GB", 0.09)
    monkeypatch.setenv("HPCMEM_DATA", str(tmp_path / "site"))
    spec = dataclasses.replace(gpu_spec("L4"), multi_gpu_margin=None, single_gpu_margin=None)   # no published margins
    assert not spec.calibrated
    v = judge(10 * GIB, spec)
    assert (v.margin, v.calibration.to_json()["status"], v.calibration.to_json()["gpu"]) == (0.09, "default", "H100-80GB")
    assert v.coverage is None and v.calibration.to_json()["coverage"] == round(30 / 31, 4)     # measured there, not on L4
    assert "L4 uncalibrated, coverage unknown" in v.line()
    assert gpu_spec("H100").calibrated and judge(10 * GIB, gpu_spec("H100")).margin == 0.09


def test_a_site_calibration_takes_precedence_over_the_packaged_one(tmp_path, monkeypatch) -> None:
    _site_calibration(tmp_path / "site" / "calibrations", "h200", "H200", 0.02, n=60)
    monkeypatch.setenv("HPCMEM_DATA", str(tmp_path / "site"))
    spec = gpu_spec("H200")
    assert spec.calibrated and spec.margin("device").margin == 0.02 and spec.context_bytes == 1_000_000_000
    # the packaged H200 file is shadowed for the defaults too: other GPUs borrow the site's 2 %
    assert gpu_spec("A100-80GB").margin("device").margin == 0.02


def test_estimate_json_carries_the_verdict_for_calibrated_and_uncalibrated_gpus() -> None:
    args = ["estimate", "sft", "--model_name_or_path", "Qwen/Qwen2.5-7B", "--dtype", "bfloat16", "--use_peft", "true",
            "--json"]
    # L4 is uncalibrated: one GPU of it takes the margin of the published single-GPU rows
    margins = {"calibrated": PACKAGE_H200["margins"]["device"]["margin"], "published": PACKAGE_SINGLE["margin"]}
    for gpu, status in (("H200", "calibrated"), ("L4", "published")):
        out = CliRunner().invoke(cli, [*args, "--gpu", gpu])
        assert out.exit_code == 0, out.output
        data = json.loads(out.output)
        v = data["verdict"]
        assert set(v) >= {"level", "fits", "safe_device_peak_bytes", "capacity_bytes", "margin", "coverage",
                          "calibration"}
        assert v["shapes_bytes"] == data["per_gpu"]["shapes_needed_bytes"] > 0     # padded: shapes vary
        upper = (data["per_gpu"]["device_peak_bytes"] + data["per_gpu"]["reserved_spread_bytes"] / 2
                 + data["per_gpu"]["shapes_needed_bytes"])
        assert v["safe_device_peak_bytes"] == math.ceil(upper * (1 + margins[status]))
        assert v["capacity_bytes"] == CATALOG[gpu]["capacity_bytes"] == data["gpu"]["capacity_bytes"]
        assert data["fits"] == v["fits"] == (v["level"] == "fits") and v["calibration"]["status"] == status
    table = CliRunner().invoke(cli, [*args[:-1], "--gpu", "H200"]).output
    verdicts = [ln for ln in table.splitlines() if ln.startswith("verdict")]
    assert len(verdicts) == 1 and "coverage: safe bound" in verdicts[0] and "calibrated on H200, n = 18" in verdicts[0]


def test_every_key_estimate_json_prints_is_in_the_readmes_contract() -> None:
    """The README's `--json` section is the contract scripts read: each key `hpcmem estimate --json` prints (names of
    components and phases aside) is named there."""
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("`--json` prints one stable object:", 1)[1].split("`; `fits` is", 1)[0]
    documented = set(re.findall(r'"(\w+)"', block))
    out = CliRunner().invoke(cli, ["estimate", "sft", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--num_processes",
                                   "2", "--gpu", "H200", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)

    def keys(obj: object, path: str = "") -> set[str]:
        if not isinstance(obj, dict) or path.endswith(("components", "notes", "phases")):
            return set()
        return {f"{path}.{k}".lstrip(".") for k in obj} | {x for k, v in obj.items() for x in keys(v, f"{path}.{k}")}

    printed = keys(data)
    assert "verdict.spread_bytes" in printed
    assert {k for k in printed if k.rsplit(".", 1)[-1] not in documented} == set()


def test_estimate_with_a_calibrated_gpu_does_not_import_torch() -> None:
    code = ("import sys; from hpcmem.cli import cli; "
            "cli.main(['estimate', 'sft', '--model_name_or_path', 'Qwen/Qwen2.5-7B', '--gpu', 'H200', '--json'], "
            "standalone_mode=False); "
            "heavy = {'torch', 'transformers', 'trl', 'deepspeed', 'matplotlib'} & set(sys.modules); "
            "assert not heavy, heavy")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["verdict"]["calibration"]["status"] == "calibrated"


TIGHT_JOB = ["sft", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--use_peft", "false", "--dtype", "bfloat16",
             "--max_length", "3180", "--per_device_train_batch_size", "8", "--gradient_checkpointing", "false"]


def test_submit_refuses_a_tight_job_with_the_numbers_and_fixes_unless_forced(tmp_path) -> None:
    """The point estimate of this job fits an L40S (44.4 of 44.5 GiB usable), its safe bound (45.0) does not: exit 2."""
    cmd = [sys.executable, "-m", "hpcmem", "submit", *TIGHT_JOB, "--preset", "example-l40s", "--dry-run",
           "--runs-dir", str(tmp_path / "runs")]
    refused = subprocess.run(cmd, capture_output=True, text=True)
    assert refused.returncode == 2, refused.stderr
    assert "hpcmem: error: tight: the point estimate fits, the safe bound does not" in refused.stderr
    assert "usable on L40S" in refused.stderr and "changes whose safe bound fits" in refused.stderr
    assert not (tmp_path / "runs").exists()
    forced = subprocess.run(cmd + ["--force"], capture_output=True, text=True)
    assert forced.returncode == 0, forced.stderr
    estimate = json.loads(next((tmp_path / "runs").iterdir()).joinpath("estimate.json").read_text())
    assert estimate["verdict"]["level"] == TIGHT and estimate["fits"] is False


def test_every_catalog_gpu_states_its_usable_capacity_and_its_source() -> None:
    out = CliRunner().invoke(cli, ["gpus", "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert {r["name"] for r in rows} == set(CATALOG)
    for r in rows:
        assert 0 < r["capacity_bytes"] < r["memory_bytes"] and r["capacity_source"], r["name"]
        assert r["capacity_derived"] == r["capacity_source"].startswith("derived"), r["name"]


def test_fit_writes_where_the_search_path_looks(tmp_path, monkeypatch) -> None:
    """--fit writes to $HPCMEM_DATA/calibrations when set (searched first), else in a checkout into the package's
    own calibrations/ (the files that ship) — both folders gpu_spec reads."""
    from hpcmem.datapath import PACKAGE_DIR, search_dirs
    from hpcmem.validate.calibration import default_fit_dir

    assert (PACKAGE_DIR.parent / "pyproject.toml").is_file()          # these tests run from a checkout
    assert default_fit_dir() == PACKAGE_DIR / "calibrations" == search_dirs("calibrations")[-1]
    monkeypatch.setenv("HPCMEM_DATA", str(tmp_path / "site"))
    assert default_fit_dir() == tmp_path / "site" / "calibrations" == search_dirs("calibrations")[0]


PUBLISHED = PeakMargin(peak="device", margin=0.25, coverage=0.95, n=19, calibrated_on="published multi-GPU rows "
                       "(3 sources)", evidence="published multi-GPU rows", held_out_covered=15, held_out_n=19)
SINGLE = PeakMargin(peak="device", margin=0.02, coverage=0.9474, n=18, calibrated_on="H200", held_out_covered=2,
                    held_out_n=2)


def _x100(**kw) -> GpuSpec:
    return GpuSpec(name="X100", memory_bytes=80 * GIB, bf16_tflops=1.0, calibrated=True, margins=(SINGLE,), **kw)


def test_a_multi_gpu_job_takes_the_published_margin_and_names_its_source() -> None:
    gpu = _x100(multi_gpu_margin=PUBLISHED)
    v = judge(40 * GIB, gpu, world_size=8)
    assert v.margin == 0.25 and v.safe_device_peak_bytes == 50 * GIB        # 40 GiB · 1.25
    assert v.calibration.status == "published" and v.coverage == 15 / 19     # held-out share, not in-sample
    assert "margin 25.0 % from published multi-GPU rows (n = 19), held-out coverage 15/19" in v.line()
    assert "8 GPUs" in v.line()
    j = v.to_json()["calibration"]
    assert j["held_out"] == {"covered": 15, "n": 19} and j["world_size"] == 8
    # the same GPU, one process: its own single-GPU margin, said to be in-sample with its held-out runs
    one = judge(40 * GIB, gpu)
    assert one.margin == 0.02 and one.calibration.status == "calibrated"
    assert "(in-sample; held out: 2/2 covered)" in one.line()


def test_a_single_gpu_margin_lent_to_a_multi_gpu_job_says_so() -> None:
    v = judge(40 * GIB, _x100(), world_size=4)                              # no published margin on the path
    assert v.margin == 0.02 and "single-GPU margin lent to 4 GPUs" in v.line()


def test_an_uncalibrated_gpu_takes_the_published_margin() -> None:
    gpu = GpuSpec(name="X100", memory_bytes=80 * GIB, bf16_tflops=1.0,
                  margins=(dataclasses.replace(SINGLE, default=True),), multi_gpu_margin=PUBLISHED)
    v = judge(40 * GIB, gpu)
    assert v.margin == 0.25 and "(X100 uncalibrated)" in v.line() and "published multi-GPU rows" in v.line()


def test_one_uncalibrated_gpu_takes_the_single_gpu_rows_margin_and_several_the_multi_gpu_one() -> None:
    one_source = PeakMargin(peak="device", margin=0.03, coverage=6 / 7, n=6, calibrated_on="published single-GPU rows",
                            evidence="published single-GPU rows")          # one source: nothing held out
    gpu = GpuSpec(name="X100", memory_bytes=80 * GIB, bf16_tflops=1.0,
                  margins=(dataclasses.replace(SINGLE, default=True),), multi_gpu_margin=PUBLISHED,
                  single_gpu_margin=one_source)
    v = judge(40 * GIB, gpu)
    assert v.margin == 0.03 and v.safe_device_peak_bytes == math.ceil(40 * GIB * 1.03) and v.coverage is None
    assert "from published single-GPU rows (n = 6), in-sample: one source, nothing held out" in v.line()
    several = judge(40 * GIB, gpu, world_size=2)
    assert several.margin == 0.25 and "published multi-GPU rows" in several.line()


def test_the_shipped_estimate_of_a_multi_gpu_job_uses_the_shipped_multi_gpu_margin() -> None:
    out = CliRunner().invoke(cli, ["estimate", "sft", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--num_processes",
                                   "2", "--accelerate_config", "zero3", "--gpu", "H200", "--json"])
    assert out.exit_code == 0, out.output
    v = json.loads(out.output)["verdict"]
    assert v["margin"] == PACKAGE_MULTI["margin"] and v["calibration"]["status"] == "published"
    assert v["calibration"]["held_out"] == {"covered": PACKAGE_MULTI["held_out"]["covered"],
                                            "n": PACKAGE_MULTI["held_out"]["n"]}
