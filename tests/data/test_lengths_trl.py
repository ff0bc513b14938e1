"""Torch tier of the length profiler: real datasets, a tokenizer trained in-process, TRL's own trainers and
`trl.pack_dataset`. Known length distributions are checked against hand calculation; tokenization against what
SFTTrainer / DPOTrainer / RewardTrainer produce; packed rows against `trl.pack_dataset` run here directly."""

from __future__ import annotations

import json
import os
import random
import sys

import pytest

pytest.importorskip("trl")
pytestmark = pytest.mark.torch
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import datasets  # noqa: E402

from hpcmem.data.profile import decode_lengths, label_tokens_per_micro_batch, tokens_per_micro_batch  # noqa: E402
from hpcmem.data.profiler import profile_dataset  # noqa: E402
from tests.helpers.cli_main import run_main

WORDS = [f"w{i}" for i in range(300)]
CHAT = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} </s> {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|> {% endif %}")


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choices(WORDS, k=n))


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("lengths")


@pytest.fixture(scope="module")
def tok_dir(tmp):
    """WordLevel over whitespace: one token per word, so a text of n words + the EOS TRL appends is n + 1 tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    specials = ["[UNK]", "<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
    tok.train_from_iterator([" ".join(WORDS)], trainers.WordLevelTrainer(special_tokens=specials))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>")
    fast.chat_template = CHAT
    fast.save_pretrained(str(tmp / "tok"))
    return str(tmp / "tok")


@pytest.fixture(scope="module")
def ramp(tmp):
    """400 examples in order whose token counts are exactly 1, 2, …, 400 (k - 1 words + EOS)."""
    rng = random.Random(0)
    path = tmp / "ramp.jsonl"
    path.write_text("".join(json.dumps({"text": _words(rng, k - 1)}) + "\n" for k in range(1, 401)))
    return str(path)


def _run_cli(args, capsys):
    return run_main(args, capsys)


def test_ramp_percentiles_truncation_and_padding_by_hand(ramp, tok_dir, tmp):
    p = profile_dataset(ramp, tok_dir, per_device_train_batch_size=4, cache_dir=str(tmp / "cache"))
    s = p["stats"]
    # lengths 1…400: pXX = ceil(XX % · 400)-th length
    assert (s["count"], s["min"], s["max"], s["mean"]) == (400, 1, 400, 200.5)
    assert [s[k] for k in ("p50", "p90", "p95", "p99", "p99.9")] == [200, 360, 380, 396, 400]
    rows = {c["max_length"]: c for c in p["candidates"]}
    assert sorted(m for m in rows if m) == [128, 256, 380, 396, 512]
    # no truncation: micro-batch j holds 4j+1 … 4j+4 → 4 × (4j+4) tensor tokens, 6 of them padding
    padded = rows[None]["strategies"]["padded"]
    assert padded["tensor_tokens"] == 16 * 5050 and padded["tokens"] == 80200
    assert padded["padding_fraction"] == pytest.approx(600 / 80800)
    assert (padded["worst_tokens_per_micro_batch"], padded["typical_tokens_per_micro_batch"]) == (1600, 800)
    # max_length 256: 144 examples cut, losing 1 + 2 + … + 144 tokens; the cut batches are 4 × 256 with no padding
    cut = rows[256]
    assert (cut["truncated_examples"], cut["tokens_lost"]) == (144, 144 * 145 // 2)
    assert cut["strategies"]["padded"]["worst_tokens_per_micro_batch"] == 1024
    assert cut["strategies"]["padded"]["tensor_tokens"] == 16 * sum(range(1, 65)) + 36 * 1024
    free = cut["strategies"]["padding_free"]
    assert (free["padding_fraction"], free["worst_tokens_per_micro_batch"]) == (0.0, 1024)
    assert cut["strategies"]["bfd"]["tokens_lost"] == cut["tokens_lost"]
    assert cut["strategies"]["bfd_split"]["tokens_lost"] == cut["strategies"]["wrapped"]["tokens_lost"] == 0
    assert rows[512]["strategies"]["bfd_split"]["same_as"] == "bfd"           # nothing longer than 512
    ask = dict(per_device_train_batch_size=4, packing=False, packing_strategy="bfd", padding_free=False,
               pad_to_multiple_of=None)
    assert tokens_per_micro_batch(p, max_length=300, **ask) == 1200
    assert tokens_per_micro_batch(p, max_length=None, **{**ask, "per_device_train_batch_size": 8}) == 3200


def test_packed_rows_are_those_of_trl_pack_dataset_run_directly(tok_dir, tmp):
    from transformers import AutoTokenizer
    from trl import pack_dataset

    rng = random.Random(1)
    texts = [_words(rng, int(rng.lognormvariate(4, 0.9))) for _ in range(2500)]   # 3 map batches, a long tail
    path = tmp / "tail.parquet"
    datasets.Dataset.from_dict({"text": texts}).to_parquet(str(path))
    p = profile_dataset(str(path), tok_dir, max_lengths=[100], cache_dir=str(tmp / "cache"))
    tok = AutoTokenizer.from_pretrained(tok_dir)
    ids = datasets.Dataset.from_dict({"input_ids": [tok(t + "</s>")["input_ids"] for t in texts]})
    checked = 0
    for cand in p["candidates"]:
        for strategy in ("bfd", "bfd_split", "wrapped") if cand["max_length"] else ():
            theirs = [len(r) for r in pack_dataset(ids, cand["max_length"], strategy)["input_ids"]]
            entry = cand["strategies"][strategy]
            mine = decode_lengths(cand["strategies"][entry.get("same_as", strategy)]["row_lengths"])
            assert mine == theirs and entry["rows"] == len(theirs), (cand["max_length"], strategy)
            checked += 1
    assert checked >= 12 and any(c["label"].startswith("asked") for c in p["candidates"])


def test_parallel_packing_matches_serial(monkeypatch):
    from hpcmem.data import packing

    rng = random.Random(2)
    lengths = [rng.randint(1, 300) for _ in range(3000)]
    jobs = [(128, "bfd"), (128, "bfd_split"), (256, "wrapped")]
    serial = packing.pack_all(lengths, jobs, num_proc=1)
    monkeypatch.setattr(packing, "PARALLEL_MIN_EXAMPLES", 10)
    assert packing.pack_all(lengths, jobs, num_proc=2) == serial


def _datasets(rng):
    def msgs(n_user, n_assistant):
        return [{"role": "user", "content": _words(rng, n_user)},
                {"role": "assistant", "content": _words(rng, n_assistant)}]

    n = 30
    shared = [msgs(rng.randint(1, 9), 1)[:1] for _ in range(n)]   # the implicit prompt both answers share
    return {
        "sft_text": {"text": [_words(rng, rng.randint(1, 60)) for _ in range(n)]},
        "sft_messages": {"messages": [msgs(rng.randint(1, 20), rng.randint(1, 40)) for _ in range(n)]},
        "sft_pc": {"prompt": [_words(rng, rng.randint(1, 20)) for _ in range(n)],
                   "completion": [" " + _words(rng, rng.randint(1, 40)) for _ in range(n)]},
        "sft_conv_pc": {"prompt": [msgs(3, 2)[:1] for _ in range(n)],
                        "completion": [msgs(1, rng.randint(1, 30))[1:] for _ in range(n)]},
        "pref": {"prompt": [_words(rng, rng.randint(1, 20)) for _ in range(n)],
                 "chosen": [" " + _words(rng, rng.randint(1, 40)) for _ in range(n)],
                 "rejected": [" " + _words(rng, rng.randint(1, 40)) for _ in range(n)]},
        "pref_implicit_chat": {"chosen": [p + msgs(1, rng.randint(1, 30))[1:] for p in shared],
                               "rejected": [p + msgs(1, rng.randint(1, 30))[1:] for p in shared]},
    }


def _trl_trainer(trainer: str, data, tok, out_dir, **config):
    """A real TRL 1.16 trainer around a 1-layer random Llama (CPU), so its own _prepare_dataset and collator run."""
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification
    from trl import DPOConfig, DPOTrainer, RewardConfig, RewardTrainer, SFTConfig, SFTTrainer

    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, pad_token_id=tok.pad_token_id)
    args = dict(output_dir=str(out_dir), report_to=[], use_cpu=True, bf16=False, **{"max_length": None, **config})
    if trainer == "sft":
        return SFTTrainer(model=LlamaForCausalLM(cfg), args=SFTConfig(**args), train_dataset=data, processing_class=tok)
    if trainer == "dpo":
        return DPOTrainer(model=LlamaForCausalLM(cfg), ref_model=LlamaForCausalLM(cfg), args=DPOConfig(**args),
                          train_dataset=data, processing_class=tok)
    model = LlamaForSequenceClassification(LlamaConfig(**{**cfg.to_dict(), "num_labels": 1, "id2label": {0: "r"}}))
    return RewardTrainer(model=model, args=RewardConfig(**args), train_dataset=data, processing_class=tok)


@pytest.mark.parametrize("trainer,name", [("sft", "sft_text"), ("sft", "sft_messages"), ("sft", "sft_pc"),
                                          ("sft", "sft_conv_pc"), ("dpo", "pref"), ("dpo", "pref_implicit_chat"),
                                          ("reward", "pref")])
def test_lengths_are_what_the_trl_trainer_tokenizes(trainer, name, tok_dir, tmp):
    from transformers import AutoTokenizer

    from hpcmem.data.tokenize import tokenize_lengths

    tok = AutoTokenizer.from_pretrained(tok_dir)
    data = datasets.Dataset.from_dict(_datasets(random.Random(3))[name])
    td = _trl_trainer(trainer, data, tok, tmp / "out").train_dataset
    if trainer == "sft":
        theirs = {"length": [len(x) for x in td["input_ids"]]}
        if "prompt" in data.column_names:   # the prompt part is what completion_only_loss masks out
            theirs["prompt"] = [sum(1 for label in x if label == -100) for x in td["labels"]]
    elif trainer == "dpo":
        theirs = {"prompt": [len(x) for x in td["prompt_ids"]],
                  **{k: [len(a) + len(b) for a, b in zip(td["prompt_ids"], td[f"{k}_ids"])]
                     for k in ("chosen", "rejected")}}
    else:
        theirs = {k: [len(x) for x in td[f"{k}_ids"]] for k in ("chosen", "rejected")}
    _, mine = tokenize_lengths(data, tok, trainer=trainer)
    for part, values in theirs.items():
        assert mine[part] == values, part


@pytest.mark.parametrize("trainer,name,config", [
    ("sft", "sft_text", {}),
    ("sft", "sft_text", {"padding_free": True}),
    ("sft", "sft_pc", {"max_length": 20, "pad_to_multiple_of": 8}),     # cuts, drops (prompt ≥ 20), rounding
    ("sft", "sft_text", {"max_length": 64, "packing": True, "packing_strategy": "bfd"}),
    ("sft", "sft_text", {"max_length": 40, "packing": True, "packing_strategy": "bfd_split"}),
    ("sft", "sft_text", {"max_length": 64, "packing": True, "packing_strategy": "wrapped"}),
    ("dpo", "pref", {"max_length": 30}),
    ("reward", "pref", {"max_length": 40}),
])
def test_worst_micro_batch_is_the_largest_batch_trl_collates(trainer, name, config, tok_dir, tmp):
    """tokens_per_micro_batch = max over TRL's own collated micro-batches (in order) of input_ids.numel()."""
    from transformers import AutoTokenizer

    from hpcmem.data.profiler import build_profile
    from hpcmem.data.tokenize import tokenize_lengths

    batch = 4
    tok = AutoTokenizer.from_pretrained(tok_dir)
    data = datasets.Dataset.from_dict(_datasets(random.Random(5))[name])
    t = _trl_trainer(trainer, data, tok, tmp / "out", per_device_train_batch_size=batch, **config)
    rows = [t.train_dataset[i] for i in range(len(t.train_dataset))]
    theirs = max(t.data_collator(rows[i:i + batch])["input_ids"].numel() for i in range(0, len(rows), batch))
    _, parts = tokenize_lengths(data, tok, trainer=trainer)
    extra = [config["max_length"]] if config.get("max_length") else []
    profile = build_profile(parts, source={"trainer": trainer}, per_device_train_batch_size=batch,
                            pad_to_multiple_of=None, max_lengths=extra)
    ask = {"max_length": None, "packing": False, "packing_strategy": "bfd", "padding_free": False,
           "pad_to_multiple_of": None, **config}
    assert tokens_per_micro_batch(json.loads(json.dumps(profile)), per_device_train_batch_size=batch, **ask) == theirs


def test_grpo_prompt_lengths_include_the_generation_prompt(tok_dir):
    from transformers import AutoTokenizer

    from hpcmem.data.tokenize import tokenize_lengths

    tok = AutoTokenizer.from_pretrained(tok_dir)
    data = datasets.Dataset.from_dict({"prompt": [[{"role": "user", "content": "w1 w2 w3"}]] * 2 + [[
        {"role": "system", "content": "w4"}, {"role": "user", "content": "w5"}]]})
    fmt, parts = tokenize_lengths(data, tok, trainer="grpo")
    # <|user|> w1 w2 w3 </s> <|assistant|>  and  <|system|> w4 </s> <|user|> w5 </s> <|assistant|>
    assert (fmt, parts["prompt"]) == ("conversational_prompt", [6, 6, 7])


def test_fast_count_equals_the_tokenizer_call_with_special_tokens_and_a_bos_processor(tok_dir):
    from tokenizers import processors
    from transformers import AutoTokenizer

    from hpcmem.data.tokenize import text_lengths

    tok = AutoTokenizer.from_pretrained(tok_dir)
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.convert_tokens_to_ids("<s>"))])
    tok.backend_tokenizer.enable_truncation(3)   # __call__ turns it off; the count must as well
    texts = ["w1 w2 w3 w4 w5", "w1</s>w2 </s>", "", "<|user|> w9 zz"]
    assert text_lengths(tok, texts) == [len(tok(t)["input_ids"]) for t in texts] == [6, 5, 1, 4]
    assert text_lengths(tok, texts, add_special_tokens=False) == [5, 4, 0, 3]


def test_formats_folders_and_splits(tok_dir, tmp, capsys):
    rows = {"text": ["w1 w2", "w3", "w4 w5 w6"]}
    ds = datasets.Dataset.from_dict(rows)
    ds.to_csv(str(tmp / "d.csv"), index=False)
    (tmp / "d.json").write_text(json.dumps([{"text": t} for t in rows["text"]]))
    ds.save_to_disk(str(tmp / "saved"))
    (tmp / "files").mkdir()
    ds.to_json(str(tmp / "files" / "train.jsonl"))
    datasets.DatasetDict({"train": ds, "test": ds.select([0])}).save_to_disk(str(tmp / "dict"))
    cases = ((tmp / "d.csv", []), (tmp / "d.json", []), (tmp / "saved", []), (tmp / "files", []),
             (tmp / "dict", ["--split", "test"]))
    for data, extra in cases:
        code, out, err = _run_cli(["lengths", str(data), "--tokenizer", tok_dir, "--json", *extra], capsys)
        assert code == 0, err
        profile = json.loads(out)
        assert profile["examples"] == (1 if extra else 3) and profile["stats"]["max"] == (3 if extra else 4)


def test_cli_report_save_and_plot(ramp, tok_dir, tmp, capsys):
    pytest.importorskip("matplotlib")
    args = ["lengths", ramp, "--tokenizer", tok_dir, "--save", str(tmp / "p.json"), "--plot", str(tmp / "p.png"),
            "--log-x", "--per-device-train-batch-size", "4", "--pad-to-multiple-of", "64", "--dataset-num-proc", "2"]
    code, out, err = _run_cli(args, capsys)
    assert code == 0, err
    assert "recommendation: max_length" in out and "packing bfd_split" in out and "(log x)" in out
    assert json.loads((tmp / "p.json").read_text())["settings"]["pad_to_multiple_of"] == 64
    assert (tmp / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_preference_and_prompt_trainers(tok_dir, tmp, capsys):
    rng = random.Random(4)
    path = tmp / "pref.jsonl"
    path.write_text("".join(json.dumps({"prompt": _words(rng, 5), "chosen": " " + _words(rng, rng.randint(1, 50)),
                                        "rejected": " " + _words(rng, rng.randint(1, 50))}) + "\n" for _ in range(50)))
    for trainer in ("dpo", "reward", "grpo"):
        code, out, err = _run_cli(["lengths", str(path), "--tokenizer", tok_dir, "--trainer", trainer], capsys)
        assert code == 0, err
        assert "recommendation:" in out and "packing bfd" not in out


@pytest.mark.parametrize("case,needle", [
    ("missing_column", "needs a 'text' column"),
    ("unknown_format", "unknown format '.txt'"),
    ("empty", "has no rows"),
    ("empty_file", "is empty"),
    ("no_tokenizer", "not found locally"),
    ("not_cached", "no dataset of that name"),
    ("no_chat_template", "no chat_template"),
    ("dpo_columns", "missing rejected"),
])
def test_bad_input_is_a_clear_error_without_traceback(case, needle, tok_dir, tmp, capsys):
    from transformers import AutoTokenizer

    files = {"missing_column": ("m.jsonl", '{"content": "w1"}\n'), "unknown_format": ("d.txt", "w1\n"),
             "empty": ("e.csv", "text\n"), "empty_file": ("e.jsonl", ""),
             "dpo_columns": ("p.jsonl", '{"prompt": "w1", "chosen": "w2"}\n'),
             "no_chat_template": ("c.jsonl", json.dumps({"messages": [{"role": "user", "content": "w1"}]}) + "\n")}
    tokenizer, data, extra = tok_dir, "hpcmem-no-such-dataset-xyz", []
    if case in files:
        name, text = files[case]
        (tmp / name).write_text(text)
        data = str(tmp / name)
    if case == "no_tokenizer":
        (tmp / "ok.jsonl").write_text('{"text": "w1"}\n')
        tokenizer, data = str(tmp / "nowhere"), str(tmp / "ok.jsonl")
    if case == "no_chat_template":
        plain = AutoTokenizer.from_pretrained(tok_dir)
        plain.chat_template = None
        plain.save_pretrained(str(tmp / "plain"))
        tokenizer = str(tmp / "plain")
    if case == "dpo_columns":
        extra = ["--trainer", "dpo"]
    code, out, err = _run_cli(["lengths", data, "--tokenizer", tokenizer, *extra], capsys)
    assert code == 2 and "hpcmem: error" in err and needle in err, err
    assert "Traceback" not in err


def test_a_file_that_does_not_parse_is_one_line_without_the_librarys_log(tok_dir, tmp):
    """datasets' JSON builder logs "Failed to load JSON from file …" at ERROR before it raises
    (packaged_modules/json/json.py `_generate_tables`), through a handler bound to the process's stderr at import: the
    user sees hpcmem's one line only (a real process, so that nothing is captured away), and it names the file and
    what the parser said (the row that does not parse), not datasets' generic "error while generating"."""
    import subprocess

    path = tmp / "broken-pref.jsonl"
    path.write_text('{"prompt": "w1", "chosen": "w2", "rejected": "w3"}\n{"prompt": "w1", "chosen": "w2"\n')
    done = subprocess.run([sys.executable, "-m", "hpcmem", "lengths", str(path), "--tokenizer", tok_dir, "--trainer",
                           "dpo", "--json"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HF_DATASETS_CACHE": str(tmp / "cache-broken")})
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    line = done.stderr.strip()
    assert line.startswith("hpcmem: error: ") and "\n" not in line, done.stderr
    assert "broken-pref.jsonl" in line and "row 1" in line, line


@pytest.mark.parametrize("config", [{}, {"max_length": 30}, {"max_length": 12}])
def test_the_scored_tokens_of_a_dpo_micro_batch_are_trls_completion_mask(config, tok_dir, tmp):
    """label_tokens_per_micro_batch = max over TRL's own collated DPO micro-batches (in order) of the completion mask's
    sum: the positions DPOTrainer scores (the prompt is not), after its max_length rules (cut, prompt ≥ max_length
    dropped)."""
    from transformers import AutoTokenizer

    from hpcmem.data.profiler import build_profile
    from hpcmem.data.tokenize import tokenize_lengths

    batch = 4
    tok = AutoTokenizer.from_pretrained(tok_dir)
    data = datasets.Dataset.from_dict(_datasets(random.Random(5))["pref"])
    t = _trl_trainer("dpo", data, tok, tmp / "out", per_device_train_batch_size=batch, **config)
    rows = [t.train_dataset[i] for i in range(len(t.train_dataset))]
    theirs = max(int(t.data_collator(rows[i:i + batch])["completion_mask"].sum()) for i in range(0, len(rows), batch))
    _, parts = tokenize_lengths(data, tok, trainer="dpo")
    profile = build_profile(parts, source={"trainer": "dpo"}, per_device_train_batch_size=batch,
                            pad_to_multiple_of=None, max_lengths=[])
    got = label_tokens_per_micro_batch(json.loads(json.dumps(profile)), max_length=config.get("max_length"),
                                       per_device_train_batch_size=batch, trainer="dpo")
    assert got == theirs


def test_kto_lengths_unpair_as_trl_and_feed_the_estimate(tok_dir, tmp, capsys):
    """`hpcmem lengths --trainer kto`: a paired dataset becomes TRL's unpaired one (trl.unpair_preference_dataset:
    the chosen examples of a map batch, then its rejected ones), each tokenized as prompt and prompt + completion +
    EOS. One token per word (tok_dir), by hand: pair 1 prompt 'w1 w2' (2), chosen ' w3' (2 + 1 + EOS = 4), rejected
    ' w4 w5 w6' (2 + 3 + 1 = 6); pair 2 prompt 'w1' (1), chosen ' w2 w3' (1 + 2 + 1 = 4), rejected ' w4' (3).
    Unpaired order c1, c2, r1, r2: prompts 2, 1, 2, 1; lengths 4, 4, 6, 3. The saved profile feeds `estimate kto`:
    batch 2 → rows 4, 4 | 6, 3 and KL rows 2 + (4 − 1) = 5, 1 + (4 − 2) = 3 | 2 + (3 − 1) = 4, 1 + (6 − 2) = 5 →
    the worst micro-batch is 2 × 6."""
    path = tmp / "kto-pairs.jsonl"
    path.write_text(json.dumps({"prompt": "w1 w2", "chosen": " w3", "rejected": " w4 w5 w6"}) + "\n" +
                    json.dumps({"prompt": "w1", "chosen": " w2 w3", "rejected": " w4"}) + "\n")
    p = profile_dataset(str(path), tok_dir, trainer="kto", per_device_train_batch_size=2,
                        cache_dir=str(tmp / "cache-kto"))
    assert decode_lengths(p["order"]["parts"]["prompt"]) == [2, 1, 2, 1]
    assert decode_lengths(p["order"]["parts"]["length"]) == [4, 4, 6, 3]
    assert tokens_per_micro_batch(p, trainer="kto", max_length=None, per_device_train_batch_size=2, packing=False,
                                  packing_strategy="bfd", padding_free=False, pad_to_multiple_of=None) == 12
    # the completions KTO scores (its prompt is labelled -100), by hand: (4 − 2) + (4 − 1) | (6 − 2) + (3 − 1) → 6
    assert label_tokens_per_micro_batch(p, trainer="kto", max_length=None, per_device_train_batch_size=2) == 6
    assert label_tokens_per_micro_batch(p, trainer="kto", max_length=5, per_device_train_batch_size=2) == 5
    saved = tmp / "kto-profile.json"
    code, out, err = _run_cli(["lengths", str(path), "--tokenizer", tok_dir, "--trainer", "kto", "--save",
                               str(saved), "--per_device_train_batch_size", "2"], capsys)
    assert code == 0, err
    code, out, err = _run_cli(["estimate", "kto", "--model_name_or_path", "Qwen/Qwen2.5-0.5B",
                               "--per_device_train_batch_size", "2", "--lengths", str(saved)], capsys)
    assert code == 0 and "2 rows × 6 " in out, (out, err)
