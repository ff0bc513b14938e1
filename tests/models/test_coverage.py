"""Coverage by construction, fast tier (no torch): every causal-LM type of the installed transformers is classified,
every refusal names its reason, learned profiles are found and used without torch, and the CLI says all of it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.models import resolve_model
from hpcmem.models.coverage import classification, coverage_rows, installed_mapping, mapping_from_source, refusal
from hpcmem.models.profile import config_hash, find_profile, profile_from_dict, profile_to_dict, save_profile

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "learned-profile-tiny.json"


def test_every_installed_causal_lm_type_is_classified():
    """The table regenerated from the installed transformers' source (no import): an unclassified type fails."""
    mapping = installed_mapping()
    if mapping is None:
        pytest.skip("transformers is not installed here")
    rows = coverage_rows(mapping)
    assert [r["model_type"] for r in rows] == list(mapping)
    unclassified = [r["model_type"] for r in rows if r["status"] == "unclassified"]
    assert not unclassified, f"classify these in hpcmem/models/coverage.json: {unclassified}"
    assert len(mapping) >= 150


def test_mapping_is_read_from_source_text():
    text = 'X = 1\nMODEL_FOR_CAUSAL_LM_MAPPING_NAMES = OrderedDict(\n    [("a", "AForCausalLM"), ("b", "B")]\n)\n'
    assert mapping_from_source(text) == {"a": "AForCausalLM", "b": "B"}
    with pytest.raises(ValueError, match="not found"):
        mapping_from_source("Y = 2\n")


def test_every_refusal_and_exclusion_names_a_reason():
    for name, entry in classification()["types"].items():
        assert entry["class"] in ("decoder", "multimodal", "not_applicable"), name
        if entry["class"] == "not_applicable":
            assert len(entry["reason"]) > 30, name
        if "refused" in entry:
            assert len(entry["refused"]) > 30, name
        if entry["class"] == "multimodal":
            assert entry["backbone"] in classification()["types"], name
    # hybrids whose kernels are mapped say so (the others are refused with the kernel source named)
    assert refusal("mamba2") is None and "kernels_mamba" in classification()["types"]["mamba2"]["kernels"]
    assert refusal("qwen3_5") is None and "kernels_linear" in classification()["types"]["qwen3_5"]["kernels"]
    assert refusal("llama") is None and refusal("bert").startswith("not applicable")


def test_refused_and_unlearned_types_say_why_and_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCMEM_DATA", str(tmp_path))
    name, entry = next((t, e) for t, e in sorted(classification()["types"].items()) if "refused" in e)
    refused = tmp_path / f"{name}.json"
    refused.write_text(json.dumps({"model_type": name, "hidden_size": 4096}))
    with pytest.raises(SpecError, match="refused: " + re.escape(entry["refused"][:40])):
        resolve_model(str(refused))
    new = tmp_path / "deepseek.json"
    new.write_text(json.dumps({"model_type": "deepseek_v3", "hidden_size": 7168}))
    with pytest.raises(SpecError, match="hpcmem models learn"):
        resolve_model(str(new))
    encoder = tmp_path / "bert.json"
    encoder.write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(SpecError, match="not applicable: a bidirectional encoder"):
        resolve_model(str(encoder))


def _install_fixture(tmp_path: Path) -> Path:
    """The stored tiny profile, saved under the hash of the config it carries, and that config as a file."""
    doc = json.loads(FIXTURE.read_text())
    profile = profile_from_dict(doc)
    save_profile(profile, tmp_path / "profiles")
    config = tmp_path / "config.json"
    config.write_text(json.dumps(doc["config"]))
    return config


def test_profile_round_trips_and_is_found_by_config_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCMEM_DATA", str(tmp_path))
    config = _install_fixture(tmp_path)
    cfg = json.loads(config.read_text())
    assert find_profile(cfg) is not None
    assert find_profile({**cfg, "hidden_size": cfg["hidden_size"] * 2}) is None     # another config, another hash
    assert config_hash({**cfg, "transformers_version": "x", "torch_dtype": "float16"}) == config_hash(cfg)
    doc = json.loads(FIXTURE.read_text())
    assert profile_to_dict(profile_from_dict(doc))["cells"] == doc["cells"]


def test_learned_estimate_is_torch_free_and_labelled(tmp_path):
    config = _install_fixture(tmp_path)
    code = ("import sys, json; from hpcmem.models import resolve_model; from hpcmem.job.trl_config import build_job; "
            "from hpcmem.estimate import estimate; "
            f"job, _ = build_job('sft', {{'model_name_or_path': {str(config)!r}, 'max_length': 64, "
            "'per_device_train_batch_size': 2, 'dtype': 'bfloat16'}); e = estimate(job); "
            "print(json.dumps({'made': e.made, 'torch': 'torch' in sys.modules, 'peak': e.peak_allocated_bytes}))")
    env = {"HPCMEM_DATA": str(tmp_path), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(ROOT)}
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                    env=env).stdout)
    assert out["torch"] is False
    assert out["made"].startswith("learned profile")
    assert out["peak"] > 0


def test_estimate_cli_on_a_learned_config_never_imports_torch(tmp_path):
    """`hpcmem estimate sft --model_name_or_path <config.json>` with the profile `hpcmem models learn` saves for it:
    the CLI runs with torch, transformers and trl made unimportable (an import would fail the command)."""
    config = _install_fixture(tmp_path)
    code = ("import sys; sys.modules.update(dict.fromkeys(('torch', 'transformers', 'trl', 'peft'))); "
            "from hpcmem.cli import main; sys.argv[0] = 'hpcmem'; main()")
    env = {"HPCMEM_DATA": str(tmp_path), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code, "estimate", "sft", "--model_name_or_path", str(config),
                          "--max_length", "512", "--json"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert "learned profile" in json.dumps(doc)


def test_learned_profile_refuses_what_it_did_not_learn(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCMEM_DATA", str(tmp_path))
    from hpcmem.estimate import estimate
    from hpcmem.job.trl_config import build_job

    config = _install_fixture(tmp_path)
    base = {"model_name_or_path": str(config), "max_length": 64, "per_device_train_batch_size": 2}
    with pytest.raises(SpecError, match="selective checkpointing is not learned"):
        estimate(build_job("sft", {**base, "dtype": "bfloat16",
                                   "gradient_checkpointing_kwargs": {"selective": True}})[0])
    with pytest.raises(SpecError, match="only 16-bit compute is learned"):
        estimate(build_job("sft", {**base, "bf16": False})[0])


def test_models_coverage_cli_lists_every_type_with_class_and_status():
    out = subprocess.run([sys.executable, "-m", "hpcmem", "models", "coverage", "--json"], capture_output=True,
                         text=True, check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    every = json.loads(out.stdout)
    rows = [r for r in every if r["task"] == "causal-lm"]
    assert {r["task"] for r in every} == {"causal-lm", "image-text-to-text"}
    mapping = installed_mapping()
    assert {r["model_type"] for r in rows} == set(mapping or classification()["types"])
    for r in rows:
        assert r["class"] in ("decoder", "multimodal", "not_applicable")
        assert r["status"] in ("derived", "learned", "refused", "not applicable")
        assert r["reason"]
    statuses = {r["model_type"]: r["status"] for r in rows}
    assert statuses["llama"] == "derived" and statuses["exaone"] == "derived"
    assert statuses["mamba2"] == "learned" and statuses["gpt_oss"] == "learned" and statuses["qwen3_5"] == "learned"
    assert "refused" in statuses.values()


def test_reduced_depth_candidates_end_on_the_last_layers_kind_when_the_first_does_not():
    from hpcmem.trace.layer_map import candidate_depths, choose_depth

    gemma4 = tuple(1 if i % 6 == 5 else 0 for i in range(30))     # sliding ×5, full — the last layer is full
    # layers 1..5 hold both kinds at D = 7, which ends on a sliding layer; D = 12 ends on a full one like layer 29
    assert choose_depth(gemma4) == 7 and candidate_depths(gemma4) == [7, 12]
    assert candidate_depths((0,) * 32) == [3]                        # one kind: the first depth already ends on it
    olmo3 = (0, 0, 0, 1, 0, 0, 0, 1)
    assert candidate_depths(olmo3) == [5, 8]                         # 8 = the real depth: the full model itself


def test_a_kind_only_the_last_layer_has_is_left_to_the_traced_last_layer_in_a_deep_model():
    from hpcmem.errors import SpecError
    from hpcmem.trace.layer_map import candidate_depths, choose_depth, last_only

    neox_japanese = (0,) * 31 + (1,)        # 32 layers; the last alone adds a dense bias
    assert last_only(neox_japanese) and choose_depth(neox_japanese) == 3 and candidate_depths(neox_japanese) == [3]
    shallow = (0,) * 10 + (1,)              # traced whole, as before
    assert not last_only(shallow) and choose_depth(shallow) == 11
    with pytest.raises(SpecError):          # a kind in the middle that does not repeat within 12 layers still fails
        choose_depth((0,) * 20 + (1,) + (0,) * 11)


def test_coverage_outcomes_count_every_decoder_type_once():
    from hpcmem.validate.coverage import outcomes

    rows = [{"model_type": t, "class": c, "status": s} for t, c, s in (
        ("a", "decoder", "learned"), ("b", "decoder", "derived"), ("c", "multimodal", "learned"),
        ("d", "decoder", "refused"), ("e", "not_applicable", "not applicable"), ("f", "decoder", "learned"),
        ("g", "decoder", "learned"), ("ctrl", "decoder", "learned"), ("openai-gpt", "decoder", "learned"))]
    ok = [{"model_type": "a", "technique": t, "err_pct": 0.5} for t in ("full+gc", "lora+gc", "full gc off")]
    # CTRL's trainer refuses checkpointing (coverage.json "requires"): its two jobs without GC are all it is held to,
    # and it is counted apart; OpenAI-GPT with one of its two is not measured yet
    no_gc = [{"model_type": "ctrl", "technique": t, "err_pct": -1.0} for t in ("full gc off", "lora gc off")]
    records = ok + no_gc + [{"model_type": "openai-gpt", "technique": "full gc off", "err_pct": 0.1},
                            {"model_type": "b", "technique": "full+gc", "err_pct": -3.2},
                    {"model_type": "c", "technique": "full+gc", "err_pct": 0.1},
                    {"model_type": "c", "technique": "lora+gc", "error": "ValueError: x"},
                    {"model_type": "f", "error": "learn: SpecError: y"}]
    got = outcomes(rows, records)
    assert got == {"within 3 %": ["a"], "within 3 % (GC refused)": ["ctrl"], "over 3 %": ["b"], "failed": ["c", "f"],
                   "not measured": ["g", "openai-gpt"], "refused": ["d"]}


@pytest.mark.parametrize("bad, rule", [("x", "must be an integer"), (1e30, "must be an integer")])
def test_learn_refuses_a_config_of_the_wrong_types_in_one_line_before_tracing(tmp_path, bad, rule):
    """The config is checked as `hpcmem estimate` checks it (hpcmem.inputs): exit 2, one line, no traceback."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": bad}))
    done = subprocess.run([sys.executable, "-m", "hpcmem", "models", "learn", str(config)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "hidden_size" in done.stderr and rule in done.stderr


@pytest.mark.parametrize("model_type, says", [
    ("bert", "model_type 'bert' is not applicable: a bidirectional encoder"),
    ("dory", "model_type 'dory' is refused: recurrent-depth layers"),
    ("no_such_type", "model_type 'no_such_type' is not a causal-LM type of the installed transformers"),
])
def test_learn_refuses_what_no_trace_can_learn_before_tracing(tmp_path, model_type, says):
    """A type hpcmem/models/coverage.json refuses or finds not applicable is refused with that reason (the text the
    table holds, written by hand there), and a type transformers cannot build is named: exit 2, one line, within
    seconds — not after minutes of traces that all fail."""
    if installed_mapping() is None:
        pytest.skip("transformers is not installed here")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": model_type}))
    done = subprocess.run([sys.executable, "-m", "hpcmem", "models", "learn", str(config), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and says in done.stderr
    assert not (tmp_path / "profiles").exists()


def test_a_lora_job_on_peft_default_targets_takes_the_cell_traced_on_them():
    """Where the profile holds a `lora-default` cell (traced on peft's default targets), a GC LoRA job whose adapters
    sit there takes it, and one on attention projections nearer them than the reference's; other targets and GC off
    keep the all-linear reference cell. The default cell here carries a
    100 GiB marker in its forward entry, so the estimate shows which cell was read."""
    from dataclasses import replace

    from hpcmem.estimate import estimate
    from hpcmem.job.jobspec import JobSpec
    from hpcmem.job.spec import TrainSpec
    from hpcmem.models.profile import Poly, spec_from_profile

    base = replace(profile_from_dict(json.loads(FIXTURE.read_text())), peft_default_targets=("q_proj", "v_proj"))
    marker = 100 * 2**30
    ref = base.cells["w2a2/lora/gc"]
    cells = {**base.cells, "w2a2/lora-default/gc": replace(ref, forward_entry=ref.forward_entry + Poly(marker, 0, 0))}
    default = {"lora_r": 16, "lora_target_modules": ["q_proj", "v_proj"]}
    profile = replace(base, cells=cells, provenance={**base.provenance, "lora_default": default})

    def peak(p, targets=(), gc=True):
        return estimate(JobSpec(model=spec_from_profile(p, "tiny"), train=TrainSpec(
            trainer="sft", dtype="bfloat16", use_peft=True, lora_target_modules=targets, gradient_checkpointing=gc,
            max_length=64, per_device_train_batch_size=2))).peak_allocated_bytes

    assert peak(profile) - peak(base) >= marker                              # default targets: the default cell
    assert peak(profile, ("v_proj", "q_proj")) - peak(base, ("v_proj", "q_proj")) >= marker     # named alike
    assert peak(profile, ("all-linear",)) == peak(base, ("all-linear",))    # other targets: the reference cell
    # targets nearer the default's than the reference's, the extra ones attention projections: the default cell
    # (hpcmem.estimate.learned `nearer_default_cell`); an extra MLP linear keeps the reference's
    assert peak(profile, ("q_proj", "k_proj")) - peak(base, ("q_proj", "k_proj")) >= marker
    assert peak(profile, ("q_proj", "up_proj")) == peak(base, ("q_proj", "up_proj"))
    assert peak(profile, gc=False) == peak(base, gc=False)                  # no default cell without GC


def _gemma3n_kinds() -> tuple[int, ...]:
    """Gemma-3n E4B's 35 layers by kind, written out from its config's rules (configuration_gemma3n.py
    Gemma3nTextConfig): full attention where (i + 1) % 5 == 0, else sliding; the first 10 layers' MLP sparse (0.95);
    the last 15 reuse the K/V stored by layer 18 (last sliding before them) and layer 19 (last full)."""
    names = []
    for i in range(35):
        full = (i + 1) % 5 == 0
        kv = "reuse" if i >= 20 else "store" if i in (18, 19) else ""
        names.append(("full" if full else "sliding", i < 10, kv))
    order = list(dict.fromkeys(names))
    return tuple(order.index(n) for n in names)


def test_a_kind_first_found_deep_in_the_stack_is_learned_from_a_subsequence_of_the_real_layers():
    from hpcmem.trace.layer_map import choose_depth, subsequence, subsequence_map

    kinds = _gemma3n_kinds()
    with pytest.raises(SpecError):          # no prefix of ≤ 12 layers holds the shared tail's kinds
        choose_depth(kinds)
    # layer 0; the first sparse sliding (1) and sparse full (4); the first dense sliding (10) and full (14); the two
    # stores (18, 19); the first reusing sliding (20) and full (24); the real last layer (34)
    keep = (0, 1, 4, 10, 14, 18, 19, 20, 24, 34)
    assert subsequence(kinds) == keep
    where = subsequence_map(kinds, keep)
    assert [where[j] for j in keep] == list(range(10))           # a kept layer takes its own terms
    assert where[9] == 2 and where[33] == 7 and where[29] == 8   # others the traced layer of their kind
    # grown to 16: each kind's next layers in turn (sparse sliding 2, sparse full 9, dense sliding 11, reusing
    # sliding 21, reusing full 29, sparse sliding 3); the dense full and the stores have no other layer
    assert subsequence(kinds, 16) == (0, 1, 2, 3, 4, 9, 10, 11, 14, 18, 19, 20, 21, 24, 29, 34)


def test_a_subsequence_cut_takes_the_kept_layers_entries_and_counts_the_kept_tail():
    from hpcmem.trace.layer_map import reduced_config

    cfg = {"num_hidden_layers": 6, "layer_types": list("abcdef"), "num_kv_shared_layers": 3,
           "per_layer_config": {"1": "x", "4": "y"}, "hidden_size": 8}
    cut = reduced_config(cfg, "num_hidden_layers", 0, 6, (0, 1, 3, 5))
    # layers 3..5 are the shared tail; 3 and 5 are kept
    assert cut == {"num_hidden_layers": 4, "layer_types": ["a", "b", "d", "f"], "num_kv_shared_layers": 2,
                   "per_layer_config": {"1": "x"}, "hidden_size": 8}


def test_a_coverage_sweep_writes_no_record_for_types_it_does_not_trace(tmp_path):
    """bart is not applicable (a seq2seq decoder) and llama4 refused (coverage.json): the sweep has nothing to measure
    on them, so it reports them and leaves the records file — a committed data file — as it was."""
    from hpcmem.validate.coverage import run

    path = tmp_path / "coverage.jsonl"
    before = '{"model_type": "llama", "technique": "full+gc", "err_pct": 0.1}\n'
    path.write_text(before)
    recs = run(["bart", "llama4"], records=path)
    assert path.read_text() == before
    assert {(r["model_type"], r["status"]) for r in recs} == {("bart", "not applicable"), ("llama4", "refused")}
    assert all(r["skipped"] for r in recs)


def test_validate_coverage_names_the_types_it_did_not_write(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from hpcmem.cli import cli

    monkeypatch.setenv("HPCMEM_ESTIMATOR_DIR", str(tmp_path))
    out = CliRunner().invoke(cli, ["validate", "--against", "coverage", "--types", "bart"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert "0 records appended to estimator/coverage.jsonl; 1 types not traced, not written" in out.output
    assert "bart" in out.output and not (tmp_path / "coverage.jsonl").exists()


def test_the_shipped_coverage_summary_is_the_sweeps():
    """models/coverage_measured.json (what a wheel shows) is what the sweep's records in estimator/ give: rerun
    `hpcmem validate coverage --rescore` (it rewrites both) when this fails."""
    import json

    from hpcmem.models.coverage import SHIPPED_SUMMARY, summary_to_ship
    from hpcmem.validate.coverage import load_records

    assert json.loads(SHIPPED_SUMMARY.read_text()) == json.loads(json.dumps(summary_to_ship(load_records())))


def test_statuses_read_as_what_a_user_does_next():
    from hpcmem.models.coverage import coverage_rows, use_label

    labels = {r["model_type"]: use_label(r) for r in coverage_rows()}
    assert labels["llama"] == "ready"
    assert labels["gpt_oss"].startswith("ready for the catalog's configs")
    assert labels["apertus"] == "run `hpcmem models learn CONFIG` first"
