"""Deterministic run directories, written without training: for the studio tests, `scripts/screenshots.py
--demo` and the fault suite's damaged run directories (fault_cases.py).

Every row holds every metric of the schema (contract/metrics.py), each drawn from its own
seeded generator, so a metric added to the schema shows up here without shifting the others. As the
trainer writes them: a synchronous run has no lagged tokens (lag 0, lagged k3 null), an asynchronous one
(`lagged`) 30% of its tokens one version behind; per-rank perf and memory only with `world_size` > 1;
env/* and the rollout's env/model seconds only in a multi-turn run (`episodes`: the calculator's one tool,
and its newest samples are episodes, samples.jsonl's "episode" key as engine/rollout/rollouts.py writes it);
mismatch/router_disagree* only for an MoE model (`moe`).
Mismatch metrics scale with the dtype's drift (bf16 ≈ 8× fp16's |Δlogp|, as measured here)."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

from ..contract import config as cfgmod
from ..contract import metrics, run_lock, rundir
from ..contract.dtypes import DTYPES

FUNCS = ["correctness", "format"]  # tiny-arith's reward functions
LAGGED_ONLY = {"mismatch/lagged/k3", "mismatch/lagged/abs_dlogp_mean"}  # left out without lagged tokens
ENV_ONLY = {name for name in metrics.names(FUNCS) if name.startswith("env/")} | {"perf/env_s", "perf/model_s"}
MOE_ONLY = {name for name in metrics.names(FUNCS) if "router_disagree" in name}  # a dense model has no routers
TOOLS = ["calc"]  # the episodes' environment's tools (env/tool_calls/<tool>)
DRIFT = {"bf16": 1.8e-3, "fp16": 2.3e-4, "fp32": 1e-7, "fp8": 6e-3}  # mean token |Δlogp| per dtype


def shapes(drift: float, lagged: float | None = None) -> dict[str, tuple[float, float, float]]:
    """(base, scale, growth) per schema name: value = base + scale·(1 + growth·progress)·(0.8 + 0.4·u),
    u uniform in [0, 1). Names not listed get (0, 1, 0). `lagged`: metrics_rows."""
    frac = 0.0 if lagged is None else 0.3
    return {
        metrics.REWARD: (0.0, 0.5, 4.0),
        metrics.reward_key(metrics.FN): (0.0, 0.25, 4.0),
        metrics.LOSS: (-0.02, 0.02, 0.0),
        metrics.K3: (0.0, drift**2, 2.0),
        metrics.DP_MAX: (0.0, 8 * drift, 0.0),
        "mismatch/abs_dp_mean": (0.0, 0.3 * drift, 0.0),
        "mismatch/is_min": (1.0, -8 * drift, 0.0),
        "mismatch/is_mean": (1.0, 0.0, 0.0),
        "mismatch/is_max": (1.0, 8 * drift, 0.0),
        "mismatch/masked_frac": (0.0, 0.0, 0.0),
        "precision/loss_scale": (65536.0, 0.0, 0.0),
        "mismatch/lag0/k3": (0.0, drift**2, 2.0),
        "mismatch/lag0/abs_dlogp_mean": (0.0, drift, 0.0),
        "mismatch/lagged/k3": (0.0, (lagged or 0.0) * drift**2, 2.0),
        "mismatch/lagged/abs_dlogp_mean": (0.0, (lagged or 0.0) * drift, 0.0),
        "mismatch/lagged_frac": (frac, 0.0, 0.0),
        "policy/token_lag_mean": (frac, 0.0, 0.0),
        "policy/token_lag_max": (frac and 1.0, 0.0, 0.0),
        "policy/dropped_tokens": (0.0, 0.0, 0.0),
        "perf/mfu": (0.0, 0.5, 0.0),
        "perf/overlap_frac": (0.6, 0.3, 0.0),  # below 1 before the clamp too
        "precision/skipped_steps": (0.0, 0.0, 0.0),  # a count: none skipped
        "perf/rollout_s": (0.0, 0.4, 0.0),
        "perf/train_s": (0.0, 0.5, 0.0),
        "perf/sync_s": (0.0, 0.03, 0.0),
        "perf/trainer_wait_s": (0.0, 0.05, 0.0),
        "perf/idle_s": (0.0, 0.05, 0.0),
        "env/turns_mean": (1.0, 0.8, 0.0),
        "env/turns_max": (3.0, 0.0, 0.0),
        "env/tool_calls_mean": (0.5, 0.6, 0.0),
        f"env/tool_calls/{metrics.TOOL}": (0.5, 0.6, 0.0),
        "env/tool_failure_frac": (0.0, 0.1, -0.5),
        "env/env_token_frac": (0.1, 0.1, 0.0),
        "env/stop/done": (0.6, 0.2, 0.5),
        "env/stop/max_turns": (0.0, 0.15, -0.5),
        "env/stop/length": (0.0, 0.05, 0.0),
        "env/stop/timeout": (0.0, 0.0, 0.0),
        "env/stop/error": (0.0, 0.05, -0.5),
        "perf/env_s": (0.0, 0.05, 0.0),
        "perf/model_s": (0.0, 0.35, 0.0),
        # shares stay shares: a healthy run's zero-variance groups, truncation and clipping fall or stay low
        "reward/frac_zero_std": (0.05, 0.3, -0.8),
        "completion/truncated_frac": (0.0, 0.05, 0.0),
        "clip/region": (0.0, 0.02, 0.0),
        "clip/low": (0.0, 0.01, 0.0),
        "clip/high": (0.0, 0.01, 0.0),
        metrics.EVAL_ACCURACY: (0.15, 0.15, 2.0),  # shares: pass@1 <= maj@k <= pass@k, all in [0, 1]
        metrics.EVAL_MAJ_AT_K: (0.2, 0.15, 1.8),
        metrics.EVAL_PASS_AT_K: (0.3, 0.15, 1.5),
    }


def metrics_rows(
    steps: int,
    total: int,
    dtype: str,
    seed: int,
    t0: float,
    lagged: float | None = None,
    world_size: int = 1,
    episodes: bool = False,
    moe: bool = False,
) -> list[dict]:
    """`lagged`: an asynchronous run whose lagged tokens' k3 is this many times the lag-0 k3; `episodes`: a
    multi-turn run (env/* metrics); `moe`: an MoE model's (its routers' disagreement)."""
    shape = shapes(DRIFT[dtype], lagged)
    names = [
        name for name in metrics.names(FUNCS) if (episodes or name not in ENV_ONLY) and (moe or name not in MOE_ONLY)
    ]
    if episodes:
        names += [f"env/tool_calls/{tool}" for tool in TOOLS]
    if world_size > 1:
        names += [metrics.rank_key(r, pattern) for r in range(world_size) for pattern in metrics.PER_RANK]
    rngs = {name: random.Random(f"{seed}/{name}") for name in names}
    rows = []
    for step in range(1, steps + 1):
        progress = step / total
        row = {}
        for name in names:
            base, scale, growth = shape.get(metrics.lookup(name).name, (0.0, 1.0, 0.0))
            value = base + scale * (1 + growth * progress) * (0.8 + 0.4 * rngs[name].random())
            if metrics.lookup(name).unit == "fraction":  # a share stays in [0, 1], as the engine clamps it
                value = min(max(value, 0.0), 1.0)
            if lagged is not None or name not in LAGGED_ONLY:
                row[name] = value
        stops = [name for name in row if name.startswith("env/stop/")]
        total_stops = sum(row[name] for name in stops)
        for name in stops:  # every episode stops for one reason: the shares add up to 1
            row[name] /= total_stops
        rows.append({**row, metrics.STEP: step, metrics.TIME: t0 + 1.5 * step})
        metrics.check_row(rows[-1])  # what the run writer would refuse, this refuses too
    return rows


def histogram_row(step: int, dtype: str, lagged: float | None = None) -> dict:
    center = math.log10(DRIFT[dtype])
    edges = metrics.HIST_EDGES
    counts = [int(400 * math.exp(-((math.log10(edges[i]) - center) ** 2))) for i in range(len(edges) - 1)]
    row = {
        "step": step,
        "edges": edges,
        "counts": counts,
        "counts_pos": [c // 2 for c in counts],
        "counts_neg": [c - c // 2 for c in counts],
        "zero": 50,
        "under": 0,
        "over": 0,
        "n": sum(counts) + 50,
    }
    lag0 = row["n"] if lagged is None else round(0.7 * row["n"])  # async: 30% of the tokens one version behind
    row["lag"] = {"0": lag0, **({"1": row["n"] - lag0} if lagged is not None else {})}
    return row


def tool_turns(a: int, b: int, calls: int) -> list[dict]:
    """`calls` rounds of a calculator call and its result, as engine/rollout/episodes.py records them: the model's
    sampled text trained, the environment's tokens (a ChatML tool turn and the next assistant header) masked."""
    turns = []
    for _ in range(calls):
        call = json.dumps({"name": TOOLS[0], "arguments": {"expression": f"{a}+{b}"}})
        turns.append({"role": "model", "text": f"<tool_call>{call}</tool_call>", "trained": True})
        env = f"\n<|im_start|>tool\n{a + b}<|im_end|>\n<|im_start|>assistant\n"
        turns.append({"role": "env", "text": env, "trained": False})
    return turns


def episode_sample(step: int, a: int, b: int, finished: bool) -> dict:
    """A samples.jsonl row of a multi-turn run: the episode, and its last model turn as the completion."""
    if finished:
        turns = tool_turns(a, b, 1) + [{"role": "model", "text": f"<answer>{a + b}</answer>", "trained": True}]
        ep = {"turns": turns, "stop": "done", "why": "the model answered without a tool call"}
    else:
        turns = tool_turns(a, b, 2) + tool_turns(a, b, 1)[:1]
        ep = {"turns": turns, "stop": "max_turns", "why": "env.max_turns = 3 turns taken"}
    return {
        "step": step,
        "prompt": f"{a}+{b}=",
        "completion": turns[-1]["text"],
        "advantage": 0.7 if finished else -1.2,
        "rewards": {"correctness": 2.0 if finished else 0.0, "format": 0.5 if finished else 0.0},
        "episode": ep,
    }


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def write_run(
    run_dir: Path,
    steps: int,
    total: int | None = None,
    dtype: str = "bf16",
    seed: int = 0,
    state: str = "finished",
    t0: float = 1_750_000_000.0,
    lagged: float | None = None,
    world_size: int = 1,
    episodes: bool = False,
    moe: bool = False,
) -> Path:
    """A run directory with `steps` rows of a `total`-step run, ending in `state` (`lagged`, `world_size`,
    `episodes`, `moe`: metrics_rows; `episodes` also makes the last step's samples episodes). A "running" run is held
    by the calling process (trainer.pid), so it reads as running while the caller lives."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    total = total or steps
    cfgmod.save(cfgmod.load("tiny-arith", [f"model.dtype={dtype}", f"train.steps={total}"]), run_dir / rundir.CONFIG)
    write_jsonl(
        run_dir / rundir.METRICS, metrics_rows(steps, total, dtype, seed, t0, lagged, world_size, episodes, moe)
    )
    write_jsonl(run_dir / rundir.HISTOGRAMS, [histogram_row(steps, dtype, lagged)])
    samples = []
    for step in range(max(1, steps - 3), steps + 1):
        for a, b in ((12, 30), (7, 41)):
            ok = (step + a) % 3 != 0
            answer = a + b if ok else a + b + 1
            samples.append(
                {
                    "step": step,
                    "prompt": f"{a}+{b}=",
                    "completion": f"<answer>{answer}</answer>",
                    "advantage": 0.7 if ok else -1.2,
                    "rewards": {"correctness": 2.0 if ok else 0.0, "format": 0.5},
                }
            )
    if episodes:
        samples += [episode_sample(steps, a, b, finished) for a, b, finished in ((9, 33, False), (5, 8, True))]
    write_jsonl(run_dir / rundir.SAMPLES, samples)
    events = [{"time": t0, "event": "started", "message": "starting step 0", "total_steps": total}]
    if steps >= 20:
        events.append({"time": t0 + 30, "event": "checkpoint", "message": "saved step-20", "step": 20})
    if DTYPES[dtype].loss_scaling and steps > total // 2:
        events.append({"time": t0 + 40, "event": "skipped_step", "message": f"fp16 overflow at step {total // 2}"})
    if state in ("finished", "stopped", "crashed"):
        events.append({"time": t0 + 1.5 * steps, "event": state, "message": f"{state} at step {steps}", "step": steps})
    write_jsonl(run_dir / rundir.EVENTS, events)
    if state == "running":
        run_lock.write_lock(run_dir, run_lock.Lock.of(os.getpid()))
    return run_dir
