"""`make gpu-check`: the GPU paths on the real model (SmolLM2-135M-Instruct), one table.

Each row is a short real run of the chat-arith recipe through the CLI (2 optimizer steps, in its own
process, so every path loads as a user's run does), or a direct check:

  vLLM CUDA + Triton   bf16, rollout.backend = vllm (compiled), model.logits_chunk = 1024 (Triton log-probs
                       on CUDA): the run finishes, mismatch/k3 is finite and below 1e-2
  Triton vs torch      engine/logprobs.triton_logps against materialised log-probs on the model's head, fp32
  fp8 unified          model.dtype = fp8, precision.fp8_flow = unified: the run finishes with finite rewards
  fp16 scaler          model.dtype = fp16: precision/loss_scale is logged and finite
  VRAM estimate        the planner's accurate estimate (grpo-studio vram --json) against mem/peak_gib
                       (torch.cuda.max_memory_allocated) of the vLLM run

Where torch sees no CUDA GPU it says so in one line and exits 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

RECIPE = "chat-arith"
SHORT = ["train.steps=2", "train.eval_every=0", "train.save_every=0", "train.prompts_per_step=8"]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_studio.cli.main", *args], capture_output=True, text=True)


def train(run_dir: Path, *sets: str) -> tuple[list[dict], str]:
    """The run's metrics rows, and "" or the last line of its error output."""
    argv = ["train", RECIPE, "--run-dir", str(run_dir)]
    for s in [*SHORT, *sets]:
        argv += ["--set", s]
    proc = cli(*argv)
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    error = "" if proc.returncode == 0 else (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return rows, error


def _row(name: str, ok: bool, detail: str) -> tuple[str, str, str]:
    return name, "ok" if ok else "FAIL", detail


def triton_check() -> tuple[str, str, str]:
    import torch

    from grpo_studio.engine.logprobs import materialised_logps, triton_kernels_available, triton_logps
    from grpo_studio.engine.policy_loader import load_base, resolve_model_path

    if not triton_kernels_available():
        return _row("Triton vs torch", False, "Triton kernels unavailable")
    head = load_base(resolve_model_path("smollm2-135m-instruct"), torch.float32).get_output_embeddings().cuda()
    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(512, head.weight.shape[1], device="cuda", generator=gen)
    targets = torch.randint(0, head.weight.shape[0], (512,), device="cuda", generator=gen)
    ours, _ = triton_logps(hidden, head.weight, targets, 1.0, 1024, with_entropy=False)
    ref, _ = materialised_logps(head(hidden)[None], targets[None], 1.0)
    err = (ours - ref[0]).abs().max().item()
    return _row("Triton vs torch", err < 1e-3, f"max |Δ log-prob| {err:.2e} over 512 tokens")


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU on this machine (torch.cuda.is_available() is False); nothing to check")
        return 0
    rows = [("check", "result", "numbers")]
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        vllm_sets = ["model.dtype=bf16", "rollout.backend=vllm", "model.logits_chunk=1024"]
        metrics, error = train(Path(tmp) / "vllm", *vllm_sets)
        k3 = max((r.get("mismatch/k3", float("nan")) for r in metrics), default=float("nan"))
        rows.append(
            _row(
                "vLLM CUDA + Triton",
                not error and len(metrics) == 2 and k3 < 1e-2,
                error or f"bf16 k3 {k3:.2e}, {metrics[-1].get('perf/rollout_tok_s', 0):.0f} rollout tok/s",
            )
        )
        rows.append(triton_check())
        fp8, error = train(Path(tmp) / "fp8", "model.dtype=fp8", "precision.fp8_flow=unified")
        rows.append(
            _row(
                "fp8 unified",
                not error and len(fp8) == 2,
                error or f"reward {fp8[-1].get('reward/mean')}, k3 {fp8[-1].get('mismatch/k3', 0):.2e}",
            )
        )
        fp16, error = train(Path(tmp) / "fp16", "model.dtype=fp16")
        scales = [r.get("precision/loss_scale") for r in fp16]
        rows.append(
            _row(
                "fp16 scaler",
                not error and len(fp16) == 2 and all(s and s > 0 for s in scales),
                error or f"loss scale {scales}, skipped {fp16[-1].get('precision/skipped_steps')}",
            )
        )
        plan = cli("vram", RECIPE, *[a for s in [*SHORT, *vllm_sets] for a in ("--set", s)], "--json")
        estimate = json.loads(plan.stdout)["total_gib"] if plan.returncode == 0 else float("nan")
        peak = max((r.get("mem/peak_gib", 0.0) for r in metrics), default=float("nan"))
        ratio = estimate / peak if peak else float("nan")
        rows.append(
            _row(
                "VRAM estimate",
                0.85 <= ratio,
                f"estimate {estimate:.2f} GiB / measured peak {peak:.2f} GiB"
                f" = {ratio:.2f} (vLLM's reservation in the estimate)",
            )
        )
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, width)))
    return 0 if all(r[1] == "ok" for r in rows[1:]) else 1


if __name__ == "__main__":
    sys.exit(main())
