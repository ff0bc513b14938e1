"""Rows past a model's position table: hpcmem refuses the jobs TRL's real SFTTrainer stops on.

The kinds of table come from the real trainer (hpcmem/job/position_limits.json, written by
`python -m hpcmem.lab.position_limits`), held here against the real trainer again and against what transformers'
modeling code says by hand: GPT-2 reads `wpe` (nn.Embedding(n_positions, …)) at each position id; MPT adds an ALiBi
bias built once at `max_seq_len` and sliced by the row (modeling_mpt.py `build_mpt_alibi_tensor`); Llama rotates by
position (RoPE) and has no table. The jobs are stored random jobs (estimator/random/trace.jsonl) with the lengths
changed; every expected number is the job's own arithmetic.
"""

from __future__ import annotations

import copy

import pytest

from hpcmem.errors import SpecError
from hpcmem.job.position_table import limited_by, table
from tests.helpers.random_records import stored_trace_record as stored

pytest.importorskip("torch")

from hpcmem.validate.random_jobs import RandomJob  # noqa: E402
from hpcmem.validate.random_model import job_spec  # noqa: E402
from hpcmem.validate.random_trace import POSITIONS_UNSEEN, score, trace_record  # noqa: E402


def job(job_id: str, **settings) -> RandomJob:
    d = copy.deepcopy(stored(job_id)["job"])
    d["settings"].update(settings)
    for key, value in list(d["settings"].items()):
        if value is None:
            del d["settings"][key]
    return RandomJob.from_dict(d)


def test_the_table_is_the_real_trainers_verdict():
    from hpcmem.lab.position_limits import probe

    expected = {"gpt2": (True, False), "mpt": (True, True), "llama": (False, False)}     # (row raises, packed raises)
    for model_type, (row, packed) in expected.items():
        got = probe(model_type)
        assert got["control"] is None and got["packed_control"] is None, (model_type, got)
        assert (got["row"] is not None, got["packed"] is not None) == (row, packed), (model_type, got)
        shipped = table()["types"][model_type]
        assert (shipped["row"] is not None, shipped["packed"] is not None) == (row, packed), model_type
    assert limited_by("gpt2") == ("sequence",)
    assert limited_by("mpt") == ("sequence", "row")
    assert limited_by("llama") == ()


def test_mpt_packed_row_past_max_seq_len_is_refused():
    # s2-119: packing, 4 sequences × max_length 2003 in one padding-free row = 8,012 tokens; max_seq_len 2048
    with pytest.raises(SpecError) as err:
        job_spec(job("s2-119"))
    text = " ".join(str(err.value).split())
    assert "8012 tokens in one padding-free row" in text and "max_seq_len 2048" in text
    assert "per_device_train_batch_size × max_length ≤ 2048" in text
    job_spec(job("s2-119", per_device_train_batch_size=1))              # 2,003 ≤ 2,048: runs


def test_gpt2_bounds_each_sequence_not_the_packed_row():
    # s3-150: 4 × 403 = 1,612 tokens in one packed row, position ids restart at each sequence (≤ 403 < 1,024)
    job_spec(job("s3-150"))
    with pytest.raises(SpecError) as err:       # one padded row of 1,500 tokens: ids up to 1,499 ≥ n_positions 1,024
        job_spec(job("s3-150", packing=False, padding_free=None, max_length=1500, per_device_train_batch_size=1))
    text = " ".join(str(err.value).split())
    assert "1500 tokens per sequence" in text and "n_positions 1024" in text and "set max_length ≤ 1024" in text


def test_rope_runs_past_its_positions():
    # s1-551 (ministral, max_position_embeddings 131,072): a padded row of 140,000 tokens is not refused
    job_spec(job("s1-551", packing=False, packing_strategy=None, max_length=140_000, per_device_train_batch_size=1))


def test_the_trace_sees_mpts_shape_error_as_the_real_codes_refusal():
    # the fake-tensor trace raises torch's broadcast check inside modeling_mpt.py: the real code's refusal, so the
    # random-job oracle scores hpcmem's refusal as parity (it was a "trace failed" before)
    rec = trace_record(stored("s2-119")["job"])
    assert rec["origin"].startswith("transformers/models/mpt/modeling_mpt.py:"), rec["origin"]
    assert rec["outcome"].startswith("refused: RuntimeError: Attempting to broadcast"), rec["outcome"]
    assert score(rec)["verdict"] == "parity"


def test_a_position_past_an_indexed_table_is_not_judged_by_the_fake_tensor_trace():
    rec = copy.deepcopy(stored("s3-150"))
    rec["job"]["settings"].update(packing=False, max_length=1500, per_device_train_batch_size=1)
    got = score(rec)            # the stored trace "ran": an embedding read past its table raises nothing on fakes
    assert got["verdict"] == "not traced" and POSITIONS_UNSEEN in got["why"]


def test_a_config_without_its_length_key_gets_the_class_default_as_transformers_builds_it(tmp_path, monkeypatch,
                                                                                            capsys):
    """`hpcmem estimate` on an MPT config.json that leaves `max_seq_len` out: MptConfig's default 2,048 sizes the
    ALiBi table (hpcmem's own fallback, 4,096, would let a packed row of 4 × 1,024 = 4,096 through). One line, exit 2."""
    import json

    from hpcmem.cli import run
    from hpcmem.datapath import estimator_dir
    from hpcmem.models.profile import config_hash, profile_filename

    doc = json.loads((estimator_dir() / "coverage-profiles" / "mpt.json").read_text())
    assert "max_seq_len" not in doc["config"]
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / profile_filename("mpt", config_hash(doc["config"]))).write_text(json.dumps(doc))
    (tmp_path / "config.json").write_text(json.dumps(doc["config"]))
    monkeypatch.setenv("HPCMEM_DATA", str(tmp_path))
    base = ["estimate", "sft", "--model_name_or_path", str(tmp_path / "config.json"), "--dtype", "bfloat16",
            "--max_length", "1024", "--packing", "true"]
    capsys.readouterr()
    assert run([*base, "--per_device_train_batch_size", "4"]) == 2
    err = capsys.readouterr().err
    assert "4096 tokens in one padding-free row" in err and "max_seq_len 2048" in err and "Traceback" not in err
    assert err.strip().count("\n") == 0
    assert run([*base, "--per_device_train_batch_size", "2"]) == 0        # 2,048 tokens: runs
