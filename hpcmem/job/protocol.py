"""What the checks a job runs while it is built read of it. hpcmem.job.jobspec.JobSpec satisfies `Job` and runs
those checks on construction (the rules, the micro-batch shape, the kernel limits, the device mesh's rules): typed by
this protocol, they need not import the class that imports them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from hpcmem.gpus.spec import GpuSpec
    from hpcmem.job.spec import ParallelSpec, TrainSpec
    from hpcmem.models.spec import ModelSpec


class Job(Protocol):
    @property
    def model(self) -> ModelSpec: ...

    @property
    def train(self) -> TrainSpec: ...

    @property
    def parallel(self) -> ParallelSpec: ...

    @property
    def gpu(self) -> GpuSpec | None: ...

    @property
    def expandable_segments(self) -> bool: ...

    @property
    def tokens_per_micro_batch(self) -> int | None: ...

    @property
    def label_tokens_per_micro_batch(self) -> int | None: ...

    @property
    def teacher(self) -> ModelSpec | None: ...

    @property
    def load_dtype(self) -> str: ...

    @property
    def reentrant_checkpointing(self) -> bool: ...

    @property
    def weight_bytes(self) -> int: ...
