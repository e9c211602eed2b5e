"""Every config key, assembled: `Config`, one field per section, and the sections data, rewards, env, precision,
report and alerts (type, default, allowed values, bounds and help of each key). The sections model, rollout,
algo and train live in config_training.py; `opt` and the bounds in config_bounds.py. The rules across keys,
loading and --set live in config.py, which re-exports these names.

Pure python (no torch).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .config_bounds import (
    MAX_COEF,
    MAX_SCALE,
    MAX_SECONDS,
    MAX_SEQUENCES,
    MAX_STEPS,
    MAX_TOKENS,
    opt,
)
from .config_training import AlgoConfig, ModelConfig, RolloutConfig, TrainConfig


@dataclass
class DataConfig:
    source: str = opt(
        "builtin:arith",
        help="builtin:arith | builtin:chat-arith | builtin:word-problems, a "
        ".jsonl/.csv/.parquet file, or a HF dataset id",
    )
    prompt_column: str = opt("prompt", help="column with the prompt text")
    answer_column: str = opt("answer", help="column with the reference answer the rewards check")
    eval_size: int = opt(
        -1,
        lo=-1,
        hi=1_000_000,
        help="rows of data.source held out for evaluation (without data.eval_split or data.eval_source); "
        "-1 = auto: 200 for a built-in task, none for other data",
    )
    split: str = opt("train", help="HF dataset split used for training")
    subset: str = opt("", help="HF dataset config name, e.g. 'main' for openai/gsm8k")
    eval_split: str = opt(
        "",
        help="HF split for evaluation (of data.eval_source when it names a HF dataset); empty = a seeded held-out "
        "slice of eval_size rows",
    )
    eval_source: str = opt(
        "",
        help="the evaluation rows themselves: a .jsonl/.json/.csv/.parquet file, or a HF dataset id with "
        "data.eval_split; read as data.source is (its columns, system prompt), and nothing of data.source is held "
        "out; empty = held-out rows of data.source",
    )
    general_size: int = opt(
        -1,
        lo=-1,
        hi=1_000_000,
        help="rows of the built-in task's generalisation split (phrasings and number ranges training never "
        "shows), evaluated beside the held-out rows as eval/general/*; -1 = auto: 200 where the task has one",
    )
    system_prompt: str = opt(
        "auto",
        help="auto (the reasoning prompt for GSM8K-format data, else default) | "
        "default (the template's own) | none | the text of a system prompt",
    )
    chat_template: str = opt(
        "auto",
        help="auto (the tokenizer's, text prompts as a user turn) | plain | none "
        "(text prompts as they are) | a Jinja template or .jinja file",
    )


@dataclass
class RewardsConfig:
    funcs: list = opt(["correctness", "format"], item=str, help="builtin names or file.py:function")
    weights: list = opt([], item=float, lo=-MAX_SCALE, hi=MAX_SCALE, help="one per func; empty = all 1.0")
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
    code_max_output: int = opt(
        65536, lo=1024, hi=2**30, help="code_exec: bytes of output read before the process is killed"
    )
    sandbox: str = opt(
        "auto",
        choices=["auto", "bwrap", "namespaces", "none"],
        help="code_exec isolation: auto = bwrap when it works here, else namespaces",
    )
    sandbox_force_none: bool = opt(False, help="code_exec: accept rewards.sandbox = none (model code runs as you)")
    reward_model_batch_size: int = opt(
        16, lo=1, hi=4096, help="rm:PATH rewards: prompt+completion pairs scored per forward pass"
    )


@dataclass
class EnvConfig:
    environment: str = opt(
        "",
        help="multi-turn episodes: calculator | lookup | guess_number | file.py:Class | module:Class; "
        "empty = one completion per prompt (docs/environments.md)",
    )
    max_turns: int = opt(4, lo=1, hi=1000, help="most model turns per episode; each may call tools")
    tool_timeout_s: float = opt(
        10.0,
        lo=0,
        lo_open=True,
        hi=MAX_SECONDS,
        help="bound on each call into the environment: the constructor, reset, step, get_reward, one turn's tool "
        "calls together; past it the episode ends",
    )
    max_result_chars: int = opt(
        20_000,
        lo=1,
        hi=MAX_TOKENS * 100,
        help="most characters of one environment answer (a turn's tool results, reset's or step's messages); "
        "longer ones are cut, saying so, before anything tokenises them",
    )


@dataclass
class WarmupConfig:
    source: str = opt(
        "",
        help="whole conversations to imitate before RL (a `messages` column): builtin:tool-arith-demos | "
        "builtin:lookup-demos | file.jsonl | a Hugging Face dataset id; trained on the assistant turns "
        "only, into the adapter RL then trains; empty = none (docs/environments.md)",
    )
    steps: int = opt(30, lo=1, hi=MAX_STEPS, help="warm-up optimizer steps (cross-entropy on the assistant turns)")
    lr: float = opt(5e-4, lo=0, hi=1e4, lo_open=True, help="the warm-up's AdamW learning rate (its own optimizer)")
    batch_size: int = opt(8, lo=1, hi=MAX_SEQUENCES, help="conversations per warm-up step")


@dataclass
class PrecisionConfig:
    fp8_flow: str = opt(
        "auto",
        choices=["auto", "unified", "rollout_only"],
        help="auto: model.dtype fp8 -> unified, bf16 + rollout fp8 -> rollout_only",
    )
    loss_scale_init: float = opt(2.0**16, lo=1, hi=2.0**32, help="fp16: the dynamic loss scale's starting value")
    loss_scale_growth_interval: int = opt(
        2000, lo=1, hi=MAX_STEPS, help="fp16: steps without overflow before the scale grows"
    )
    loss_scale_backoff: float = opt(0.5, lo=0, hi=1.0, lo_open=True, help="fp16: scale factor after an overflow")
    loss_scale_growth: float = opt(
        2.0, lo=1, hi=MAX_COEF, lo_open=True, help="fp16: scale factor after growth_interval clean steps"
    )


@dataclass
class ReportConfig:
    to: list = opt(
        [],
        item=str,
        help="trackers that mirror every metrics row as the run goes (docs/trackers.md): "
        "tensorboard, trackio, wandb; each needs its extra, e.g. 'grpo-studio[wandb]'",
    )
    project: str = opt(
        "grpo-studio",
        help="the wandb / trackio project the run is logged under (the run is named after its run directory)",
    )


@dataclass
class AlertsConfig:
    rules: list = opt(
        [],
        item=str,
        help="metric rules, e.g. 'mismatch/k3 > 1e-3', 'reward/mean < 0.1 for 20 steps', "
        "'loss is nan'; 'defaults' = the default set (docs/alerts.md)",
    )
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
    env: EnvConfig = field(default_factory=EnvConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)

    @property
    def rollout_dtype(self) -> str:
        return self.rollout.dtype or self.model.dtype

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
