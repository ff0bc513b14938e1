"""The refactor check: random command lines are reproducible, and `differences` flags any changed output but the
search time a plan reports."""

from __future__ import annotations

from hpcmem.lab.cli_replay import differences, generate, replay


def test_the_same_seed_gives_the_same_command_lines():
    assert generate(3, 20, 5) == generate(3, 20, 5) and generate(3, 20, 5) != generate(4, 20, 5)


def test_a_changed_output_is_a_difference_and_the_search_time_is_not():
    old = [{"argv": ["plan", "sft"], "rc": 0, "out": "searched 3888 combinations in 151 ms\n", "err": ""},
           {"argv": ["estimate", "sft"], "rc": 0, "out": '{"seconds": 0.07, "peak": 10}', "err": ""}]
    new = [{**old[0], "out": "searched 3888 combinations in 192 ms\n"}, {**old[1], "out": '{"seconds": 0.09, "peak": 10}'}]
    assert differences(old, new) == []
    assert differences(old, [new[0], {**new[1], "out": '{"seconds": 0.09, "peak": 11}'}]) == ["estimate sft"]
    assert differences(old, [{**new[0], "rc": 2}, new[1]]) == ["plan sft"]
    assert differences(old, [{**new[0], "out": "searched 3887 combinations in 192 ms\n"}, new[1]]) == ["plan sft"]


def test_replay_runs_the_cli_in_process():
    [done] = replay([["estimate", "sft", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--per_device_train_batch_size",
                      "0", "--json"]])
    assert done["rc"] == 2 and "per_device_train_batch_size" in done["err"] and not done["out"]
