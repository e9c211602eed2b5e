"""`grpo-studio bench logprobs [--json]`: per-token log-probs of a big-vocabulary lm_head, forward + backward,
materialised logits (model.logits_chunk = 0) vs the fused, chunked path (model.logits_chunk = N) vs, on CUDA
with trl installed, TRL's Triton kernels; the same hidden states, lm_head and targets.

    grpo-studio bench logprobs                      # 512 tokens, hidden 896, vocab 151,936 (Qwen2.5), fp32
    grpo-studio bench logprobs --tokens 64 --vocab 4096 --hidden 64 --chunk 8   # seconds

For each path and head (frozen: LoRA, the lm_head gets no gradient; trained: a full fine-tune):
  peak_mib  memory the call adds at its peak: CPU, the process's peak RSS (VmHWM, reset through
            /proc/self/clear_refs) less its RSS before the call, in a fresh process per path so one
            path's freed memory cannot hide another's; CUDA, torch.cuda.max_memory_allocated less before
  seconds   median wall seconds of forward + backward over --repeats calls after one warm-up call, the
            paths' calls interleaved in one process (a busy machine slows them alike); cpu_seconds the
            same in process CPU time (steadier than wall time on a shared machine)
  max_abs_* largest |difference| from the materialised path: log-probs, entropies, the hidden states'
            gradient and (trained) the lm_head's
and the ratios to the materialised path (peak: target ≤ 1/8, time: target ≤ 1.1 on CPU); with a trained
head the peak ratio leaves out the lm_head's V×H fp32 gradient, which every path holds.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

HEADS = ("frozen", "trained")


@dataclass
class Workload:
    """What one `grpo-studio bench logprobs` measures (its flags)."""

    tokens: int
    hidden: int
    vocab: int
    chunk: int  # model.logits_chunk of the chunked paths
    temperature: float
    repeats: int
    device: str  # cpu or cuda
    seed: int


def paths(device: str) -> list[str]:
    from ..engine.train.logprobs import triton_kernels_available

    return ["materialised", "chunked"] + (["triton"] if device == "cuda" and triton_kernels_available() else [])


def _inputs(w: Workload, head: str):
    import torch

    g = torch.Generator().manual_seed(w.seed)
    hidden = (torch.randn(w.tokens, w.hidden, generator=g)).to(w.device).requires_grad_()
    weight = (torch.randn(w.vocab, w.hidden, generator=g) / w.hidden**0.5).to(w.device)
    weight.requires_grad_(head == "trained")
    targets = torch.randint(0, w.vocab, (w.tokens,), generator=g).to(w.device)
    upstream = torch.randn(w.tokens, generator=g).to(w.device)
    return hidden, weight, targets, upstream


def _call(path: str, w: Workload, hidden, weight, targets, upstream):
    """One forward + backward; returns (log-probs, entropies) detached."""
    import torch

    from ..engine.train import logprobs as lp
    from ..engine.train.chunked_logsoftmax import ChunkedLogSoftmax

    if path == "materialised":  # the lm_head's [N, V] logits, then token_logprobs' fp32 log-softmax
        logits = torch.nn.functional.linear(hidden, weight)[None]
        logps, entropy = lp.materialised_logps(logits, targets[None], w.temperature, with_entropy=True)
        logps, entropy = logps[0], entropy[0]
    elif path == "chunked":
        logps, entropy = ChunkedLogSoftmax.apply(hidden, weight, targets, w.temperature, w.chunk, 1.0, None, True, True)
    else:
        logps, entropy = lp.triton_logps(hidden, weight, targets, w.temperature, w.chunk)
    (logps * upstream).sum().backward()
    return logps.detach(), entropy


def _rss_kib() -> tuple[int, int]:
    status = open("/proc/self/status").read()
    return tuple(int(re.search(rf"{k}:\s+(\d+)", status).group(1)) for k in ("VmRSS", "VmHWM"))


def measure_peak(path: str, head: str, w: Workload) -> dict:
    """Peak memory of one forward + backward of one path (run in its own process by run())."""
    import torch

    inputs = _inputs(w, head)
    if w.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        _call(path, w, *inputs)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        before, _ = _rss_kib()
        with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM to the current RSS (Linux ≥ 4.0)
            f.write("5")
        _call(path, w, *inputs)
        peak = (_rss_kib()[1] - before) * 1024
    return {"peak_mib": round(peak / 2**20, 1)}


def _seconds(w: Workload, head: str, names: list[str]) -> dict[str, dict]:
    """Median wall and CPU (process) seconds per path, the paths interleaved call by call so that a busy
    machine slows them alike."""
    import torch

    inputs = _inputs(w, head)
    times = {path: [] for path in names}
    cpu = {path: [] for path in names}
    for k in range(w.repeats + 1):  # call 0 warms up
        for path in names:
            for t in inputs[:2]:
                t.grad = None
            if w.device == "cuda":
                torch.cuda.synchronize()
            t0, c0 = time.perf_counter(), time.process_time()
            _call(path, w, *inputs)
            if w.device == "cuda":
                torch.cuda.synchronize()
            if k:
                times[path].append(time.perf_counter() - t0)
                cpu[path].append(time.process_time() - c0)
    return {
        path: {
            "seconds": round(statistics.median(times[path]), 4),
            "cpu_seconds": round(statistics.median(cpu[path]), 4),
        }
        for path in names
    }


def _differences(w: Workload, head: str, names: list[str]) -> dict[str, dict]:
    """Max |difference| of each path from the materialised one, in this process."""
    results = {}
    for path in names:
        hidden, weight, targets, upstream = inputs = _inputs(w, head)
        logps, entropy = _call(path, w, *inputs)
        results[path] = {"logps": logps, "entropy": entropy, "grad_hidden": hidden.grad, "grad_weight": weight.grad}
    base = results["materialised"]
    return {
        path: {f"max_abs_{k}": (v - base[k]).abs().max().item() for k, v in r.items() if v is not None}
        for path, r in results.items()
        if path != "materialised"
    }


def run(w: Workload, progress=None) -> dict:
    names = paths(w.device)
    report = {"workload": asdict(w), "logits_mib": round(w.tokens * w.vocab * 4 / 2**20, 1), "heads": {}}
    for head in HEADS:
        rows = {}
        for path in names:
            if progress:
                progress(f"{path}, {head} lm_head")
            child = subprocess.run(
                [sys.executable, "-m", "grpo_studio.benchmarks.logprobs_bench", path, head, json.dumps(asdict(w))],
                capture_output=True,
                text=True,
                check=False,
            )
            if child.returncode:
                raise RuntimeError(f"bench logprobs: the {path} process failed:\n{child.stderr[-2000:]}")
            rows[path] = json.loads(child.stdout.strip().splitlines()[-1])
        for path, seconds in _seconds(w, head, names).items():
            rows[path].update(seconds)
        for path, diffs in _differences(w, head, names).items():
            rows[path].update(diffs)
        # a trained head's gradient (V×H fp32) is held by every path: the ratio compares what is on top of it
        held = w.vocab * w.hidden * 4 / 2**20 if head == "trained" else 0.0
        base = rows["materialised"]["peak_mib"] - held
        for row in rows.values():
            row["peak_ratio"] = round((row["peak_mib"] - held) / base, 4) if base > 0 else None
            row["time_ratio"] = round(row["seconds"] / rows["materialised"]["seconds"], 3)
            row["cpu_time_ratio"] = round(row["cpu_seconds"] / rows["materialised"]["cpu_seconds"], 3)
        report["heads"][head] = rows
    return report


def print_report(report: dict) -> None:
    w = report["workload"]
    print(
        f"{w['tokens']} tokens × vocab {w['vocab']:,} × hidden {w['hidden']} on {w['device']}, chunk {w['chunk']} "
        f"(one [N, V] fp32 logits tensor: {report['logits_mib']} MiB)"
    )
    for head, rows in report["heads"].items():
        print(f"\n{head} lm_head      peak MiB   ×naive   seconds   ×naive   max|Δlogp|  max|Δgrad h|")
        for path, r in rows.items():
            print(
                f"  {path:<14} {r['peak_mib']:>9.1f} {r['peak_ratio'] or 0:>8.3f} {r['seconds']:>9.3f} "
                f"{r['time_ratio']:>8.3f}   {r.get('max_abs_logps', 0):>9.2e}  {r.get('max_abs_grad_hidden', 0):>9.2e}"
            )


if (
    __name__ == "__main__"
):  # one path in a fresh process: python -m grpo_studio.benchmarks.logprobs_bench PATH HEAD JSON
    print(json.dumps(measure_peak(sys.argv[1], sys.argv[2], Workload(**json.loads(sys.argv[3])))))
