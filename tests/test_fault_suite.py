"""The fault suite's fast categories (benchmarks/fault_cases.py), every case on every commit: a bad config value
for every key the schema has, broken recipe files, bad flags, damaged run directories. A user mistake is one
line on stderr and exit code 2, and leaves no run directory behind; a reader shows what it can. The cases run
through cli.main.main in this process (file descriptors captured, so a child the command starts is judged
too); then every feature's hostile cases (benchmarks/fault_probes.py) but the slow ones. `grpo-studio bench
faults` runs the same cases as real processes, with the slow categories."""

import pytest

from grpo_studio.benchmarks.fault_cases import CRASHED, READ, REFUSED, fast_cases
from grpo_studio.benchmarks.fault_probes import Probe, hostile_cases
from grpo_studio.benchmarks.faults_bench import judge
from grpo_studio.cli.main import main

HOSTILE = hostile_cases()
CASES = fast_cases() + [case for case in HOSTILE if not case.slow]


def test_the_suite_is_generated_large():
    assert {case.category for case in fast_cases()} == {"config", "recipe", "flags", "rewards", "rundir"}
    assert len(fast_cases()) >= 400
    assert len({(case.category, case.name) for case in CASES}) == len(CASES)  # every case says what it is


def test_every_feature_brings_its_hostile_cases():
    """Issue 40's categories, each with cases of its own, at least 150 in all."""
    by_category: dict[str, int] = {}
    for case in HOSTILE:
        by_category[case.category] = by_category.get(case.category, 0) + 1
    assert set(by_category) >= {
        "environments",
        "model text",
        "rollout server",
        "readers",
        "resume",
        "data",
        "signals",
        "cache",
    }, by_category
    assert len(HOSTILE) >= 150, by_category


@pytest.mark.parametrize("case", CASES, ids=[f"{c.category}:{c.name}" for c in CASES])
def test_case_holds(case):
    verdict, outcome = judge(case, main)
    expected = (
        "the probe's check held"
        if isinstance(case, Probe)
        else {
            REFUSED: "one line on stderr, exit 2, no run directory",
            READ: "exit 0, or one line and exit 2",
            CRASHED: "one line on stderr, a non-zero exit",
        }[case.expect]
    )
    assert verdict == "held", f"{verdict} (expected {expected}): exit {outcome.code}\n{outcome.stderr[-1500:]}"
