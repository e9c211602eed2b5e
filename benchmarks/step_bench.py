"""`grpo-studio bench step --vs trl [--json]`: whole optimizer steps, TRL 1.16's GRPOTrainer against ours.

Four workloads (`--workload`):

  random              the bundled tiny-arith recipe (its data, correctness + format rewards) on `--model`
                      (default: the bundled tiny model, or a random Qwen3 `random:LxHxI`); 16 prompts × 8, ≤ 8 tokens
  short-prompt        tiny-arith on a random 50M Qwen3 (random:8x768x2048): prompts of about 6 tokens,
                      8 prompts × 8, ≤ 32 tokens
  shared-instruction  the same with a 160-character system prompt before every question (SYSTEM_PROMPT,
                      prompts of about 170 tokens, one per group), ≤ 64 tokens
  gsm8k-shaped        the word-problems recipe on the real SmolLM2-135M-Instruct: its chat template, the GSM8K
                      reasoning system prompt, generated GSM8K-shaped questions and the GSM8K reward set;
                      8 prompts × 8, ≤ 128 tokens

Ours runs with the recipe's defaults (train.micro_batch_size = auto: the rows it chooses on this machine);
TRL gets the same rows per micro-batch (per_device_train_batch_size, accumulation over the rest).

Both sides get the same model, data, rewards, batch shape (prompts × G), completion length cap, LoRA
(rank, alpha, all linear layers, no dropout), learning rate, seed, loss (the recipe's: dapo, ε = 0.2,
β = 0, one update per rollout), no gradient checkpointing (our default; TRL's default is on, and it also
turns the KV cache off while generating) and hf rollout; ours also with vLLM (`--backends hf,vllm`) and
with `--micro-batch-tokens` (train.micro_batch_tokens; TRL pads). TRL gets each prompt as the text ours
renders, so both tokenise the same prompt.

Each side runs in a Python process of its own (step_sides.py), so its peak RSS is its own and not what an
earlier side left behind. With `--vs trl`, a first process computes both sides' gradients on one shared
rollout (step_parity.py) and the report's parity line gives their distance before any timing. Each side
takes `--warmup` untimed steps, then `--steps` timed ones; per side it reports:

  step_s         median seconds per optimizer step (rollout + rewards + forward/backward + AdamW)
  rollout_s      median seconds inside the sampler (ours: Sampler.generate; TRL: _generate_single_turn)
  gen_tok_s      completion tokens (EOS included, padding not) / rollout seconds
  train_tok_s    prompt + completion tokens / (step_s − rollout_s)
  peak_rss_gib   the side's process's peak resident memory (getrusage; on CUDA also the peak allocated)
  memory         where it went: RSS after the libraries' imports, once the trainer is built (model,
                 sampler), at the peak; the bytes of the model's weights and of the optimizer's state
  reward_last    mean reward of the last step's rollout (reward_mean: over all timed steps)
  mfu            achieved FLOP/s over the matmul peak measured in this run (fp32, engine/train/flops.py)
  sync_s, idle_s, run_mfu   ours only: the medians of the trainer's perf/sync_s (weight sync to the
                 sampler), perf/idle_s (rewards, decoding, advantages, metrics) and perf/mfu (its own
                 per-step FLOPs over its cached peak)

and for ours per backend, `grpo-studio train` started as a user starts it (a fresh process, one step): the
seconds from the launch to its `started` event and to the end of its first step (report["startup"]).

The report also counts the prompt tokens per step that ours computes once per group instead of once per
completion (prefix_tokens_saved; from the workload's shape): in the rollout (hf: each prompt prefilled once
into a KV cache its G samples share; vLLM: its prefix cache) and in training (train.shared_prefix = auto,
in micro-batches that hold whole groups). TRL computes every copy.

FLOPs are counted by engine/train/flops.py, as the trainer's perf/mfu counts them (Kaplan et al. 2020 /
PaLM's MFU, attention's sequence-length term left out, the sequences here are short): N = the weights
of the model's matmuls (every nn.Linear, lm_head included); generation 2·N per prompt or completion
token; training 6·N per token for a full fine-tune (forward 2N, backward 4N) and 4·N with LoRA (the
frozen weights need the input gradient, 2N, not their own). Tokens are the real ones (padding is
waste, not work): the completion tokens of the side's own rollouts and the data set's mean prompt
length per sequence.

`random:LxHxI` builds a random Qwen3 (benchmarks/rollout_bench.py) whose logits are near uniform over
the 64-token character vocabulary, so completions would almost all run to the cap. To give them a
realistic spread, the EOS logit gets a constant bias b = ln((V−1)/(L−1)) (per-token stop probability
1/L, so lengths are geometric with mean ≈ L = `--mean-len`, cut at the cap): every embedding (tied to
lm_head) gets a constant coordinate 0, which makes coordinate 0 of the final hidden state a nearly
constant h₀ > 0, and the EOS row gets b/h₀ more there. It is part of the weights both sides load.

    grpo-studio bench step --vs trl                                  # tiny-arith, 16 prompts × 8, ≤ 8 tokens
    grpo-studio bench step --vs trl --workload gsm8k-shaped --backends hf,vllm   # the real model
    grpo-studio bench step --vs trl --model random:8x768x2048 --prompts 8 --max-tokens 32 --backends hf,vllm
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from .step_measure import Workload, model_path_of, summary

SYSTEM_PROMPT = (  # shared-instruction: 160 characters before every question, the same in every group
    "You are a careful arithmetic teacher. Read the question, add the two numbers step by step, "
    "and give only the final sum between answer tags, with no other words."
)
WORKLOADS = {  # --workload: the recipe, the flags' defaults and the workload's own --sets over the recipe
    "random": {"recipe": "tiny-arith", "model": "tiny-arith", "prompts": 16, "max_tokens": 8, "lr": 2e-3},
    "short-prompt": {"recipe": "tiny-arith", "model": "random:8x768x2048", "prompts": 8, "max_tokens": 32, "lr": 2e-3},
    "shared-instruction": {
        "recipe": "tiny-arith",
        "model": "random:8x768x2048",
        "prompts": 8,
        "max_tokens": 64,
        "lr": 2e-3,
        "sets": (f"data.system_prompt={SYSTEM_PROMPT}", "rollout.max_prompt_len=256"),
    },
    "gsm8k-shaped": {
        "recipe": "word-problems",
        "model": "smollm2-135m-instruct",
        "prompts": 8,
        "max_tokens": 128,
        "lr": 5e-4,
        # the RL step alone, as TRL's side runs it: not the recipe's supervised format warm-up before step 1
        "sets": ("warmup.source=", "warmup.steps=30", "warmup.lr=5e-4", "warmup.batch_size=8"),
    },
}


# ---- the sides, each in a process of its own -------------------------------------------------------------


def side_process(name: str, w: Workload, model_path: str) -> dict:
    """Run one side (step_sides.py) in a fresh Python, so its peak RSS is its own; its output JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        spec, out = Path(tmp) / "workload.json", Path(tmp) / "out.json"
        spec.write_text(json.dumps(asdict(w)))
        argv = [sys.executable, "-m", "grpo_studio.benchmarks.step_sides", name, str(spec), model_path, str(out)]
        proc = subprocess.run(argv, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"bench step: side {name} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        return json.loads(out.read_text())


def startup_process(w: Workload, model_path: str, backend: str) -> dict:
    """`grpo-studio train` as a user starts it, in a fresh process, on ours' config for `backend`, one step:
    seconds from the launch to its `started` event (data, model, sampler loaded) and to the end of its first
    step (the metrics row's time), and that step's own seconds."""
    from ..contract import config
    from ..contract.rundir import METRICS, read_events, read_rows
    from .step_sides import bench_config

    cfg = bench_config(w, model_path, backend)
    cfg.train.steps, cfg.train.eval_every, cfg.train.save_every = 1, 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        recipe, run = Path(tmp) / "recipe.toml", Path(tmp) / "run"
        config.save(cfg, recipe)
        argv = [sys.executable, "-m", "grpo_studio.cli.main", "train", str(recipe), "--run-dir", str(run), "--force"]
        launched = time.time()
        proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"bench step: start-up run failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        started = next(e["time"] for e in read_events(run) if e["event"] == "started")
        first = read_rows(run / METRICS)[0]
    return {
        "to_started_s": round(started - launched, 3),
        "to_first_step_s": round(first["time"] - launched, 3),
        "first_step_s": round(first["perf/step_s"], 3),
    }


def prefix_tokens_saved(w: Workload, prompt_len: float, micro_batch_size: int) -> dict:
    """Prompt tokens per step that ours computes once per group instead of once per completion: in the rollout
    (hf: each prompt prefilled once into a KV cache shared by its G samples; vLLM: its prefix cache) and in
    training (train.shared_prefix: each distinct prompt of a micro-batch run once). TRL saves neither."""
    B = w.prompts * w.generations
    rows = micro_batch_size or B
    groups_per_micro = [len({r // w.generations for r in range(s, min(s + rows, B))}) for s in range(0, B, rows)]
    repeats = B - sum(groups_per_micro)  # rows whose prompt their micro-batch already computed
    shared = not w.micro_batch_tokens  # train.shared_prefix = auto
    return {
        "per_step": round(B * prompt_len),
        "rollout": round(w.prompts * (w.generations - 1) * prompt_len),
        "train": round(repeats * prompt_len) if shared else 0,
    }


def _prompt_len(model_path: str, cfg) -> float:
    """Mean prompt tokens per sequence over the training rows (both sides draw from them)."""
    from ..engine.model.policy_loader import load_tokenizer
    from ..engine.prompts import data, prompt_render

    tok = load_tokenizer(model_path)
    texts = [prompt_render.prompt_text(r, cfg.data, tok) for r in data.load_rows(cfg.data, "train")]
    ids = prompt_render.encode_prompts(tok, texts, cfg.rollout.max_prompt_len)
    return sum(map(len, ids)) / len(ids)


def run(w: Workload, progress=None) -> dict:
    """The parity line and TRL (unless vs = none), then ours per backend, each in its own process: the report."""
    from ..contract.errors import UserError
    from ..engine.sampler import vllm_backend

    if "vllm" in w.backends and vllm_backend.unavailable_reason():
        raise UserError(
            f"needs vLLM: {vllm_backend.unavailable_reason()}",
            kind="bench",
            key="--backends",
            value=",".join(w.backends),
        )
    say = progress or (lambda _: None)
    model_path = model_path_of(w)
    try:
        return _run(w, model_path, say)
    finally:
        if w.model.startswith("random:"):  # built for this run in a temp folder
            shutil.rmtree(model_path, ignore_errors=True)


def _run(w: Workload, model_path: str, say) -> dict:
    import torch

    from ..contract.planner import micro_batch
    from ..engine.model.policy_loader import device
    from ..engine.train import flops
    from .step_sides import bench_config

    peak = flops.measure_peak(str(device()), torch.float32)  # fp32, as both sides train; not the cached peak
    cfg = bench_config(w, model_path, "hf")
    prompt_len, micro_batch_size = _prompt_len(model_path, cfg), micro_batch.rows_here(cfg)  # auto: as ours chooses
    report = {
        "workload": {
            **asdict(w),
            "torch_threads": torch.get_num_threads(),
            "prompt_len_mean": round(prompt_len, 2),
            "micro_batch_size": micro_batch_size,
        },
        "matmul_peak_gflop_s": round(peak / 1e9, 2),
    }
    if w.vs == "trl":
        say("parity: both sides' gradients on one shared rollout")
        report["parity"] = side_process("parity", w, model_path)
    sides = {}
    for name in (["trl"] if w.vs == "trl" else []) + [f"ours_{b}" for b in w.backends]:
        say(name)
        out = side_process(name, w, model_path)
        sides[name] = {
            **summary(out["steps"], w, out["n_params"], prompt_len, peak, out),
            "matmul_params": out["n_params"],
        }
        if out["profile"]:
            sides[name]["profile"] = out["profile"]
    report["sides"] = sides
    report["startup"] = {}
    for backend in w.backends:
        say(f"start-up: grpo-studio train ours_{backend}, one step")
        report["startup"][f"ours_{backend}"] = startup_process(w, model_path, backend)
    report["prefix_tokens_saved"] = prefix_tokens_saved(w, prompt_len, micro_batch_size)
    if "trl" in sides:
        report["speedup_vs_trl"] = {
            name: round(sides["trl"]["step_s"] / s["step_s"], 3) for name, s in sides.items() if name != "trl"
        }
    return report


def print_report(report: dict) -> None:
    w = report["workload"]
    lora = f"LoRA r{w['lora_rank']}" if w["lora_rank"] else "full fine-tune"
    print(
        f"step ({w['name']}): {w['model']}, {w['prompts']} prompts × {w['generations']}, ≤{w['max_tokens']} tokens, {lora}, "
        f"lr {w['lr']:g}, micro-batches of {w['micro_batch_size'] or 'all'} rows, {w['steps']} timed steps after {w['warmup']} warm-up, {w['torch_threads']} threads; "
        f"matmul peak {report['matmul_peak_gflop_s']:.1f} GFLOP/s"
    )
    print(
        f"  {'side':10s} {'s/step':>8s} {'rollout':>8s} {'train':>8s} {'gen tok/s':>10s} {'train tok/s':>11s} "
        f"{'len':>6s} {'peak GiB':>9s} {'reward':>7s} {'MFU':>6s} {'vs TRL':>7s}"
    )
    speedup = report.get("speedup_vs_trl", {})
    for name, s in report["sides"].items():
        ratio = f"{speedup[name]:.2f}x" if name in speedup else "—"
        print(
            f"  {name:10s} {s['step_s']:8.3f} {s['rollout_s']:8.3f} {s['train_s']:8.3f} {s['gen_tok_s']:10.1f} "
            f"{s['train_tok_s']:11.1f} {s['completion_len_mean']:6.1f} {s['peak_rss_gib']:9.2f} "
            f"{s['reward_last']:7.3f} {s['mfu']:6.1%} {ratio:>7s}"
        )
    parity = report.get("parity")
    if parity:
        verdict = "same gradient" if parity["ok"] else "DIFFERENT gradients: the timings compare different work"
        print(
            f"  parity on one shared rollout ({parity['rows']} rows, {parity['completion_tokens']} completion "
            f"tokens, {parity['advantages']} advantages): |g_ours − g_trl| / |g_trl| = "
            f"{parity['grad_rel_l2']:.2e} over {parity['weights']} weights, "
            f"loss {parity['loss_ours']:.6g} vs {parity['loss_trl']:.6g}: {verdict}"
            if "grad_rel_l2" in parity
            else f"  parity: {parity['why']}"
        )
    B = w["prompts"] * w["generations"]
    for name, s in report["sides"].items():
        if "rows_trained" in s:
            print(
                f"  {name}: rows trained / run forward per timed step "
                f"{', '.join(f'{t:g}/{r:g}' for t, r in zip(s['rows_trained'], s['rows_run']))} of {B} "
                "(zero-advantage micro-batches skipped; TRL trains every row)"
            )
    saved = report["prefix_tokens_saved"]
    print(
        f"  prompt tokens per step {saved['per_step']}; ours computes once per group instead of per completion: "
        f"{saved['rollout']} in the rollout, {saved['train']} in training (TRL: 0)"
    )
    print("  memory (GiB, each side in its own process): after imports → built → peak RSS; weights, optimizer")
    for name, s in report["sides"].items():
        m = s["memory"]
        print(
            f"    {name:10s} {m['imports_gib']:.2f} → {m['built_gib']:.2f} → {m['peak_rss_gib']:.2f}; "
            f"weights {m['weights_gib']:.2f}, optimizer {m['optimizer_gib']:.3f}, sampler {m['sampler']}"
        )
    print(
        "  where the peak goes (GiB): weights (+ the sampler's own copy), optimizer state; live malloc growth in the "
        "rollout (sampler's KV cache, sampling logits) and in training (activations + logits); the live high-water "
        "mark (RSS less malloc's held free bytes, sampled every 10 ms) and the allocator's slack above it"
    )
    for name, s in report["sides"].items():
        m, t = s["memory"], s["memory"]["trace"]
        print(
            f"    {name:10s} weights {m['weights_gib']:.2f} (+{m['sampler_weights_gib']:.2f}), optimizer "
            f"{m['optimizer_gib']:.3f}; rollout {t.get('rollout_gib', 0):.2f}, training {t.get('train_gib', 0):.2f}; "
            f"live peak {t['live_peak_gib']:.2f} ({t['live_peak_phase']}), peak RSS {m['peak_rss_gib']:.2f}, "
            f"slack {t['slack_gib']:.2f}"
        )
    for name, t in report.get("startup", {}).items():
        print(
            f"  start-up, grpo-studio train {name}: {t['to_started_s']:.2f} s to `started` (loaded), "
            f"{t['to_first_step_s']:.2f} s to the end of the first step ({t['first_step_s']:.2f} s of it the step)"
        )
    for name, s in report["sides"].items():
        if "profile" in s:
            print(f"  profile of one {name} step (self time):")
            for op in s["profile"]:
                print(f"    {op['self_s']:8.3f}s {op['share']:6.1%} {op['calls']:6d}  {op['op']}")
