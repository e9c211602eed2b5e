"""`make gpu-check`: the GPU paths on the real model (SmolLM2-135M-Instruct), one table.

Each row is a short real run of the chat-arith recipe through the CLI (2 optimizer steps, in its own
process, so every path loads as a user's run does), or a direct check:

  hf CUDA bf16         bf16, rollout.backend = hf: the run finishes, mismatch/k3 is finite and below 1e-2
  mismatch by dtype    the same run in bf16, fp16 and fp32: bf16's mismatch/k3 above fp16's (arXiv 2510.26788)
  VRAM estimate (hf)   the planner's accurate estimate (grpo-studio vram --json) against mem/peak_gib
                       (torch.cuda.max_memory_allocated) of the bf16 hf run
  vLLM CUDA + Triton   bf16, rollout.backend = vllm (compiled), model.logits_chunk = 1024 (Triton log-probs
                       on CUDA): the run finishes, mismatch/k3 is finite and below 1e-2; "skip" without vLLM
  VRAM estimate (vLLM) the same against the vLLM run's peak (vLLM's reservation in the estimate)
  Triton vs torch      engine/train/logprobs.triton_logps against materialised log-probs on the model's head, fp32
  fp8 unified          model.dtype = fp8, precision.fp8_flow = unified: the run finishes with finite rewards
  fp16 scaler          model.dtype = fp16: precision/loss_scale is logged and finite

Where torch sees no CUDA GPU it says so in one line and exits 0. `--model PATH` runs every row on another
model folder (e.g. a random-weight copy of the same architecture).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

RECIPE = "chat-arith"
SHORT = [
    "train.steps=2",
    "train.eval_every=0",
    "train.eval_before=false",
    "train.save_every=0",
    "train.prompts_per_step=8",
]
MODEL: list[str] = []  # --model PATH: model.name for every run (default: the recipe's SmolLM2-135M-Instruct)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_studio.cli.main", *args], capture_output=True, text=True)


def train(run_dir: Path, *sets: str) -> tuple[list[dict], str]:
    """The run's metrics rows, and "" or the last line of its error output."""
    argv = ["train", RECIPE, "--run-dir", str(run_dir)]
    for s in [*SHORT, *MODEL, *sets]:
        argv += ["--set", s]
    proc = cli(*argv)
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    error = "" if proc.returncode == 0 else (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return rows, error


def _row(name: str, ok: bool, detail: str) -> tuple[str, str, str]:
    return name, "ok" if ok else "FAIL", detail


class Table(list):
    """The rows, each printed as it comes (a check cut short by a timeout still shows the rows before it)."""

    def append(self, row: tuple[str, str, str]) -> None:
        super().append(row)
        print(f"{row[0]:22s}{row[1]:6s}{row[2]}", flush=True)


def triton_check() -> tuple[str, str, str]:
    import torch

    from grpo_studio.engine.model.policy_loader import load_base, resolve_model_path
    from grpo_studio.engine.train.logprobs import materialised_logps, triton_kernels_available, triton_logps

    if not triton_kernels_available():
        return _row("Triton vs torch", False, "Triton kernels unavailable")
    name = MODEL[0].split("=", 1)[1] if MODEL else "smollm2-135m-instruct"
    head = load_base(resolve_model_path(name), torch.float32).get_output_embeddings().cuda()
    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(512, head.weight.shape[1], device="cuda", generator=gen)
    targets = torch.randint(0, head.weight.shape[0], (512,), device="cuda", generator=gen)
    ours, _ = triton_logps(hidden, head.weight, targets, 1.0, 1024, with_entropy=False)
    ref, _ = materialised_logps(head(hidden)[None], targets[None], 1.0)
    err = (ours - ref[0]).abs().max().item()
    return _row("Triton vs torch", err < 1e-3, f"max |Δ log-prob| {err:.2e} over 512 tokens")


def k3_of(metrics: list[dict]) -> float:
    return max((r.get("mismatch/k3", float("nan")) for r in metrics), default=float("nan"))


def vram_row(name: str, sets: list[str], metrics: list[dict]) -> tuple[str, str, str]:
    """The planner's accurate estimate for `sets` against the run's mem/peak_gib (torch.cuda.max_memory_allocated)."""
    plan = cli("vram", RECIPE, *[a for s in [*SHORT, *MODEL, *sets] for a in ("--set", s)], "--json")
    estimate = json.loads(plan.stdout)["total_gib"] if plan.returncode == 0 else float("nan")
    peak = max((r.get("mem/peak_gib", 0.0) for r in metrics), default=float("nan"))
    ratio = estimate / peak if peak else float("nan")
    return _row(name, 0.85 <= ratio, f"estimate {estimate:.2f} GiB / measured peak {peak:.2f} GiB = {ratio:.2f}")


def main() -> int:
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU on this machine (torch.cuda.is_available() is False); nothing to check")
        return 0
    if sys.argv[1:2] == ["--model"]:
        MODEL.append(f"model.name={sys.argv[2]}")
    rows = Table()
    rows.append(("check", "result", "numbers"))
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        runs = {}  # precision -> (metrics, error) of the hf-rollout runs
        for dtype in ("bf16", "fp16", "fp32"):
            runs[dtype] = train(Path(tmp) / f"hf-{dtype}", f"model.dtype={dtype}", "rollout.backend=hf")
        metrics, error = runs["bf16"]
        rows.append(
            _row(
                "hf CUDA bf16",
                not error and len(metrics) == 2 and k3_of(metrics) < 1e-2,
                error or f"k3 {k3_of(metrics):.2e}, {metrics[-1].get('perf/rollout_tok_s', 0):.0f} rollout tok/s",
            )
        )
        # The product's premise (arXiv 2510.26788): bf16's rollout/train mismatch is far above fp16's.
        k3 = {d: k3_of(m) for d, (m, _) in runs.items()}
        rows.append(
            _row(
                "mismatch by dtype",
                k3["bf16"] > k3["fp16"] >= 0 and not any(e for _, e in runs.values()),
                ", ".join(f"{d} k3 {v:.2e}" for d, v in k3.items()),
            )
        )
        rows.append(vram_row("VRAM estimate (hf)", ["model.dtype=bf16", "rollout.backend=hf"], metrics))
        if importlib.util.find_spec("vllm") is None:
            rows.append(("vLLM CUDA + Triton", "skip", "vLLM is not installed here (pip install vllm)"))
        else:
            vllm_sets = ["model.dtype=bf16", "rollout.backend=vllm", "model.logits_chunk=1024"]
            vllm, error = train(Path(tmp) / "vllm", *vllm_sets)
            rows.append(
                _row(
                    "vLLM CUDA + Triton",
                    not error and len(vllm) == 2 and k3_of(vllm) < 1e-2,
                    error or f"bf16 k3 {k3_of(vllm):.2e}, {vllm[-1].get('perf/rollout_tok_s', 0):.0f} rollout tok/s",
                )
            )
            rows.append(vram_row("VRAM estimate (vLLM)", vllm_sets, vllm))
        rows.append(triton_check())
        fp8, error = train(Path(tmp) / "fp8", "model.dtype=fp8", "precision.fp8_flow=unified", "rollout.backend=hf")
        rows.append(
            _row(
                "fp8 unified",
                not error and len(fp8) == 2,
                error or f"reward {fp8[-1].get('reward/mean')}, k3 {fp8[-1].get('mismatch/k3', 0):.2e}",
            )
        )
        fp16, error = runs["fp16"]
        scales = [r.get("precision/loss_scale") for r in fp16]
        rows.append(
            _row(
                "fp16 scaler",
                not error and len(fp16) == 2 and all(s and s > 0 for s in scales),
                error or f"loss scale {scales}, skipped {fp16[-1].get('precision/skipped_steps')}",
            )
        )
    return 0 if all(r[1] in ("ok", "skip") for r in rows[1:]) else 1


if __name__ == "__main__":
    sys.exit(main())
