"""Throughput per knob combination, memoised (`Speeds`, what the search ranks with), and the planner's speed for one
job as it is (`job_throughput`, what `hpcmem validate probes --speed` holds to timed probe runs) — stdlib, the same
code path, memo and constants."""

from __future__ import annotations

from dataclasses import asdict, replace
from types import SimpleNamespace

from hpcmem.errors import SpecError
from hpcmem.estimate.lora import lora_layout
from hpcmem.gpus.spec import GpuSpec
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import micro_batch
from hpcmem.plan.knobs import GIVEN, Knobs, job_knobs
from hpcmem.plan.sync_batch import is_sync
from hpcmem.plan.throughput import (
    PADDED_FILL_FRACTION,
    Rates,
    Setting,
    Throughput,
    flops_params,
    interconnect_gbps,
    mfu_curve,
    throughput,
)


class Speeds:
    """Throughput per combination, memoised on the few inputs that differ between combinations."""

    def __init__(self, job: JobSpec, gpu: GpuSpec) -> None:
        m, par = job.model, job.parallel
        self.job = job
        self.cache: dict[tuple, Throughput] = {}
        self.shape: dict[tuple, tuple[int, float, int]] = {}
        self.trainable: dict[str, int] = {}
        self.by_sharding: dict[str, tuple] = {}
        self.rates = Rates(n_flops=flops_params(m), n_params=m.num_params, layers=m.num_hidden_layers,
                           attn_width=m.num_attention_heads * m.head_dim, hidden=m.hidden_size,
                           kv_width=m.num_key_value_heads * m.head_dim,
                           world=par.world_size, num_machines=par.num_machines,
                           peak_tflops=gpu.peak_tflops(job.train.fp16),
                           link_gbps=interconnect_gbps(gpu.name, par.num_machines), mfu_curve=mfu_curve(gpu.name))

    def _shape(self, pack: str, batch: int) -> tuple[int, float, int]:
        """Tokens computed per micro-batch (estimate.shape.micro_batch, the estimator's own), useful share, span."""
        key = (pack, batch)
        if key not in self.shape:
            t = replace(self.job.train, per_device_train_batch_size=batch, packing=pack == "packing",
                        padding_free=pack == "padding_free")
            # parallel: a generating trainer pads its whole generation batch, split over the ranks (job.shape)
            mb = micro_batch(SimpleNamespace(train=t, model=self.job.model, parallel=self.job.parallel,
                                             tokens_per_micro_batch=self.job.tokens_per_micro_batch,
                                             label_tokens_per_micro_batch=self.job.label_tokens_per_micro_batch))
            max_len = t.max_length or self.job.model.max_position_embeddings
            if mb.padding_free:
                self.shape[key] = (mb.tokens, 1.0, max(1, int(max_len * PADDED_FILL_FRACTION)))
            else:
                self.shape[key] = (mb.tokens, PADDED_FILL_FRACTION, mb.seq)
        return self.shape[key]

    def _trainable(self, peft: str) -> int:
        if peft not in self.trainable:
            if peft in ("none",):
                self.trainable[peft] = self.job.model.num_params
            else:
                t = replace(self.job.train, use_peft=True, load_in_4bit=peft == "qlora")
                try:
                    self.trainable[peft] = lora_layout(SimpleNamespace(train=t, model=self.job.model,
                                                                       parallel=self.job.parallel)).num_params
                except SpecError:
                    # peft cannot place the adapters (no default target_modules for this model type): the walk
                    # refuses these combinations with peft's reason (hpcmem.estimate raises the same SpecError)
                    self.trainable[peft] = self.job.model.num_params
        return self.trainable[peft]

    @staticmethod
    def key(k: Knobs) -> tuple:
        """What the throughput reads of a combination: gc, activation_offloading, pack, batch, accum, sharding, peft —
        Knobs' first seven fields (a slice, not seven attribute reads: the planner asks once per combination)."""
        return k[:7]

    def __call__(self, k: Knobs, fields: dict) -> Throughput:
        """`fields`: the parallel fields of k's sharding (ParallelSpec names), the same for every call with it."""
        key = self.key(k)
        hit = self.cache.get(key)
        if hit is None:
            hit = self.cache[key] = self._throughput(k, fields)
        return hit

    def _sharding(self, name: str, fields: dict) -> tuple:
        """What the throughput reads of a sharding's fields: (sequence shards, sharding, offload optimizer, offload
        parameters, sequence split), worked out once per sharding name."""
        hit = self.by_sharding.get(name)
        if hit is None:
            shards = max(fields["cp_size"], fields["sp_size"])        # a sequence-split layout: the rank's share
            dist, stage = fields["distributed_type"], fields["zero_stage"]
            hit = self.by_sharding[name] = (
                shards, "fsdp" if dist == "FSDP" else (f"zero{stage}" if dist == "DEEPSPEED" and stage else "ddp"),
                fields["offload_optimizer_device"] != "none" or fields["fsdp_offload_params"],
                fields["offload_param_device"] != "none" or fields["fsdp_offload_params"],
                "cp" if fields["cp_size"] > 1 else "sp" if fields["sp_size"] > 1 else "")
        return hit

    def _throughput(self, k: Knobs, fields: dict) -> Throughput:
        tokens, useful, span = self._shape(k.pack, k.batch)
        shards, sharding, offload_optimizer, offload_params, seq_split = self._sharding(k.sharding, fields)
        s = Setting(tokens=-(-tokens // shards), useful_fraction=useful, attn_seq=span, grad_accum=k.accum, gc=k.gc,
                    activation_offloading=k.activation_offloading, sharding=sharding,
                    offload_optimizer=offload_optimizer, offload_params=offload_params,
                    peft=k.peft if k.peft in ("none", "lora", "qlora") else "lora",
                    trainable_params=self._trainable(k.peft), seq_shards=shards, seq_split=seq_split,
                    sync_each_batch=is_sync(k.sharding) or (k.sharding == GIVEN and self.job.train.sync_each_batch))
        return throughput(s, self.rates)


def job_throughput(job: JobSpec, gpu: GpuSpec) -> Throughput:
    """The throughput model's answer for `job` on `gpu` (its fitted MFU curve when the GPU has one)."""
    return Speeds(job, gpu)(job_knobs(job), asdict(job.parallel))
