"""What `grpo-studio bench step` (step_bench.py) measures with: the workload's model (a random one gets an EOS bias
for realistic lengths), a side's memory, and a side's summary from its timed steps."""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .step_bench import Workload


def model_path_of(w: Workload) -> str:
    from ..engine.model.policy_loader import resolve_model_path
    from .rollout_bench import _random_model

    if not w.model.startswith("random:"):
        return resolve_model_path(w.model)
    import torch

    torch.manual_seed(w.seed)  # the same random weights, and so the same lengths, on every run
    path = _random_model(w.model)
    if w.mean_len:
        add_eos_bias(path, w.mean_len)
    return path


def add_eos_bias(path: str, mean_len: int) -> float:
    """Raise the EOS logit of the model at `path` by b = ln((V−1)/(L−1)) nats (see step_bench.py's module doc); returns b."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..engine.prompts import arith

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    emb = model.get_input_embeddings().weight
    eos, vocab = tok.eos_token_id, emb.shape[0]
    bias = math.log((vocab - 1) / max(mean_len - 1, 1))
    prompts = [torch.tensor([tok.encode(r["prompt"], add_special_tokens=False)]) for r in arith.rows("train")[:16]]
    with torch.no_grad():
        emb[:, 0] = 1.0
        h0 = torch.cat([model.get_decoder()(input_ids=ids).last_hidden_state[0, :, 0] for ids in prompts]).mean()
        emb[eos, 0] += bias / h0.item()
    model.save_pretrained(path)
    return bias


def rss_gib() -> float:
    """This process's resident memory now, GiB."""
    import psutil

    return round(psutil.Process().memory_info().rss / 2**30, 3)


class CudaPeak:
    """CUDA's peak allocated bytes over a `with` block (`peak`: None without a GPU)."""

    def __enter__(self):
        import torch

        self.cuda, self.peak = torch.cuda.is_available(), None
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        return self

    def __exit__(self, *exc):
        import torch

        self.peak = torch.cuda.max_memory_allocated() if self.cuda else None


def summary(steps: list[dict], w: Workload, n_params: int, prompt_len: float, peak: float, side: dict) -> dict:
    """One side's report from its timed steps (each {step_s, rollout_s, completion_tokens, reward}) and the
    memory its process measured (step_sides.py: RSS after imports, once built, at its peak; CUDA's peak)."""
    from ..engine.train import flops

    B = w.prompts * w.generations
    step_s = statistics.median(s["step_s"] for s in steps)
    rollout_s = statistics.median(s["rollout_s"] for s in steps)
    completion = statistics.mean(s["completion_tokens"] for s in steps)
    tokens = B * prompt_len + completion
    flop = flops.step_flop(n_params, generated=tokens, trained=tokens, lora=bool(w.lora_rank))
    return {
        "step_s": round(step_s, 4),
        "rollout_s": round(rollout_s, 4),
        "train_s": round(step_s - rollout_s, 4),
        "completion_len_mean": round(completion / B, 2),
        "gen_tok_s": float(f"{completion / rollout_s:.4g}"),
        "train_tok_s": float(f"{tokens / (step_s - rollout_s):.4g}"),
        "flop_per_step": flop,
        "achieved_gflop_s": float(f"{flop / step_s / 1e9:.4g}"),
        # ours counts only the work it ran (zero-advantage rows skipped: engine/train/zero_advantage.py)
        "mfu": statistics.median(s["run_mfu"] for s in steps)
        if "run_mfu" in steps[0]
        else float(f"{flop / step_s / peak:.4g}"),
        "peak_rss_gib": side["memory"]["peak_rss_gib"],
        "memory": side["memory"],
        **({"cuda_peak_gib": round(side["cuda_peak"] / 2**30, 3)} if side["cuda_peak"] is not None else {}),
        "reward_last": round(steps[-1]["reward"], 4),
        "reward_mean": round(statistics.mean(s["reward"] for s in steps), 4),
        "steps_s": [round(s["step_s"], 4) for s in steps],
        # ours: the trainer's own split and MFU (its rows' perf/sync_s, perf/idle_s, perf/mfu)
        **{
            k: round(statistics.median(s[k] for s in steps), 4)
            for k in ("sync_s", "idle_s", "run_mfu")
            if k in steps[0]
        },
        **{k: [s[k] for s in steps] for k in ("rows_trained", "rows_run") if k in steps[0]},
    }
