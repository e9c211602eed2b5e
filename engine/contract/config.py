"""Typed run config: TOML load/save, dotted `--set` overrides, one-line validation errors.

Pure python (no torch), so the studio and the VRAM planner can import it.

Every user mistake raises `UserError` (engine/contract/errors.py) whose message is one line naming
the key, the value and what is allowed. The CLI prints it and exits with code 2.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from grpo_studio.engine.contract import algorithms, bundled, dtypes
from grpo_studio.engine.contract.errors import UserError, did_you_mean, show_choices


def opt(default, *, choices=None, lo=None, hi=None, lo_open=False, help=""):
    """A config field with its validation rules (choices, inclusive/open lower bound, upper bound)."""
    meta = {"choices": choices, "lo": lo, "hi": hi, "lo_open": lo_open, "help": help}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


DTYPES = list(dtypes.DTYPES)
ALGOS = list(algorithms.PRESETS)
LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo"]


@dataclass
class ModelConfig:
    name: str = opt("tiny-arith", help="preset id, local folder, or hub id")
    dtype: str = opt("fp32", choices=DTYPES, help="trainer precision")
    lora_rank: int = opt(8, lo=0, help="0 = full fine-tune")
    lora_alpha: float = opt(16.0, lo=0, lo_open=True, help="LoRA scaling: the update is multiplied by alpha / rank")
    lora_dropout: float = opt(0.0, lo=0, hi=0.99, help="dropout on the LoRA adapters' input")
    lora_target_modules: list = opt(["all-linear"], help="peft target_modules")
    load_in_4bit: bool = opt(False, help="QLoRA in the VRAM planner: base weights counted in 4-bit nf4 "
                                         "(the trainer does not quantise)")
    gradient_checkpointing: bool = opt(False, help="recompute each layer in the backward instead of keeping "
                                                   "its activations (less memory, slower)")
    offload_checkpoints: bool = opt(False, help="keep saved activations in host RAM during the forward "
                                                "(CUDA only; Unsloth-style offloaded checkpoints)")
    logits_chunk: int = opt(0, lo=0, help="tokens per chunk of the fused, recomputed lm_head + log-softmax; "
                                          "0 = materialise the completion logits")


@dataclass
class RolloutConfig:
    backend: str = opt("auto", choices=["auto", "hf", "vllm"], help="auto = vllm when installed, else hf")
    dtype: str = opt("", choices=["", *DTYPES], help="empty = model.dtype")
    num_generations: int = opt(8, lo=2, help="G completions per prompt")
    max_prompt_len: int = opt(64, lo=1, help="prompt tokens kept (the end of a longer prompt)")
    max_completion_len: int = opt(16, lo=1, help="most tokens sampled per completion")
    temperature: float = opt(1.0, lo=0, lo_open=True, help="sampling temperature; the trainer's log-probs use the same")
    top_p: float = opt(1.0, lo=0, hi=1.0, lo_open=True, help="nucleus sampling; 1 = off")
    top_k: int = opt(0, lo=0, help="0 = off")
    gpu_memory_utilization: float = opt(0.3, lo=0, hi=1.0, lo_open=True,
                                        help="vLLM: share of the GPU's memory it reserves for weights and KV cache")
    colocate: bool = opt(True, help="vLLM shares the training GPU (TRL vllm_mode=colocate); false = its own GPU")
    sleep: bool = opt(False, help="vLLM sleeps (frees its memory) during the train phase")
    vllm_enforce_eager: str = opt("auto", choices=["auto", "on", "off"],
                                  help="on = no torch.compile/graphs (faster start, slower decode); auto = vLLM's default")


@dataclass
class AlgoConfig:
    name: str = opt("grpo", choices=ALGOS, help="algorithm preset: fills the other algo.* keys (docs/algorithms.md)")
    loss_type: str = opt("grpo", choices=LOSS_TYPES, help="how token losses are averaged: per sequence (grpo), "
                                                          "per batch token (bnpo), by B·L_max (dr_grpo), DAPO's")
    epsilon: float = opt(0.2, lo=0, help="clip range below: ratio >= 1 - epsilon")
    epsilon_high: float = opt(0.2, lo=0, help="clip range above: ratio <= 1 + epsilon_high")
    delta: float = opt(0.0, lo=0, help="INTELLECT-2 cap on the unclipped ratio; 0 = off")
    beta: float = opt(0.0, lo=0, help="KL-to-reference coefficient (k3)")
    scale_rewards: str = opt("group", choices=["group", "batch", "none"],
                             help="advantages divided by the reward std of the group or the batch; none = only centred")
    mask_truncated_completions: bool = opt(False, help="completions cut at max_completion_len are left out of the loss")
    importance_sampling_level: str = opt("token", choices=["token", "sequence"],
                                         help="pi/pi_old ratio per token, or one per sequence (GSPO)")
    is_level: str = opt("none", choices=["none", "token", "sequence"],
                        help="rollout-correction against the inference policy mu")
    is_mode: str = opt("truncate", choices=["truncate", "mask"],
                       help="rollout correction above algo.is_cap: truncate the weight, or mask the token/sequence")
    is_cap: float = opt(0.0, lo=0, help="C for rollout correction; 0 = no cap (plain IS, truncate mode only)")
    objective: str = opt("ppo", choices=["ppo", "pg"],
                         help="ppo = clipped surrogate; pg = -sg(w)·A·log pi (vanilla policy gradient)")
    use_bias_correction_kl: bool = opt(True, help="TRL's default: multiply the k3 KL term by pi/pi_old")


@dataclass
class TrainConfig:
    steps: int = opt(40, lo=1, help="optimizer steps in the run")
    lr: float = opt(1e-3, lo=0, lo_open=True, help="AdamW learning rate")
    warmup_steps: int = opt(0, lo=0, help="steps of linear learning-rate warm-up")
    lr_schedule: str = opt("constant", choices=["constant", "linear", "cosine"], help="learning rate after the warm-up")
    weight_decay: float = opt(0.0, lo=0, help="AdamW weight decay")
    prompts_per_step: int = opt(8, lo=1, help="prompts per step, each sampled rollout.num_generations times")
    micro_batch_size: int = opt(0, lo=0, help="sequences per forward/backward (gradient accumulation); "
                                               "0 = the whole step's batch at once")
    seed: int = opt(0, lo=0, help="seed of the data order, sampling and initialisation")
    grad_clip: float = opt(1.0, lo=0, help="max grad norm; 0 = off")
    save_every: int = opt(20, lo=0, help="checkpoint every N steps; 0 = only at the end")
    samples_every: int = opt(1, lo=1, help="write samples.jsonl every N steps")
    eval_every: int = opt(0, lo=0, help="held-out accuracy every N steps; 0 = off")


@dataclass
class DataConfig:
    source: str = opt("builtin:arith", help="builtin:arith, a .jsonl/.csv/.parquet file, or a HF dataset id")
    prompt_column: str = opt("prompt", help="column with the prompt text")
    answer_column: str = opt("answer", help="column with the reference answer the rewards check")
    eval_size: int = opt(200, lo=0, help="rows held out for evaluation (without data.eval_split)")
    split: str = opt("train", help="HF dataset split used for training")
    subset: str = opt("", help="HF dataset config name, e.g. 'main' for openai/gsm8k")
    eval_split: str = opt("", help="HF split for evaluation; empty = a seeded held-out slice of eval_size rows")
    system_prompt: str = opt("auto", help="'auto' = the reasoning prompt for GSM8K-format data, '' = none")
    chat_template: str = opt("auto", help="auto (the tokenizer's) | plain | a Jinja template or .jinja file")


@dataclass
class RewardsConfig:
    funcs: list = opt(["correctness", "format"], help="builtin names or file.py:function")
    weights: list = opt([], help="one per func; empty = all 1.0")
    timeout_s: float = opt(30.0, lo=0, help="bound on one call of one reward function; 0 = no bound")
    reasoning_start: str = opt("<reasoning>", help="format rewards: reasoning start marker")
    reasoning_end: str = opt("</reasoning>", help="format rewards: reasoning end marker")
    solution_start: str = opt("<answer>", help="answer extraction: solution start marker")
    solution_end: str = opt("</answer>", help="answer extraction: solution end marker")
    answer_regex: str = opt("", help="regex whose group 1 is the answer; empty = solution markers, then '#### N'")
    format_require_reasoning: bool = opt(False, help="format: the reasoning block is required")
    format_numeric: bool = opt(True, help="format: the solution must be a number")
    length_min: int = opt(0, lo=0, help="length_penalty: fewest characters without penalty")
    length_max: int = opt(2000, lo=1, help="length_penalty: most characters without penalty")
    keywords: list = opt([], help="keyword: required words (a 'keywords' column overrides)")
    regex: str = opt("", help="regex_match: pattern searched in the completion")
    code_tests_column: str = opt("tests", help="code_exec: column with the test cases")
    code_timeout_s: float = opt(5.0, lo=0, lo_open=True, help="code_exec: wall seconds per execution")
    code_memory_mb: int = opt(512, lo=64, help="code_exec: address-space limit")
    code_workers: int = opt(0, lo=0, help="code_exec: parallel executions; 0 = one per CPU core")
    code_max_output: int = opt(65536, lo=1024, help="code_exec: bytes of output read before the process is killed")


@dataclass
class PrecisionConfig:
    fp8_flow: str = opt("auto", choices=["auto", "unified", "rollout_only"],
                        help="auto: model.dtype fp8 -> unified, bf16 + rollout fp8 -> rollout_only")
    loss_scale_init: float = opt(2.0 ** 16, lo=1, help="fp16: the dynamic loss scale's starting value")
    loss_scale_growth_interval: int = opt(2000, lo=1, help="fp16: steps without overflow before the scale grows")
    loss_scale_backoff: float = opt(0.5, lo=0, hi=1.0, lo_open=True, help="fp16: scale factor after an overflow")
    loss_scale_growth: float = opt(2.0, lo=1, lo_open=True, help="fp16: scale factor after growth_interval clean steps")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rewards: RewardsConfig = field(default_factory=RewardsConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)

    @property
    def rollout_dtype(self) -> str:
        return self.rollout.dtype or self.model.dtype

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


SECTIONS = {f.name: f.type for f in dataclasses.fields(Config)}


def _section_fields(section: str) -> dict[str, dataclasses.Field]:
    cls = {f.name: f for f in dataclasses.fields(Config)}[section].default_factory
    return {f.name: f for f in dataclasses.fields(cls)}


def all_keys() -> list[str]:
    return [f"{s}.{k}" for s in SECTIONS for k in _section_fields(s)]


@dataclass(frozen=True)
class KeyInfo:
    """What a user may know about one key: `grpo-studio config --keys` and the setup form's tooltips."""
    key: str
    type: str           # bool | int | float | str | list
    default: Any
    choices: tuple | None
    lo: float | None
    hi: float | None
    lo_open: bool
    help: str

    def allowed(self) -> str:
        """The allowed values as the error messages word them: 'fp32, bf16, fp16, fp8', '>= 0', '> 0, <= 1'."""
        if self.choices is not None:
            return show_choices(self.choices)
        bounds = []
        if self.lo is not None:
            bounds.append(_lower(self.lo, self.lo_open))
        if self.hi is not None:
            bounds.append(_upper(self.hi))
        return ", ".join(bounds)


def key_info() -> list[KeyInfo]:
    """Every key in file order, with its type, default, allowed values and help."""
    defaults = Config()
    out = []
    for section in SECTIONS:
        for name, f in _section_fields(section).items():
            default = getattr(getattr(defaults, section), name)
            m = f.metadata
            out.append(KeyInfo(f"{section}.{name}", type(default).__name__, default,
                               tuple(m["choices"]) if m.get("choices") is not None else None,
                               m.get("lo"), m.get("hi"), bool(m.get("lo_open")), m.get("help", "")))
    return out


def _coerce(key: str, value: Any, default: Any, from_text: bool) -> Any:
    """Convert `value` to the type of `default`; `from_text` is True for --set strings."""
    kind = type(default)
    if kind is bool:
        if isinstance(value, bool):
            return value
        if from_text and str(value).lower() in ("true", "false", "1", "0", "yes", "no"):
            return str(value).lower() in ("true", "1", "yes")
        raise UserError("expected true or false", key=key, value=value)
    if kind is int:
        if isinstance(value, bool):
            raise UserError("expected an integer", key=key, value=value)
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if from_text:
            try:
                return int(str(value).replace("_", ""))
            except ValueError:
                pass
        raise UserError("expected an integer", key=key, value=value)
    if kind is float:
        if isinstance(value, bool):
            raise UserError("expected a number", key=key, value=value)
        if isinstance(value, (int, float)):
            return float(value)
        if from_text:
            try:
                return float(value)
            except ValueError:
                pass
        raise UserError("expected a number", key=key, value=value)
    if kind is list:
        if isinstance(value, list):
            return value
        if from_text:
            text = str(value).strip()
            if text.startswith("["):
                try:
                    return tomllib.loads(f"v = {text}")["v"]
                except tomllib.TOMLDecodeError:
                    raise UserError('expected a list like ["a", "b"]', key=key, value=text) from None
            return [item.strip() for item in text.split(",") if item.strip()]
        raise UserError("expected a list", key=key, value=value)
    if not isinstance(value, str):
        raise UserError("expected a string", key=key, value=value)
    return value


def _lower(lo: float, lo_open: bool) -> str:
    return f"{'>' if lo_open else '>='} {lo:g}"


def _upper(hi: float) -> str:
    return f"<= {hi:g}"


def _check(key: str, value: Any, meta: dict) -> None:
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise UserError(key=key, value=value, allowed=choices)
    lo, hi = meta.get("lo"), meta.get("hi")
    if lo is not None and (value <= lo if meta.get("lo_open") else value < lo):
        raise UserError(f"must be {_lower(lo, meta.get('lo_open'))}", key=key, value=value)
    if hi is not None and value > hi:
        raise UserError(f"must be {_upper(hi)}", key=key, value=value)


def set_key(cfg: Config, key: str, value: Any, from_text: bool = False) -> None:
    """Set a dotted key (e.g. 'train.steps') with conversion and validation."""
    section, _, name = key.partition(".")
    fields = _section_fields(section) if section in SECTIONS else {}
    if name not in fields:
        raise UserError(f"unknown key '{key}'{did_you_mean(key, all_keys())}")
    current = getattr(getattr(cfg, section), name)
    converted = _coerce(key, value, current, from_text)
    _check(key, converted, fields[name].metadata)
    setattr(getattr(cfg, section), name, converted)


def apply_dict(cfg: Config, data: dict, source: str = "") -> None:
    for section, body in data.items():
        if section not in SECTIONS:
            raise UserError(f"unknown section '{section}'{did_you_mean(section, SECTIONS)}"
                            + (f" in {source}" if source else ""))
        if not isinstance(body, dict):
            raise UserError(f"[{section}] must be a table of keys")
        for name, value in body.items():
            set_key(cfg, f"{section}.{name}", value)


def parse_override(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise UserError(f"--set {text!r}: expected section.key=value")
    return key.strip(), value.strip()


def load(source: str | None = None, overrides: list[str] = ()) -> Config:
    """Resolve a recipe (preset name or TOML path) plus `--set` overrides into a validated Config.
    The algorithm preset fills its defaults before the explicit keys."""
    data = read_recipe(source) if source else {}
    cfg = Config()
    algo_name = data.get("algo", {}).get("name", "grpo")
    parsed = [parse_override(o) for o in overrides]
    for key, value in parsed:
        if key == "algo.name":
            algo_name = value
    set_key(cfg, "algo.name", algo_name)
    for key, value in algorithms.defaults(algo_name).items():
        set_key(cfg, key, value)
    apply_dict(cfg, data, source or "")
    for key, value in parsed:
        set_key(cfg, key, value, from_text=True)
    validate(cfg)
    return cfg


def read_recipe(source: str) -> dict:
    path = Path(source)
    if path.suffix != ".toml":
        preset = bundled.recipe(source)
        if preset is None:
            names = bundled.recipe_names()
            raise UserError(f"recipe {source!r} not found: not a .toml file or a preset "
                            f"(presets: {', '.join(names)}){did_you_mean(source, names)}")
        path = preset
    if not path.is_file():
        raise UserError(f"recipe file {str(path)!r} does not exist")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise UserError(f"{path}: invalid TOML: {err}") from None


def validate(cfg: Config) -> None:
    """Cross-field rules that single-key checks cannot express."""
    r, a = cfg.rollout, cfg.algo
    if a.is_mode == "mask" and a.is_level != "none" and a.is_cap <= 0:
        raise UserError(f"algo.is_cap = {a.is_cap:g}: algo.is_mode = 'mask' needs a cap > 0 (e.g. 10.0)")
    if 0 < a.delta <= 1 + a.epsilon_high:
        raise UserError(f"algo.delta = {a.delta:g}: must be > 1 + algo.epsilon_high ({1 + a.epsilon_high:g}), "
                        f"or 0 = off")
    if a.objective == "pg" and a.importance_sampling_level == "sequence":
        raise UserError("algo.importance_sampling_level = 'sequence' with algo.objective = 'pg': the pg objective "
                        "has no pi/pi_old ratio; use 'token' (its IS weight is algo.is_level)")
    if cfg.rewards.weights and len(cfg.rewards.weights) != len(cfg.rewards.funcs):
        raise UserError(f"needs {len(cfg.rewards.funcs)} values, one per rewards.funcs entry", key="rewards.weights",
                        value=cfg.rewards.weights)
    if not cfg.rewards.funcs:
        raise UserError("give at least one reward function", key="rewards.funcs", value=cfg.rewards.funcs)
    if cfg.rollout_dtype == "fp8" and cfg.model.dtype not in ("bf16", "fp8"):
        raise UserError(f"rollout.dtype = 'fp8' with model.dtype = {cfg.model.dtype!r}: "
                        f"fp8 rollout pairs with model.dtype 'bf16' (rollout_only) or 'fp8' (unified)")
    if r.max_prompt_len + r.max_completion_len > 1_000_000:
        raise UserError("prompt + completion must be <= 1000000 tokens", key="rollout.max_completion_len",
                        value=r.max_completion_len)


def to_toml(cfg: Config) -> str:
    return tomli_w.dumps(cfg.to_dict())


def save(cfg: Config, path: Path) -> None:
    from grpo_studio.engine.contract.rundir import atomic_write_text

    atomic_write_text(path, to_toml(cfg))
