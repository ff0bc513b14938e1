"""The CLI against input a careful user would not give: contradictions are refused in one line naming the field, the
value and the rule, and a plan that cannot be made says so with numbers."""

import json

from click.testing import CliRunner

from hpcmem.cli import cli, run

SMALL = ["--model_name_or_path", "Qwen/Qwen2.5-0.5B"]
GIB = 2 ** 30


def _run(*args):
    return CliRunner().invoke(cli, list(args))


def _refused(capsys, argv, *words):
    """hpcmem's own entry point (what `python -m hpcmem` runs): exit 2 and one line on stderr holding `words`."""
    capsys.readouterr()
    status = run(argv)
    err = capsys.readouterr().err
    assert status == 2, err
    line = err.strip()
    assert line.startswith("hpcmem: error: ") and "\n" not in line, line
    for word in words:
        assert word in line, (word, line)


def _profile(path, trainer, parts, lengths):
    """A length profile as `hpcmem lengths --save` writes it (hpcmem.data.profile): per-example lengths of each part,
    the histogram of `lengths`."""
    from hpcmem.data.profile import SCHEMA, encode_lengths
    from hpcmem.data.stats import histogram

    path.write_text(json.dumps({"schema": SCHEMA, "source": {"trainer": trainer}, "histogram": histogram(lengths),
                                "order": {"encoding": "zlib+base64 uint32le",
                                          "parts": {k: encode_lengths(v) for k, v in parts.items()}},
                                "candidates": []}))
    return path


def test_plan_refuses_a_global_batch_that_the_fixed_batch_does_not_divide(capsys):
    """7 rows per step on one GPU cannot be micro-batches of 2 (2 × 3 = 6, 2 × 4 = 8): refused, not planned as 6."""
    _refused(capsys, ["plan", "sft", *SMALL, "--gpu", "H100", "--global_batch_size", "7",
                  "--per_device_train_batch_size", "2"], "global_batch_size 7", "per_device_train_batch_size 2")
    _refused(capsys, ["plan", "sft", *SMALL, "--gpu", "H100", "--global_batch_size", "7",
                  "--gradient_accumulation_steps", "2"], "global_batch_size 7", "gradient_accumulation_steps 2")
    # both fixed and 4 × 2 × 1 GPU ≠ 12
    _refused(capsys, ["plan", "sft", *SMALL, "--gpu", "H100", "--global_batch_size", "12",
                  "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2"], "global_batch_size 12")


def test_every_plan_keeps_the_global_batch_it_was_asked_for():
    res = _run("plan", "sft", *SMALL, "--gpu", "H100", "--num_processes", "2", "--global_batch_size", "12",
               "--per_device_train_batch_size", "2", "--json")
    assert res.exit_code == 0, res.output
    plans = json.loads(res.output)["plans"]
    assert plans
    for p in plans:
        assert p["knobs"]["batch"] * p["knobs"]["accum"] * 2 == 12, p["knobs"]


def test_nothing_fits_names_the_least_a_combination_needs():
    """Llama-3.1-8B full fine-tuning on a 3 GB GPU: no plan; the table and the JSON name the combination that needs
    the least, and that number is what `hpcmem estimate` says for the same flags, above the GPU's usable memory."""
    user = ["sft", "--model_name_or_path", "meta-llama/Llama-3.1-8B", "--gpu", "3GB"]
    table = _run("plan", *user)
    assert table.exit_code == 0, table.output
    line = next(x for x in table.output.splitlines() if "nothing fits" in x)
    data = json.loads(_run("plan", *user, "--json").output)
    assert data["plans"] == []
    least = data["least"]
    assert least["device_peak_bytes"] > data["capacity_bytes"]
    assert f"{least['device_peak_bytes'] / GIB:.1f} GiB" in line, line
    est = _run("estimate", *user, *least["flags"], "--json")
    assert est.exit_code == 0, est.output
    assert json.loads(est.output)["per_gpu"]["device_peak_bytes"] == least["device_peak_bytes"]


def test_deepspeed_and_fsdp_settings_outside_their_engine_are_refused(capsys):
    """accelerate reads zero_stage / offload_*_device only under DeepSpeed and fsdp_offload_params only under FSDP
    (commands/launch.py picks the launcher by distributed_type); given elsewhere they would be silently dropped."""
    _refused(capsys, ["estimate", "sft", *SMALL, "--accelerate_config", "fsdp2", "--num_processes", "2",
                  "--zero_stage", "2"], "zero_stage 2", "DEEPSPEED", "FSDP")
    _refused(capsys, ["estimate", "sft", *SMALL, "--zero_stage", "3"], "zero_stage 3", "DEEPSPEED")
    _refused(capsys, ["estimate", "sft", *SMALL, "--accelerate_config", "multi_gpu", "--num_processes", "2",
                  "--offload_optimizer_device", "cpu"], "offload_optimizer_device 'cpu'", "DEEPSPEED")
    _refused(capsys, ["estimate", "sft", *SMALL, "--accelerate_config", "fsdp2", "--num_processes", "2",
                  "--offload_param_device", "cpu"], "offload_param_device 'cpu'", "DEEPSPEED")
    _refused(capsys, ["estimate", "sft", *SMALL, "--accelerate_config", "zero2", "--num_processes", "2",
                  "--fsdp_offload_params", "true"], "fsdp_offload_params", "FSDP")
    _refused(capsys, ["plan", "sft", *SMALL, "--gpu", "H100", "--zero_stage", "3"], "zero_stage 3")
    # the engine's own flags still work
    assert _run("estimate", "sft", *SMALL, "--accelerate_config", "zero3", "--num_processes", "2",
                "--zero_stage", "2").exit_code == 0


def test_an_accelerate_file_block_for_the_other_engine_is_ignored_as_accelerate_does(tmp_path):
    """A MULTI_GPU accelerate YAML with a leftover deepspeed_config block launches DDP (accelerate ignores the block),
    so hpcmem estimates DDP and does not refuse it."""
    path = tmp_path / "accelerate.yaml"
    path.write_text("distributed_type: MULTI_GPU\nnum_processes: 2\nnum_machines: 1\n"
                    "deepspeed_config:\n  zero_stage: 3\n  offload_optimizer_device: cpu\n")
    res = _run("estimate", "sft", *SMALL, "--accelerate_config", str(path), "--json")
    assert res.exit_code == 0, res.output
    ddp = _run("estimate", "sft", *SMALL, "--accelerate_config", "multi_gpu", "--num_processes", "2", "--json")
    assert json.loads(res.output)["per_gpu"] == json.loads(ddp.output)["per_gpu"]


def test_a_preset_gres_type_that_would_change_the_gres_request_is_refused(tmp_path, capsys):
    """--gres=gpu:<type>:<count> (sbatch's gres syntax name[:type][:count], comma-separated gres): a type holding ','
    or ':' requests another resource or count (gpu:h100,mem:5:8 asks for one h100 and a 'mem' gres), so a preset's
    gres_type is refused unless it is one name."""
    import yaml

    from hpcmem.launch.presets import SHIPPED_DIR

    data = yaml.safe_load((SHIPPED_DIR / "example-h100.yaml").read_text())
    for bad in ("h100,mem:5", "h100:2", "h 100"):
        path = tmp_path / "p.yaml"
        path.write_text(yaml.safe_dump({**data, "gres_type": bad}))
        _refused(capsys, ["presets", "show", str(path)], "gres_type", repr(bad))
    path.write_text(yaml.safe_dump({**data, "gres_type": "nvidia_h100-80gb.pcie"}))
    assert run(["presets", "show", str(path)]) == 0


def test_a_picture_path_that_is_not_a_png_or_cannot_be_written_is_refused(tmp_path, capsys):
    """--plot / --png / --timeline write PNGs, --snapshot a pickle: a user's config given by mistake is refused before
    anything is written or traced (and stays as it was), and a folder that cannot be made is one line, not an
    internal error."""
    config = tmp_path / "sft.yaml"
    config.write_text("max_length: 512\n")
    _refused(capsys, ["estimate", "sft", *SMALL, "--plot", str(config)], "--plot", "sft.yaml", ".png")
    _refused(capsys, ["plan", "sft", *SMALL, "--gpu", "H100", "--plot", str(config)], "--plot", ".png")
    _refused(capsys, ["validate", "--png", str(config)], "--png", ".png")
    _refused(capsys, ["trace", "sft", *SMALL, "--snapshot", str(config)], "--snapshot", ".pickle")
    assert config.read_text() == "max_length: 512\n"
    _refused(capsys, ["estimate", "sft", *SMALL, "--plot", str(config / "under-a-file.png")], "under-a-file.png")


def test_a_picture_never_replaces_a_users_file_or_writes_through_a_link(tmp_path, capsys):
    """--plot onto a file hpcmem did not draw (a photo named .png), or onto a symbolic link (to a dotfile), is refused
    and both stay byte-identical; a picture hpcmem drew there before is replaced."""
    import pytest

    pytest.importorskip("matplotlib")
    photo = tmp_path / "holiday.png"
    photo.write_bytes(b"\x89PNG\r\n\x1a\nmy photo")
    dotfile = tmp_path / "bashrc"
    dotfile.write_text("export PATH=/usr/bin\n")
    link = tmp_path / "link.png"
    link.symlink_to(dotfile)
    _refused(capsys, ["estimate", "sft", *SMALL, "--plot", str(photo)], "holiday.png", "is kept")
    _refused(capsys, ["estimate", "sft", *SMALL, "--plot", str(link)], "link.png", "symbolic link")
    assert photo.read_bytes() == b"\x89PNG\r\n\x1a\nmy photo"
    assert dotfile.read_text() == "export PATH=/usr/bin\n" and link.is_symlink()
    ours = tmp_path / "ours.png"
    assert run(["estimate", "sft", *SMALL, "--plot", str(ours)]) == 0
    first = ours.read_bytes()
    assert run(["estimate", "sft", *SMALL, "--max_length", "512", "--plot", str(ours)]) == 0
    assert ours.read_bytes() != first and ours.read_bytes().startswith(b"\x89PNG")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bashrc", "holiday.png", "link.png", "ours.png"]


def test_lengths_save_never_overwrites_what_is_not_a_length_profile(tmp_path, capsys):
    """`hpcmem lengths --save FILE` is checked before the data is read: a file there that is not a length profile
    (the user's config) is refused and kept, a path under a file is one line; an older profile may be replaced (the
    run then stops on the missing tokenizer, not on --save)."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello"}\n')
    config = tmp_path / "sft.yaml"
    config.write_text("max_length: 512\n")
    base = ["lengths", str(data), "--tokenizer", str(tmp_path / "no-tokenizer")]
    _refused(capsys, [*base, "--save", str(config)], "--save", "sft.yaml", "hpcmem.lengths/1")
    assert config.read_text() == "max_length: 512\n"
    _refused(capsys, [*base, "--save", str(config / "p.json")], "--save", "p.json")
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema": "hpcmem.lengths/1"}))
    _refused(capsys, [*base, "--save", str(old), "--json"], "tokenizer")   # --json: no progress lines


def test_an_attention_transformers_does_not_know_is_refused(capsys):
    """transformers 5.24 builds eager, sdpa, flash_attention_2/3/4, flex_attention, paged|eager or a hub kernel named
    org/repo[@rev][:name] (modeling_utils.py get_correct_attn_implementation, integrations/hub_kernels.py is_kernel)
    and raises on anything else; hpcmem refuses it before estimating."""
    for bad in ("x;y", "flash", "SDPA", "org/repo/extra"):
        _refused(capsys, ["estimate", "sft", *SMALL, "--attn_implementation", bad], "attn_implementation", repr(bad))
    for good in ("eager", "flash_attention_3", "kernels-community/flash-attn2"):
        assert run(["estimate", "sft", *SMALL, "--attn_implementation", good]) == 0, good


def test_an_attention_hpcmem_has_not_traced_is_said_so():
    """flex_attention is estimated as SDPA would keep it; the estimate says it has not traced that kernel."""
    res = _run("estimate", "sft", *SMALL, "--attn_implementation", "flex_attention", "--json")
    assert res.exit_code == 0, res.output
    assert any("flex_attention" in w for w in json.loads(res.output)["warnings"])


def test_lora_settings_without_use_peft_are_said_to_do_nothing():
    """TRL builds adapters only with use_peft (trl/trainer/utils.py get_peft_config returns None without it): a LoRA
    setting given alone trains the full model, and the estimate says the setting has no effect."""
    res = _run("estimate", "sft", *SMALL, "--lora_r", "8", "--use_dora", "true", "--json")
    assert res.exit_code == 0, res.output
    said = [w for w in json.loads(res.output)["warnings"] if "use_peft" in w]
    assert said and "lora_r" in said[0] and "use_dora" in said[0], said
    with_peft = _run("estimate", "sft", *SMALL, "--lora_r", "8", "--use_peft", "true", "--json")
    assert not [w for w in json.loads(with_peft.output)["warnings"] if "use_peft" in w]


def test_grpo_and_rloo_need_two_generations_per_prompt(capsys):
    """grpo_config.py / rloo_config.py __post_init__ raise when num_generations < 2 (the advantage needs a group)."""
    for trainer in ("grpo", "rloo"):
        _refused(capsys, ["estimate", trainer, *SMALL, "--num_generations", "1", "--per_device_train_batch_size", "2"],
                 "num_generations 1", "2")
        assert run(["estimate", trainer, *SMALL, "--num_generations", "2", "--per_device_train_batch_size", "2"]) == 0


def test_an_assumed_row_length_is_said_for_every_trainer():
    """max_length none with no length profile: the rows are assumed max_position_embeddings long, a guess the
    estimate must name for DPO / Reward / KTO as it does for SFT."""
    for trainer in ("sft", "dpo", "reward", "kto"):
        res = _run("estimate", trainer, *SMALL, "--max_length", "none", "--per_device_train_batch_size", "2", "--json")
        assert res.exit_code == 0, res.output
        assert any("max_position_embeddings" in w for w in json.loads(res.output)["warnings"]), trainer


def test_a_length_profile_shapes_dpo_and_reward_micro_batches(tmp_path):
    """`--lengths` for a preference trainer: the profile's two examples have chosen rows of 6 and 12 tokens and
    rejected rows of 4 and 10 (prompt included), so with batch 2 the one micro-batch is 2 chosen + 2 rejected rows
    padded to the longest, 12 (hand count) — the estimate is the one for max_length 12, not for the default 1024. DPO
    scores the completions only: 6 − 2 + 4 − 2 + 12 − 9 + 10 − 9 = 10 tokens (hand count), not 4 rows × 11."""
    for trainer in ("dpo", "reward"):
        parts = {"prompt": [2, 9], "chosen": [6, 12], "rejected": [4, 10]}
        path = _profile(tmp_path / f"{trainer}.json", trainer, parts, [6, 4, 12, 10])
        common = [trainer, *SMALL, "--per_device_train_batch_size", "2", "--json"]
        got = json.loads(_run("estimate", *common, "--lengths", str(path)).output)
        want = json.loads(_run("estimate", *common, "--max_length", "12").output)
        if trainer == "dpo":
            # 34 fewer scored tokens: the fused head's backward holds at least a bf16 [N, 32768] tile row less for
            # each (trl/kernels/chunked_logprob.py `mm_buf`); the layers' phases are those of max_length 12
            head = "backward (LM head)"
            assert want["phases"][head] - got["phases"][head] >= 34 * 32768 * 2
            assert "10 scored tokens (length profile)" in got["summary"], got["summary"]     # said where it counts
            assert got["phases"]["backward (layer 0)"] == want["phases"]["backward (layer 0)"]
            continue
        assert "length profile" in got["summary"], got["summary"]
        assert got["per_gpu"]["peak_allocated_bytes"] == want["per_gpu"]["peak_allocated_bytes"], trainer
        # the reference model's no-grad pass sees the same rows (it took max_length, 1024 here, whatever the data)
        assert got["phases"].get("reference forward") == want["phases"].get("reference forward"), trainer


def test_a_length_profile_for_a_trainer_hpcmem_lengths_cannot_tokenize_for_is_refused_with_the_way_out(tmp_path,
                                                                                                     capsys):
    """`hpcmem lengths --trainer` takes sft, dpo, reward, grpo and kto (its click choices); distillation's rows are
    generated, so no profile holds them. The refusal must not send the user to `hpcmem lengths --trainer
    distillation`, which click refuses, but say what to pass instead; a dpo profile is not a kto one."""
    parts = {"prompt": [2, 9], "chosen": [6, 12], "rejected": [4, 10]}
    path = _profile(tmp_path / "dpo.json", "dpo", parts, [6, 4, 12, 10])
    capsys.readouterr()
    assert run(["estimate", "distillation", *SMALL, "--teacher_model_name_or_path", "Qwen/Qwen2.5-0.5B",
                "--per_device_train_batch_size", "2", "--lengths", str(path)]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("hpcmem: error: ") and "\n" not in line, line
    assert "--lengths" in line and "distillation" in line and "max_" in line and "--trainer distill" not in line, line
    assert run(["lengths", "x.jsonl", "--tokenizer", "t", "--trainer", "distillation"]) == 2   # what it would name
    _refused(capsys, ["estimate", "kto", *SMALL, "--per_device_train_batch_size", "2", "--lengths", str(path)],
             "made for dpo, not kto", "--trainer kto")


def test_a_kto_length_profile_sizes_the_micro_batch_and_its_kl_rows_by_hand(tmp_path):
    """KTOTrainer (trl/trainer/kto_trainer.py `_prepare_dataset`): drops examples whose prompt alone fills max_length,
    then pairs each prompt with the previous example's completion within each batch of per_device_train_batch_size
    (add_kl_completion_ids: the first takes the batch's last); DataCollatorForUnpairedPreference cuts prompt +
    completion and prompt + KL completion to max_length and pads each set of B rows to its longest; the KL rows run
    through the policy (no grad) and the reference. The micro-batch is sized by the longer of the two sets.
    Four examples, prompt / prompt+completion: (8, 9), (1, 9), (3, 5), (2, 4); batch 2 (hand count):
      max_length none: batch 1 rows 9, 9; KL 8 + (9 − 1) = 16, 1 + (9 − 8) = 2 → 2 × 16 (the rows alone: 2 × 9);
                       batch 2 rows 5, 4; KL 3 + 2 = 5, 2 + 2 = 4 → 2 × 5.  Worst: 2 × 16.
      max_length 12:   the KL row 16 is cut to 12 → 2 × 12.
      max_length 8:    (8, 9) is dropped (its prompt fills 8); batch 1 (1, 9), (3, 5): rows 8 (cut), 5; KL
                       1 + 2 = 3, 3 + 8 = 11 → 8; batch 2 (2, 4): row 4, KL 4 → 2 × 8."""
    prompts, lengths = [8, 1, 3, 2], [9, 9, 5, 4]
    path = _profile(tmp_path / "kto.json", "kto", {"prompt": prompts, "length": lengths}, lengths)
    common = ["kto", *SMALL, "--per_device_train_batch_size", "2", "--json"]
    for max_length, seq in (("none", 16), ("12", 12), ("8", 8)):
        got = json.loads(_run("estimate", *common, "--max_length", max_length, "--lengths", str(path)).output)
        assert f"2 rows × {seq} " in got["summary"], (max_length, got["summary"])
        want = json.loads(_run("estimate", *common, "--max_length", str(seq)).output)
        assert got["per_gpu"]["peak_allocated_bytes"] == want["per_gpu"]["peak_allocated_bytes"], max_length


def test_a_prompt_length_profile_sets_grpos_longest_prompt(tmp_path, capsys):
    """A grpo profile holds the prompts' token counts (hpcmem lengths --trainer grpo); GRPO/RLOO's micro-batch is B
    rows of the longest prompt + max_completion_length (max_prompt_length, hpcmem's own: the longest prompt). With
    prompts of 20 and 30 tokens the estimate is the one for max_prompt_length 30 (hand count), not for the default 512,
    which it was: the profile was dropped without a word. Both given: refused, one sets the other."""
    path = _profile(tmp_path / "grpo.json", "grpo", {"prompt": [20, 30]}, [20, 30])
    for trainer in ("grpo", "rloo"):
        common = [trainer, *SMALL, "--per_device_train_batch_size", "2", "--num_generations", "2", "--json"]
        got = json.loads(_run("estimate", *common, "--lengths", str(path)).output)
        want = json.loads(_run("estimate", *common, "--max_prompt_length", "30").output)
        default = json.loads(_run("estimate", *common).output)
        assert got["per_gpu"]["peak_allocated_bytes"] == want["per_gpu"]["peak_allocated_bytes"], trainer
        assert got["per_gpu"]["peak_allocated_bytes"] < default["per_gpu"]["peak_allocated_bytes"], trainer
        assert "prompt 30" in got["summary"], got["summary"]
    _refused(capsys, ["estimate", "grpo", *SMALL, "--per_device_train_batch_size", "2", "--num_generations", "2",
                      "--lengths", str(path), "--max_prompt_length", "64"], "max_prompt_length 64", "--lengths")


def test_a_plan_from_a_length_profile_keeps_the_batch_and_packing_it_was_measured_for(tmp_path):
    """A profile's worst micro-batch is for the given per_device_train_batch_size and packing (hpcmem.data.profile
    tokens_per_micro_batch): the planner must not pair that token count with another batch size or packing."""
    lengths = [300, 500, 200, 700, 100, 900, 50, 400]
    path = _profile(tmp_path / "p.json", "sft", {"length": lengths}, lengths)
    res = _run("plan", "sft", *SMALL, "--gpu", "H100", "--lengths", str(path), "--json")   # TRL's batch 8
    assert res.exit_code == 0, res.output
    plans = json.loads(res.output)["plans"]
    assert plans and all(p["knobs"]["batch"] == 8 and p["knobs"]["pack"] == "padded" for p in plans), \
        [p["knobs"] for p in plans]


def test_submit_plan_keeps_the_accelerate_config_the_user_gave(tmp_path):
    """`submit --plan`: "the flags you give stay fixed" — --accelerate_config zero3 is a flag given, so the job
    written is ZeRO-3 (the planner alone would pick DDP for a 0.5B model on two H100s)."""
    import yaml

    run_dir = tmp_path / "runs"
    res = _run("submit", "sft", *SMALL, "--preset", "example-h100", "--num_processes", "2", "--accelerate_config",
               "zero3", "--plan", "--dry-run", "--runs-dir", str(run_dir))
    assert res.exit_code == 0, res.output
    folder = next(run_dir.iterdir())
    assert yaml.safe_load((folder / "accelerate.yaml").read_text())["distributed_type"] == "DEEPSPEED"
    assert json.loads((folder / "spec.json").read_text())["job"]["parallel"]["zero_stage"] == 3


def test_logs_of_a_run_without_logs_names_only_what_was_asked(tmp_path, capsys):
    """No --node given: the message is about the folder, not about a node called None."""
    capsys.readouterr()
    assert run(["logs", str(tmp_path)]) != 0
    err = capsys.readouterr().err
    assert "no logs yet" in err and "None" not in err, err
    run(["logs", str(tmp_path), "--node", "3"])
    assert "--node 3" in capsys.readouterr().err


def test_submit_refuses_a_config_json_file_as_the_model_to_train(tmp_path, capsys):
    """`hpcmem estimate` reads a bare config.json, but the job's TRL loads the model with from_pretrained, which
    needs the model's folder or a Hub id: a job naming the file would fail at load, so submit refuses it."""
    from pathlib import Path

    import hpcmem

    catalog = json.loads((Path(hpcmem.__file__).parent / "models" / "catalog" / "Qwen--Qwen2.5-0.5B.json").read_text())
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(catalog["config"]))
    base = ["submit", "sft", "--preset", "example-h100", "--dry-run", "--runs-dir", str(tmp_path / "runs")]
    _refused(capsys, [*base, "--model_name_or_path", str(folder / "config.json")], "model_name_or_path",
             "config.json", "folder")
    # example-h100's container mounts /shared only: a model folder elsewhere is refused too, on a preset without a
    # container it is the job's
    _refused(capsys, [*base, "--model_name_or_path", str(folder)], "model_name_or_path", "not visible")
    base[3] = "example-l40s"
    assert run([*base, "--model_name_or_path", str(folder)]) == 0


def test_nvme_offload_is_refused_with_its_reason(capsys):
    """DeepSpeed's NVMe offload needs nvme_path (deepspeed runtime/zero/offload_config.py), which hpcmem neither
    takes nor writes, and keeps swap buffers on the host that the host estimate does not model: the job written would
    fail and the host number would be wrong, so it is refused."""
    for flag in ("--offload_optimizer_device", "--offload_param_device"):
        _refused(capsys, ["estimate", "sft", *SMALL, "--accelerate_config", "zero3", "--num_processes", "2", flag,
                          "nvme"], flag.lstrip("-"), "'nvme'", "cpu")


def _tiny_qwen(folder, **dtype_keys):
    """A tiny Qwen2 config.json (the catalog's Qwen2.5-0.5B, shrunk) with only the dtype keys given."""
    from pathlib import Path

    import hpcmem

    cfg = json.loads((Path(hpcmem.__file__).parent / "models" / "catalog" / "Qwen--Qwen2.5-0.5B.json").read_text())
    cfg = {k: v for k, v in cfg["config"].items() if k not in ("dtype", "torch_dtype")}
    cfg.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=256, max_position_embeddings=512, bos_token_id=1, eos_token_id=1,
               **dtype_keys)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_dtype_auto_loads_the_dtype_the_checkpoints_config_names(tmp_path):
    """from_pretrained(dtype="auto") loads in config.json's `dtype`, else its older `torch_dtype` (transformers 5.24
    modeling_utils.py `_get_dtype`; configuration_utils.py keeps `dtype` when both are given). The expected weight
    bytes are those of the model transformers itself loads from a saved checkpoint with dtype="auto"."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    for keys in ({"torch_dtype": "float32"}, {"dtype": "float16", "torch_dtype": "float32"}, {"dtype": "bfloat16"}):
        folder = _tiny_qwen(tmp_path / "_".join(f"{k}-{v}" for k, v in keys.items()), **keys)
        saved = json.loads((folder / "config.json").read_text())
        # float64 weights on disk: only the config's key can make the load 4 or 2 bytes per weight
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.float64).save_pretrained(folder)
        (folder / "config.json").write_text(json.dumps(saved))     # the keys under test, not save_pretrained's
        loaded = AutoModelForCausalLM.from_pretrained(folder, dtype="auto")
        want = sum(p.numel() * p.element_size() for p in loaded.parameters())
        res = _run("estimate", "sft", "--model_name_or_path", str(folder), "--dtype", "auto", "--json")
        assert res.exit_code == 0, res.output
        out = json.loads(res.output)
        assert out["per_gpu"]["components"]["weights"] == want, (keys, next(loaded.parameters()).dtype)
        assert not [w for w in out["warnings"] if "dtype auto" in w], out["warnings"]


def test_dtype_auto_without_a_dtype_in_config_json_says_what_it_assumes(tmp_path):
    """No `dtype` nor `torch_dtype`: transformers then reads the first floating weight of the checkpoint, which
    hpcmem does not open; the estimate takes bfloat16 and says so (a float32 checkpoint holds twice the bytes)."""
    folder = _tiny_qwen(tmp_path / "m")
    res = _run("estimate", "sft", "--model_name_or_path", str(folder), "--dtype", "auto", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert any("auto" in w and "bfloat16" in w for w in out["warnings"]), out["warnings"]
    assert out["per_gpu"]["components"]["weights"] == out["model"]["num_params"] * 2      # bfloat16: 2 bytes


def test_dtype_auto_refuses_a_checkpoint_dtype_it_cannot_estimate(tmp_path, capsys):
    """A float64 checkpoint loads in float64 under dtype auto: hpcmem estimates float32/bfloat16/float16 weights only,
    so it refuses in one line rather than print a number it cannot stand behind; a non-text dtype is refused where
    the config.json is read."""
    folder = _tiny_qwen(tmp_path / "f64", torch_dtype="float64")
    _refused(capsys, ["estimate", "sft", "--model_name_or_path", str(folder), "--dtype", "auto"], "float64",
             "dtype auto")
    assert run(["estimate", "sft", "--model_name_or_path", str(folder), "--dtype", "bfloat16"]) == 0
    folder = _tiny_qwen(tmp_path / "num", torch_dtype=5)
    _refused(capsys, ["estimate", "sft", "--model_name_or_path", str(folder), "--dtype", "auto"], "torch_dtype", "5")


def test_dtype_auto_reads_config_json_without_torch(tmp_path):
    """The light install (no torch) reads the checkpoint's dtype too: torch, transformers and trl are blocked from
    importing in the subprocess; 4 bytes per weight for a float32 checkpoint (hand count)."""
    from tests.helpers.light_install import run_json_without

    folder = _tiny_qwen(tmp_path / "m", torch_dtype="float32")
    out = run_json_without(["estimate", "sft", "--model_name_or_path", str(folder), "--dtype", "auto", "--json"],
                           ("torch", "transformers", "trl"))
    assert out["per_gpu"]["components"]["weights"] == out["model"]["num_params"] * 4


def test_nothing_fits_names_the_least_memory_combination_not_the_first_one_estimated():
    """README's long-context job with the layout fixed to DDP (multi_gpu: no sharding, no SP/CP): 8B params of full
    AdamW states cannot fit 80 GB, so one estimate rules out every combination. The combination it names as needing the
    least must be at or below the smallest micro-batch of the same flags — by hand: micro-batch 1 × accumulation 8
    (the global batch, 8 × 8, held) keeps one row of 131,072 tokens' activations where micro-batch 8 keeps eight."""
    user = ["sft", "--model_name_or_path", "Qwen/Qwen3-8B", "--max_length", "131072", "--num_processes", "8",
            "--gpu", "H100-80GB", "--accelerate_config", "multi_gpu"]
    least = json.loads(_run("plan", *user, "--json").output)["least"]
    assert least["knobs"]["batch"] == 1, least
    line = next(x for x in _run("plan", *user).output.splitlines() if "nothing fits" in x)
    assert "drop --accelerate_config" in line, line       # README's same job without it plans ZeRO-3 + SP
    est = _run("estimate", *user, *least["flags"], "--per_device_train_batch_size", "1",
               "--gradient_accumulation_steps", "8", "--json")
    assert est.exit_code == 0, est.output
    assert least["device_peak_bytes"] <= json.loads(est.output)["per_gpu"]["device_peak_bytes"]


def test_nothing_fits_does_not_suggest_what_was_already_tried():
    """With --allow_peft (or a LoRA job) the plan already tried LoRA/QLoRA: 'allow PEFT' is no way out then."""
    base = ["plan", "sft", "--model_name_or_path", "meta-llama/Llama-3.1-8B", "--gpu", "3GB"]
    assert "--allow_peft" in _run(*base).output
    for more in (["--allow_peft"], ["--use_peft", "true"]):
        line = next(x for x in _run(*base, *more).output.splitlines() if "nothing fits" in x)
        assert "--allow_peft" not in line, line


def test_submit_refuses_launch_flags_that_would_do_nothing(tmp_path, capsys):
    """--allow_peft acts only with --plan, --max-restarts only counts --requeue's requeues, --vllm-placement only
    places a vLLM server (use_vllm, vllm_mode server): given without them they would be dropped without a word."""
    base = ["submit", "sft", *SMALL, "--preset", "example-h100", "--dry-run", "--runs-dir", str(tmp_path)]
    _refused(capsys, [*base, "--allow_peft"], "--allow_peft", "--plan")
    _refused(capsys, [*base, "--max-restarts", "5"], "--max-restarts 5", "--requeue")
    _refused(capsys, [*base, "--vllm-placement", "split"], "--vllm-placement split", "vllm_mode server")
    assert run([*base, "--max-restarts", "5", "--requeue"]) == 0


def test_coverage_refuses_a_model_type_nobody_knows(capsys):
    """`validate --against coverage --types` with a type neither hpcmem's table nor the installed transformers has (a
    typo) is refused before anything runs or is written: it appended an 'unclassified' record to the shared
    estimator/coverage.jsonl."""
    from hpcmem.datapath import estimator_dir

    records = estimator_dir() / "coverage.jsonl"
    before = records.read_bytes() if records.is_file() else None
    _refused(capsys, ["validate", "--against", "coverage", "--types", "llama,lamma_typo", "--no-png"], "lamma_typo",
             "--types")
    assert (records.read_bytes() if records.is_file() else None) == before


def test_validate_refuses_a_flag_its_mode_does_not_read(tmp_path, capsys):
    """Each --against mode reads its own flags (the help says which): one given to another mode would be dropped
    without a word, so it is refused before anything runs."""
    empty = tmp_path / "r.jsonl"
    empty.write_text("")
    _refused(capsys, ["validate", "--records", str(empty), "--no-png", "--ci"], "--ci", "trace", "probes")
    _refused(capsys, ["validate", "--records", str(empty), "--no-png", "--types", "llama"], "--types", "coverage")
    _refused(capsys, ["validate", "--against", "coverage", "--types", "llama", "--speed"], "--speed", "probes")
    _refused(capsys, ["validate", "--records", str(empty), "--no-png", "--fit-dir", str(tmp_path)], "--fit-dir",
             "--fit")
    assert run(["validate", "--records", str(empty), "--no-png", "--stored"]) == 0


def test_submit_plan_names_its_choice_as_pastable_flags(tmp_path, capsys):
    """`submit --plan` says which plan it took as the label and the shell-quoted flags (what `hpcmem plan` prints),
    not a Python repr: the selective-checkpointing JSON must come back as one word when the line is split."""
    import shlex

    capsys.readouterr()
    status = run(["submit", "sft", "--model_name_or_path", "Qwen/Qwen2.5-7B", "--preset", "example-l40s",
                  "--use_peft", "false", "--max_length", "2048", "--plan", "--dry-run", "--runs-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 0, err
    line = next(x for x in err.splitlines() if x.startswith("plan: "))
    assert "Knobs(" not in line
    words = shlex.split(line.split(": ", 2)[2])
    assert words and all(w.startswith("--") for w in words[::2]), words
    kwargs = dict(zip(words[::2], words[1::2]))
    if "--gradient_checkpointing_kwargs" in kwargs:
        assert json.loads(kwargs["--gradient_checkpointing_kwargs"]) == {"selective": True}


def test_submit_refuses_an_empty_account_instead_of_taking_the_presets(capsys, tmp_path):
    """`--account ''` is not "no flag": sbatch would get the preset's account without the user knowing."""
    _refused(capsys, ["submit", "sft", *SMALL, "--preset", "example-h100", "--account", "", "--dry-run",
                      "--runs-dir", str(tmp_path)], "--account ''", "empty")
    assert not any(tmp_path.iterdir())      # nothing written


def test_submit_refusal_fixes_keep_the_batch_a_length_profile_was_measured_for(tmp_path, capsys):
    """Without --plan, a refusal lists changes whose safe bound fits; with --lengths none of them may change the
    micro-batch or the packing the profile's worst case was computed for (as `hpcmem plan --lengths`)."""
    import shlex

    lengths = [1500, 2000, 1800, 2048, 900, 1200, 2048, 1000]
    path = _profile(tmp_path / "p.json", "sft", {"length": lengths}, lengths)
    capsys.readouterr()
    status = run(["submit", "sft", "--model_name_or_path", "Qwen/Qwen2.5-7B", "--use_peft", "false",
                  "--per_device_train_batch_size", "4", "--lengths", str(path), "--preset", "example-l40s",
                  "--dry-run", "--runs-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert status == 2, err
    fixes = [x.strip().split("   →")[0] for x in err.splitlines() if x.startswith("  --")]
    assert fixes, err
    for fix in fixes:
        flags = shlex.split(fix)[::2]
        assert not {"--per_device_train_batch_size", "--packing", "--padding_free"} & set(flags), fix


def test_probe_out_never_appends_to_what_is_not_a_records_file(tmp_path, capsys):
    """`hpcmem probe --out FILE` appends one JSON line per run: the user's config given there by mistake was appended
    to (and kept the record), a path under a file ended as an internal error. Both are refused before anything runs,
    in one line, and the file is kept; a records file is accepted (the refusal that follows is about the steps)."""
    config = tmp_path / "sft.yaml"
    config.write_text("max_length: 512\n")
    base = ["probe", "sft", "--model_name_or_path", str(_tiny_qwen(tmp_path / "m")), "--device", "cpu",
            "--max_length", "16", "--per_device_train_batch_size", "2"]
    _refused(capsys, [*base, "--out", str(config)], "--out", "sft.yaml", ".jsonl")
    assert config.read_text() == "max_length: 512\n"
    imposter = tmp_path / "notes.jsonl"
    imposter.write_text("my notes, not records\n")
    _refused(capsys, [*base, "--out", str(imposter)], "--out", "notes.jsonl", "records")
    assert imposter.read_text() == "my notes, not records\n"
    _refused(capsys, [*base, "--out", str(config / "r.jsonl")], "--out", "r.jsonl", "folder")
    records = tmp_path / "r.jsonl"
    records.write_text("")
    _refused(capsys, [*base, "--out", str(records), "--steps", "3", "--warmup-steps", "3"], "--warmup-steps 3",
             "--steps 3")


def test_probe_refuses_warmup_that_leaves_no_step_to_measure(tmp_path, capsys):
    """The peak is taken over the steps after --warmup-steps (probe/__init__.py): warm-up ≥ steps measured nothing
    and ended as an internal error after building the model; now one line naming both values."""
    base = ["probe", "sft", "--model_name_or_path", str(_tiny_qwen(tmp_path / "m")), "--device", "cpu", "--no-record"]
    _refused(capsys, [*base, "--steps", "2", "--warmup-steps", "5"], "--warmup-steps 5", "--steps 2")


def test_a_preset_name_that_is_not_a_file_is_said_so_not_not_found(tmp_path, monkeypatch, capsys):
    """A folder, a FIFO or a looping link named NAME.yaml on the search path was listed as available and then "not
    found" by `presets show NAME`; it is refused as not a regular file (a FIFO is never opened: reading it would
    block), and `presets list --json` says the same of it in valid JSON."""
    import os

    folder = tmp_path / "presets"
    folder.mkdir()
    (folder / "adir.yaml").mkdir()
    os.mkfifo(folder / "afifo.yaml")
    (folder / "aloop.yaml").symlink_to(folder / "aloop.yaml")
    monkeypatch.setenv("HPCMEM_PRESETS", str(folder))
    for name in ("adir", "afifo", "aloop"):
        for sub in ("show", "check"):
            _refused(capsys, ["presets", sub, name], f"{name}.yaml", "not a regular file")
    _refused(capsys, ["presets", "show", str(folder / "adir.yaml")], "adir.yaml", "not a regular file")
    capsys.readouterr()
    assert run(["presets", "list", "--json"]) == 0
    listed = {p["name"]: p["problem"] for p in json.loads(capsys.readouterr().out)}
    assert all("not a regular file" in listed[n] for n in ("adir", "afifo", "aloop")), listed
    assert listed["example-h100"] is None


def _fake_slurm(tmp_path, monkeypatch, script, mode=0o755):
    """A `scontrol` of our own, alone on PATH (no shell reads any value: hpcmem runs it by argv)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "scontrol"
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(mode)
    monkeypatch.setenv("PATH", str(bin_dir))
    return tool


def test_presets_check_says_what_slurm_said_on_one_line_and_never_ends_as_an_internal_error(tmp_path, monkeypatch,
                                                                                          capsys):
    """`presets check` runs scontrol: a several-line complaint is one line, an scontrol that cannot be run (not
    executable) or that does not answer in time is one line naming it — they ended as "internal error"."""
    from hpcmem.errors import HpcmemError
    from hpcmem.launch.backends import run_command

    _fake_slurm(tmp_path, monkeypatch, "echo 'scontrol: error: first' >&2; echo 'scontrol: fatal: second' >&2; "
                                       "exit 1\n")
    _refused(capsys, ["presets", "check", "example-h100"], "gpu-h100", "first", "second")
    _fake_slurm(tmp_path, monkeypatch, "exit 0\n", mode=0o644)
    _refused(capsys, ["presets", "check", "example-h100"], "scontrol", "cannot be run")
    tool = _fake_slurm(tmp_path, monkeypatch, "exec /bin/sleep 5\n")
    try:
        run_command([str(tool)], timeout_s=0.3)
        raise AssertionError("no refusal")
    except HpcmemError as exc:
        assert "did not answer within" in str(exc) and "\n" not in str(exc).strip("- "), exc


def test_probe_json_is_json_in_a_fresh_process(tmp_path):
    """`probe --json` prints the record, and only it, on stdout: DeepSpeed's logger writes its accelerator notice to
    stdout when transformers first imports it (deepspeed/accelerator/real_accelerator.py), which made the output
    unreadable as JSON. A fresh process (the notice comes once per process); a tiny model, two CPU steps."""
    import os
    import subprocess
    import sys

    folder = _tiny_qwen(tmp_path / "m")
    done = subprocess.run([sys.executable, "-m", "hpcmem", "probe", "sft", "--model_name_or_path", str(folder),
                           "--device", "cpu", "--max_length", "16", "--per_device_train_batch_size", "2", "--steps",
                           "2", "--no-record", "--json"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(done.stdout)
    assert record["device"] == "cpu" and record["source"] == "probe", sorted(record)


def test_gradient_checkpointing_kwargs_torch_would_refuse_are_refused(tmp_path, capsys):
    """transformers binds gradient_checkpointing_kwargs into its torch.utils.checkpoint.checkpoint call
    (modeling_utils.py `_activation_checkpointing_enable`), and a key checkpoint does not take stops the first
    training forward; the estimate accepted such a key and the probe ended as an internal error. Asked of the real
    transformers + torch here (a tiny Qwen2, one forward and backward per key): the keys that run pass, one that
    does not is refused in one line, and TRL's own `selective` (SFT) passes."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(_tiny_qwen(tmp_path / "m")))
    model.train()

    def trains(kwargs):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        try:
            model(input_ids=torch.ones(1, 4, dtype=torch.long), labels=torch.ones(1, 4, dtype=torch.long)).loss.backward()
            return True
        except (TypeError, ValueError):
            return False

    good = {"use_reentrant": False, "preserve_rng_state": True, "determinism_check": "default", "debug": False,
            "early_stop": True}
    for key, value in good.items():
        assert trains({key: value}), key
        assert run(["estimate", "sft", *SMALL, "--gradient_checkpointing_kwargs", json.dumps({key: value})]) == 0, key
    for bad in ({"a": 1}, {"use_reentrant": True, "a": 1}):
        assert not trains(bad)
        _refused(capsys, ["estimate", "sft", *SMALL, "--gradient_checkpointing_kwargs", json.dumps(bad)],
                 "gradient_checkpointing_kwargs", "'a'", "torch.utils.checkpoint")
    assert run(["estimate", "sft", *SMALL, "--gradient_checkpointing_kwargs", '{"selective": true}']) == 0


def test_probe_refuses_a_model_name_with_a_line_break_in_one_line(capsys):
    """probe resolves the model before the settings are checked (to probe a type hpcmem cannot estimate): a name with
    a line break printed a note broken over two lines; it is refused as `hpcmem estimate` refuses it."""
    _refused(capsys, ["probe", "sft", "--model_name_or_path", "a\nb", "--device", "cpu", "--no-record"],
             "model_name_or_path", "control characters")
    _refused(capsys, ["probe", "sft", "--model_name_or_path", "/tmp/\udcff", "--device", "cpu", "--no-record"],
             "model_name_or_path", "UTF-8")


def test_a_model_path_that_is_no_config_is_named_for_what_it_is(tmp_path, capsys):
    """`models show` / `estimate` take a config.json or a folder holding one: a FIFO given there was called a folder
    holding no config.json (and is never opened: reading one blocks), an empty name was read as the current folder
    ("model : folder . holds no config.json")."""
    import os

    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    _refused(capsys, ["models", "show", str(fifo)], "config.json", "not a regular file")
    _refused(capsys, ["estimate", "sft", "--model_name_or_path", str(tmp_path)], "config.json", "not a regular file")
    _refused(capsys, ["models", "show", ""], "empty")


def test_status_refuses_a_job_id_that_is_not_one(tmp_path, capsys):
    """RUN/job_id holds what sbatch --parsable or submitit gave (digits, N_M for an array task): anything else was
    asked of squeue/sacct and reported as a job SLURM "no longer knows" (with --json too), and bytes that are not
    UTF-8 ended as an internal error. Both are one line naming the file and the value."""
    (tmp_path / "job_id").write_text("123; touch pwned\n")
    for extra in ([], ["--json"]):
        _refused(capsys, ["status", str(tmp_path), *extra], "job_id", "'123; touch pwned'", "digits")
    (tmp_path / "job_id").write_bytes(b"\xff\xfe\n")
    _refused(capsys, ["status", str(tmp_path)], "job_id", "UTF-8")


def test_logs_reads_only_regular_files_and_never_hangs(tmp_path):
    """`hpcmem logs RUN` tails RUN/logs/*.log: a FIFO there blocked it forever at open(), a folder named *.log was an
    internal error. Only regular files are logs; the others are left alone (a real process with a deadline, so a
    hang fails the test instead of stalling it)."""
    import os
    import subprocess
    import sys

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "node0.log").write_bytes(b"first\nlast \xff line\n")
    os.mkfifo(logs / "node1.log")
    (logs / "vllm.log").mkdir()
    done = subprocess.run([sys.executable, "-m", "hpcmem", "logs", str(tmp_path), "-n", "1"], capture_output=True,
                          text=True, timeout=15)
    assert done.returncode == 0, done.stderr
    assert "node0.log" in done.stdout and "last" in done.stdout and "first" not in done.stdout, done.stdout
    assert "node1.log" not in done.stdout and "vllm.log" not in done.stdout, done.stdout


def test_presets_check_json_is_one_object_also_on_a_mismatch(tmp_path, monkeypatch, capsys):
    """Every other listing command has --json; `presets check --json` prints one object (the checks, each with both
    numbers, and whether all hold), exit 1 on a mismatch as without --json; an unreachable SLURM stays one line on
    stderr with nothing on stdout. SLURM here: stub scontrol and sinfo that print recorded answers."""
    tool = _fake_slurm(tmp_path, monkeypatch, "echo 'PartitionName=gpu-h100 MaxNodes=UNLIMITED MaxTime=2-00:00:00 "
                                              "State=UP'\n")
    (tool.parent / "sinfo").write_text("#!/bin/sh\necho 'n1|96|1100000|gpu:h100:8|ib'\necho "
                                       "'n2|96|1100000|gpu:h100:4|ib'\n")
    (tool.parent / "sinfo").chmod(0o755)
    capsys.readouterr()
    status = run(["presets", "check", "example-h100", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert status == 1 and out["ok"] is False, out          # max_nodes 16 > 2 nodes; MaxArraySize unknown
    checks = {c["what"].split()[0]: c for c in out["checks"]}
    assert checks["gpus_per_node"]["ok"] is True and checks["max_nodes"]["ok"] is False, checks
    assert checks["partition"]["cluster"] == "UP"
    tool.write_text("#!/bin/sh\necho 'scontrol: fatal: no controller' >&2\nexit 1\n")
    capsys.readouterr()
    assert run(["presets", "check", "example-h100", "--json"]) == 2
    got = capsys.readouterr()
    assert got.out == "" and got.err.count("\n") == 1 and "no controller" in got.err, got


def test_calibrate_refuses_an_only_that_selects_nothing_and_a_site_with_a_line_break(tmp_path, capsys):
    """`--only 'zzz*'` matched no case and planned a campaign of nothing (submitted, its collect job alone); `--only
    ''` silently meant every case; `--site` with a line break went into campaign.json and into every estimate's
    "calibrated at <site>" line. Each is one line naming the flag and the value, before anything is written."""
    base = ["calibrate", "--preset", "example-h100", "--dry-run", "--campaign", str(tmp_path / "camp")]
    _refused(capsys, [*base, "--only", "zzz*"], "--only", "'zzz*'", "no case")
    _refused(capsys, [*base, "--only", " , "], "--only", "no case pattern")
    _refused(capsys, [*base, "--only", "sft-q05*", "--site", "a\nb"], "--site", "control characters")
    assert not (tmp_path / "camp").exists()


def test_trace_of_a_preference_or_kto_job_traces_the_profiles_rows(tmp_path):
    """`hpcmem trace dpo|kto --lengths` read the profile and traced max_length rows ([4, 64] below) — the profile
    dropped without a word while `estimate` used it. The trace now runs TRL's trainer on rows as long as the
    profile's worst micro-batch (hand count: DPO chosen 6 / 12, rejected 4 / 10 → 4 rows × 12; KTO rows 9, 9 and KL
    rows 16, 2 → 2 rows × 16), the rows `--max_length` of that length traces. Tiny Qwen2, two real CPU steps each."""
    model = str(_tiny_qwen(tmp_path / "m"))
    dpo = _profile(tmp_path / "dpo.json", "dpo", {"prompt": [2, 9], "chosen": [6, 12], "rejected": [4, 10]},
                   [6, 4, 12, 10])
    kto = _profile(tmp_path / "kto.json", "kto", {"prompt": [8, 1, 3, 2], "length": [9, 9, 5, 4]}, [9, 9, 5, 4])
    for trainer, path, shape in (("dpo", dpo, [4, 12]), ("kto", kto, [2, 16])):
        common = ["trace", trainer, "--model_name_or_path", model, "--per_device_train_batch_size", "2", "--json"]
        got = _run(*common, "--max_length", "64", "--lengths", str(path))
        assert got.exit_code == 0, got.output
        got = json.loads(got.stdout)
        assert got["trace"]["batch"]["shape"] == shape, (trainer, got["trace"]["batch"])


def test_validate_refuses_records_that_are_not_a_file(tmp_path, capsys):
    """`validate --records FIFO` read it as a file with no records ("0 probe records") and went on; a FIFO is named
    as not a regular file and never opened (reading it blocks)."""
    import os

    fifo = tmp_path / "r.jsonl"
    os.mkfifo(fifo)
    _refused(capsys, ["validate", "--records", str(fifo), "--no-png"], "r.jsonl", "not a regular file")


def test_a_fifo_given_as_an_input_file_is_refused_not_waited_on(tmp_path):
    """hpcmem.inputs.files opened a file, then checked it was a regular one: open() of a FIFO blocks until someone
    writes, so `estimate --lengths FIFO` and `calibrate --cases FIFO` hung. Each is one line naming the file; a
    config given as a FIFO is "not a regular file", not "does not exist". Real processes with a deadline."""
    import os
    import subprocess
    import sys

    fifo = tmp_path / "in.yaml"
    os.mkfifo(fifo)
    small = ["--model_name_or_path", "Qwen/Qwen2.5-0.5B"]
    for argv in (["estimate", "sft", *small, "--lengths", str(fifo)],
                 ["calibrate", "--preset", "example-h100", "--dry-run", "--cases", str(fifo)],
                 ["estimate", "sft", *small, "--config", str(fifo)]):
        done = subprocess.run([sys.executable, "-m", "hpcmem", *argv], capture_output=True, text=True, timeout=15)
        line = done.stderr.strip()
        assert done.returncode == 2 and "\n" not in line and "in.yaml" in line, (argv, done.stderr)
        assert "not a regular file" in line, line


def test_calibrate_never_makes_a_campaign_in_a_folder_of_other_files(tmp_path, capsys):
    """A new campaign writes scripts/, records/, status/, logs/, work/ and report/ into its folder: `--campaign` naming
    the user's own non-empty folder (no campaign.json) would mix them with — and write over — what is there. Refused,
    dry run included, and the folder is left as it was; an empty folder is fine."""
    mine = tmp_path / "project"
    (mine / "report").mkdir(parents=True)
    (mine / "report" / "report.md").write_text("my report\n")
    _refused(capsys, ["calibrate", "--preset", "example-h100", "--dry-run", "--only", "sft-q05*", "--campaign",
                      str(mine)], "--campaign", "project", "campaign.json")
    assert sorted(p.name for p in mine.rglob("*")) == ["report", "report.md"]
    (tmp_path / "empty").mkdir()
    assert run(["calibrate", "--preset", "example-h100", "--dry-run", "--only", "sft-q05*", "--campaign",
                str(tmp_path / "empty")]) == 0


def test_logs_follow_outlives_a_log_that_goes_away(tmp_path, capsys):
    """`logs -f` re-reads each log every two seconds: a log removed or replaced by a folder meanwhile (a requeue's
    cleanup) ended the command as an internal error; it is skipped, the others still followed."""
    from hpcmem.cli.logs import _print_new

    kept, gone = tmp_path / "node0.log", tmp_path / "node1.log"
    kept.write_text("a\n")
    gone.write_text("b\n")
    offsets = {kept: 2, gone: 2}
    gone.unlink()
    kept.write_text("a\nmore\n")
    _print_new(offsets)
    assert capsys.readouterr().out == "more\n"


def test_check_gives_scripts_an_exit_status_per_verdict(capsys):
    """`estimate --check`: 0 fits, 3 tight, 4 does not fit — the level its own --json verdict names; 2 without a GPU."""
    seen = {}
    for batch in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64):
        argv = ["estimate", "sft", "--model_name_or_path", "Qwen/Qwen2.5-7B", "--dtype", "bfloat16", "--use_peft",
                "--gpu", "H100-80GB", "--max_length", "2048", "--per_device_train_batch_size", str(batch)]
        capsys.readouterr()
        assert run([*argv, "--json"]) == 0
        level = json.loads(capsys.readouterr().out)["verdict"]["level"]
        seen[level] = run([*argv, "--check"])
    assert seen == {"fits": 0, "does not fit": 4} or seen == {"fits": 0, "tight": 3, "does not fit": 4}, seen
    assert run(["estimate", "sft", *SMALL, "--check"]) == 2
