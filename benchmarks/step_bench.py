"""`grpo-studio bench step --vs trl [--json]`: whole optimizer steps, TRL 1.16's GRPOTrainer against ours.

Both sides, back to back in one process, get the same model, data (the bundled arithmetic task),
rewards (the tiny-arith recipe's correctness + format), batch shape (prompts × G), completion
length cap, LoRA (rank, alpha 32, all linear layers, no dropout), learning rate, seed, loss (dapo,
ε = 0.2, β = 0, one update per rollout), no gradient checkpointing (our default; TRL's default is on,
and it also turns the KV cache off while generating) and hf rollout; ours also with vLLM
(`--backends hf,vllm`) and with `--micro-batch-tokens` (train.micro_batch_tokens; TRL pads).
Each side takes `--warmup` untimed steps, then `--steps` timed ones; per side it reports:

  step_s         median seconds per optimizer step (rollout + rewards + forward/backward + AdamW)
  rollout_s      median seconds inside the sampler (ours: Sampler.generate; TRL: _generate_single_turn)
  gen_tok_s      completion tokens (EOS included, padding not) / rollout seconds
  train_tok_s    prompt + completion tokens / (step_s − rollout_s)
  peak_rss_gib   the process's peak resident memory while the side was built and stepped (on CUDA also
                 the peak allocated); rss_growth_gib: that peak less the RSS the side started from
                 (a later side starts from what the allocator kept of the earlier ones)
  reward_last    mean reward of the last step's rollout (reward_mean: over all timed steps)
  mfu            achieved FLOP/s over the matmul peak measured in this run (fp32, engine/flops.py)
  sync_s, idle_s, run_mfu   ours only: the medians of the trainer's perf/sync_s (weight sync to the
                 sampler), perf/idle_s (rewards, decoding, advantages, metrics) and perf/mfu (its own
                 per-step FLOPs over its cached peak)

FLOPs are counted by engine/flops.py, as the trainer's perf/mfu counts them (Kaplan et al. 2020 /
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
    grpo-studio bench step --vs trl --model random:8x768x2048 --prompts 8 --max-tokens 32 --backends hf,vllm
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import asdict, dataclass

from grpo_studio.benchmarks.step_measure import PeakMemory, model_path_of, summary


@dataclass
class Workload:
    """What one `grpo-studio bench step` measures (its flags)."""

    model: str  # preset id, local folder, or random:LxH[xI]
    prompts: int  # prompts per optimizer step
    generations: int  # completions per prompt (G)
    max_tokens: int  # completion length cap
    mean_len: int  # random models: target mean completion length via the EOS bias (0: no bias)
    steps: int  # timed steps per side
    warmup: int  # untimed steps per side first
    lora_rank: int  # 0 = full fine-tune
    lr: float
    seed: int
    backends: tuple  # our rollout backends, from hf, vllm
    vs: str  # trl | none
    micro_batch_tokens: int = 0  # ours: train.micro_batch_tokens (TRL pads every row to the longest)
    profile: int = 0  # > 0: torch.profiler over one more step of ours per backend, its top ops by self time


# ---- the model ------------------------------------------------------------------------------


def _config(w: Workload, model_path: str, backend: str):
    from grpo_studio.contract import config

    return config.load(
        "tiny-arith",
        [
            f"model.name={model_path}",
            f"model.lora_rank={w.lora_rank}",
            f"rollout.backend={backend}",
            f"rollout.num_generations={w.generations}",
            f"rollout.max_completion_len={w.max_tokens}",
            f"train.prompts_per_step={w.prompts}",
            f"train.lr={w.lr}",
            f"train.seed={w.seed}",
            f"train.steps={w.warmup + w.steps}",
            f"train.micro_batch_tokens={w.micro_batch_tokens}",
            "train.save_every=0",
            "train.eval_every=0",
            "algo.is_level=none",
        ],
    )


def run_ours(w: Workload, model_path: str, backend: str, report_side) -> None:
    """Our Trainer, stepped as `grpo-studio train` steps it; report_side(n_params, steps, mem)."""
    from grpo_studio.engine import flops
    from grpo_studio.engine.trainer import Trainer

    cfg = _config(w, model_path, backend)
    with tempfile.TemporaryDirectory() as tmp, PeakMemory() as mem:
        trainer = Trainer(cfg, f"{tmp}/run")
        trainer.rundir.acquire()
        try:
            rows = [trainer.step() for _ in range(w.warmup + w.steps)][w.warmup :]
            top = profile_step(trainer, w.profile) if w.profile else None
        finally:
            trainer.rundir.release()
            trainer.close()
        n_params = flops.matmul_params(trainer.policy)
    B = w.prompts * w.generations
    steps = [
        {
            "step_s": r["perf/step_s"],
            "rollout_s": r["perf/rollout_s"],
            "completion_tokens": r["completion/len_mean"] * B,
            "reward": sum(v for k, v in r.items() if k.startswith("rewards/") and k.endswith("/mean")),
            "sync_s": r["perf/sync_s"],
            "idle_s": r["perf/idle_s"],
            "run_mfu": r["perf/mfu"],
        }
        for r in rows
    ]
    report_side(n_params, steps, mem, top)


def profile_step(trainer, rows: int) -> list[dict]:
    """The `rows` operators with the most self CPU time (self CUDA time on a GPU) in one step of `trainer`."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        trainer.step()
    events = prof.key_averages()
    key = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    total = sum(map(key, events)) or 1
    return [
        {"op": e.key, "self_s": round(key(e) / 1e6, 4), "share": round(key(e) / total, 4), "calls": e.count}
        for e in sorted(events, key=key, reverse=True)[:rows]
    ]


def run_trl(w: Workload, model_path: str, report_side) -> None:
    """TRL 1.16's GRPOTrainer as a user drives it (GRPOConfig + train()), on our settings."""
    import datasets
    import transformers
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from grpo_studio.engine import data, flops, rewards

    cfg = _config(w, model_path, "hf")
    rows = data.load_rows(cfg.data, "train")
    funcs = [fn for _, fn in rewards.build(cfg.rewards)]
    B = w.prompts * w.generations
    lora = (
        LoraConfig(
            r=w.lora_rank,
            lora_alpha=cfg.model.lora_alpha,
            lora_dropout=0.0,
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )
        if w.lora_rank
        else None
    )
    steps, marks = [], {}

    class Timer(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            marks.update(t0=time.perf_counter(), rollout=0.0)

        def on_step_end(self, args, state, control, **kw):
            steps.append({"step_s": time.perf_counter() - marks["t0"], "rollout_s": marks["rollout"]})

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs and steps:
                steps[-1].update(reward=logs["reward"], completion_tokens=logs["completions/mean_length"] * B)

    with tempfile.TemporaryDirectory() as tmp, PeakMemory() as mem:
        args = GRPOConfig(
            output_dir=tmp,
            use_cpu=not _cuda(),
            per_device_train_batch_size=B,
            num_generations=w.generations,
            max_completion_length=w.max_tokens,
            temperature=cfg.rollout.temperature,
            learning_rate=w.lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=cfg.train.grad_clip,
            beta=0.0,
            loss_type=cfg.algo.loss_type,
            epsilon=cfg.algo.epsilon,
            scale_rewards="group",
            max_steps=w.warmup + w.steps,
            seed=w.seed,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            bf16=False,
            fp16=False,
            gradient_checkpointing=cfg.model.gradient_checkpointing,
        )  # TRL's default is on
        trainer = GRPOTrainer(
            model=model_path,
            reward_funcs=funcs,
            args=args,
            peft_config=lora,
            train_dataset=datasets.Dataset.from_list(rows),
        )
        generate = trainer._generate_single_turn

        def timed(*a, **k):  # the sampler's share of the step, as ours reports perf/rollout_s
            t0 = time.perf_counter()
            try:
                return generate(*a, **k)
            finally:
                marks["rollout"] += time.perf_counter() - t0

        trainer._generate_single_turn = timed
        trainer.add_callback(Timer())
        trainer.train()
        n_params = flops.matmul_params(trainer.model)
    report_side(n_params, steps[w.warmup :], mem, None)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _prompt_len(model_path: str, w: Workload) -> float:
    """Mean prompt tokens per sequence over the training rows (both sides draw from them)."""
    from grpo_studio.engine import data, prompt_render
    from grpo_studio.engine.policy_loader import load_tokenizer

    cfg = _config(w, model_path, "hf")
    tok = load_tokenizer(model_path)
    texts = [prompt_render.prompt_text(r, cfg.data, tok) for r in data.load_rows(cfg.data, "train")]
    ids = prompt_render.encode_prompts(tok, texts, cfg.rollout.max_prompt_len)
    return sum(map(len, ids)) / len(ids)


def run(w: Workload, progress=None) -> dict:
    """TRL (unless vs = none) then ours per backend, back to back: the JSON report."""
    from grpo_studio.contract.errors import UserError
    from grpo_studio.engine.sampler import vllm_backend

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

    from grpo_studio.engine import flops
    from grpo_studio.engine.policy_loader import device

    peak = flops.measure_peak(str(device()), torch.float32)  # fp32, as both sides train; not the cached peak
    prompt_len = _prompt_len(model_path, w)
    sides = {}

    def side(name):
        def report(n_params, steps, mem, top):
            sides[name] = summary(steps, w, n_params, prompt_len, peak, mem)
            sides[name]["matmul_params"] = n_params
            if top:
                sides[name]["profile"] = top

        return report

    if w.vs == "trl":
        say("trl")
        run_trl(w, model_path, side("trl"))
    for backend in w.backends:
        say(f"ours ({backend})")
        run_ours(w, model_path, backend, side(f"ours_{backend}"))
    report = {
        "workload": {
            **asdict(w),
            "backends": list(w.backends),
            "torch_threads": torch.get_num_threads(),
            "prompt_len_mean": round(prompt_len, 2),
        },
        "matmul_peak_gflop_s": round(peak / 1e9, 2),
        "sides": sides,
    }
    if "trl" in sides:
        report["speedup_vs_trl"] = {
            name: round(sides["trl"]["step_s"] / s["step_s"], 3) for name, s in sides.items() if name != "trl"
        }
    return report


def print_report(report: dict) -> None:
    w = report["workload"]
    lora = f"LoRA r{w['lora_rank']}" if w["lora_rank"] else "full fine-tune"
    print(
        f"step: {w['model']}, {w['prompts']} prompts × {w['generations']}, ≤{w['max_tokens']} tokens, {lora}, "
        f"lr {w['lr']:g}, {w['steps']} timed steps after {w['warmup']} warm-up, {w['torch_threads']} threads; "
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
    for name, s in report["sides"].items():
        if "profile" in s:
            print(f"  profile of one {name} step (self time):")
            for op in s["profile"]:
                print(f"    {op['self_s']:8.3f}s {op['share']:6.1%} {op['calls']:6d}  {op['op']}")
