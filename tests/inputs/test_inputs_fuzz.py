"""Property-based fuzzing of every input edge, through the real CLI (in process): flags, the TRL YAML, accelerate
configs, presets, length profiles, model config.json files and probe records.

Property: each input ends with exit 0, or exit 2 and a clean error (one line, or one line per gathered problem) —
never a traceback, never the internal-error exit (70), never longer than TIME_LIMIT_S. With --json, every byte count
is an integer. Hypothesis is derandomized (the same inputs in the same order on every run) and each test stops
drawing after its share of the time budget, so the suite costs a fixed ~45 s; counts are printed (`pytest -s`).
HPCMEM_FUZZ_SCALE=20 multiplies budgets and examples for a deeper run by hand.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import signal
import time
import zlib
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hpcmem.cli import run
from hpcmem.job.settings import checkers

TIME_LIMIT_S = 20.0          # per input: far above any legitimate run here (≤ 3 s), so only a hang trips it
# submit's refusals are several lines by design: the verdict (does not fit / tight) or the host-RAM line first, then
# the numbers and the plans that would fit
REFUSALS = ("hpcmem: error: does not fit: ", "hpcmem: error: tight: ", "hpcmem: error: host RAM does not fit: ")
SCALE = float(os.environ.get("HPCMEM_FUZZ_SCALE", "1"))    # e.g. 20 for a deeper local run (budgets and examples)
FUZZ = settings(derandomize=True, deadline=None, database=None, max_examples=int(400 * SCALE),
                suppress_health_check=list(HealthCheck))
ROOT = Path(__file__).resolve().parents[2]
MODEL = ["--model_name_or_path", "Qwen/Qwen2.5-0.5B"]

NASTY = ["", " ", "none", "null", "nan", "inf", "-inf", "1e400", "-1", "0", "1", "1.5", "2147483648",
         "99999999999999999999", "true", "yes", "maybe", "{bad", '{"selective": true}', "[1]", "\x00", "\n", "a\nb",
         "\r", "\t", "$(touch x)", "`x`", "'", '"', "\\", "%j", "~", "~nosuchuser/x", "/dev/zero", "/", ".",
         "x" * 5000, "é", "\u2028", "\udcff", "UNLIMITED", "0", "0-0:-5", "1:2:3:4", "1--5", "zero3", "fsdp2",
         "multi_gpu", "cpu", "nvme", "bfloat16", "auto", "H100-80GB", "L4", "Qwen/Qwen2.5-0.5B", "all-linear",
         "packing", "bfd_split", "wrapped", "colocate", "server", "DEEPSPEED", "FSDP", "NO", "--json"]
text_values = st.one_of(st.sampled_from(NASTY), st.integers(-2**70, 2**70).map(str),
                        st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=12))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.sampled_from(NASTY),
                    st.text(max_size=10))
yaml_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.one_of(st.text(max_size=6), st.integers(), st.booleans()),
                                                 inner, max_size=3)), max_leaves=8)
FIELDS = sorted(checkers())
field_names = st.one_of(st.sampled_from(FIELDS), st.sampled_from(["learning_rate", "env", "output_dir"]),
                        st.text(max_size=6))


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


class Budget:
    """A test's share of the suite's time: once spent, the remaining examples return at once."""

    def __init__(self, name: str, seconds: float) -> None:
        self.name, self.seconds, self.end, self.tried, self.slowest = name, seconds * SCALE, None, 0, 0.0

    def spent(self) -> bool:
        if self.end is None:
            self.end = time.monotonic() + self.seconds
        return time.monotonic() > self.end

    def report(self) -> None:
        print(f"\nfuzz {self.name}: {self.tried} inputs, slowest {self.slowest:.2f} s")


def check(budget: Budget, argv: list[str]) -> tuple[int, str]:
    """Run one command; assert the property; return (exit status, stdout)."""
    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT_S)
    start = time.monotonic()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = run(argv)
    except Hang:
        pytest.fail(f"no answer within {TIME_LIMIT_S} s: hpcmem {argv!r}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    budget.tried += 1
    budget.slowest = max(budget.slowest, time.monotonic() - start)
    text = err.getvalue()
    assert "Traceback" not in text and status != 70, f"hpcmem {argv!r}:\n{text}{_traceback(argv)}"
    assert status in (0, 2), (status, argv, text)
    if status == 2:     # one line; or one per gathered problem; or submit's refusal with the fixes that would fit
        lines = text.rstrip("\n").split("\n")
        assert lines[0].startswith("hpcmem: error: "), (argv, text)
        assert lines[0].startswith(REFUSALS) or all(x.startswith("- ") for x in lines[1:]), (argv, text)
    return status, out.getvalue()


def _traceback(argv: list[str]) -> str:
    """The traceback of a bug, for the failure message (HPCMEM_DEBUG=1 lets it through)."""
    import traceback

    os.environ["HPCMEM_DEBUG"] = "1"
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            run(argv)
    except Exception:  # noqa: BLE001 - it is what we came for
        return traceback.format_exc()
    finally:
        del os.environ["HPCMEM_DEBUG"]
    return ""


def integer_bytes(doc) -> None:
    """Every byte count of a --json answer is an int (keys ending in _bytes, components, phases)."""
    stack = [(doc, "")]
    while stack:
        item, key = stack.pop()
        if isinstance(item, dict):
            stack.extend((v, k if key not in ("components", "phases") else key) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, key) for v in item)
        elif key.endswith("_bytes") or key in ("components", "phases"):
            assert item is None or (isinstance(item, int) and not isinstance(item, bool)), (key, item)


# ---- flags ------------------------------------------------------------------------------------------------------
FLAG_NAMES = [f"--{f}" for f in FIELDS if f not in ("model_name_or_path",)] + [
    "--gpu", "--accelerate_config", "--lengths", "--config", "--model_name_or_path"]
PLAN_FLAGS = ["--global_batch_size", "--top"]
SUBMIT_FLAGS = ["--time", "--account", "--qos", "--job-name", "--env", "--entry", "--max-restarts", "--runs-dir"]
ESTIMATE_BUDGET = Budget("estimate flags", 8)


@FUZZ
@given(trainer=st.sampled_from(["sft", "dpo", "reward", "grpo", "rloo"]),
       flags=st.lists(st.tuples(st.sampled_from(FLAG_NAMES), text_values), max_size=4))
def test_fuzz_estimate_flags(trainer, flags):
    if ESTIMATE_BUDGET.spent():
        return
    argv = ["estimate", trainer, *MODEL, "--gpu", "H100-80GB", *[x for pair in flags for x in pair], "--json"]
    status, out = check(ESTIMATE_BUDGET, argv)
    if status == 0:
        integer_bytes(json.loads(out))


PLAN_BUDGET = Budget("plan / submit flags", 8)


@FUZZ
@given(command=st.sampled_from(["plan", "submit"]),
       flags=st.lists(st.tuples(st.sampled_from(FLAG_NAMES + PLAN_FLAGS + SUBMIT_FLAGS), text_values), max_size=3))
def test_fuzz_plan_and_submit_flags(tmp_path_factory, command, flags):
    if PLAN_BUDGET.spent():
        return
    runs = tmp_path_factory.mktemp("runs")
    # a fuzzed --runs-dir stays inside the test's folder: submit writes the run folder there
    flags = [(f, str(runs / v.replace("..", "__").lstrip("/~")) if f == "--runs-dir" else v) for f, v in flags]
    extra = [x for pair in flags for x in pair if not (command == "plan" and pair[0] in SUBMIT_FLAGS)
             and not (command == "submit" and pair[0] in PLAN_FLAGS)]
    if command == "plan":
        argv = ["plan", "sft", *MODEL, "--gpu", "H100-80GB", *extra, "--json"]
    else:
        argv = ["submit", "sft", *MODEL, "--preset", "example-h100", "--dry-run", "--runs-dir", str(runs), *extra]
    status, out = check(PLAN_BUDGET, argv)
    if status == 0 and command == "plan":
        integer_bytes(json.loads(out))


# ---- files ------------------------------------------------------------------------------------------------------
def _write(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.write_bytes(data)
    return path


def _dump(doc) -> bytes:
    return yaml.safe_dump(doc, allow_unicode=True).encode("utf-8", "surrogatepass")


raw_bytes = st.one_of(st.binary(max_size=64), st.sampled_from([
    b"a: &a [1,1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    b"d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: [*e,*e,*e,*e,*e,*e]\n",
    b"a: &a [*a]\n", b"[" * 3000 + b"]" * 3000, b"{" * 3000, b'{"a":' * 2000 + b"1" + b"}" * 2000,
    b"\xff\xfe\x00", b"? [1, 2]\n: 3\n", b"- 1\n- 2\n", b"!!python/object:os.system {}\n", b"a: !!binary AAAA\n",
    b"a: 2024-01-01\n", b"--- a\n--- b\n"]))
YAML_BUDGET = Budget("TRL YAML (--config)", 6)


@FUZZ
@given(doc=st.one_of(st.dictionaries(field_names, yaml_values, max_size=5), raw_bytes))
def test_fuzz_trl_yaml(tmp_path_factory, doc):
    if YAML_BUDGET.spent():
        return
    folder = tmp_path_factory.mktemp("yaml")
    data = doc if isinstance(doc, bytes) else _dump({**doc, "model_name_or_path": doc.get("model_name_or_path",
                                                                                          "Qwen/Qwen2.5-0.5B")})
    check(YAML_BUDGET, ["estimate", "sft", "--config", str(_write(folder, "c.yaml", data)), "--json"])


ACCEL_BUDGET = Budget("accelerate configs", 3)
accel_docs = st.fixed_dictionaries({}, optional={
    "distributed_type": st.one_of(st.sampled_from(["NO", "MULTI_GPU", "DEEPSPEED", "FSDP"]), yaml_values),
    "num_processes": st.one_of(st.integers(-3, 16), yaml_values), "num_machines": yaml_values,
    "deepspeed_config": st.one_of(st.fixed_dictionaries({}, optional={
        "zero_stage": st.one_of(st.integers(-1, 4), yaml_values), "offload_optimizer_device": yaml_values,
        "offload_param_device": yaml_values}), yaml_values),
    "fsdp_config": st.one_of(st.fixed_dictionaries({}, optional={"fsdp_version": yaml_values,
                                                                 "fsdp_offload_params": yaml_values}), yaml_values)})


@FUZZ
@given(doc=st.one_of(accel_docs, raw_bytes))
def test_fuzz_accelerate_config(tmp_path_factory, doc):
    if ACCEL_BUDGET.spent():
        return
    path = _write(tmp_path_factory.mktemp("accel"), "a.yaml", doc if isinstance(doc, bytes) else _dump(doc))
    check(ACCEL_BUDGET, ["estimate", "sft", *MODEL, "--accelerate_config", str(path), "--json"])


def _mutated(base: dict, edits: list[tuple[list, object]]) -> dict:
    """`base` with each (path, value) applied: value DELETE removes the key; a path through a non-mapping stops."""
    doc = json.loads(json.dumps(base))
    for path, value in edits:
        node = doc
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
            if not isinstance(node, (dict, list)):
                break
        else:
            last = path[-1]
            if isinstance(node, dict) and value is DELETE:
                node.pop(last, None)
            elif isinstance(node, dict):
                node[last] = value
            elif isinstance(node, list) and isinstance(last, int) and node:
                node[last % len(node)] = None if value is DELETE else value
    return doc


DELETE = object()
edit_values = st.one_of(yaml_values, st.just(DELETE))
PRESET_BASE = yaml.safe_load((ROOT / "hpcmem/presets/example-h100.yaml").read_text())
preset_paths = st.one_of(st.sampled_from([[k] for k in PRESET_BASE] + [["container", k] for k in PRESET_BASE[
    "container"]] + [["env", "HF_HOME"], ["defaults", "attn_implementation"], ["container", "mounts", 0]]),
    st.lists(st.text(max_size=5), min_size=1, max_size=2))
PRESET_BUDGET = Budget("presets", 6)


@FUZZ
@given(edits=st.lists(st.tuples(preset_paths, edit_values), min_size=1, max_size=3), raw=st.one_of(st.none(),
                                                                                                  raw_bytes))
@example(edits=[(["defaults"], None), (["signal_lead_s"], None)], raw=None)     # found here: null kept as a value
def test_fuzz_presets(tmp_path_factory, edits, raw):
    if PRESET_BUDGET.spent():
        return
    folder = tmp_path_factory.mktemp("preset")
    data = raw if raw is not None else _dump(_mutated(PRESET_BASE, edits))
    path = _write(folder, "site.yaml", data)
    check(PRESET_BUDGET, ["presets", "show", str(path), "--json"])
    check(PRESET_BUDGET, ["submit", "sft", *MODEL, "--preset", str(path), "--dry-run", "--runs-dir",
                          str(folder / "runs")])


PROFILE_BASE = json.loads((ROOT / "hpcmem/examples/lengths-sft.json").read_text())
profile_paths = st.sampled_from([["schema"], ["source"], ["source", "trainer"], ["histogram"], ["histogram", 0],
                                 ["histogram", 3], ["order"], ["order", "encoding"], ["order", "parts"],
                                 ["order", "parts", "length"], ["order", "parts", "prompt"], ["candidates"],
                                 ["candidates", 1], ["candidates", 1, "strategies"], ["candidates", 1, "max_length"],
                                 ["examples"]])
blobs = st.one_of(st.binary(max_size=40).map(lambda b: base64.b64encode(b).decode()),
                  st.just(base64.b64encode(zlib.compress(b"\0" * 2**26)).decode()))     # a 64 MiB zlib bomb
PROFILE_BUDGET = Budget("length profiles", 5)


@FUZZ
@given(edits=st.lists(st.tuples(profile_paths, st.one_of(edit_values, blobs)), min_size=1, max_size=3),
       settings_=st.lists(st.tuples(st.sampled_from(["--max_length", "--per_device_train_batch_size",
                                                     "--packing", "--padding_free", "--packing_strategy",
                                                     "--pad_to_multiple_of"]), text_values), max_size=2))
def test_fuzz_length_profiles(tmp_path_factory, edits, settings_):
    if PROFILE_BUDGET.spent():
        return
    path = _write(tmp_path_factory.mktemp("profile"), "p.json",
                  json.dumps(_mutated(PROFILE_BASE, edits)).encode())
    status, out = check(PROFILE_BUDGET, ["estimate", "sft", *MODEL, "--lengths", str(path),
                                         *[x for pair in settings_ for x in pair], "--json"])
    if status == 0:
        integer_bytes(json.loads(out))


CONFIG_BASE = json.loads((ROOT / "hpcmem/models/catalog/Qwen--Qwen2.5-0.5B.json").read_text())["config"]
config_paths = st.one_of(st.sampled_from([[k] for k in CONFIG_BASE] + [["text_config"], ["mlp_only_layers"]]),
                         st.lists(st.text(max_size=5), min_size=1, max_size=1))
CONFIG_BUDGET = Budget("model config.json", 4)


@FUZZ
@given(edits=st.lists(st.tuples(config_paths, edit_values), min_size=1, max_size=3),
       model_type=st.sampled_from(["qwen2", "llama", "gemma3_text", "qwen3_moe", "mixtral", "phi3", "gemma3"]))
# found here (past the usual time budget): a model_type that is not text beside a text_config was hashed
@example(edits=[(["model_type"], ["llama"]), (["text_config"], {"model_type": "llama"})], model_type="qwen2")
def test_fuzz_model_configs(tmp_path_factory, edits, model_type):
    if CONFIG_BUDGET.spent():
        return
    doc = _mutated({**CONFIG_BASE, "model_type": model_type}, edits)
    path = _write(tmp_path_factory.mktemp("model"), "config.json", json.dumps(doc).encode())
    status, out = check(CONFIG_BUDGET, ["estimate", "sft", "--model_name_or_path", str(path), "--json"])
    if status == 0:
        integer_bytes(json.loads(out))


RECORDS_BASE = [json.loads(line) for line in (ROOT / "estimator/probes/cpu.jsonl").read_text().splitlines()[:2]]
record_paths = st.sampled_from([["job"], ["job", "train"], ["job", "model"], ["job", "train", "trainer"],
                                ["status"], ["measured"], ["measured", "peak_allocated_bytes"], ["estimate"],
                                ["gpu"], ["gpu", "gpu_name"], ["env"], ["id"], ["run"], ["estimate", "per_gpu"],
                                ["estimate", "per_gpu", "device_peak_bytes"], ["measured", "oom"],
                                ["run", "capacity_bytes"], ["excluded"], ["source"], ["device"], ["case"]])
RECORDS_BUDGET = Budget("probe records", 3)


@FUZZ
@given(edits=st.lists(st.tuples(record_paths, edit_values), min_size=1, max_size=3), raw=st.one_of(st.none(),
                                                                                                  raw_bytes))
@example(edits=[(["job"], None)], raw=None)          # found here: a record without its job
@example(edits=[(["job"], {})], raw=None)
def test_fuzz_probe_records(tmp_path_factory, edits, raw):
    if RECORDS_BUDGET.spent():
        return
    lines = raw if raw is not None else "\n".join(json.dumps(_mutated(r, edits)) for r in RECORDS_BASE).encode()
    path = _write(tmp_path_factory.mktemp("records"), "cpu.jsonl", lines)
    check(RECORDS_BUDGET, ["validate", "--records", str(path), "--no-png", "--stored", "--json"])


@pytest.fixture(scope="module", autouse=True)
def _counts(tmp_path_factory):
    """Run from a scratch folder (whatever a fuzzed relative path creates lands there); print the counts."""
    yield from in_scratch_folder(tmp_path_factory, (ESTIMATE_BUDGET, PLAN_BUDGET, YAML_BUDGET, ACCEL_BUDGET,
                                                    PRESET_BUDGET, PROFILE_BUDGET, CONFIG_BUDGET, RECORDS_BUDGET))


def in_scratch_folder(tmp_path_factory, budgets):
    """A module fixture's body: run from a scratch folder, then print each budget's counts."""
    home = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    try:
        yield
    finally:
        os.chdir(home)
    for budget in budgets:
        budget.report()
