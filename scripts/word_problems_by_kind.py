"""word-problems' answer accuracy per problem kind and number range, before and after RL (issue 45).

For each run directory (presets/recipes/word-problems.toml trained for some steps with one train.seed): the
warmed-up model (step 0, the run's warm-up done again from its config.toml, as Trainer._warm_up does it) and the
run's last checkpoint, each evaluated as the run's evals are (one sample per prompt at the run's temperature,
evaluation.SEED) on the held-out rows and on a larger generalisation split (--general rows, the run's own first).
The split is sampled in calls of the run's data.general_size rows, so the first call is the run's own eval call:
each row draws its tokens as in the run (the hf sampler's draws depend on the batch), and the step-0 and
last-step aggregates must equal the run's events.jsonl / metrics.jsonl rows, which is checked and printed.

Each reply is right when evaluation.answer_right says so (the last number of the reply against the reference).
A row's kind is read from its question (the five templates of engine/prompts/tasks.py's _problem and
_other_problem) and its number range from the largest number in the question; accuracies per (split, kind)
and (split, range) come with Wilson 95% intervals (evaluation.wilson).

    taskset -c 1 .venv/bin/python scripts/word_problems_by_kind.py /tmp/wp/run0 /tmp/wp/seed1 /tmp/wp/seed2 \\
        --general 300 --work /tmp/wp-by-kind --out docs/recipes

writes OUT/word-problems-by-kind.json (the tallies) and OUT/word-problems-by-kind.png (accuracy against the
question's largest number, and per kind, before and after, pooled over the seeds); prints the markdown table.
A seed's evaluated rows are kept in WORK/<run name>.json and read back on the next call (delete it to redo).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

KINDS = ("add", "subtract", "multiply", "share", "buy-then-give")
HELD_OUT, GENERAL = "held-out", "general"
# each kind's template, as _problem (training's and the held-out rows' wording) and _other_problem (the
# generalisation split's) write it
TEMPLATES = {
    HELD_OUT: {
        "add": r"\w+ has \d+ \w+\. \w+ gives \w+ \d+ more\. How many \w+ does \w+ have now\?",
        "subtract": r"\w+ had \d+ \w+ and gave \d+ of them to \w+\. How many \w+ does \w+ have left\?",
        "multiply": r"\w+ fills \d+ bags with \d+ \w+ each\. How many \w+ are in the bags altogether\?",
        "share": r"\w+ shares \d+ \w+ equally among \d+ friends\. How many \w+ does each friend get\?",
        "buy-then-give": r"\w+ has \d+ \w+, buys \d+ more, then gives \d+ to \w+\. How many \w+ does \w+ have now\?",
    },
    GENERAL: {
        "add": r"There are \d+ \w+ in a box and \w+ puts in another \d+\. How many \w+ are in the box\?",
        "subtract": r"A shop had \d+ \w+\. It sold \d+ of them\. How many \w+ are left in the shop\?",
        "multiply": r"Each of \d+ shelves holds \d+ \w+\. How many \w+ do the shelves hold in total\?",
        "share": r"\w+ packs \d+ \w+ into \d+ equal boxes\. How many \w+ go in each box\?",
        "buy-then-give": r"\w+ collects \d+ \w+ on Monday and \d+ on Tuesday, then loses \d+\. How many \w+ does \w+ have\?",
    },
}
# the largest number in the question: training's rows stay at or under 108 (9 friends sharing 12 each)
RANGES = (("<=108", 108), ("109-200", 200), ("201-300", 300))
PHASES = ("before", "after")  # the warmed-up model (step 0), the run's last checkpoint


def kind_of(question: str) -> tuple[str, str]:
    """(wording, kind) of a word problem: the one template of either split its whole text matches."""
    found = [
        (split, kind)
        for split, templates in TEMPLATES.items()
        for kind, pattern in templates.items()
        if re.fullmatch(pattern, question)
    ]
    if len(found) != 1:
        raise ValueError(f"{question!r} matches {len(found)} word-problem templates, not one")
    return found[0]


def range_of(question: str) -> str:
    """The RANGES bin of the question's largest number."""
    top = max(int(n) for n in re.findall(r"\d+", question))
    for label, high in RANGES:
        if top <= high:
            return label
    raise ValueError(f"{question!r}: {top} is past the last range ({RANGES[-1][1]})")


# what a reply writes when it sets the problem up right: the kind's operation on the question's numbers, in
# their order ({0}, {1}, {2}: the first, second, third number; a sum either way round)
SET_UPS = {
    "add": (r"(?:{0}\s*\+\s*{1}|{1}\s*\+\s*{0})",),
    "subtract": (r"{0}\s*[-−]\s*{1}",),
    "multiply": (r"(?:{0}\s*[*×x]\s*{1}|{1}\s*[*×x]\s*{0})",),
    "share": (r"{0}\s*[/÷]\s*{1}",),
    "buy-then-give": (r"(?:{0}\s*\+\s*{1}|{1}\s*\+\s*{0})", r"[-−]\s*{2}"),
}


def set_up(question: str, reply: str) -> bool:
    """Whether the reply writes the problem's operation on its numbers (SET_UPS), whatever it computes: right
    here and the answer wrong is an arithmetic slip, not a misreading."""
    numbers = re.findall(r"\d+", question)
    patterns = SET_UPS[kind_of(question)[1]]
    return all(re.search(rf"(?<!\d){pattern.format(*numbers)}(?!\d)", reply) for pattern in patterns)


def tally(records: list[dict]) -> dict:
    """Per cell, from records {split, question, before, after, replies} (before/after: the reply's answer right
    or not; replies: {before, after} texts): {split: {name: {n, before: [p, lo, hi], after: [p, lo, hi], gain,
    set_up: {before: [p, lo, hi], after: [...]}, right_if_set_up: {the same}}}}, names "all", each kind (KINDS' order), each range (RANGES'
    order) and each "kind range"; a cell only where it has rows. p: answer accuracy; set_up: the share of
    replies that set the problem up right (set_up); right_if_set_up: of those, the share right (a phase with
    none set up has none)."""
    from grpo_studio.engine.run.evaluation import wilson

    def share(hits: list[bool]) -> list[float]:
        p = sum(hits) / len(hits)
        return [p, *wilson(p, len(hits))]

    out: dict = {}
    for split in (HELD_OUT, GENERAL):
        rows = [r for r in records if r["split"] == split]
        cells = {"all": rows}
        for kind in KINDS:
            cells[kind] = [r for r in rows if kind_of(r["question"])[1] == kind]
        for label, _ in RANGES:
            cells[label] = [r for r in rows if range_of(r["question"]) == label]
        for kind in KINDS:
            for label, _ in RANGES:
                cells[f"{kind} {label}"] = [r for r in cells[kind] if range_of(r["question"]) == label]
        out[split] = {}
        for name, members in cells.items():
            if not members:
                continue
            cell = {"n": len(members), **{phase: share([r[phase] for r in members]) for phase in PHASES}}
            cell["gain"] = cell["after"][0] - cell["before"][0]
            ups = {p: [set_up(r["question"], r["replies"][p]) for r in members] for p in PHASES}
            cell["set_up"] = {p: share(ups[p]) for p in PHASES}
            cell["right_if_set_up"] = {  # the arithmetic: of the replies set up right, the share answered right
                p: share([r[p] for r, up in zip(members, ups[p]) if up]) for p in PHASES if any(ups[p])
            }
            out[split][name] = cell
    return out


# ---- evaluating one run (torch and the engine from here) ---------------------------------------------------
def _run_evals(run_dir: Path) -> tuple[dict, dict, int]:
    """The run's recorded evals: step 0's (events.jsonl, keys without 'eval/'), its last eval row's
    (metrics.jsonl, with 'eval/'), and that row's step."""
    from grpo_studio.contract.rundir import read_events, read_rows

    before = next(e for e in read_events(run_dir) if e.get("event") == "eval" and e.get("step") == 0)
    last = [row for row in read_rows(run_dir / "metrics.jsonl") if "eval/answer_accuracy" in row][-1]
    return before, last, last["step"]


def _sample(trainer, rows: list[dict], chunk: int) -> tuple[list[str], list[dict]]:
    """The reply to each row, sampled by evaluation.sample (one sample a row: train.eval_k = 1), `chunk` rows a
    call; and each call's eval metrics (evaluation.eval_metrics of its sums), to set against the run's."""
    from grpo_studio.engine.run import evaluation

    cfg, rollouts = trainer.cfg, trainer.grpo.rollouts
    texts, calls = [], []
    for start in range(0, len(rows), chunk):
        part = rows[start : start + chunk]
        sums, replies = evaluation.sample(rollouts, part, cfg)
        calls.append(evaluation.eval_metrics(sums, len(part), 1, reward_names=rollouts.reward_names))
        texts += replies
    return texts, calls


def _same(ours: dict, theirs: dict, prefix: str) -> list[str]:
    """The eval keys where `ours` (eval/...) and the run's record (under `prefix`) differ."""
    return [
        f"{key} {value:.4f} vs {theirs.get(prefix + key.removeprefix('eval/'))}"
        for key, value in ours.items()
        if theirs.get(prefix + key.removeprefix("eval/")) != value
    ]


def evaluate_run(run_dir: Path, general: int, work: Path) -> dict:
    """One run's rows before and after RL: {seed, steps, records, checks, seconds}."""
    from grpo_studio.contract import config
    from grpo_studio.engine.model.weights import export_weights
    from grpo_studio.engine.out import checkpoint
    from grpo_studio.engine.run.evaluation import answer_right
    from grpo_studio.engine.run.trainer import Trainer

    start = time.perf_counter()
    cfg_run = config.load(str(run_dir / "config.toml"))
    if general < cfg_run.data.general_size:
        sys.exit(f"--general {general}: fewer than the run's data.general_size ({cfg_run.data.general_size})")
    cfg = config.load(str(run_dir / "config.toml"), [f"data.general_size={general}"])
    if cfg.train.eval_k != 1:  # one reply a row is what the tables count
        sys.exit(
            f"{run_dir}: train.eval_k = {cfg.train.eval_k}; this script reads runs evaluated with one sample a row"
        )
    before_rec, after_rec, steps = _run_evals(run_dir)
    scratch = work / run_dir.name
    shutil.rmtree(scratch, ignore_errors=True)  # a fresh run directory: the run's own is only read
    trainer = Trainer(cfg, scratch)
    try:
        splits = {HELD_OUT: trainer.eval_rows, GENERAL: trainer.general_rows}
        replies, checks = {}, {}
        for phase in PHASES:
            if phase == "before":
                if not trainer._warm_up(None):  # the run's warm-up, from the same seed: step 0's weights
                    sys.exit(f"{run_dir}: stopped during the warm-up")
                recorded, prefix = before_rec, ""
            else:  # the run's checkpoint, copied so that restore's housekeeping never touches the run
                shutil.copytree(run_dir / "checkpoints" / f"step-{steps}", scratch / "checkpoints" / f"step-{steps}")
                g = trainer.grpo
                checkpoint.restore(scratch, trainer.policy, g.optimizer, g.schedule, g.scaler, print, at_most=steps)
                g.sampler.load_weights(export_weights(trainer.policy))
                recorded, prefix = after_rec, "eval/"
            held_texts, (held_call,) = _sample(trainer, splits[HELD_OUT], len(splits[HELD_OUT]))
            general_texts, general_calls = _sample(trainer, splits[GENERAL], cfg_run.data.general_size)
            replies[phase] = {HELD_OUT: held_texts, GENERAL: general_texts}
            ours = {**held_call, **{k.replace("eval/", "eval/general/", 1): v for k, v in general_calls[0].items()}}
            checks[phase] = {"step": 0 if phase == "before" else steps, "differ": _same(ours, recorded, prefix)}
            print(f"{run_dir.name} {phase}: {len(checks[phase]['differ'])} eval keys differ from the run's", flush=True)
    finally:
        trainer.close()
    records = []
    for split, rows in splits.items():
        for i, row in enumerate(rows):
            text = {phase: replies[phase][split][i] for phase in PHASES}
            right = {phase: answer_right(text[phase], row["answer"], cfg.rewards) for phase in PHASES}
            records.append({"split": split, "question": row["question"], **right, "replies": text})
    return {
        "run": str(run_dir),
        "seed": cfg.train.seed,
        "steps": steps,
        "records": records,
        "checks": checks,
        "seconds": time.perf_counter() - start,
    }


# ---- the outputs ------------------------------------------------------------------------------------------
def percent(cell: list[float]) -> str:
    p, lo, hi = cell
    return f"{100 * p:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def markdown(tallies: dict) -> str:
    """Two tables. Per split and cell (all, each kind, each range): n (a seed's rows), each seed's before → after
    (points gained), the pooled accuracies with their Wilson intervals, and the share of replies set up right.
    Then the generalisation split's kind × range cells, pooled."""
    seeds = [name for name in tallies if name != "pooled"]
    pooled = tallies["pooled"]

    def set_ups(cell: dict) -> str:
        """The share set up right, before → after, and (of those) the share right."""
        ups = " → ".join(f"{100 * cell['set_up'][phase][0]:.0f}%" for phase in PHASES)
        right = cell["right_if_set_up"]
        return ups + " | " + " → ".join(f"{100 * right[p][0]:.0f}%" if p in right else "–" for p in PHASES)

    head = "| split | cell | n | " + " | ".join(f"seed {s}" for s in seeds) + " | pooled before | pooled after | gain |"
    lines = [head + " set up | right if set up |", "|" + "---|" * (head.count("|") + 1)]
    for split in (HELD_OUT, GENERAL):
        for name, cell in pooled[split].items():
            if " " in name:  # a kind × range cell: the second table
                continue
            each = [tallies[s][split][name] for s in seeds]
            per_seed = [
                f"{100 * c['before'][0]:.0f} → {100 * c['after'][0]:.0f} ({100 * c['gain']:+.0f})" for c in each
            ]
            lines.append(
                f"| {split} | {name} | {each[0]['n']} | "
                + " | ".join(per_seed)
                + f" | {percent(cell['before'])} | {percent(cell['after'])} | {100 * cell['gain']:+.1f} |"
                + f" {set_ups(cell)} |"
            )
    lines += ["", "| kind | range | n (pooled) | before | after | gain | set up | right if set up |", "|" + "---|" * 8]
    for name, cell in pooled[GENERAL].items():
        if " " in name:
            kind, label = name.split(" ")
            lines.append(
                f"| {kind} | {label} | {cell['n']} | {percent(cell['before'])} | {percent(cell['after'])} |"
                f" {100 * cell['gain']:+.1f} | {set_ups(cell)} |"
            )
    return "\n".join(lines)


def plot(tallies: dict, path: Path) -> None:
    """Two panels, pooled over the seeds with Wilson 95% bars: accuracy against the question's largest number
    (each split before and after), and per kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pooled = tallies["pooled"]
    fig, (by_range, by_kind) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2, 3]})
    style = {
        (HELD_OUT, "before"): ("tab:blue", "o", ":"),
        (HELD_OUT, "after"): ("tab:blue", "o", "-"),
        (GENERAL, "before"): ("tab:orange", "s", ":"),
        (GENERAL, "after"): ("tab:orange", "s", "-"),
    }
    shown = [label for label, _ in RANGES] + list(KINDS)
    top = max(c[p][2] for split in (HELD_OUT, GENERAL) for n, c in pooled[split].items() if n in shown for p in PHASES)
    for axis, names in ((by_range, [label for label, _ in RANGES]), (by_kind, list(KINDS))):
        for j, (split, phase) in enumerate(style):
            colour, marker, line = style[split, phase]
            xs = [i for i, name in enumerate(names) if name in pooled[split]]
            offset = (j - 1.5) * 0.06
            cells = [pooled[split][names[i]] for i in xs]
            ps = [100 * c[phase][0] for c in cells]
            errors = [
                [p - 100 * c[phase][1] for p, c in zip(ps, cells)],
                [100 * c[phase][2] - p for p, c in zip(ps, cells)],
            ]
            axis.errorbar(
                [x + offset for x in xs],
                ps,
                yerr=errors,
                color=colour,
                marker=marker,
                linestyle=line if axis is by_range else "none",  # a curve over the ranges; kinds are apart
                capsize=3,
                markerfacecolor="white" if phase == "before" else colour,  # hollow: the warmed-up start
                label=f"{split}, {'warmed-up start' if phase == 'before' else 'after RL'}",
            )
        axis.set_xticks(range(len(names)), names)
        axis.set_ylabel("answer accuracy, %")
        axis.set_ylim(0, min(100, 100 * top + 5))
        axis.grid(alpha=0.3)
    seeds = len(tallies) - 1
    by_range.set_xlabel("largest number in the question (training's stay <= 108)")
    by_range.set_title(f"by number range ({seeds} seeds pooled, 95% Wilson)")
    by_kind.set_xlabel("problem kind")
    by_kind.set_title("by kind")
    by_kind.legend(fontsize=8, loc="upper right")
    fig.suptitle("word-problems: answer accuracy before and after RL, SmolLM2-135M-Instruct")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories of the word-problems recipe, one a seed")
    parser.add_argument("--general", type=int, default=300, help="generalisation rows (the run's own first)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/wp-by-kind"), help="scratch runs and kept rows")
    parser.add_argument("--out", type=Path, default=Path("docs/recipes"), help="where the JSON and PNG go")
    args = parser.parse_args(argv)
    from grpo_studio.contract.run_files import atomic_write_text

    args.work.mkdir(parents=True, exist_ok=True)
    results = []
    for run_dir in args.runs:
        kept = args.work / f"{run_dir.name}.json"
        if kept.is_file():
            result = json.loads(kept.read_text())
        else:
            result = evaluate_run(run_dir, args.general, args.work)
            atomic_write_text(kept, json.dumps(result))
        print(f"{run_dir}: seed {result['seed']}, {result['seconds']:.0f} s, checks {result['checks']}", flush=True)
        results.append(result)
    tallies = {str(r["seed"]): tally(r["records"]) for r in results}
    tallies["pooled"] = tally([rec for r in results for rec in r["records"]])
    summary = {
        "runs": [{k: r[k] for k in ("run", "seed", "steps", "checks", "seconds")} for r in results],
        "general_rows": args.general,
        "ranges": RANGES,
        "tallies": tallies,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "word-problems-by-kind.json", json.dumps(summary, indent=1) + "\n")
    plot(tallies, args.out / "word-problems-by-kind.png")
    print(markdown(tallies))
    return 0


if __name__ == "__main__":
    sys.exit(main())
