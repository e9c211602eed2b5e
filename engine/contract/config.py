"""Typed run config: TOML load/save, dotted `--set` overrides, one-line validation errors.

Pure python (no torch), so the studio and the VRAM planner can import it.

Every user mistake raises `UserError` (engine/contract/errors.py) whose message is one line naming
the key, the value and what is allowed. The CLI prints it and exits with code 2.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from grpo_studio.engine.contract import alert_rules, algorithms, backend, bundled, dtypes, metrics
from grpo_studio.engine.contract.errors import UserError, did_you_mean, show_choices, user_path


def opt(default, *, choices=None, lo=None, hi=None, lo_open=False, item=None, auto=None, help=""):
    """A config field with its validation rules (choices, inclusive/open lower bound, upper bound; for a
    list the type of its items, str or float; for a key that also takes the word "auto", the type of its
    other values)."""
    meta = {"choices": choices, "lo": lo, "hi": hi, "lo_open": lo_open, "item": item, "auto": auto, "help": help}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


DTYPES = list(dtypes.DTYPES)
ALGOS = list(algorithms.PRESETS)
LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo"]
# Upper bounds no real run reaches, so a typo (an extra 000) is refused before anything allocates.
MAX_STEPS = 10_000_000        # optimizer steps, and every "every N steps" key
MAX_TOKENS = 1_000_000        # prompt + completion tokens of one sequence
MAX_GENERATIONS = 1024        # completions per prompt
MAX_PROMPTS = 65_536          # prompts per step
MAX_SEQUENCES = 1_048_576     # sequences per step: prompts_per_step x num_generations
MAX_SECONDS = 86_400          # a reward time bound: one day
MAX_UPDATES = 1024            # optimizer steps per rollout: steps_per_generation, num_iterations
AUTO = "auto"                 # the word a key declared with opt(auto=type) takes besides its values


@dataclass
class ModelConfig:
    name: str = opt("tiny-arith", help="preset id, local folder, or hub id")
    dtype: str = opt("fp32", choices=DTYPES, help="trainer precision")
    lora_rank: int = opt(8, lo=0, hi=4096, help="0 = full fine-tune")
    lora_alpha: float = opt(16.0, lo=0, lo_open=True, help="LoRA scaling: the update is multiplied by alpha / rank")
    lora_dropout: float = opt(0.0, lo=0, hi=0.99, help="dropout on the LoRA adapters' input")
    lora_target_modules: list = opt(["all-linear"], item=str, help="peft target_modules")
    load_in_4bit: bool = opt(False, help="QLoRA: the base's linear layers in 4-bit NF4 (bitsandbytes, computing in "
                                         "model.dtype) under the LoRA adapters; needs 'grpo-studio[qlora]'")
    double_quant: bool = opt(True, help="4-bit base: also quantise its per-block scales to 8 bits (QLoRA double "
                                        "quantisation: ~4.13 instead of 4.5 bits per weight)")
    gradient_checkpointing: bool = opt(False, help="recompute each layer in the backward instead of keeping "
                                                   "its activations (less memory, slower)")
    offload_checkpoints: bool = opt(False, help="keep saved activations in host RAM during the forward "
                                                "(CUDA only; Unsloth-style offloaded checkpoints)")
    logits_chunk: int = opt(0, lo=0, hi=MAX_TOKENS, help="tokens per chunk of the fused, recomputed lm_head + "
                                                         "log-softmax (on CUDA TRL's Triton kernels when trl is "
                                                         "installed); 0 = materialise the completion logits")


@dataclass
class RolloutConfig:
    backend: str = opt("auto", choices=["auto", "hf", "vllm"], help="auto = vllm when installed, else hf "
                                                                     "(hf for a 4-bit base: model.load_in_4bit)")
    dtype: str = opt("", choices=["", *DTYPES], help="empty = model.dtype")
    num_generations: int = opt(8, lo=2, hi=MAX_GENERATIONS, help="G completions per prompt")
    max_prompt_len: int = opt(64, lo=1, hi=MAX_TOKENS, help="prompt tokens kept (the end of a longer prompt)")
    max_completion_len: int = opt(16, lo=1, hi=MAX_TOKENS, help="most tokens sampled per completion")
    temperature: float = opt(1.0, lo=0, lo_open=True, help="sampling temperature; the trainer's log-probs use the same")
    top_p: float = opt(1.0, lo=0, hi=1.0, lo_open=True, help="nucleus sampling; 1 = off")
    top_k: int = opt(0, lo=0, hi=MAX_TOKENS, help="0 = off")
    gpu_memory_utilization: float | str = opt(AUTO, auto=float, lo=0, hi=1.0, lo_open=True,
                                              help="vLLM: share of the GPU's memory it reserves for weights and KV "
                                                   "cache; auto = the planner's need for one rollout (docs/vram.md)")
    colocate: bool = opt(True, help="vLLM shares the training GPU (TRL vllm_mode=colocate); false = a rollout "
                                    "server in its own process, on its own device (docs/rollout_server.md)")
    server: str = opt("", help="colocate = false: the rollout server's host:port (grpo-studio rollout-serve); "
                               "empty = start one on 127.0.0.1 for the run")
    server_timeout: float = opt(120.0, lo=1, hi=MAX_SECONDS, help="seconds without an answer from the rollout "
                                                                  "server before the run stops with a checkpoint")
    async_mode: str = opt("off", choices=["off", "one_step", "in_flight"],
                          help="colocate = false: one_step = the server samples the next batch while the trainer "
                               "trains on this one (policy lag 1, verl's one-step off-policy); in_flight is not "
                               "built yet")
    sleep: bool = opt(False, help="vLLM sleeps (frees its memory) during the train phase")
    vllm_enforce_eager: str = opt("auto", choices=["auto", "on", "off"],
                                  help="on = no torch.compile/graphs (faster start, slower decode); off = always compiled; "
                                       "auto = compiled, eager where a flow needs it (the simulated FP8 rollout)")


@dataclass
class AlgoConfig:
    name: str = opt("grpo", choices=ALGOS, help="algorithm preset: fills the other algo.* keys (docs/algorithms.md)")
    loss_type: str = opt("dapo", choices=LOSS_TYPES, help="how token losses are averaged: per sequence (grpo), "
                                                          "per batch token (bnpo), by B·L_max (dr_grpo), over the "
                                                          "rollout's tokens (dapo, TRL's default)")
    epsilon: float = opt(0.2, lo=0, help="clip range below: ratio >= 1 - epsilon")
    epsilon_high: float = opt(0.2, lo=0, help="clip range above: ratio <= 1 + epsilon_high")
    delta: float = opt(0.0, lo=0, help="INTELLECT-2 cap on the unclipped ratio; 0 = off")
    beta: float = opt(0.0, lo=0, help="KL-to-reference coefficient (k3)")
    scale_rewards: str = opt("group", choices=["group", "batch", "none"],
                             help="advantages divided by the reward std of the group or the batch; none = only centred")
    mask_truncated_completions: bool = opt(False, help="completions cut at max_completion_len are left out of the loss")
    importance_sampling_level: str = opt("token", choices=["token", "sequence"],
                                         help="pi/pi_old ratio per token, or one per sequence (GSPO)")
    is_level: str = opt("auto", choices=["auto", "none", "token", "sequence"],
                        help="rollout correction against the inference policy mu; auto = sequence for a vLLM "
                             "rollout, none for hf (TRL's vllm_importance_sampling_correction)")
    is_mode: str = opt("mask", choices=["truncate", "mask"],
                       help="rollout correction above algo.is_cap: truncate the weight, or mask the token/sequence")
    is_cap: float = opt(3.0, lo=0, help="C for rollout correction; 0 = no cap (plain IS, truncate mode only)")
    objective: str = opt("ppo", choices=["ppo", "pg"],
                         help="ppo = clipped surrogate; pg = -sg(w)·A·log pi (vanilla policy gradient)")
    use_bias_correction_kl: bool = opt(True, help="TRL's default: multiply the k3 KL term by pi/pi_old")


@dataclass
class TrainConfig:
    steps: int = opt(40, lo=1, hi=MAX_STEPS, help="optimizer steps in the run")
    lr: float = opt(1e-3, lo=0, lo_open=True, help="AdamW learning rate")
    warmup_steps: int = opt(0, lo=0, hi=MAX_STEPS, help="steps of linear learning-rate warm-up")
    lr_schedule: str = opt("constant", choices=["constant", "linear", "cosine"], help="learning rate after the warm-up")
    weight_decay: float = opt(0.0, lo=0, help="AdamW weight decay")
    prompts_per_step: int = opt(8, lo=1, hi=MAX_PROMPTS,
                                help="prompts per step, each sampled rollout.num_generations times")
    micro_batch_size: int = opt(0, lo=0, hi=MAX_SEQUENCES, help="sequences per forward/backward (gradient "
                                                                "accumulation); 0 = the whole step's batch at once")
    micro_batch_tokens: int = opt(0, lo=0, hi=MAX_SEQUENCES * MAX_TOKENS,
                                  help="token budget per forward/backward instead: rows sorted by length, each "
                                       "micro-batch cut to its own longest row, rows × width <= this (verl's "
                                       "dynamic batch size); same loss and gradients as the whole batch; 0 = off")
    shared_prefix: str = opt("auto", choices=["auto", "on", "off"],
                             help="run each distinct prompt of a micro-batch once and its G completions on its KV "
                                  "cache (same log-probs and gradients, prompt FLOPs / G); auto = on where exact "
                                  "(eager/sdpa full attention, no gradient checkpointing) and the micro-batch "
                                  "repeats a prompt of at least 16 tokens")
    steps_per_generation: int = opt(1, lo=1, hi=MAX_UPDATES, help="optimizer steps each rollout is split into "
                                                                  "(TRL steps_per_generation): a rollout samples "
                                                                  "prompts_per_step × this many prompts")
    num_iterations: int = opt(1, lo=1, hi=MAX_UPDATES, help="optimizer passes over each rollout (TRL "
                                                            "num_iterations, the GRPO paper's inner iterations); "
                                                            "with either key above 1 the pi/pi_old clip acts")
    shuffle_batch: bool = opt(True, help="shuffle the rollout's sequences before splitting them into "
                                         "train.steps_per_generation steps (TRL always does)")
    seed: int = opt(0, lo=0, hi=2**32 - 1, help="seed of the data order, sampling and initialisation")
    grad_clip: float = opt(1.0, lo=0, help="max grad norm; 0 = off")
    parallel: str = opt("none", choices=["none", "ddp", "fsdp"],
                        help="data parallelism across the processes of `train --nproc N` (torchrun): ddp = each "
                             "rank samples its share of the prompts, gradients all-reduced (docs/distributed.md)")
    dist_timeout_s: float = opt(300.0, lo=1, hi=MAX_SECONDS, help="data-parallel collective timeout: a rank "
                                                                  "that hangs this long stops the run")
    save_every: int = opt(20, lo=0, hi=MAX_STEPS, help="checkpoint every N steps; 0 = only at the end")
    keep_checkpoints: int = opt(0, lo=0, hi=MAX_STEPS, help="keep the newest N checkpoints (plus the best by "
                                                             "train.best_metric) and delete older ones; 0 = keep all")
    best_metric: str = opt("", help="metrics key whose highest value marks the best checkpoint, kept by "
                                    "train.keep_checkpoints (e.g. reward/mean); empty = no best")
    samples_every: int = opt(1, lo=1, hi=MAX_STEPS, help="write samples.jsonl every N steps")
    eval_every: int = opt(0, lo=0, hi=MAX_STEPS, help="held-out accuracy every N steps; 0 = off")
    max_bad_steps: int = opt(5, lo=0, hi=MAX_STEPS, help="stop the run (diverged) after this many steps in a row "
                                                          "skipped for a non-finite sampler, loss or gradient; "
                                                          "0 = never stop")


@dataclass
class DataConfig:
    source: str = opt("builtin:arith", help="builtin:arith, a .jsonl/.csv/.parquet file, or a HF dataset id")
    prompt_column: str = opt("prompt", help="column with the prompt text")
    answer_column: str = opt("answer", help="column with the reference answer the rewards check")
    eval_size: int = opt(-1, lo=-1, hi=1_000_000, help="rows held out for evaluation (without data.eval_split); "
                                                         "-1 = auto: 200 for builtin:arith, none for other data")
    split: str = opt("train", help="HF dataset split used for training")
    subset: str = opt("", help="HF dataset config name, e.g. 'main' for openai/gsm8k")
    eval_split: str = opt("", help="HF split for evaluation; empty = a seeded held-out slice of eval_size rows")
    system_prompt: str = opt("auto", help="'auto' = the reasoning prompt for GSM8K-format data, '' = none")
    chat_template: str = opt("auto", help="auto (the tokenizer's) | plain | a Jinja template or .jinja file")


@dataclass
class RewardsConfig:
    funcs: list = opt(["correctness", "format"], item=str, help="builtin names or file.py:function")
    weights: list = opt([], item=float, help="one per func; empty = all 1.0")
    timeout_s: float = opt(30.0, lo=0, hi=MAX_SECONDS, help="bound on one call of one reward function; 0 = no bound")
    reasoning_start: str = opt("<reasoning>", help="format rewards: reasoning start marker")
    reasoning_end: str = opt("</reasoning>", help="format rewards: reasoning end marker")
    solution_start: str = opt("<answer>", help="answer extraction: solution start marker")
    solution_end: str = opt("</answer>", help="answer extraction: solution end marker")
    answer_regex: str = opt("", help="regex whose group 1 is the answer; empty = solution markers, then '#### N'")
    format_require_reasoning: bool = opt(False, help="format: the reasoning block is required")
    format_numeric: bool = opt(True, help="format: the solution must be a number")
    length_min: int = opt(0, lo=0, hi=10**9, help="length_penalty: fewest characters without penalty")
    length_max: int = opt(2000, lo=1, hi=10**9, help="length_penalty: most characters without penalty")
    keywords: list = opt([], item=str, help="keyword: required words (a 'keywords' column overrides)")
    regex: str = opt("", help="regex_match: pattern searched in the completion")
    code_tests_column: str = opt("tests", help="code_exec: column with the test cases")
    code_timeout_s: float = opt(5.0, lo=0, hi=MAX_SECONDS, lo_open=True, help="code_exec: wall seconds per execution")
    code_memory_mb: int = opt(512, lo=64, hi=1_048_576, help="code_exec: address-space limit")
    code_workers: int = opt(0, lo=0, hi=1024, help="code_exec: parallel executions; 0 = one per CPU core")
    code_max_output: int = opt(65536, lo=1024, hi=2**30,
                               help="code_exec: bytes of output read before the process is killed")
    sandbox: str = opt("auto", choices=["auto", "bwrap", "namespaces", "none"],
                       help="code_exec isolation: auto = bwrap when it works here, else namespaces")
    sandbox_force_none: bool = opt(False, help="code_exec: accept rewards.sandbox = none (model code runs as you)")
    reward_model_batch_size: int = opt(16, lo=1, hi=4096,
                                       help="rm:PATH rewards: prompt+completion pairs scored per forward pass")


@dataclass
class PrecisionConfig:
    fp8_flow: str = opt("auto", choices=["auto", "unified", "rollout_only"],
                        help="auto: model.dtype fp8 -> unified, bf16 + rollout fp8 -> rollout_only")
    loss_scale_init: float = opt(2.0 ** 16, lo=1, hi=2.0 ** 32, help="fp16: the dynamic loss scale's starting value")
    loss_scale_growth_interval: int = opt(2000, lo=1, hi=MAX_STEPS,
                                          help="fp16: steps without overflow before the scale grows")
    loss_scale_backoff: float = opt(0.5, lo=0, hi=1.0, lo_open=True, help="fp16: scale factor after an overflow")
    loss_scale_growth: float = opt(2.0, lo=1, lo_open=True, help="fp16: scale factor after growth_interval clean steps")


TRACKERS = ("tensorboard", "trackio", "wandb")  # report.to: each an extra of the same name (docs/trackers.md)


@dataclass
class ReportConfig:
    to: list = opt([], item=str, help="trackers that mirror every metrics row as the run goes (docs/trackers.md): "
                                      "tensorboard, trackio, wandb; each needs its extra, e.g. 'grpo-studio[wandb]'")
    project: str = opt("grpo-studio", help="the wandb / trackio project the run is logged under (the run is named "
                                           "after its run directory)")


@dataclass
class AlertsConfig:
    rules: list = opt([], item=str, help="metric rules, e.g. 'mismatch/k3 > 1e-3', 'reward/mean < 0.1 for 20 steps', "
                                         "'loss is nan'; 'defaults' = the default set (docs/alerts.md)")
    on: list = opt([], item=str, help="run events that alert: finished, crashed, stopped, diverged")
    webhook: str = opt("", help="http(s) URL each alert is POSTed to as JSON; empty = none")
    desktop: bool = opt(False, help="also a desktop notification per alert (notify-send)")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rewards: RewardsConfig = field(default_factory=RewardsConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)

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
    auto: bool = False  # also takes the word "auto"

    def allowed(self) -> str:
        """The allowed values as the error messages word them: 'fp32, bf16, fp16, fp8', '>= 0', '> 0, <= 1'."""
        if self.choices is not None:
            return show_choices(self.choices)
        bounds = ["auto"] if self.auto else []
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
            kind = m["auto"] if m.get("auto") else type(default)
            out.append(KeyInfo(f"{section}.{name}", kind.__name__, default,
                               tuple(m["choices"]) if m.get("choices") is not None else None,
                               m.get("lo"), m.get("hi"), bool(m.get("lo_open")), m.get("help", ""),
                               bool(m.get("auto"))))
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
            try:
                return float(value)
            except OverflowError:  # an int beyond the float range
                raise UserError("must be a finite number", key=key, value=value) from None
        if from_text:
            try:
                return float(value)
            except ValueError:
                pass
        raise UserError("expected a number", key=key, value=value)
    if not isinstance(value, str):
        raise UserError("expected a string", key=key, value=value)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: bytes from the command line that are not UTF-8
        raise UserError("not valid UTF-8 text", key=key, value=value) from None
    return value


def _coerce_list(key: str, value: Any, item: type, from_text: bool) -> list:
    """A list whose items are each coerced and checked like a key of type `item` (str or float), named
    `key[i]` in a message; `from_text` accepts --set's '["a", "b"]' and 'a, b' forms."""
    items_from_text = False
    if from_text and not isinstance(value, list):
        text = str(value).strip()
        if text.startswith("["):
            try:
                value = tomllib.loads(f"v = {text}")["v"]
            except (tomllib.TOMLDecodeError, ValueError):
                raise UserError('expected a list like ["a", "b"]', key=key, value=text) from None
        else:
            value, items_from_text = [part.strip() for part in text.split(",") if part.strip()], True
    if not isinstance(value, list):
        raise UserError("expected a list", key=key, value=value)
    out = []
    for i, element in enumerate(value):
        converted = _coerce(f"{key}[{i}]", element, item(), items_from_text)
        _check(f"{key}[{i}]", converted, {})
        out.append(converted)
    return out


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _lower(lo: float, lo_open: bool) -> str:
    return f"{'>' if lo_open else '>='} {_num(lo)}"


def _upper(hi: float) -> str:
    return f"<= {_num(hi)}"


def _check(key: str, value: Any, meta: dict) -> None:
    if isinstance(value, float) and not math.isfinite(value):  # NaN slips past every comparison below
        raise UserError("must be a finite number", key=key, value=value)
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
        raise UserError(f"unknown key {key!r}{did_you_mean(key, all_keys())}")
    current, meta = getattr(getattr(cfg, section), name), fields[name].metadata
    if meta.get("auto") and isinstance(value, str) and value.strip().lower() == AUTO:
        setattr(getattr(cfg, section), name, AUTO)
        return
    if isinstance(current, list):
        converted = _coerce_list(key, value, meta["item"], from_text)
    else:
        try:
            converted = _coerce(key, value, meta["auto"]() if meta.get("auto") else current, from_text)
        except UserError as err:
            if not meta.get("auto"):
                raise
            raise UserError(f"expected {AUTO} or {err.why.removeprefix('expected ')}", key=key, value=value) from None
    _check(key, converted, meta)
    setattr(getattr(cfg, section), name, converted)


def check_tables(data: dict, source: str = "") -> None:
    """A recipe's top level holds only known [section] tables."""
    where = f" in {source}" if source else ""
    for section, body in data.items():
        if section not in SECTIONS:
            raise UserError(f"unknown section {section!r}{did_you_mean(section, SECTIONS)}{where}")
        if not isinstance(body, dict):
            raise UserError(f"must be a [{section}] table of keys{where}", key=section, value=body)


def apply_dict(cfg: Config, data: dict, source: str = "") -> None:
    check_tables(data, source)
    for section, body in data.items():
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
    check_tables(data, source or "")
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
    """The TOML table of a preset name or a .toml path; unreadable, not UTF-8 or not TOML: one line."""
    with user_path("recipe", source):
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
        text = path.read_bytes().decode("utf-8")
    try:
        return tomllib.loads(text)
    except ValueError as err:  # TOMLDecodeError, or an integer of more than 4300 digits
        raise UserError(f"{path}: invalid TOML: {err}") from None


def validate(cfg: Config) -> None:
    """Cross-field rules that single-key checks cannot express."""
    r, a = cfg.rollout, cfg.algo
    best = cfg.train.best_metric
    if best and metrics.lookup(best) is None:
        raise UserError(f"not a metric the trainer writes{did_you_mean(best, metrics.names(cfg.rewards.funcs))}",
                        key="train.best_metric", value=best)
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
    if cfg.rewards.sandbox == "none" and not cfg.rewards.sandbox_force_none:
        raise UserError("runs model-written code unconfined, as your user (rlimits and the wall clock only); "
                        "use auto, bwrap or namespaces, or set rewards.sandbox_force_none = true to accept it",
                        key="rewards.sandbox", value="none")
    if cfg.model.lora_rank > 0 and not cfg.model.lora_target_modules:
        raise UserError("give at least one module name, or 'all-linear'", key="model.lora_target_modules",
                        value=cfg.model.lora_target_modules)
    if cfg.model.load_in_4bit:
        _refuse_4bit(cfg)
    if cfg.rollout_dtype == "fp8" and cfg.model.dtype not in ("bf16", "fp8"):
        raise UserError(f"rollout.dtype = 'fp8' with model.dtype = {cfg.model.dtype!r}: "
                        f"fp8 rollout pairs with model.dtype 'bf16' (rollout_only) or 'fp8' (unified)")
    if r.max_prompt_len + r.max_completion_len > MAX_TOKENS:
        raise UserError(f"prompt + completion must be <= {MAX_TOKENS} tokens", key="rollout.max_completion_len",
                        value=r.max_completion_len)
    if cfg.train.shared_prefix == "on" and cfg.model.gradient_checkpointing:
        raise UserError("with model.gradient_checkpointing = true transformers turns the prompt pass's KV cache "
                        "off; set auto or off", key="train.shared_prefix", value="on")
    if cfg.train.micro_batch_tokens and cfg.train.micro_batch_size:
        raise UserError(f"train.micro_batch_tokens = {cfg.train.micro_batch_tokens} with train.micro_batch_size = "
                        f"{cfg.train.micro_batch_size}: micro-batches are cut by one of them; set the other to 0")
    sequences = cfg.train.prompts_per_step * r.num_generations
    if sequences > MAX_SEQUENCES:
        raise UserError(f"{sequences} sequences per step with rollout.num_generations = {r.num_generations}; "
                        f"must be <= {MAX_SEQUENCES}", key="train.prompts_per_step", value=cfg.train.prompts_per_step)
    _check_updates_per_rollout(cfg, sequences)
    _refuse_truncated_is(cfg)
    _check_rollout_server(cfg.rollout)
    _check_parallel(cfg)
    _check_outlets(cfg)


def _check_outlets(cfg: Config) -> None:
    """report.* and alerts.*: tracker and event names, the rules' grammar and metrics, the webhook's scheme."""
    for key, values, allowed in (("report.to", cfg.report.to, TRACKERS),
                                 ("alerts.on", cfg.alerts.on, alert_rules.EVENTS)):
        for i, value in enumerate(values):
            if value not in allowed:
                raise UserError(key=f"{key}[{i}]", value=value, allowed=allowed)
    alert_rules.parse_all(cfg.alerts.rules, cfg.rewards.funcs)
    hook = cfg.alerts.webhook
    if hook and not (hook.startswith(("http://", "https://")) and len(hook.split("://", 1)[1]) > 0):
        raise UserError("an http:// or https:// URL, or empty for none", key="alerts.webhook", value=hook)


def _check_parallel(cfg: Config) -> None:
    """train.parallel: what data-parallel training cannot honour yet (docs/distributed.md)."""
    if cfg.train.parallel == "fsdp":
        raise UserError("FSDP2 sharding is not built yet; use 'ddp' (every rank holds the whole model)",
                        key="train.parallel", value="fsdp")
    if cfg.train.parallel != "none" and cfg.algo.scale_rewards == "batch":
        raise UserError(f"algo.scale_rewards = 'batch' with train.parallel = {cfg.train.parallel!r}: the batch std "
                        f"would be each rank's; use 'group' or 'none'")


def _check_rollout_server(r: RolloutConfig) -> None:
    """rollout.server / async_mode only mean something for a rollout server (docs/rollout_server.md)."""
    if r.async_mode == "in_flight":
        raise UserError("weight updates inside a running generation (PipelineRL) are not built yet; use "
                        "'one_step' or 'off'", key="rollout.async_mode", value="in_flight")
    if r.colocate:
        for key, value, off in (("server", r.server, ""), ("async_mode", r.async_mode, "off")):
            if value != off:
                raise UserError("needs rollout.colocate = false (a rollout server); the colocated engine "
                                "shares the trainer's process", key=f"rollout.{key}", value=value)
        return
    if r.backend == "hf":
        raise UserError("rollout.colocate = false runs vLLM in a rollout server; use rollout.backend = 'vllm' "
                        "or 'auto'", key="rollout.backend", value="hf")
    host, _, port = r.server.rpartition(":")
    if r.server and not (host and port.isdigit() and 0 < int(port) < 65536):
        raise UserError("host:port, e.g. 127.0.0.1:8000; or empty to start a server for the run",
                        key="rollout.server", value=r.server)


def _check_updates_per_rollout(cfg: Config, sequences: int) -> None:
    """A rollout is trained on for steps_per_generation × num_iterations optimizer steps (docs/algorithms.md)."""
    t = cfg.train
    if sequences * t.steps_per_generation > MAX_SEQUENCES:
        raise UserError(f"{sequences * t.steps_per_generation} sequences per rollout "
                        f"(train.prompts_per_step × rollout.num_generations × this); must be <= {MAX_SEQUENCES}",
                        key="train.steps_per_generation", value=t.steps_per_generation)
    cycle = t.steps_per_generation * t.num_iterations
    if t.save_every % cycle:
        raise UserError(f"must be a multiple of train.steps_per_generation × train.num_iterations ({cycle}), so a "
                        f"checkpoint never falls between the updates of one rollout; or 0 = only at the end",
                        key="train.save_every", value=t.save_every)


def _refuse_truncated_is(cfg: Config) -> None:
    """top-p / top-k sampling makes μ the truncated distribution while π is the full one: π_old/μ is then no
    importance weight (docs/mismatch.md), so rollout correction is refused with it."""
    r = cfg.rollout
    if r.top_k == 0 and r.top_p == 1:
        return
    name = backend.resolve(r.backend, load_in_4bit=cfg.model.load_in_4bit)[0]
    level = algorithms.rollout_is_level(cfg.algo.is_level, name)
    if level != "none":
        key, value = ("rollout.top_k", r.top_k) if r.top_k else ("rollout.top_p", r.top_p)
        shown = "" if level == cfg.algo.is_level else f" ({level} for the {name} rollout)"
        raise UserError(f"algo.is_level = {cfg.algo.is_level!r}{shown} corrects towards the sampler's mu, "
                        f"which this truncates while pi does not; set algo.is_level = 'none', or sample the full "
                        f"distribution (rollout.top_k = 0, rollout.top_p = 1)", key=key, value=value)


def _refuse_4bit(cfg: Config) -> None:
    """The model.load_in_4bit combinations that cannot run, refused before anything loads."""
    m = cfg.model
    if m.lora_rank == 0:
        raise UserError("a 4-bit base cannot be fine-tuned in full (model.lora_rank = 0); set a LoRA rank > 0 (QLoRA)",
                        key="model.load_in_4bit", value=True)
    for key, dtype in (("model.dtype", m.dtype), ("rollout.dtype", cfg.rollout_dtype)):
        if dtype == "fp8":
            raise UserError(f"{key} = 'fp8': bitsandbytes 4-bit layers compute in fp32, bf16 or fp16; use one of "
                            f"those", key="model.load_in_4bit", value=True)
    if cfg.rollout.backend == "vllm":
        raise UserError("rollout.backend = 'vllm': a 4-bit base is sampled with its live LoRA adapters by the hf "
                        "backend only (docs/mismatch.md); use rollout.backend = 'hf' or 'auto' (hf for a 4-bit base)",
                        key="model.load_in_4bit", value=True)


def to_toml(cfg: Config) -> str:
    return tomli_w.dumps(cfg.to_dict())


def save(cfg: Config, path: Path) -> None:
    from grpo_studio.engine.contract.rundir import atomic_write_text

    atomic_write_text(path, to_toml(cfg))
