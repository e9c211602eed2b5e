"""The sections of the training itself: model, rollout, algo and train, each key with its type, default,
allowed values, bounds and help (`opt`, config_bounds.py). config_schema.py holds the other sections and
assembles them all into Config; config.py re-exports these names.

Pure python (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import loss_types
from .config_bounds import (
    ALGOS,
    AUTO,
    DTYPES,
    LOSS_TYPES,
    MAX_COEF,
    MAX_GENERATIONS,
    MAX_PROMPTS,
    MAX_ROUNDS,
    MAX_SCALE,
    MAX_SECONDS,
    MAX_SEQUENCES,
    MAX_STEPS,
    MAX_TOKENS,
    MAX_UPDATES,
    opt,
)


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
    server_secret_file: str = opt(
        "",
        help="with rollout.server: a file (mode 0600) holding the server's secret; empty = the environment "
        "variable GRPO_STUDIO_ROLLOUT_SECRET, else none (a server started for the run makes its own)",
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
    vllm_sync: str = opt(
        "auto",
        choices=["auto", "adapter", "merged"],
        help="vLLM weight sync with LoRA: adapter = only the adapter, served by vLLM's LoRA; merged = the merged "
        "weights; auto = adapter where vLLM's LoRA can serve it (docs/performance.md)",
    )


@dataclass
class AlgoConfig:
    name: str = opt("grpo", choices=ALGOS, help="algorithm preset: fills the other algo.* keys (docs/algorithms.md)")
    loss_type: str = opt(
        "dapo",
        choices=LOSS_TYPES,
        help="how token losses are averaged: " + ", ".join(kind.summary for kind in loss_types.BY_NAME.values()),
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
    advantage: str = opt(
        "grpo",
        choices=["grpo", "pass_at_k"],
        help="group advantages: grpo = (r - mean) / std; pass_at_k = the pass@k objective's closed form "
        "(Chen et al. 2025, arXiv 2508.10751), a completion passing when its reward is > 0 (docs/algorithms.md)",
    )
    pass_k: int = opt(
        4,
        lo=1,
        hi=MAX_GENERATIONS,
        help="k of algo.advantage = pass_at_k: the group reward is the best of k completions; below "
        "rollout.num_generations",
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
        help="rollout correction outside [algo.is_floor, algo.is_cap]: truncate the weight, or mask the "
        "token/sequence (MIS; IcePop with a floor)",
    )
    is_cap: float = opt(
        3.0, lo=0, hi=MAX_SCALE, help="C for rollout correction; 0 = no cap (plain IS, truncate mode only)"
    )
    is_floor: float = opt(
        0.0,
        lo=0,
        hi=1,
        help="lower bound of rollout correction: ratios below it are masked (is_mode mask: IcePop's band "
        "[is_floor, is_cap], arXiv 2510.18855) or raised to it (truncate); 0 = none",
    )
    logprob_support: str = opt(
        "sampler",
        choices=["sampler", "full"],
        help="with rollout.top_p < 1 or top_k > 0, pi (its entropy, the reference's KL) on the tokens the "
        "sampler kept at each position, renormalised as mu is; full = the whole vocabulary (mismatch/* then "
        "also measure the truncation; docs/mismatch.md)",
    )
    objective: str = opt(
        "ppo", choices=["ppo", "pg"], help="ppo = clipped surrogate; pg = -sg(w)·A·log pi (vanilla policy gradient)"
    )
    use_bias_correction_kl: bool = opt(True, help="TRL's default: multiply the k3 KL term by pi/pi_old")
    dynamic_sampling: bool = opt(
        False,
        help="DAPO dynamic sampling: groups whose rewards are all equal (no gradient) are dropped and more "
        "prompts sampled until the rollout holds only groups with signal (docs/algorithms.md)",
    )
    dynamic_sampling_max_rounds: int = opt(
        4,
        lo=1,
        hi=MAX_ROUNDS,
        help="sampling rounds of one rollout with algo.dynamic_sampling, the first included; when they run "
        "out, the first dropped groups fill the rollout and a warning event says so",
    )
    router_replay: str = opt(
        "off",
        choices=["off", "replay"],
        help="mixture-of-experts models: replay = the training forward sends each token to the experts the "
        "sampler chose, gate weights from the trainer's router (R3, Ma et al. 2025; docs/mismatch.md)",
    )


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
    micro_batch_size: int | str = opt(
        AUTO,
        auto=int,
        lo=0,
        hi=MAX_SEQUENCES,
        help="sequences per forward/backward (gradient accumulation); auto = the most whole groups whose planned "
        "peak fits the free memory (VRAM, or host RAM), on a CPU no more tokens than pay "
        "(contract/planner/micro_batch.py, docs/performance.md); 0 = the whole step's batch at once",
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
        "repeats a prompt",
    )
    score_zero_advantage: bool = opt(
        False,
        help="also run the forward of micro-batches whose rows all have advantage 0 (their "
        "backward is skipped either way: a gradient of exactly 0), so entropy and the "
        "rollout/train mismatch are measured on every row; off: on the rows trained, faster",
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
    eval_k: int = opt(
        1,
        lo=1,
        hi=MAX_GENERATIONS,
        help="samples per held-out prompt at each eval: 1 = eval/accuracy of one sample; k > 1 also "
        "eval/pass_at_k and eval/maj_at_k (eval/accuracy then pass@1 estimated from the k)",
    )
    eval_before: bool = opt(
        False,
        help="with eval_every: also the starting weights' accuracy, before step 1 "
        "(an `eval` event at step 0; a resumed run does not repeat it)",
    )
    max_bad_steps: int = opt(
        5,
        lo=0,
        hi=MAX_STEPS,
        help="stop the run after this many bad steps in a row: skipped for a non-finite sampler, loss or "
        "gradient (diverged), or with reward and gradient exactly 0 after a signal (collapsed); 0 = never stop",
    )
    max_staleness: int = opt(
        -1,
        lo=-1,
        hi=MAX_STEPS,
        help="tokens sampled more than this many policy versions "
        "before the weights they train are left out of the loss "
        "(rollout.async_mode one_step / in_flight); -1 = off",
    )
