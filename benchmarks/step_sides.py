"""One side of `grpo-studio bench step` (step_bench.py), run in a process of its own so its peak RSS is its own:

    python -m grpo_studio.benchmarks.step_sides SIDE WORKLOAD.json MODEL_PATH OUT.json

SIDE is `trl` (TRL 1.16's GRPOTrainer as a user drives it), `ours_hf` / `ours_vllm` (our Trainer, stepped as
`grpo-studio train` steps it) or `parity` (step_parity.py: both sides' gradients on one shared rollout).
OUT.json gets the side's timed steps, its matmul weights, where its memory went and, with --profile, its top
operators; the parent (step_bench.py) turns them into the report.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from ..engine.run.rehearsal import peak_rss
from .step_measure import CudaPeak, MemoryTrace, Workload, rss_gib
from .tensor_bytes import persistent_tensors, unique_storages


def bench_config(w: Workload, model_path: str, backend: str, steps: int | None = None):
    """The workload's recipe with the bench's flags over it: what both sides are set up from."""
    from ..contract import config

    return config.load(
        w.recipe,
        [
            f"model.name={model_path}",
            f"model.lora_rank={w.lora_rank}",
            f"rollout.backend={backend}",
            f"rollout.num_generations={w.generations}",
            f"rollout.max_completion_len={w.max_tokens}",
            f"train.prompts_per_step={w.prompts}",
            f"train.lr={w.lr}",
            f"train.seed={w.seed}",
            f"train.steps={w.warmup + w.steps if steps is None else steps}",
            f"train.micro_batch_tokens={w.micro_batch_tokens}",
            "train.save_every=0",
            "train.eval_every=0",
            "train.eval_before=false",
            "algo.is_level=none",
            *w.sets,
        ],
    )


def gib(tensors) -> float:
    """GiB held by `tensors`, each storage counted once (tied weights share one)."""
    return round(sum(t.untyped_storage().nbytes() for t in unique_storages(tensors)) / 2**30, 3)


def model_memory(memory: dict, model, optimizer, sampler: str, sampler_model=None) -> None:
    """The side's persistent bytes into `memory`: the model's weights and buffers, the optimizer's state, and
    the weights of the sampler's own copy of the model (ours, hf: a model of its own; TRL samples with the
    trained one)."""
    memory["weights_gib"] = gib([*model.parameters(), *model.buffers()])
    memory["optimizer_gib"] = gib(persistent_tensors([], optimizer))
    memory["sampler"] = sampler
    own = sampler_model is not None and sampler_model is not model
    memory["sampler_weights_gib"] = gib([*sampler_model.parameters(), *sampler_model.buffers()]) if own else 0.0


def run_ours(w: Workload, model_path: str, backend: str, memory: dict) -> dict:
    from ..engine.run.trainer import Trainer
    from ..engine.train import flops

    cfg = bench_config(w, model_path, backend)
    with tempfile.TemporaryDirectory() as tmp, CudaPeak() as mem, MemoryTrace() as trace:
        trainer = Trainer(cfg, f"{tmp}/run")
        memory["built_gib"] = rss_gib()
        step, sampler = trainer.grpo, trainer.grpo.sampler
        sampler.generate = trace.wrap(sampler.generate, "rollout")  # the KV cache and the sampling logits
        step._accumulate = trace.wrap(step._accumulate, "train")  # forward, backward, then AdamW's step
        trainer.rundir.acquire()
        try:
            rows = [trainer.step() for _ in range(w.warmup + w.steps)][w.warmup :]
            top = profile_step(trainer, w.profile) if w.profile else None
            model_memory(memory, trainer.policy, step.optimizer, sampler.name, getattr(sampler, "model", None))
        finally:
            trainer.rundir.release()
            trainer.close()
        n_params = flops.matmul_params(trainer.policy)
    memory["trace"] = trace.breakdown(peak_rss())
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
            "rows_trained": B - r["perf/skipped_backward_rows"],
            "rows_run": B - r["perf/skipped_forward_rows"],
        }
        for r in rows
    ]
    return {"steps": steps, "n_params": n_params, "cuda_peak": mem.peak, "profile": top}


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


def trl_rows(cfg, model_path: str) -> list[dict]:
    """The training rows with each prompt rendered as ours renders it (chat template, system prompt): TRL gets
    the same text, so both sides tokenise the same prompt."""
    from ..engine.model.policy_loader import load_tokenizer
    from ..engine.prompts import data, prompt_render

    tok = load_tokenizer(model_path)
    return [{**r, "prompt": prompt_render.prompt_text(r, cfg.data, tok)} for r in data.load_rows(cfg.data, "train")]


def trl_trainer(w: Workload, model_path: str, cfg, tmp: str, steps: int):
    """TRL 1.16's GRPOTrainer on our settings: same LoRA (rank, alpha, all linear layers, no dropout), lr, loss,
    ε, β = 0, seed, rewards, micro-batching (gradient accumulation over the same rows) and hf rollout."""
    import datasets
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from .. import rewards
    from ..contract.planner import micro_batch
    from ..engine.model.policy_loader import device

    B = w.prompts * w.generations
    m = micro_batch.rows_here(cfg)  # auto: the rows ours chooses on this machine
    micro = m if m and B % m == 0 else B  # ours: micro-batches of m rows (all B when m = 0 or m > B)
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
    args = GRPOConfig(
        output_dir=tmp,
        use_cpu=device().type != "cuda",
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=B // micro,
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
        epsilon_high=cfg.algo.epsilon_high,
        mask_truncated_completions=cfg.algo.mask_truncated_completions,
        scale_rewards=cfg.algo.scale_rewards,
        max_steps=steps,
        seed=w.seed,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=cfg.model.gradient_checkpointing,  # TRL's default is on; ours off
    )
    return GRPOTrainer(
        model=model_path,
        reward_funcs=[fn for _, fn in rewards.build(cfg.rewards)],
        args=args,
        peft_config=lora,
        train_dataset=datasets.Dataset.from_list(trl_rows(cfg, model_path)),
    )


def run_trl(w: Workload, model_path: str, memory: dict) -> dict:
    import transformers

    from ..engine.train import flops

    cfg = bench_config(w, model_path, "hf")
    B = w.prompts * w.generations
    steps, marks = [], {}

    class Timer(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            marks.update(t0=time.perf_counter(), rollout=0.0)

        def on_step_end(self, args, state, control, **kw):
            steps.append({"step_s": time.perf_counter() - marks["t0"], "rollout_s": marks["rollout"]})

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs and steps:
                steps[-1].update(reward=logs["reward"], completion_tokens=logs["completions/mean_length"] * B)

    with tempfile.TemporaryDirectory() as tmp, CudaPeak() as mem, MemoryTrace() as trace:
        trainer = trl_trainer(w, model_path, cfg, tmp, w.warmup + w.steps)
        memory["built_gib"] = rss_gib()
        generate = trace.wrap(trainer._generate_single_turn, "rollout")
        trainer.compute_loss = trace.wrap(trainer.compute_loss, "train")  # then its backward and AdamW's step

        def timed(*a, **k):  # the sampler's share of the step, as ours reports perf/rollout_s
            t0 = time.perf_counter()
            try:
                return generate(*a, **k)
            finally:
                marks["rollout"] += time.perf_counter() - t0

        trainer._generate_single_turn = timed
        trainer.add_callback(Timer())
        trainer.train()
        model_memory(memory, trainer.model, trainer.optimizer, "hf")
        n_params = flops.matmul_params(trainer.model)
    memory["trace"] = trace.breakdown(peak_rss())
    return {"steps": steps[w.warmup :], "n_params": n_params, "cuda_peak": mem.peak, "profile": None}


def main(argv: list[str]) -> int:
    side, workload_json, model_path, out = argv
    w = Workload(**json.loads(Path(workload_json).read_text()))
    w.backends, w.sets = tuple(w.backends), tuple(w.sets)
    import transformers  # noqa: F401  (the libraries every side loads, counted before its model; torch is in)

    memory = {"imports_gib": rss_gib()}
    if side == "parity":
        from .step_parity import gradient_parity

        result = gradient_parity(w, model_path)
    elif side == "trl":
        result = run_trl(w, model_path, memory)
    else:
        result = run_ours(w, model_path, side.removeprefix("ours_"), memory)
    memory["peak_rss_gib"] = round(peak_rss() / 2**30, 3)
    Path(out).write_text(json.dumps({**result, "memory": memory, "workload": asdict(w)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
