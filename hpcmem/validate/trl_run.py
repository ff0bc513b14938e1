"""TRL's real trainer run from a job's settings, as `trl <trainer>` would run it, on a shrunken model: the oracle of
refusal parity (does the real trainer raise where hpcmem refuses?).

    verdict = run_trl(trainer, settings, config, steps=2)   # TrlVerdict(ran, reason, adjusted, seconds)

Nothing of hpcmem's own reading of the settings is used: the fields go to TRL's own classes as the command line's
parser would split them (trl/scripts/<trainer>.py `main`): ModelConfig's fields to `trl.ModelConfig` (the model's
`dtype` and `attn_implementation` become `model_init_kwargs`; LoRA through `trl.get_peft_config`), the rest to the
trainer's config class (`trl.<Name>Config`), and the trainer gets the model as a path, so TRL's own
`create_model_from_path` loads it. The model is the shrunken config with random weights saved to a folder with a
word-level tokenizer; the dataset is text in the trainer's TRL dataset type.

Before any model is built, TRL's config classes are (`config_refusal`: an unknown field, a __post_init__ check), as
the command line's parser builds them before it loads a model: their refusal is the trainer's on any machine, and a
distillation job, whose teacher this oracle does not build, is still held to them.
What a CPU cannot run is not run (`cpu_limit`: quantization, bitsandbytes optimizers, flash-attn, fp16 autocast,
Liger, vLLM, more than one process) and what TRL runs only on an accelerator is switched off and listed in `adjusted`
(activation offloading: trl/models/activation_offloading.py asks `torch.accelerator.current_accelerator()`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from hpcmem.job.trainers import entry
from hpcmem.trace import pieces

WORDS = 64                 # words of the tokenizer (ids 3 … 66: inside any shrunken vocabulary)
# not settings of TRL's classes: hpcmem's own (the GPU, the launcher, the allocator) — the trainer never sees them
HPCMEM_ONLY = ("profile_images", "profile_patches", "profile_image_tokens",
               "gpu", "num_processes", "num_machines", "distributed_type", "expandable_segments",
               "tokens_per_micro_batch", "label_tokens_per_micro_batch", "mixed_precision", "fsdp_config", "deepspeed_config")
# hpcmem's description of the data, where TRL's config has no such field (GRPO/RLOO/distillation in TRL 1.16 have no
# max_prompt_length: the prompt is as long as the dataset's); it shapes the oracle's dataset instead
DATA_ONLY = ("max_prompt_length",)
BNB_OPTIMS = ("8bit", "paged", "bnb", "lomo", "galore", "apollo")


@dataclass
class TrlVerdict:
    ran: bool | None                # None: not run on a CPU (see `reason`)
    reason: str = ""
    adjusted: list[str] = field(default_factory=list)
    seconds: float = 0.0
    raised_in: str = ""             # where it raised: "trl/<file>:<function> > <file>:<function>" (`raised_in_frames`)


def cpu_limit(trainer: str, settings: dict[str, Any]) -> str:
    """Why TRL's trainer cannot run these settings on a CPU here ("" when it can)."""
    s = settings
    if s.get("load_in_4bit") or s.get("load_in_8bit"):
        return "load_in_4bit/8bit: bitsandbytes needs a GPU"
    if any(m in str(s.get("optim", "")) for m in BNB_OPTIMS):
        return f"optim {s['optim']!r} needs bitsandbytes / a GPU"
    if str(s.get("attn_implementation") or "").startswith(("flash", "kernels-")) or "/" in str(
            s.get("attn_implementation") or ""):
        return f"attn_implementation {s['attn_implementation']!r} needs CUDA"
    if s.get("fp16"):        # accelerate/accelerator.py Accelerator.__init__: fp16 mixed precision needs cuda/xpu/…
        return "fp16: accelerate's fp16 mixed precision needs a GPU"
    if s.get("use_liger_kernel"):
        return "use_liger_kernel: Liger's Triton kernels need a GPU"
    if s.get("use_vllm"):
        return "use_vllm: vLLM needs a GPU"
    if int(s.get("num_processes") or 1) > 1 or s.get("fsdp") or s.get("deepspeed"):
        return "more than one process / FSDP / DeepSpeed: one CPU process here"
    if s.get("torch_compile"):
        return "torch_compile: inductor on CPU is out of this oracle's time budget"
    return ""


NO_TEACHER = "distillation: the oracle builds no teacher"


def run_trl(trainer: str, settings: dict[str, Any], config: dict[str, Any], *, steps: int = 2,
            workdir: str | None = None, image_text: bool = False) -> TrlVerdict:
    """Run `steps` optimizer steps of TRL's `trainer` on `config` (shrunken) with `settings` (TRL field → value);
    `image_text`: the type's image-text-to-text class is saved (its config's `architectures`, which TRL's
    create_model_from_path loads), else its causal-LM class."""
    start = time.perf_counter()
    limit = cpu_limit(trainer, settings)
    if limit:
        return TrlVerdict(None, limit)
    refused = config_refusal(trainer, settings)       # TRL's config classes say it before any model is built
    if refused:
        return TrlVerdict(False, refused, [], time.perf_counter() - start)
    if trainer == "distillation":
        return TrlVerdict(None, NO_TEACHER)
    adjusted: list[str] = []
    with tempfile.TemporaryDirectory(prefix="hpcmem-trl-", dir=workdir) as tmp, kept_autocast():
        try:
            model_path = save_model(config, Path(tmp) / "model", image_text=image_text)
        except Exception as exc:                       # the shrink's limit, not the trainer's verdict
            return TrlVerdict(None, f"shrunken model does not build: {type(exc).__name__}: {one_line(exc)}")
        try:
            built = _build(trainer, settings, model_path, Path(tmp) / "out", steps, adjusted)
            built.train()
        except Exception as exc:                       # the verdict: TRL (or torch under it) raised
            return TrlVerdict(False, f"{type(exc).__name__}: {one_line(exc)}", adjusted,
                              time.perf_counter() - start, raised_in_frames(exc))
    return TrlVerdict(True, "", adjusted, time.perf_counter() - start)


def save_model(config: dict[str, Any], folder: Path, *, image_text: bool = False) -> str:
    """The config with random weights in its own dtype (what `dtype="auto"` reads back), and the tokenizer."""
    build_model(config, image_text=image_text).save_pretrained(folder)
    pieces.tokenizer(WORDS).save_pretrained(folder)
    return str(folder)


def build_model(config: dict[str, Any], *, image_text: bool = False) -> Any:
    """The config's causal-LM class (`image_text`: its image-text-to-text class) with random weights in the config's
    dtype."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    data = {k: v for k, v in config.items() if k not in ("model_type", "transformers_version", "architectures",
                                                            "auto_map", "quantization_config")}
    cfg = AutoConfig.for_model(config["model_type"], **data)
    dtype = getattr(torch, str(config.get("dtype") or config.get("torch_dtype") or "float32"), torch.float32)
    if not image_text:
        return AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    # the image-text class by its name in transformers' mapping (AutoModelForImageTextToText.from_config does not
    # resolve every type's config class, Evolla's among them)
    cls = getattr(transformers, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[config["model_type"]])
    return cls._from_config(cfg, dtype=dtype)


def trl_args(trainer: str, settings: dict[str, Any], model_path: str, out: Path, steps: int,
             adjusted: list[str] | None = None) -> tuple[Any, Any]:
    """(trl.ModelConfig, the trainer's config) built from the settings as trl/scripts/<trainer>.py's parser splits
    them: what TRL's own classes raise on (an unknown field, __post_init__'s checks) raises here."""
    import trl

    e = entry(trainer)
    model_fields = _fields(trl.ModelConfig)
    config_cls = getattr(trl, e.config_class)
    s = {k: v for k, v in settings.items() if k not in HPCMEM_ONLY and k != "model_name_or_path"}
    model_args = trl.ModelConfig(model_name_or_path=model_path, **{k: v for k, v in s.items() if k in model_fields})
    train = {k: v for k, v in s.items() if k not in model_fields and not (k in DATA_ONLY and k not in
                                                                           _fields(config_cls))}
    if train.get("activation_offloading") and adjusted is not None:
        train["activation_offloading"] = False
        adjusted.append("activation_offloading off (TRL's offloading needs an accelerator)")
    # use_cpu: TrainingArguments refuses bf16 on a machine without a GPU otherwise (a fact of this machine, not of
    # the settings)
    args = config_cls(**train, output_dir=str(out), max_steps=steps, report_to="none", use_cpu=True,
                      save_strategy="no", logging_steps=10_000, disable_tqdm=True, dataloader_num_workers=0)
    return model_args, args


def config_refusal(trainer: str, settings: dict[str, Any]) -> str:
    """What TRL's own config classes raise on the settings, one line ("" when they take them, or when a package this
    machine lacks keeps them from saying: an ImportError is not a verdict on the settings)."""
    with tempfile.TemporaryDirectory(prefix="hpcmem-trl-args-") as tmp:
        try:
            trl_args(trainer, settings, tmp, Path(tmp) / "out", 1)
        except ImportError:
            return ""
        except Exception as exc:  # noqa: BLE001 — whatever TRL's classes raise is their refusal
            return f"{type(exc).__name__}: {one_line(exc)}"
    return ""


def _build(trainer: str, settings: dict[str, Any], model_path: str, out: Path, steps: int,
           adjusted: list[str]) -> Any:
    import trl

    e = entry(trainer)
    model_args, args = trl_args(trainer, settings, model_path, out, steps, adjusted)
    # trl/scripts/<trainer>.py main: the model's loading arguments go to model_init_kwargs
    init = {"attn_implementation": model_args.attn_implementation, "dtype": model_args.dtype}
    args.model_init_kwargs = {**init, **(args.model_init_kwargs or {})}
    rows = max(16, 4 * args.per_device_train_batch_size * args.gradient_accumulation_steps * steps)
    kwargs: dict[str, Any] = {}
    if e.generates:
        kwargs["reward_funcs"] = _length_reward
    cls = getattr(trl, e.trainer_class)
    # the tokenizer is handed over: a multimodal type's folder holds no image processor for TRL's
    # AutoProcessor.from_pretrained to find (a real checkpoint has one; text rows never reach it)
    return cls(model=model_path, args=args, train_dataset=dataset(e.lengths.dataset, rows, settings),
               processing_class=pieces.tokenizer(WORDS), peft_config=trl.get_peft_config(model_args), **kwargs)


def _fields(cls: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def dataset(kind: str, rows: int, settings: dict[str, Any]) -> Any:
    """Rows in TRL's dataset type `kind` (docs "Dataset formats and types"), each as long as max_length allows."""
    from datasets import Dataset

    length = int(settings.get("max_length") or 32)
    prompt = int(settings.get("max_prompt_length") or max(1, length // 2))

    def words(n: int, shift: int = 0) -> str:
        return " ".join(f"t{pieces.FIRST_TOKEN_ID + (i + shift) % WORDS}" for i in range(max(1, n)))

    if kind == "preference":
        # prompt + chosen (+ eos) within max_length: RewardTrainer drops a longer pair instead of cutting it
        # (trl/trainer/reward_trainer.py `_prepare_dataset` filter), DPOTrainer would cut it
        head = max(1, length // 4)
        body = max(2, length - head - 2)
        return Dataset.from_dict({"prompt": [words(head)] * rows, "chosen": [words(body, 1)] * rows,
                                  "rejected": [words(body - 1, 2)] * rows})
    if kind == "prompt_only":
        return Dataset.from_dict({"prompt": [words(prompt, i) for i in range(rows)]})
    if kind == "unpaired_preference":
        return Dataset.from_dict({"prompt": [words(prompt // 2)] * rows, "completion": [words(length, 1)] * rows,
                                  "label": [i % 2 == 0 for i in range(rows)]})
    return Dataset.from_dict({"text": [words(length + 1, i) for i in range(rows)]})


def _length_reward(completions: list[Any], **_: Any) -> list[float]:
    """A reward function (GRPO/RLOO take any callable): the completion's length."""
    return [float(len(str(c))) for c in completions]


def raised_in_frames(exc: BaseException) -> str:
    """Where TRL's code last ran before the exception ("trl/<file>:<function>", its innermost frame in the trl
    package) and the frame that raised ("<file>:<function>"), joined by " > " when they differ."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    where = [f"{Path(f.filename).name}:{f.name}" for f in frames]
    in_trl = [i for i, f in enumerate(frames) if "/trl/" in Path(f.filename).as_posix()]
    if in_trl and in_trl[-1] != len(frames) - 1:
        return f"trl/{where[in_trl[-1]]} > {where[-1]}"
    return f"trl/{where[-1]}" if in_trl else where[-1]


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:400]


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """TimeoutError in the main thread after `seconds` (signal.alarm): one stuck run does not stop the batch."""
    def fire(*_: Any) -> None:
        raise TimeoutError(f"over {seconds} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No progress bars, metrics or warnings on the terminal (datasets, transformers, TRL print them)."""
    import datasets
    import transformers

    datasets.disable_progress_bars()
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        transformers.logging.set_verbosity(level)


@contextlib.contextmanager
def kept_autocast() -> Iterator[None]:
    """The CPU autocast state (enabled, dtype, cache) as it was before, whatever the run inside left: a forward that
    re-enters its own autocast-wrapped forward (accelerate's `prepare_model` wraps `model.forward` in one
    torch.autocast instance; TRL's fused LM head on a model that is its own `base_model` calls it again) overwrites
    the instance's saved state on the inner `__enter__` (torch/amp/autocast_mode.py `autocast.__enter__` keeps
    `self.prev` on the instance), so the outer `__exit__` leaves autocast on for the rest of the process — every
    later trace in it then runs under bf16 autocast."""
    import torch

    state = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), torch.is_autocast_cache_enabled())
    try:
        yield
    finally:
        torch.set_autocast_enabled("cpu", state[0])
        torch.set_autocast_dtype("cpu", state[1])
        torch.set_autocast_cache_enabled(state[2])
