"""Site presets: strict validation, the search path, SLURM time formats, and `presets check` on recorded output."""

from __future__ import annotations

import pytest
import yaml

from hpcmem.errors import HpcmemError, SpecError
from hpcmem.launch import presets
from tests.helpers.launch_helpers import PRESET, Recorder, preset

SHIPPED = sorted(presets.SHIPPED_DIR.glob("*.yaml"))


def test_shipped_presets_are_valid_and_listed():
    assert len(SHIPPED) >= 2
    for path in SHIPPED:
        p = presets.load(path)
        assert p.name == path.stem and p.gpu_spec().memory_bytes > 0
    assert {p.stem for p in SHIPPED} <= {p.stem for p in presets.available()}


def test_unknown_key_names_the_file_and_the_allowed_keys(tmp_path):
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump({**PRESET, "gpus": 4, "partiton": "x"}))
    with pytest.raises(SpecError) as err:
        presets.load(path)
    text = str(err.value)
    assert f"preset {path}: unknown key 'gpus'" in text and "unknown key 'partiton'" in text
    assert "allowed keys: name, partition, gpu, gpus_per_node" in text


def test_every_problem_is_reported_together(tmp_path):
    bad = {"partition": "gpu", "gpu": "H100-80GB", "gpus_per_node": 0, "cpus_per_node": "many", "max_time": "soon",
           "gpu_request": "gpus", "container": {"kind": "docker", "image": "x", "tag": 1}, "defaults": {"lr": 1}}
    with pytest.raises(SpecError) as err:
        presets.from_dict(bad, source="s.yaml", default_name="s")
    assert len(err.value.problems) == 7, err.value.problems
    assert any("defaults has unknown field 'lr'" in p for p in err.value.problems)


def test_unquoted_time_is_refused(tmp_path):
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump({**PRESET, "max_time": None}).replace("max_time: null", "max_time: 12:00:00"))
    with pytest.raises(SpecError, match="max_time must be quoted text .*got the number 43200"):
        presets.load(path)


def test_gpu_must_be_in_the_catalog():
    with pytest.raises(SpecError, match="gpu 'H900' is not in the GPU catalog"):
        presets.from_dict({**PRESET, "gpu": "H900"}, source="s.yaml", default_name="s")


def test_search_path_env_first_then_shipped(tmp_path, monkeypatch):
    first, second = tmp_path / "a", tmp_path / "b"
    for folder, partition in ((first, "first"), (second, "second")):
        folder.mkdir()
        (folder / "site.yaml").write_text(yaml.safe_dump({**PRESET, "partition": partition}))
    monkeypatch.setenv(presets.ENV_PRESETS, f"{first}:{second}")
    assert presets.load("site").partition == "first"
    assert presets.load("example-h100").source.endswith("hpcmem/presets/example-h100.yaml")
    assert presets.load(second / "site.yaml").partition == "second"        # a FILE is read as given
    with pytest.raises(HpcmemError, match="preset 'nope' not found; looked in .*available: .*example-h100"):
        presets.load("nope")


# Expected minutes worked by hand from SLURM's rules (src/common/parse_time.c time_str2secs / time_str2mins: seconds
# round up; src/common/slurm_opt.c arg_set_time_limit: 0 means no limit, written None here).
@pytest.mark.parametrize("text,minutes", [
    ("30", 30), ("1:30", 2), ("0:59", 1), ("02:00:00", 120), ("1:2:3", 63), ("1-00", 1440), ("1-2", 1560),
    ("1-02:30", 1590), ("1-2:3:4", 1564), ("2-00:00:00", 2880), ("5-", 7200), ("0", None), ("0:0:0", None),
    ("-0", None), ("-1", None), ("UNLIMITED", None), ("infinite", None),
])
def test_slurm_time_formats(text, minutes):
    from hpcmem.launch import slurm_time

    limit = slurm_time.parse(text)
    assert (limit.text, limit.minutes) == (text, minutes)


@pytest.mark.parametrize("text", ["garbage", "", " 5", "1:2:3:4", "0-0:-5", "1--5", "1:-5", "-5", "-2-00:00:00",
                                  "1-2:3:4:5", ":5", "5:", "1:2-3", "+5", "99999999999", "30000-00:00:00"])
def test_slurm_time_refusals_name_the_text_and_the_rule(text):
    from hpcmem.launch import slurm_time

    with pytest.raises(ValueError) as err:
        slurm_time.parse(text)
    assert repr(text) in str(err.value) and "\n" not in str(err.value)


def test_preset_check_with_recorded_slurm_output():
    from hpcmem.launch.preset_check import check, parse_gres

    assert parse_gres("gpu:h100:8(S:0-1),gpu:a100:2") == {"h100": 8, "a100": 2} and parse_gres("(null)") == {}
    rec = Recorder({
        ("scontrol", "show", "partition"): (0, "PartitionName=gpu MaxNodes=UNLIMITED MaxTime=2-00:00:00 State=UP\n", ""),
        ("sinfo",): (0, "n1|64|512000|gpu:8|ib\nn2|64|512000|gpu:4|ib\n", ""),
    })
    results = {c.what.split()[0]: c for c in check(preset(max_nodes=2), runner=rec)}
    assert all(c.ok for c in results.values()), results
    assert results["gpus_per_node"].cluster == "4–8 (1/2 nodes have ≥ 8)"
    bad = {c.what.split()[0] for c in check(preset(gpus_per_node=16, max_time="3-00:00:00"), runner=rec) if not c.ok}
    assert bad == {"gpus_per_node", "max_time"}
