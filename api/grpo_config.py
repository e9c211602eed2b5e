"""GRPOConfig: TRL 1.16's fields and defaults (field_fates.FATES), TRL's __post_init__ arithmetic with its errors
as one line each, and `studio_keys`: the studio config keys a GRPOConfig sets.

The batch arithmetic (TRL grpo_config.py __post_init__; P = per_device_train_batch_size completions per
micro-step, W = world size, GA = gradient_accumulation_steps, G = num_generations, spg = steps_per_generation
micro-steps per generation, gbs = generation_batch_size completions per generation):

    neither gbs nor spg   spg = GA, gbs = P·W·spg
    gbs only              spg = gbs / (P·W)   (refused unless it divides)
    spg only              gbs = P·W·spg
    then                  gbs % G == 0, G >= 2

TRL takes an optimizer step every GA micro-steps, so one step trains P·W·GA completions, and a generation
feeds spg / GA steps. The studio counts whole prompt groups per optimizer step, so
train.prompts_per_step = P·W·GA / G and train.steps_per_generation = spg / GA must be whole numbers (refused
in one line otherwise); train.micro_batch_size = P keeps TRL's micro-step.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import sys

from .contract import algorithms
from .contract.config import Config, set_key, validate
from .contract.errors import UserError
from .field_fates import BY_FIELD, FATES, MAPPED, check_refused, refuse


def _field(fate):
    if isinstance(fate.default, list):
        return (fate.field, object, dataclasses.field(default_factory=list))
    return (fate.field, object, dataclasses.field(default=fate.default))


def _post_init(self) -> None:
    """TRL's __post_init__ (transformers' and TRL's base config's parts this API reads), then the refusals."""
    if self.bf16 is None:  # trl/trainer/base_config.py: bf16 unless fp16
        self.bf16 = not self.fp16
    if isinstance(self.scale_rewards, bool):  # grpo_config.py: True/False are the old names
        self.scale_rewards = "group" if self.scale_rewards else "none"
    if self.vllm_importance_sampling_cap is not None:  # the deprecated name of clip_max
        self.vllm_importance_sampling_clip_max = self.vllm_importance_sampling_cap
    world = world_size()
    P, gbs, spg = self.per_device_train_batch_size, self.generation_batch_size, self.steps_per_generation
    if gbs is not None and spg is not None:
        raise refuse(
            "generation_batch_size",
            gbs,
            f"'generation_batch_size' and 'steps_per_generation' ({spg}) can not be both configured at the same time",
        )
    if gbs is None and spg is None:
        spg = self.gradient_accumulation_steps
    if gbs is not None:
        if gbs % (P * world):
            raise refuse(
                "generation_batch_size",
                gbs,
                f"generation_batch_size ({gbs}) must be divisible by the global batch size ({P * world})",
            )
        spg = gbs // (P * world)
    self.steps_per_generation, self.generation_batch_size = spg, P * world * spg
    G = self.num_generations
    if G < 2:
        raise refuse(
            "num_generations",
            G,
            f"GRPO requires at least 2 generations per prompt to calculate the advantages. You provided {G}, "
            f"which is less than the minimum required",
        )
    if self.generation_batch_size % G:
        raise refuse(
            "generation_batch_size",
            self.generation_batch_size,
            f"generation_batch_size ({self.generation_batch_size}) must be divisible by num_generations ({G})",
        )
    if self.eval_on_start and self.eval_strategy in ("no", None):
        raise refuse(
            "eval_on_start",
            True,
            "grpo-studio evaluates on start only beside eval_strategy 'steps' or 'epoch'; set one of them, or "
            "remove eval_on_start",
        )
    if self.eval_strategy not in ("no", None):  # grpo_config.py: whole prompt groups per eval batch
        eval_G = self.num_generations_eval or G
        if (self.per_device_eval_batch_size * world) % eval_G:
            raise refuse(
                "per_device_eval_batch_size",
                self.per_device_eval_batch_size,
                f"The global eval batch size ({self.per_device_eval_batch_size} * {world}) must be divisible by the "
                f"number of generations used for evaluation ({eval_G})",
            )
    check_refused(dataclasses.asdict(self))


GRPOConfig = dataclasses.make_dataclass(
    "GRPOConfig",
    [_field(fate) for fate in FATES],
    namespace={
        "__post_init__": _post_init,
        "__doc__": "TRL 1.16's GRPOConfig: the same fields and defaults, each field's fate in "
        "grpo_studio.field_fates (docs/python-api.md).",
    },
)
GRPOConfig.__module__ = __name__


def _one_line(hook):
    """sys.excepthook for a script using the API: a UserError it does not catch is its one line on stderr (exit
    status 1), as the CLI prints it, not a traceback."""

    def excepthook(kind, err, trace):
        if isinstance(err, UserError):
            print(err.line(), file=sys.stderr, flush=True)
        else:
            hook(kind, err, trace)

    excepthook.one_line = True
    return excepthook


if not getattr(sys.excepthook, "one_line", False):
    sys.excepthook = _one_line(sys.excepthook)


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def from_trl(args) -> GRPOConfig:
    """Ours from a trl.GRPOConfig (which has run its own __post_init__: both batch numbers are resolved, so
    generation_batch_size is left for ours to derive again). A field TRL has and the table has not: one line."""
    values = {f.name: _plain(getattr(args, f.name)) for f in dataclasses.fields(args) if f.init}
    values["debug"] = values["debug"] or ""  # transformers turns '' into []
    unknown = sorted(set(values) - set(BY_FIELD))
    if unknown:
        raise refuse(
            unknown[0], values[unknown[0]], f"a field of TRL {_trl_version()} that grpo-studio has not decided on"
        )
    values["generation_batch_size"] = None
    return GRPOConfig(**values)


def _plain(value):
    """transformers' str enums (IntervalStrategy, SchedulerType, ...) as their strings."""
    return value.value if isinstance(value, enum.Enum) else value


def _trl_version() -> str:
    import trl

    return trl.__version__


def batch_keys(args: GRPOConfig) -> dict[str, int]:
    """The batch arithmetic in the studio's keys (the module doc); a split TRL makes and the studio cannot is
    one line."""
    P, GA, G, spg = (
        args.per_device_train_batch_size,
        args.gradient_accumulation_steps,
        args.num_generations,
        args.steps_per_generation,
    )
    step = P * world_size() * GA
    if step % G:
        raise refuse(
            "per_device_train_batch_size",
            P,
            f"per_device_train_batch_size ({P}) x world size ({world_size()}) x gradient_accumulation_steps ({GA}) "
            f"= {step} completions per optimizer step is not a multiple of num_generations ({G}); grpo-studio's "
            f"optimizer steps take whole prompt groups",
        )
    if spg % GA:
        raise refuse(
            "steps_per_generation",
            spg,
            f"steps_per_generation ({spg}) must be a multiple of gradient_accumulation_steps ({GA}) under "
            f"grpo-studio: a generation is split into whole optimizer steps",
        )
    return {
        "train.prompts_per_step": step // G,
        "train.steps_per_generation": spg // GA,
        "train.micro_batch_size": P,
    }


def total_steps(args: GRPOConfig, n_rows: int | None) -> int:
    """train.steps: max_steps, or TRL's count of optimizer steps in num_train_epochs passes over n_rows prompts
    (RepeatSampler: whole generations of gbs / G prompts, each repeated spg x num_iterations micro-steps;
    transformers: ceil(micro-steps / GA) per epoch, at least 1)."""
    if args.max_steps > 0:
        return args.max_steps
    if n_rows is None:
        raise refuse("max_steps", args.max_steps, "an IterableDataset has no length: set max_steps > 0, as TRL needs")
    return math.ceil(args.num_train_epochs * steps_per_epoch(args, n_rows))


def steps_per_epoch(args: GRPOConfig, n_rows: int) -> int:
    """TRL's optimizer steps in one pass over n_rows prompts (total_steps)."""
    per_generation = args.generation_batch_size // args.num_generations
    micro_steps = (n_rows // per_generation) * args.steps_per_generation * args.num_iterations
    GA = args.gradient_accumulation_steps
    return max(micro_steps // GA + int(micro_steps % GA > 0), 1)


def _ratio_steps(field: str, value: float, steps: int) -> int:
    """transformers' steps fields: a value below 1 is a fraction of the run's steps."""
    if value < 0:
        raise refuse(field, value, "allowed: >= 0")
    return math.ceil(steps * value) if value < 1 else int(value)


LR_SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant"}
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
TRACKERS = ("tensorboard", "wandb", "trackio")
IS_MODES = {
    "token_truncate": ("token", "truncate"),
    "token_mask": ("token", "mask"),
    "sequence_truncate": ("sequence", "truncate"),
    "sequence_mask": ("sequence", "mask"),
}


def studio_keys(args: GRPOConfig, n_rows: int | None) -> list[tuple[str, object, str]]:
    """(studio key, value, the GRPOConfig field it comes from) for every mapped field; n_rows: the training
    prompts (None for an IterableDataset). A mapped field's value the studio cannot take is one line."""
    out: list[tuple[str, object, str]] = []

    def put(key: str, value: object, field: str) -> None:
        out.append((key, value, field))

    for fate in FATES:
        if fate.kind == MAPPED and fate.key:
            put(fate.key, getattr(args, fate.field), fate.field)
    for key, value in batch_keys(args).items():
        put(key, value, "per_device_train_batch_size")
    steps = total_steps(args, n_rows)
    put("train.steps", steps, "max_steps")
    if not args.shuffle_dataset:
        raise refuse("shuffle_dataset", False, "prompts are always drawn in a seeded shuffled order")
    schedule = LR_SCHEDULES.get(args.lr_scheduler_type)
    if schedule is None:
        raise refuse("lr_scheduler_type", args.lr_scheduler_type, f"allowed: {', '.join(LR_SCHEDULES)}")
    put("train.lr_schedule", schedule, "lr_scheduler_type")
    put("train.warmup_steps", _ratio_steps("warmup_steps", args.warmup_steps, steps), "warmup_steps")
    if args.optim not in ("adamw_torch", "adamw_torch_fused"):
        raise refuse(
            "optim", args.optim, "grpo-studio trains with torch AdamW; allowed: adamw_torch, adamw_torch_fused"
        )
    put("model.dtype", "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32", "bf16")
    kwargs = args.gradient_checkpointing_kwargs
    if kwargs not in (None, {}, {"use_reentrant": False}):
        raise refuse("gradient_checkpointing_kwargs", kwargs, "the studio checkpoints non-reentrant only")
    _model_init_kwargs(args.model_init_kwargs, put)
    put("report.to", _trackers(args.report_to), "report_to")
    if set(_trackers(args.report_to)) & {"wandb", "trackio"}:
        put("report.project", args.project, "project")
    _evaluation(args, n_rows, steps, put)
    if args.save_strategy == "steps":  # rounded up to whole rollouts (a checkpoint never falls inside one)
        rollout = (args.steps_per_generation // args.gradient_accumulation_steps) * args.num_iterations
        every = _ratio_steps("save_steps", args.save_steps, steps)
        put("train.save_every", math.ceil(every / rollout) * rollout, "save_steps")
    elif args.save_strategy == "no":
        put("train.save_every", 0, "save_strategy")
    else:
        raise refuse("save_strategy", args.save_strategy, "allowed: 'steps', 'no'")
    put("train.keep_checkpoints", args.save_total_limit or 0, "save_total_limit")
    put("algo.epsilon_high", args.epsilon if args.epsilon_high is None else args.epsilon_high, "epsilon_high")
    put("algo.delta", args.delta or 0.0, "delta")
    put("algo.scale_rewards", args.scale_rewards, "scale_rewards")
    if args.loss_type not in LOSS_TYPES:
        raise refuse("loss_type", args.loss_type, f"allowed with grpo-studio: {', '.join(LOSS_TYPES)}")
    put("algo.loss_type", args.loss_type, "loss_type")
    if args.reward_weights is not None:
        put("rewards.weights", list(args.reward_weights), "reward_weights")
    turns = 1000 if args.max_tool_calling_iterations is None else args.max_tool_calling_iterations + 1
    put("env.max_turns", turns, "max_tool_calling_iterations")
    _sampler(args, put)
    return out


def _evaluation(args: GRPOConfig, n_rows: int | None, steps: int, put) -> None:
    """eval_strategy as train.eval_every (transformers: 'steps' every eval_steps, logging_steps when unset; 'epoch'
    at each pass over the prompts), eval_on_start as train.eval_before, num_generations_eval as train.eval_k. The
    eval rows are eval_dataset's (GRPOTrainer: data.eval_source)."""
    strategy = args.eval_strategy or "no"
    if strategy == "no":
        put("train.eval_every", 0, "eval_strategy")
        return
    if strategy == "steps":
        every = _ratio_steps("eval_steps", args.eval_steps or args.logging_steps, steps)
    elif strategy == "epoch":
        if n_rows is None:
            raise refuse("eval_strategy", strategy, "an IterableDataset has no epochs; use 'steps' with eval_steps")
        every = steps_per_epoch(args, n_rows)
    else:
        raise refuse("eval_strategy", strategy, "allowed: 'no', 'steps', 'epoch'")
    put("train.eval_every", max(every, 1), "eval_steps" if strategy == "steps" else "eval_strategy")
    put("train.eval_before", bool(args.eval_on_start), "eval_on_start")
    put("train.eval_k", args.num_generations_eval or args.num_generations, "num_generations_eval")


def _model_init_kwargs(kwargs: dict | None, put) -> None:
    dtypes = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
    for name, value in (kwargs or {}).items():
        field = f"model_init_kwargs[{name!r}]"
        if name == "dtype" or name == "torch_dtype":
            text = str(value).removeprefix("torch.")
            if text != "auto" and text not in dtypes:
                raise refuse(field, value, f"allowed: auto, {', '.join(dtypes)}")
            if text != "auto":
                put("model.dtype", dtypes[text], field)
        elif name not in ("attn_implementation", "device_map"):
            raise refuse(field, value, "grpo-studio's loader takes dtype (attn_implementation, device_map: no effect)")


def _trackers(report_to) -> list[str]:
    names = [report_to] if isinstance(report_to, str) or report_to is None else list(report_to)
    if names in ([None], ["none"], []):
        return []
    if names == ["all"]:
        import importlib.util

        return [name for name in TRACKERS if importlib.util.find_spec(name) is not None]
    for name in names:
        if name not in TRACKERS:
            raise refuse("report_to", report_to, f"grpo-studio mirrors metrics to {', '.join(TRACKERS)} or none")
    return names


def _sampler(args: GRPOConfig, put) -> None:
    if not args.use_vllm:
        put("rollout.backend", "hf", "use_vllm")
        return
    put("rollout.backend", "vllm", "use_vllm")
    if args.vllm_mode != "colocate":
        raise refuse(
            "vllm_mode",
            args.vllm_mode,
            "the studio's rollout server is `grpo-studio rollout-serve`, used from the CLI (rollout.server); "
            "allowed: 'colocate'",
        )
    put("rollout.gpu_memory_utilization", args.vllm_gpu_memory_utilization, "vllm_gpu_memory_utilization")
    put("rollout.sleep", args.vllm_enable_sleep_mode, "vllm_enable_sleep_mode")
    if not args.vllm_importance_sampling_correction:
        put("algo.is_level", "none", "vllm_importance_sampling_correction")
        return
    mode = IS_MODES.get(args.vllm_importance_sampling_mode)
    if mode is None:
        raise refuse(
            "vllm_importance_sampling_mode", args.vllm_importance_sampling_mode, f"allowed: {', '.join(IS_MODES)}"
        )
    put("algo.is_level", mode[0], "vllm_importance_sampling_mode")
    put("algo.is_mode", mode[1], "vllm_importance_sampling_mode")
    put("algo.is_cap", args.vllm_importance_sampling_clip_max or 0.0, "vllm_importance_sampling_clip_max")


def studio_config(pairs: list[tuple[str, object, str]]) -> Config:
    """A validated Config from (key, value, field) pairs, as config.load builds one: algo.name grpo and its
    preset first, then every pair; a value a key refuses is one line naming the GRPOConfig field."""
    cfg = Config()
    set_key(cfg, "algo.name", "grpo")
    for key, value in algorithms.defaults("grpo").items():
        set_key(cfg, key, value)
    for key, value, field in pairs:
        try:
            set_key(cfg, key, value)
        except UserError as err:
            raise refuse(field, value, f"{err.why} (as {key})") from None
    validate(cfg)
    return cfg
