"""`grpo-studio bench ui`: studio responsiveness.

first frame   process start -> the setup screen's first frame (python start-up and imports
              included), median of N fresh processes; target < 1.5 s
chart refresh one new metrics row appended -> tail read, the overview's charts rebuilt from
              10,000 steps of history and rendered; target < 50 ms. Baseline: the same with
              100 steps, so the ratio shows how refresh cost scales with history.
samples index a generated samples.jsonl of trainer-shaped rows (100 MB by default) indexed as the studio
              does (contract/samples_index.py, 8 MiB a poll): the whole build and its slowest poll, the
              memory the index keeps (tracemalloc, a second build), a page of the table (first, middle,
              best-first), and a search of the whole file for a string only in its first row; targets:
              build < 3 s, poll < 150 ms, page < 30 ms, search < 1.5 s, < 64 bytes a row.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..contract import config, metrics, rundir

FIRST_FRAME_TARGET_S = 1.5
REFRESH_TARGET_MS = 50.0
INDEX_TARGETS = {"build_s": 3.0, "max_poll_ms": 150.0, "page_ms": 30.0, "search_s": 1.5, "bytes_per_row": 64.0}

CHILD = r"""
import sys, time
t0 = float(sys.argv[1])
import asyncio
from grpo_studio.studio import hardware
from grpo_studio.studio.app import StudioApp
async def main():
    app = StudioApp(live_hardware=False)
    async with app.run_test(size=(120, 40)) as pilot:
        while app.setup_screen is None or not app.setup_screen.is_mounted:
            await asyncio.sleep(0.001)
        done = asyncio.Event()
        app.setup_screen.call_after_refresh(done.set)
        await done.wait()
        print(time.time() - t0)
asyncio.run(main())
"""


def first_frame_s(repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-c", CHILD, str(t0)], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "child failed")
        out.append(float(proc.stdout.strip().splitlines()[-1]))
    return out


def metrics_row(step: int, rng: random.Random) -> dict:
    """A row as wide as the trainer's: every schema metric (tiny-arith's rewards), values in [0, 1)."""
    return {
        **{name: rng.random() for name in metrics.names(["correctness", "format"])},
        metrics.STEP: step,
        metrics.TIME: float(step),
    }


def write_metrics(path: Path, steps: range, rng: random.Random) -> None:
    with open(path, "a") as fh:
        fh.writelines(json.dumps(metrics_row(step, rng)) + "\n" for step in steps)


async def _refresh_ms(run_dir: Path, repeats: int) -> list[float]:
    from ..studio.app import StudioApp
    from ..studio.widgets.metric_chart import MetricChart

    app = StudioApp(live_hardware=False, poll_s=3600)
    times = []
    async with app.run_test(size=(120, 40)) as pilot:
        app.open_run(run_dir)
        await pilot.pause()
        dash = app.screen
        charts = list(dash.query_one("#overview").query(MetricChart))
        rng = random.Random(0)
        for _ in range(repeats):
            write_metrics(run_dir / rundir.METRICS, range(dash.run.step + 1, dash.run.step + 2), rng)
            t = time.perf_counter()
            dash.refresh_data()  # tail read + lines for the visible tab
            for chart in charts:  # what the compositor does next: plotext build at the widget's size
                chart.render()
            times.append((time.perf_counter() - t) * 1000)
            await pilot.pause()
    return times


def sample_row(step: int, i: int, group_size: int, rng: random.Random) -> dict:
    """A samples.jsonl row as engine/rollout/sample_rows.py writes it: a chat-rendered prompt, a completion of a
    few hundred characters, its rewards, advantage, group and token counts."""
    a, b = random.Random(step * 1000 + i // group_size).sample(range(100), 2)  # one prompt a group
    ok = rng.random() < 0.5
    prompt = (
        "<|im_start|>system\nYou are a careful assistant. Think step by step, then give the answer inside "
        f"<answer></answer>.<|im_end|>\n<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n<|im_start|>assistant\n"
    )
    thought = " ".join(rng.choice(("add", "the", "tens", "ones", "carry", "then", "so", "sum")) for _ in range(40))
    completion = f"<think>{thought}</think> <answer>{a + b if ok else a + b + 1}</answer>"
    tokens = len(completion) // 4
    return {
        "prompt": prompt,
        "completion": completion,
        "advantage": round(rng.gauss(0, 1), 6),
        "group": i // group_size,
        "rewards": {"correctness": 2.0 if ok else 0.0, "format": 0.5},
        "tokens": tokens,
        "trained": tokens,
        "truncated": rng.random() < 0.05,
        "step": step,
    }


def write_samples(path: Path, megabytes: float, rows_per_step: int = 128, group_size: int = 8) -> int:
    """Trainer-shaped rows into `path` until it holds `megabytes` MB; how many rows."""
    rng, n, size = random.Random(0), 0, 0
    with open(path, "wb") as fh:
        while size < megabytes * 1e6:
            line = json.dumps(sample_row(1 + n // rows_per_step, n % rows_per_step, group_size, rng)).encode()
            fh.write(line + b"\n")
            size, n = size + len(line) + 1, n + 1
    return n


def samples_index_cost(megabytes: float) -> dict:
    """The Samples tab's index of a `megabytes` MB samples.jsonl: build, memory, pages and a whole-file search."""
    import tracemalloc

    from ..contract.samples_index import SamplesIndex

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / rundir.SAMPLES
        rows = write_samples(path, megabytes)
        first_completion = json.loads(path.open("rb").readline())["completion"]
        needle = "needle-only-in-row-1"
        text = path.read_bytes().replace(first_completion.encode(), (first_completion + needle).encode(), 1)
        path.write_bytes(text)
        index, polls, t0 = SamplesIndex(path), [], time.perf_counter()
        while True:
            t = time.perf_counter()
            added = index.update()
            polls.append((time.perf_counter() - t) * 1000)
            if not added and not index.pending:
                break
        build_s = time.perf_counter() - t0
        tracemalloc.start()
        again = SamplesIndex(path)
        while again.update() or again.pending:
            pass
        kept = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del again

        def page_ms(order) -> float:
            t = time.perf_counter()
            got = index.rows(list(order[len(order) // 2 : len(order) // 2 + 100]))
            assert len(got) == 100 and all(got)
            return (time.perf_counter() - t) * 1000

        t = time.perf_counter()
        first_page = index.rows(list(index.order("all")[:100]))
        first_ms = (time.perf_counter() - t) * 1000
        middle_ms = page_ms(index.order("all"))
        t = time.perf_counter()
        best = index.order("best")
        best_ms = (time.perf_counter() - t) * 1000 + page_ms(best)
        t = time.perf_counter()
        hits, _ = index.search(needle.upper())
        search_s = time.perf_counter() - t
        assert hits == [0] and len(first_page) == 100, hits
    return {
        "megabytes": megabytes,
        "rows": rows,
        "indexed": len(index),
        "build_s": build_s,
        "polls": len(polls),
        "max_poll_ms": max(polls),
        "kept_bytes": kept,
        "bytes_per_row": kept / max(rows, 1),
        "page_ms": {"first": first_ms, "middle": middle_ms, "best_first_with_sort": best_ms},
        "search_s": search_s,
        "targets": INDEX_TARGETS,
    }


def refresh_ms(steps: int, repeats: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "bench"
        run.mkdir()
        config.save(config.load("tiny-arith", [f"train.steps={steps + 1000}"]), run / rundir.CONFIG)
        write_metrics(run / rundir.METRICS, range(1, steps + 1), random.Random(1))
        return asyncio.run(_refresh_ms(run, repeats))


def run(repeats: int, history: int, samples_mb: float = 100.0) -> dict:
    """First-frame seconds over `repeats` fresh processes; chart refresh ms with `history` steps vs 100; the
    samples index's cost on a `samples_mb` MB samples.jsonl."""
    index = samples_index_cost(samples_mb)
    frames = first_frame_s(repeats)
    base = refresh_ms(100, repeats * 4)
    big = refresh_ms(history, repeats * 4)
    return {
        "first_frame_s": {
            "median": statistics.median(frames),
            "min": min(frames),
            "max": max(frames),
            "target": FIRST_FRAME_TARGET_S,
        },
        "chart_refresh_ms": {
            "history": history,
            "median": statistics.median(big),
            "max": max(big),
            "baseline_100_steps_median": statistics.median(base),
            "target": REFRESH_TARGET_MS,
            "ratio_vs_100_steps": statistics.median(big) / max(statistics.median(base), 1e-9),
        },
        "samples_index": index,
    }


def print_report(result: dict) -> None:
    ff, cr = result["first_frame_s"], result["chart_refresh_ms"]
    ok = lambda v, t: "ok" if v < t else "OVER TARGET"  # noqa: E731
    import os

    print(f"machine load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (figures scale with it)")
    print(
        f"first frame      median {ff['median']:.2f} s (min {ff['min']:.2f}, max {ff['max']:.2f}); "
        f"target < {FIRST_FRAME_TARGET_S} s: {ok(ff['median'], FIRST_FRAME_TARGET_S)}"
    )
    print(
        f"chart refresh    {cr['history']:,} steps: median {cr['median']:.1f} ms (max {cr['max']:.1f}); "
        f"100 steps: {cr['baseline_100_steps_median']:.1f} ms; ratio {cr['ratio_vs_100_steps']:.2f}x; "
        f"target < {REFRESH_TARGET_MS:.0f} ms: {ok(cr['median'], REFRESH_TARGET_MS)}  "
        f"(2 charts, 5 lines, at 120x40)"
    )
    si, target = result["samples_index"], INDEX_TARGETS
    pages = si["page_ms"]
    slowest_page = max(pages["first"], pages["middle"])  # a page read; best-first adds a sort of every row, shown
    print(
        f"samples index    {si['megabytes']:.0f} MB, {si['rows']:,} rows: built in {si['build_s']:.2f} s over "
        f"{si['polls']} polls (slowest {si['max_poll_ms']:.0f} ms), keeps {si['kept_bytes'] / 2**20:.1f} MiB "
        f"({si['bytes_per_row']:.0f} B a row); targets < {target['build_s']:.0f} s, < {target['max_poll_ms']:.0f} ms, "
        f"< {target['bytes_per_row']:.0f} B: {ok(si['build_s'], target['build_s'])}, "
        f"{ok(si['max_poll_ms'], target['max_poll_ms'])}, {ok(si['bytes_per_row'], target['bytes_per_row'])}"
    )
    print(
        f"samples page     first {pages['first']:.1f} ms, middle {pages['middle']:.1f} ms, best-first "
        f"{pages['best_first_with_sort']:.1f} ms (sort included); target < {target['page_ms']:.0f} ms: "
        f"{ok(slowest_page, target['page_ms'])}"
    )
    print(
        f"samples search   whole file, a string only in row 1: {si['search_s']:.2f} s; target < "
        f"{target['search_s']} s: {ok(si['search_s'], target['search_s'])}"
    )
