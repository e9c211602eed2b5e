"""`make mutation`: how many small, realistic bugs in the engine's core the fast tests catch (mutmut 3).

A benchmark of the tests, not part of `make test`. mutmut copies the code to mutants/, rewrites each
function into a trampoline that runs the original or one mutant (an operator, a constant, a
comparison, an argument changed), and runs the tests that reach that function once per mutant.

Why a staging copy: mutmut names each mutant after its file's path (engine/train/losses.py ->
engine.train.losses) and makes the tests import the mutated copy through sys.path, while the tests import
grpo_studio.engine.train.losses, which pyproject's package-dir mapping puts at engine/. So this script
builds .mutation/ with engine/ at grpo_studio/engine (plus tests/ and pyproject.toml, whose
[tool.mutmut] table is the configuration), runs `mutmut run` there on the functions below, and
writes the score per module with every surviving mutant's diff to .mutation/report.md.
PYTHONPATH points at the mutated copy too, so tests that start a subprocess run the mutant as well.

    python scripts/mutation.py                 # everything in SCOPE (tens of minutes on 2 cores)
    python scripts/mutation.py --keep          # reuse .mutation/ and mutmut's cached results
    python scripts/mutation.py 'grpo_studio.engine.train.losses.*'   # some mutants only
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGE = ROOT / ".mutation"
MUTMUT = Path(sys.executable).with_name("mutmut")

# The engine's core, as mutmut names its functions: module.x_function, module.xǁClassǁmethod.
SCOPE = [
    "grpo_studio.engine.rollout.advantages.*",
    "grpo_studio.engine.train.losses.*",
    "grpo_studio.engine.precision.mismatch.*",
    "grpo_studio.engine.precision.numerics.*",
    "grpo_studio.engine.out.checkpoint.*",
    "grpo_studio.engine.train.grpo_step.xǁGRPOStepǁ_lr_factor__mutmut_*",  # the LR schedule
    *[
        f"grpo_studio.contract.config.x_{name}__mutmut_*"  # validation
        for name in ("validate", "_check", "_coerce", "set_key", "_lower", "_upper", "parse_override")
    ],
]
# Not scored: a developer's shell helper (`python -m grpo_studio.engine.precision.mismatch`), no behaviour.
EXCLUDE = ["grpo_studio.engine.precision.mismatch.x__self_check__mutmut_*"]
DETECTED = {"killed", "timeout", "segfault", "caught by type check"}


def stage(keep: bool) -> None:
    if not keep:
        shutil.rmtree(STAGE, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    (STAGE / "grpo_studio").mkdir(parents=True, exist_ok=True)
    for src, dst in (
        (ROOT / "engine", STAGE / "grpo_studio" / "engine"),
        (ROOT / "contract", STAGE / "grpo_studio" / "contract"),
        (ROOT / "rewards", STAGE / "grpo_studio" / "rewards"),
        (ROOT / "tests", STAGE / "tests"),
        (ROOT / "scripts", STAGE / "scripts"),
    ):
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst, ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", STAGE / "pyproject.toml")
    # mutants/ must exist before mutmut starts: PYTHONPATH names it, and Python caches "no such folder"
    # for a sys.path entry at startup, which would send every import back to the unmutated engine/.
    (STAGE / "mutants").mkdir(exist_ok=True)
    if keep and (STAGE / "mutants").exists():  # mutmut keeps mutants/ as it is: refresh what changed
        for rel in ("grpo_studio", "tests"):
            shutil.rmtree(STAGE / "mutants" / rel, ignore_errors=True)


def env() -> dict:
    out = dict(
        os.environ,
        PYTHONPATH=str(STAGE / "mutants"),
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
    )
    out.pop("MUTANT_UNDER_TEST", None)
    return out


def results() -> dict[str, str]:
    out = subprocess.run(
        [str(MUTMUT), "results", "--all", "true"], cwd=STAGE, env=env(), capture_output=True, text=True, check=True
    ).stdout
    found = {}
    for line in out.splitlines():
        match = re.fullmatch(r"\s*(\S+): (.+)", line)
        if match:
            found[match.group(1)] = match.group(2).strip()
    return found


def selected(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns) and not any(
        fnmatch.fnmatchcase(name, p) for p in EXCLUDE
    )


def module_of(name: str) -> str:
    return name.split(".x", 1)[0] if ".x_" in name or ".xǁ" in name else name.rsplit(".", 1)[0]


def report(patterns: list[str], seconds: float) -> int:
    status = {k: v for k, v in results().items() if selected(k, patterns)}
    by_module: dict[str, Counter] = defaultdict(Counter)
    for name, state in status.items():
        by_module[module_of(name)][state] += 1
    lines = [
        f"# mutation score ({time.strftime('%Y-%m-%d %H:%M')}, {seconds / 60:.1f} min)",
        "",
        "| module | mutants | detected | survived | no tests | other | score |",
        "|---|---|---|---|---|---|---|",
    ]
    total = Counter()
    for module in sorted(by_module):
        c = by_module[module]
        n, det = sum(c.values()), sum(c[s] for s in DETECTED)
        other = n - det - c["survived"] - c["no tests"]
        total.update({"n": n, "det": det, "surv": c["survived"], "none": c["no tests"], "other": other})
        lines.append(f"| {module} | {n} | {det} | {c['survived']} | {c['no tests']} | {other} | {det / n:.1%} |")
    n = total["n"] or 1
    lines.append(
        f"| **all** | {total['n']} | {total['det']} | {total['surv']} | {total['none']} | {total['other']} "
        f"| **{total['det'] / n:.1%}** |"
    )
    lines += ["", "'no tests' and 'not checked' count as survivors: code the selected tests never reach.", ""]
    survivors = sorted(k for k, v in status.items() if v not in DETECTED)
    if survivors:
        lines += ["## surviving mutants", ""]
    for name in survivors:
        diff = subprocess.run([str(MUTMUT), "show", name], cwd=STAGE, env=env(), capture_output=True, text=True).stdout
        lines += [f"### {name} ({status[name]})", "", "```diff", diff.strip(), "```", ""]
    text = "\n".join(lines) + "\n"
    (STAGE / "report.md").write_text(text)
    print("\n".join(lines[: len(by_module) + 5]))
    print(f"\n{len(survivors)} survivors; diffs in {STAGE / 'report.md'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("patterns", nargs="*", help="mutant names or globs (default: the engine's core)")
    parser.add_argument("--keep", action="store_true", help="reuse .mutation/ and cached results")
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--report-only", action="store_true", help="only (re)write the report")
    args = parser.parse_args(argv)
    patterns = args.patterns or SCOPE
    if not MUTMUT.exists():
        print(f"mutation: {MUTMUT} not found; pip install -e '.[dev]'", file=sys.stderr)
        return 2
    start = time.monotonic()
    if not args.report_only:
        stage(args.keep)
        run = subprocess.run(
            [str(MUTMUT), "run", "--max-children", str(args.max_children), *patterns], cwd=STAGE, env=env()
        )
        if run.returncode not in (0, 1):
            print(f"mutation: mutmut run exited {run.returncode}", file=sys.stderr)
            return run.returncode
    return report(patterns, time.monotonic() - start)


if __name__ == "__main__":
    sys.exit(main())
