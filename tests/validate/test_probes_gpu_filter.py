"""`hpcmem validate probes --gpu NAME`: a records file is named by its device's slug (nvidia-h200.jsonl); the catalog
name and its aliases select it too, and a GPU without records says so."""

from __future__ import annotations

from click.testing import CliRunner

from hpcmem.cli import cli
from hpcmem.datapath import estimator_dir
from hpcmem.validate.probes import load

PROBES = estimator_dir() / "probes"


def test_catalog_names_and_the_device_slug_select_the_same_records():
    by_slug = {r.id for r in load([PROBES], gpu="nvidia-h200", estimate=False).records}
    assert len(by_slug) >= 40
    for name in ("H200", "h200", "H200-SXM"):
        assert {r.id for r in load([PROBES], gpu=name, estimate=False).records} == by_slug
    assert not load([PROBES], gpu="H100-80GB", estimate=False).records
    assert {r.device for r in load([PROBES], gpu="cpu", estimate=False).records} == {"cpu"}


def test_a_gpu_without_records_is_named():
    out = CliRunner().invoke(cli, ["validate", "probes", "--gpu", "L40S", "--no-png"])
    assert out.exit_code == 0, out.output
    assert "no records of GPU 'L40S'" in out.output
