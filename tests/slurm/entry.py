"""Training entry for the slurm tier (`hpcmem submit --entry tests/slurm/entry.py`): reports who it is, then runs
`trl.scripts.sft` unchanged.

It prints the distributed identity torchrun gave this process (RANK, GROUP_RANK, WORLD_SIZE) next to the SLURM task's
node id, so the test can prove that the two nodes joined as ranks 0 and 1. HPCMEM_TEST_STEP_SLEEP (seconds) slows
each optimizer step, so the requeue test can signal the job while it trains. HPCMEM_TEST_ECHO_FILE: instead of
training, write the job's name, HPCMEM_TEST_VALUE, the node and GPUs it got and its argv to that file as JSON (the
quoting and vLLM-placement tests); with HPCMEM_TEST_VLLM_FILE it first waits for the stub server to report, as a
real trainer waits for `trl vllm-serve`.
"""

import json
import os
import runpy
import sys
import time

ident = {k: os.environ.get(k) for k in ("RANK", "GROUP_RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_NODEID",
                                        "SLURM_PROCID", "MASTER_ADDR", "MASTER_PORT")}
print("hpcmem-test identity " + json.dumps(ident), flush=True)

echo = os.environ.get("HPCMEM_TEST_ECHO_FILE")
if echo:
    server = os.environ.get("HPCMEM_TEST_VLLM_FILE")
    for _ in range(600):
        if not server or os.path.exists(server):
            break
        time.sleep(0.1)
    with open(echo, "w") as fh:
        json.dump({"job_name": os.environ.get("SLURM_JOB_NAME"), "value": os.environ.get("HPCMEM_TEST_VALUE"),
                   "cwd": os.getcwd(), "argv": sys.argv[1:], "node": os.environ.get("SLURMD_NODENAME"),
                   "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}, fh)
    sys.exit(0)

delay = float(os.environ.get("HPCMEM_TEST_STEP_SLEEP", "0") or 0)
if delay:
    import transformers

    step = transformers.Trainer.training_step

    def slow_step(self, *args, **kwargs):
        time.sleep(delay)
        return step(self, *args, **kwargs)

    transformers.Trainer.training_step = slow_step

sys.argv[0] = "trl.scripts.sft"
runpy.run_module("trl.scripts.sft", run_name="__main__", alter_sys=True)

# torch 2.13 (CPU, gloo) sometimes aborts while a finished rank's interpreter tears down: "terminate called without an
# active exception", exit -6, seen in CI after "Training completed" and again locally with destroy_process_group()
# called first; torchrun then fails the step and the job. The launcher is what these tests check, not torch's exit
# path: once training has returned (model saved by every rank), the entry flushes its output and leaves without
# running interpreter or static destructors.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
