"""Every config key: its section, type, default, allowed values and help (`opt`), and the constants
that bound them. The rules across keys, loading and --set live in config.py, which re-exports these names.

Pure python (no torch).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from grpo_studio.contract import algorithms, dtypes


def opt(default, *, choices=None, lo=None, hi=None, lo_open=False, item=None, auto=None, help=""):
    """A config field with its validation rules (choices, inclusive/open lower bound, upper bound; for a
    list the type of its items, str or float, and the bounds apply to each item; for a key that also takes
    the word "auto", the type of its other values)."""
    meta = {"choices": choices, "lo": lo, "hi": hi, "lo_open": lo_open, "item": item, "auto": auto, "help": help}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


DTYPES = list(dtypes.DTYPES)
ALGOS = list(algorithms.PRESETS)
LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo"]
# Upper bounds no real run reaches, so a typo (an extra 000) is refused before anything allocates.
MAX_STEPS = 10_000_000  # optimizer steps, and every "every N steps" key
MAX_TOKENS = 1_000_000  # prompt + completion tokens of one sequence
MAX_GENERATIONS = 1024  # completions per prompt
MAX_PROMPTS = 65_536  # prompts per step
MAX_SEQUENCES = 1_048_576  # sequences per step: prompts_per_step x num_generations
MAX_SECONDS = 86_400  # a reward time bound: one day
MAX_UPDATES = 1024  # optimizer steps per rollout: steps_per_generation, num_iterations
# Every float key is bounded on both sides (tests/test_config_limits.py): generous, but finite, so 1e308 or a
# sign slip is refused in one line before it reaches an optimizer, a sampler or a loss.
MAX_COEF = 1000.0  # a loss coefficient or clip range (algo.beta, epsilon, delta)
MAX_SCALE = 1e6  # a multiplier: LoRA alpha, a reward weight (|w|), a cap, a grad norm
AUTO = "auto"  # the word a key declared with opt(auto=type) takes besides its values


@dataclass
class ModelConfig:
    name: str = opt("tiny-arith", help="preset id, local folder, or hub id")
    dtype: str = opt("fp32", choices=DTYPES, help="trainer precision")
    lora_rank: int = opt(8, lo=0, hi=4096, help="0 = full fine-tune")
    lora_alpha: float = opt(
        16.0, lo=0, hi=MAX_SCALE, lo_open=True, help="LoRA scaling: the update is multiplied by alpha / rank"
    )
    lora_dropout: float = opt(0.0, lo=0, hi=0.99, help="dropout on the LoRA adapters' input")
    lora_target_modules: list = opt(["all-linear"], item=str, help="peft target_modules")
    load_in_4bit: bool = opt(
        False,
        help="QLoRA: the base's linear layers in 4-bit NF4 (bitsandbytes, computing in "
        "model.dtype) under the LoRA adapters; needs 'grpo-studio[qlora]'",
    )
    double_quant: bool = opt(
        True,
        help="4-bit base: also quantise its per-block scales to 8 bits (QLoRA double "
        "quantisation: ~4.13 instead of 4.5 bits per weight)",
    )
    gradient_checkpointing: bool = opt(
        False, help="recompute each layer in the backward instead of keeping its activations (less memory, slower)"
    )
    offload_checkpoints: bool = opt(
        False,
        help="keep saved activations in host RAM during the forward (CUDA only; Unsloth-style offloaded checkpoints)",
    )
    logits_chunk: int = opt(
        0,
        lo=0,
        hi=MAX_TOKENS,
        help="tokens per chunk of the fused, recomputed lm_head + "
        "log-softmax (on CUDA TRL's Triton kernels when trl is "
        "installed); 0 = materialise the completion logits",
    )


@dataclass
class RolloutConfig:
    backend: str = opt(
        "auto",
        choices=["auto", "hf", "vllm"],
        help="auto = vllm when installed, else hf (hf for a 4-bit base: model.load_in_4bit)",
    )
    dtype: str = opt("", choices=["", *DTYPES], help="empty = model.dtype")
    num_generations: int = opt(8, lo=2, hi=MAX_GENERATIONS, help="G completions per prompt")
    max_prompt_len: int = opt(
        64, lo=1, hi=MAX_TOKENS, help="longest rendered prompt in tokens (a longer one is refused)"
    )
    max_completion_len: int = opt(16, lo=1, hi=MAX_TOKENS, help="most tokens sampled per completion")
    temperature: float = opt(
        1.0, lo=0, hi=100.0, lo_open=True, help="sampling temperature; the trainer's log-probs use the same"
    )
    top_p: float = opt(1.0, lo=0, hi=1.0, lo_open=True, help="nucleus sampling; 1 = off")
    top_k: int = opt(0, lo=0, hi=MAX_TOKENS, help="0 = off")
    gpu_memory_utilization: float | str = opt(
        AUTO,
        auto=float,
        lo=0,
        hi=1.0,
        lo_open=True,
        help="vLLM: share of the GPU's memory it reserves for weights and KV "
        "cache; auto = the planner's need for one rollout (docs/vram.md)",
    )
    colocate: bool = opt(
        True,
        help="vLLM shares the training GPU (TRL vllm_mode=colocate); false = a rollout "
        "server in its own process, on its own device (docs/rollout_server.md)",
    )
    server: str = opt(
        "",
        help="colocate = false: the rollout server's host:port (grpo-studio rollout-serve); "
        "empty = start one on 127.0.0.1 for the run",
    )
    server_timeout: float = opt(
        120.0,
        lo=1,
        hi=MAX_SECONDS,
        help="seconds without an answer from the rollout server before the run stops with a checkpoint",
    )
    async_mode: str = opt(
        "off",
        choices=["off", "one_step", "in_flight"],
        help="colocate = false: one_step = the server samples the next batch while the trainer "
        "trains on this one (policy lag 1, verl's one-step off-policy); in_flight = the same, "
        "and the weight sync enters that generation between decode steps (PipelineRL)",
    )
    sleep: bool = opt(False, help="vLLM sleeps (frees its memory) during the train phase")
    vllm_enforce_eager: str = opt(
        "auto",
        choices=["auto", "on", "off"],
        help="on = no torch.compile/graphs (faster start, slower decode); off = always compiled; "
        "auto = compiled, eager where a flow needs it (the simulated FP8 rollout)",
    )


@dataclass
class AlgoConfig:
    name: str = opt("grpo", choices=ALGOS, help="algorithm preset: fills the other algo.* keys (docs/algorithms.md)")
    loss_type: str = opt(
        "dapo",
        choices=LOSS_TYPES,
        help="how token losses are averaged: per sequence (grpo), "
        "per batch token (bnpo), by B·L_max (dr_grpo), over the "
        "rollout's tokens (dapo, TRL's default)",
    )
    epsilon: float = opt(0.2, lo=0, hi=MAX_COEF, help="clip range below: ratio >= 1 - epsilon")
    epsilon_high: float = opt(0.2, lo=0, hi=MAX_COEF, help="clip range above: ratio <= 1 + epsilon_high")
    delta: float = opt(0.0, lo=0, hi=10 * MAX_COEF, help="INTELLECT-2 cap on the unclipped ratio; 0 = off")
    beta: float = opt(0.0, lo=0, hi=MAX_COEF, help="KL-to-reference coefficient (k3)")
    scale_rewards: str = opt(
        "group",
        choices=["group", "batch", "none"],
        help="advantages divided by the reward std of the group or the batch; none = only centred",
    )
    mask_truncated_completions: bool = opt(False, help="completions cut at max_completion_len are left out of the loss")
    importance_sampling_level: str = opt(
        "token", choices=["token", "sequence"], help="pi/pi_old ratio per token, or one per sequence (GSPO)"
    )
    is_level: str = opt(
        "auto",
        choices=["auto", "none", "token", "sequence"],
        help="rollout correction against the inference policy mu; auto = sequence for a vLLM "
        "rollout, none for hf (TRL's vllm_importance_sampling_correction)",
    )
    is_mode: str = opt(
        "mask",
        choices=["truncate", "mask"],
        help="rollout correction above algo.is_cap: truncate the weight, or mask the token/sequence",
    )
    is_cap: float = opt(
        3.0, lo=0, hi=MAX_SCALE, help="C for rollout correction; 0 = no cap (plain IS, truncate mode only)"
    )
    objective: str = opt(
        "ppo", choices=["ppo", "pg"], help="ppo = clipped surrogate; pg = -sg(w)·A·log pi (vanilla policy gradient)"
    )
    use_bias_correction_kl: bool = opt(True, help="TRL's default: multiply the k3 KL term by pi/pi_old")


@dataclass
class TrainConfig:
    steps: int = opt(40, lo=1, hi=MAX_STEPS, help="optimizer steps in the run")
    lr: float = opt(1e-3, lo=0, hi=1e4, lo_open=True, help="AdamW learning rate")
    warmup_steps: int = opt(0, lo=0, hi=MAX_STEPS, help="steps of linear learning-rate warm-up")
    lr_schedule: str = opt("constant", choices=["constant", "linear", "cosine"], help="learning rate after the warm-up")
    weight_decay: float = opt(0.0, lo=0, hi=MAX_COEF, help="AdamW weight decay")
    prompts_per_step: int = opt(
        8, lo=1, hi=MAX_PROMPTS, help="prompts per step, each sampled rollout.num_generations times"
    )
    micro_batch_size: int = opt(
        0,
        lo=0,
        hi=MAX_SEQUENCES,
        help="sequences per forward/backward (gradient accumulation); 0 = the whole step's batch at once",
    )
    micro_batch_tokens: int = opt(
        0,
        lo=0,
        hi=MAX_SEQUENCES * MAX_TOKENS,
        help="token budget per forward/backward instead: rows sorted by length, each "
        "micro-batch cut to its own longest row, rows × width <= this (verl's "
        "dynamic batch size); same loss and gradients as the whole batch; 0 = off",
    )
    shared_prefix: str = opt(
        "auto",
        choices=["auto", "on", "off"],
        help="run each distinct prompt of a micro-batch once and its G completions on its KV "
        "cache (same log-probs and gradients, prompt FLOPs / G); auto = on where exact "
        "(eager/sdpa full attention, no gradient checkpointing) and the micro-batch "
        "repeats a prompt of at least 16 tokens",
    )
    steps_per_generation: int = opt(
        1,
        lo=1,
        hi=MAX_UPDATES,
        help="optimizer steps each rollout is split into "
        "(TRL steps_per_generation): a rollout samples "
        "prompts_per_step × this many prompts",
    )
    num_iterations: int = opt(
        1,
        lo=1,
        hi=MAX_UPDATES,
        help="optimizer passes over each rollout (TRL "
        "num_iterations, the GRPO paper's inner iterations); "
        "with either key above 1 the pi/pi_old clip acts",
    )
    shuffle_batch: bool = opt(
        True,
        help="shuffle the rollout's sequences before splitting them into "
        "train.steps_per_generation steps (TRL always does)",
    )
    seed: int = opt(0, lo=0, hi=2**32 - 1, help="seed of the data order, sampling and initialisation")
    grad_clip: float = opt(1.0, lo=0, hi=MAX_SCALE, help="max grad norm; 0 = off")
    parallel: str = opt(
        "none",
        choices=["none", "ddp", "fsdp"],
        help="data parallelism across the processes of `train --nproc N` (torchrun): ddp = each "
        "rank samples its share of the prompts, gradients all-reduced; fsdp = the same with "
        "weights, gradients and optimizer state sharded (FSDP2) (docs/distributed.md)",
    )
    dist_timeout_s: float = opt(
        300.0, lo=1, hi=MAX_SECONDS, help="data-parallel collective timeout: a rank that hangs this long stops the run"
    )
    save_every: int = opt(20, lo=0, hi=MAX_STEPS, help="checkpoint every N steps; 0 = only at the end")
    keep_checkpoints: int = opt(
        0,
        lo=0,
        hi=MAX_STEPS,
        help="keep the newest N checkpoints (plus the best by train.best_metric) and delete older ones; 0 = keep all",
    )
    best_metric: str = opt(
        "",
        help="metrics key whose highest value marks the best checkpoint, kept by "
        "train.keep_checkpoints (e.g. reward/mean); empty = no best",
    )
    samples_every: int = opt(1, lo=1, hi=MAX_STEPS, help="write samples.jsonl every N steps")
    eval_every: int = opt(0, lo=0, hi=MAX_STEPS, help="held-out accuracy every N steps; 0 = off")
    eval_before: bool = opt(
        False,
        help="with eval_every: also the starting weights' accuracy, before step 1 "
        "(an `eval` event at step 0; a resumed run does not repeat it)",
    )
    max_bad_steps: int = opt(
        5,
        lo=0,
        hi=MAX_STEPS,
        help="stop the run (diverged) after this many steps in a row "
        "skipped for a non-finite sampler, loss or gradient; "
        "0 = never stop",
    )
    max_staleness: int = opt(
        -1,
        lo=-1,
        hi=MAX_STEPS,
        help="tokens sampled more than this many policy versions "
        "before the weights they train are left out of the loss "
        "(rollout.async_mode one_step / in_flight); -1 = off",
    )


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
        help="rows held out for evaluation (without data.eval_split); "
        "-1 = auto: 200 for a built-in task, none for other data",
    )
    split: str = opt("train", help="HF dataset split used for training")
    subset: str = opt("", help="HF dataset config name, e.g. 'main' for openai/gsm8k")
    eval_split: str = opt("", help="HF split for evaluation; empty = a seeded held-out slice of eval_size rows")
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


TRACKERS = ("tensorboard", "trackio", "wandb")  # report.to: each an extra of the same name (docs/trackers.md)


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
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)

    @property
    def rollout_dtype(self) -> str:
        return self.rollout.dtype or self.model.dtype

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
