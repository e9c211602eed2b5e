"""One home per rule, checked on the files themselves:

- the process-count rule (`--nproc` a whole number >= 1; more than one process needs train.parallel ddp or
  fsdp; train.prompts_per_step divides evenly among them) is worded in contract/config_rules.py
  check_processes only: every launcher (train, vram, bench scaling, torchrun ranks, the studio) calls it;
- `grpo-studio bench --help` lists exactly the benchmarks of cli/bench_cmd.py's BENCHMARKS registry;
- the precision: no code compares a dtype name itself (contract/dtypes.py's table and predicates say what each
  means), and in the engine only the precision plan reads model.dtype / rollout.dtype.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cli_helpers import ROOT, run_cli

from grpo_studio.cli.bench_cmd import BENCHMARKS
from grpo_studio.contract import config

HOME = ROOT / "contract" / "config_rules.py"
ROOMS = ("api", "contract", "rewards", "engine", "studio", "cli", "benchmarks", "presets", "scripts", "docs")
# The rule's wording, and the wordings it had before it had one home: none may be written anywhere else.
FRAGMENTS = (
    "must divide evenly among",
    "processes need train.parallel",
    "must be a whole number >= 1",
    "need 'ddp' or 'fsdp'",
    "needs train.parallel = 'ddp' or 'fsdp'",
)


def _texts() -> dict[str, str]:
    paths = [
        p
        for room in ROOMS
        for p in (ROOT / room).rglob("*")
        if p.suffix in (".py", ".md") and "__pycache__" not in p.parts
    ]
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in sorted(paths)}


def test_the_process_rule_is_worded_in_its_home_only():
    texts = _texts()
    assert len(texts) > 100  # the walk really saw the tree
    home = texts.pop(str(HOME.relative_to(ROOT)))
    assert all(fragment in home for fragment in FRAGMENTS[:3])
    found = {path: [f for f in FRAGMENTS if f in text] for path, text in texts.items()}
    assert {path: fragments for path, fragments in found.items() if fragments} == {}


@pytest.mark.parametrize(
    ("nproc", "sets", "line"),
    [
        (0, [], "config error: --nproc = 0: must be a whole number >= 1"),
        (
            2,
            [],
            "config error: train.parallel = 'none': 2 processes need train.parallel = 'ddp' or 'fsdp' (each "
            "trains on its share of the prompts); add --set train.parallel=ddp",
        ),
        (
            3,
            ["train.parallel=ddp"],
            "config error: train.prompts_per_step = 16: must divide evenly among the 3 "
            "processes (each samples its share of the prompts)",
        ),
    ],
)
def test_check_processes_words_each_refusal_once(nproc, sets, line):
    with pytest.raises(config.UserError) as err:
        config.check_processes(config.load("tiny-arith", sets), nproc)
    assert str(err.value) == line


def test_check_processes_accepts_what_it_allows():
    config.check_processes(config.load("tiny-arith"), 1)
    config.check_processes(config.load("tiny-arith", ["train.parallel=fsdp"]), 4)


def test_bench_help_lists_exactly_the_registry():
    proc = run_cli("bench", "--help", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    listing = proc.stdout.split("positional arguments:", 1)[1].split("options:", 1)[0]
    names = re.findall(r"^    (\S+)", listing, flags=re.M)
    assert names == list(BENCHMARKS)
    top = run_cli("--help", cwd=ROOT).stdout  # grpo-studio --help's bench line names them too
    listed = re.search(r"^    bench\s[^(]*\(([^)]*)\)", top, flags=re.M).group(1)
    assert " ".join(listed.split()).split(", ") == list(BENCHMARKS)


def test_home_is_where_the_config_says():
    assert Path(config.check_processes.__code__.co_filename).resolve() == HOME.resolve()


DTYPE_NAME = r"""["'](?:fp32|bf16|fp16|fp8|float32|bfloat16|float16)["']"""
# `x == "bf16"`, `x != "fp8"`, `x in ("bf16", "fp16")`, `x not in ["fp32"]`: a decision on a dtype's name (a loop
# over names, `for d in ("bf16", "fp16")`, is not one)
DTYPE_COMPARISON = re.compile(rf"(?:==|!=)\s*{DTYPE_NAME}|(?<!for )(?:\b\w+\s+)(?:not\s+)?in\s*[\(\[{{]\s*{DTYPE_NAME}")
CODE_ROOMS = ("api", "contract", "rewards", "engine", "studio", "cli", "benchmarks", "scripts")


def _code() -> dict[str, str]:
    paths = [p for room in CODE_ROOMS for p in (ROOT / room).rglob("*.py") if "__pycache__" not in p.parts]
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in sorted(paths)}


def compares_dtype(line: str) -> bool:
    return bool(DTYPE_COMPARISON.search(line.split("#")[0]))


def test_no_dtype_name_is_compared_outside_the_dtype_table():
    code = _code()
    assert len(code) > 100
    found = [
        f"{path}:{n}: {line.strip()}"
        for path, text in code.items()
        if path != "contract/dtypes.py"
        for n, line in enumerate(text.splitlines(), 1)
        if compares_dtype(line)
    ]
    assert found == []


def test_the_comparison_pattern_catches_what_it_should():
    caught = ['if m.dtype == "fp8":', "x != 'bf16'", 'if d in ("bf16", "fp16") and y:', 'a not in ["fp32"]']
    passed = ['out["bf16"] = 1', 'dtype: str = "bf16"', 'DTYPES["fp8"].torch', 'key = "model.dtype"']
    passed += ['for d in ("fp32", "bf16")', '[f(d) for d in ("bf16", "fp16")]', 'x = "a" if y in DTYPES else "fp32"']
    assert all(compares_dtype(line) for line in caught)
    assert not any(compares_dtype(line) for line in passed)


def test_only_the_precision_plan_reads_the_dtype_keys_in_the_engine():
    engine = {path: text for path, text in _code().items() if path.startswith("engine/")}
    readers = re.compile(r"\b(?:cfg|config|m|model_cfg)\.(?:model|rollout)\.dtype\b|\bm\.dtype\b|cfg\.rollout_dtype")
    found = [
        f"{path}:{n}"
        for path, text in engine.items()
        for n, line in enumerate(text.splitlines(), 1)
        if readers.search(line.split("#")[0])
    ]
    assert found == []
