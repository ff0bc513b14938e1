"""JobSpec: the model, the trainer's settings, the parallel layout and the GPU of one job, checked against TRL's
rules (hpcmem.job.rules) on construction."""

from __future__ import annotations

from dataclasses import dataclass, field

from hpcmem.errors import SpecError
from hpcmem.gpus.spec import GpuSpec
from hpcmem.job.job_env import JobEnv
from hpcmem.job.rules import check_job
from hpcmem.job.spec import DTYPES, ParallelSpec, TrainSpec, load_dtype
from hpcmem.models.spec import ModelSpec


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """Everything an estimate needs. `expandable_segments` mirrors PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True;
    `env` what the job's environment changes in GPU memory (hpcmem.job.job_env)."""

    model: ModelSpec
    train: TrainSpec
    parallel: ParallelSpec = field(default_factory=ParallelSpec)
    gpu: GpuSpec | None = None
    expandable_segments: bool = False
    tokens_per_micro_batch: int | None = None   # hpcmem-only: from a length profile (hpcmem lengths), else worst case
    # hpcmem-only: from a length profile, the most tokens a micro-batch scores (DPO's and KTO's completions; TRL
    # labels prompts -100); None: every position but each row's last (the bound without a profile)
    label_tokens_per_micro_batch: int | None = None
    teacher: ModelSpec | None = None            # distillation: the model teacher_model_name_or_path names
    assumed: tuple[str, ...] = ()               # values taken as hpcmem's assumption (hpcmem.job.assumptions)
    # hpcmem-only, the learner's: an SFT trace with the model's dropout modules at p = 0, as DPO, KTO and Reward's
    # disable_dropout leaves them (SFTConfig has no such field; hpcmem.trace.learn `learn_job`, NOMDROP cells)
    model_dropout_off: bool = False
    env: JobEnv = JobEnv()                      # frozen: one shared default is safe

    def __post_init__(self) -> None:
        tokens = self.tokens_per_micro_batch
        if tokens is not None and tokens < 1:
            raise SpecError(f"tokens_per_micro_batch must be ≥ 1 or None; got {tokens}")
        labels = self.label_tokens_per_micro_batch
        if labels is not None and labels < 1:
            raise SpecError(f"label_tokens_per_micro_batch must be ≥ 1 or None; got {labels}")
        check_job(self)

    @property
    def trl_forces_reentrant(self) -> bool:
        """PEFT under ZeRO-3 with checkpointing: every TRL trainer sets use_reentrant True there, whatever the user set
        (trl/trainer/sft_trainer.py: "`use_reentrant` is forced to `True` in this configuration")."""
        t, par = self.train, self.parallel
        return bool(t.use_peft and par.deepspeed and par.zero_stage == 3 and t.gradient_checkpointing)

    @property
    def reentrant_checkpointing(self) -> bool:
        """Whether the job checkpoints reentrantly: use_reentrant True, or where TRL forces it."""
        t = self.train
        return bool(t.gradient_checkpointing and t.gradient_checkpointing_kwargs.get("use_reentrant")) \
            or self.trl_forces_reentrant

    @property
    def load_dtype(self) -> str:
        """The dtype the weights load in (`load_dtype`'s rule)."""
        return load_dtype(self.train.dtype, self.model.dtype)

    @property
    def weight_bytes(self) -> int:
        """Bytes per element of the loaded (unquantized) weights."""
        return DTYPES.get(self.load_dtype, 2)
