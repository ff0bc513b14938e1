"""Torch processes that share a machine get their share of its CPUs (hpcmem.trace.threads): the arithmetic by hand,
and a real trace pool's workers asked for their torch thread count."""

import pytest

from hpcmem.trace.threads import threads_per_process


@pytest.mark.parametrize("processes,cpus,expected", [(2, 2, 1), (2, 16, 8), (3, 2, 1), (3, 16, 5), (1, 4, 4), (0, 4, 4)])
def test_each_process_gets_its_share_and_at_least_one_thread(processes, cpus, expected, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert threads_per_process(processes, cpus=cpus) == expected


@pytest.mark.parametrize("given,expected", [("4", 4), ("32", 8), ("0", 8), ("many", 8)])
def test_an_omp_num_threads_in_the_environment_caps_the_share(given, expected, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", given)
    assert threads_per_process(2, cpus=16) == expected


@pytest.mark.torch
def test_a_trace_pool_worker_runs_torch_with_its_share(monkeypatch):
    pytest.importorskip("torch")
    import torch

    from hpcmem.trace.threads import usable_cpus
    from hpcmem.validate.trace import trace_pool

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)     # the workers would otherwise read the test run's own
    with trace_pool(workers=2) as pool:
        seen = pool.apply(torch.get_num_threads)
    assert seen == max(1, usable_cpus() // 2)
