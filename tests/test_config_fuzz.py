"""Property-based fuzzing of the config front door: whatever a user writes, the outcome is a valid config
or one UserError line.

Inputs: random TOML documents mixing the real [section] keys with random keys and sections, values of
every type (booleans, small and huge integers, NaN/inf and ordinary floats, unicode text, nested lists
and tables, datetimes, top-level scalars such as `algo = 3`), sometimes with bad bytes spliced in; plus
random `--set KEY=VALUE` overrides. Hypothesis runs 500 cases per CI run (max_examples=500,
derandomize=True: the same cases every run; no example database), each through `config.load` in this
process. Then 16 of the refused cases, spread over the run, go through the real CLI as subprocesses:
exit code 2, exactly the same single stderr line, no traceback.

Properties:
  * accepted: every float key is finite, and the config survives config.toml (save, load, equal);
  * refused: a UserError whose str() is one line starting "config error: ".

The test prints its counts (pytest -rA or -s shows them): 500 cases.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tomli_w
from cli_helpers import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_studio.contract import config
from grpo_studio.contract.errors import UserError

CASES = 500
CLI_CASES = 16
INFOS = config.key_info()
SECTIONS = list(config.SECTIONS)

# ---- values ----------------------------------------------------------------------------------------

huge_ints = st.sampled_from([2**31, 2**32, 2**63 - 1, 2**63, 10**9, 10**18, 10**30, 10**400, -(10**400)])
ints = st.one_of(st.integers(-10, 3000), st.integers(), huge_ints)
floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0, 5e-324, 0.5, 2.0]),
)
texts = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", "nan", "inf", "-1", "1e999", "fp16", "grpo", "x" * 5000, "a\nb", "\x00", "~nosuchuser/x"]),
)
datetimes = st.datetimes(min_value=datetime.datetime(1, 1, 1), max_value=datetime.datetime(9999, 1, 1))
scalars = st.one_of(st.booleans(), ints, floats, texts, datetimes)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8,
)


def plausible(info: config.KeyInfo):
    """A value a user might really write for this key: its default, an allowed choice, near its bounds, or
    the typical slip of its type (NaN/inf for a float, an extra 000 for an int, a bad list item)."""
    options = [st.just(info.default)]
    if info.choices:
        options.append(st.sampled_from(info.choices))
    if info.type == "int":
        lo = int(info.lo if info.lo is not None else -5)
        options.append(st.integers(lo - 1, int(info.hi) + 1 if info.hi is not None else lo + 10**6))
        options.append(huge_ints)
    if info.type == "float":
        options.append(st.floats(min_value=(info.lo or 0) - 1, max_value=(info.hi or 10.0) + 1))
        options.append(st.sampled_from([math.nan, math.inf, -math.inf, 10**400]))
    if info.type == "list":
        options.append(st.lists(st.one_of(texts, floats, ints, st.booleans()), max_size=3))
    return st.one_of(*options)


real_entry = st.sampled_from(INFOS).flatmap(
    lambda info: st.tuples(st.just(info.key), st.one_of(plausible(info), plausible(info), plausible(info), values))
)
random_entry = st.tuples(
    st.builds("{}.{}".format, st.one_of(st.sampled_from(SECTIONS), st.text(max_size=6)), st.text(max_size=8)), values
)


@st.composite
def documents(draw) -> bytes:
    """A TOML document (bytes): [section] tables of real and random keys, sometimes a top-level scalar,
    sometimes with bad bytes spliced in."""
    doc: dict = {}
    for key, value in draw(st.lists(st.one_of(real_entry, real_entry, real_entry, random_entry), max_size=6)):
        section, _, name = key.partition(".")
        table = doc.setdefault(section, {})
        if isinstance(table, dict):
            table[name] = value
    if draw(st.integers(0, 9)) == 0:
        doc[draw(st.one_of(st.sampled_from(SECTIONS), st.text(max_size=5)))] = draw(scalars)
    raw = tomli_w.dumps(doc).encode()
    if draw(st.integers(0, 7)) == 0:
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.one_of(st.binary(min_size=1, max_size=4), st.sampled_from([b"\xff", b"\xc3("])))
        raw += raw[at:]
    return raw


def set_text(value) -> str:
    return (
        tomli_w.dumps({"v": value})[4:].strip()
        if isinstance(value, (list, dict, datetime.datetime))
        else str(value).lower()
        if isinstance(value, bool)
        else str(value)
    )


overrides = st.lists(
    st.one_of(
        st.builds(lambda kv: f"{kv[0]}={set_text(kv[1])}", real_entry),
        st.builds(lambda kv: f"{kv[0]}={set_text(kv[1])}", real_entry),
        st.builds(lambda kv: f"{kv[0]}={set_text(kv[1])}", random_entry),
        st.text(max_size=10),
    ),
    max_size=2,
)


# ---- the properties --------------------------------------------------------------------------------


def check_accepted(cfg: config.Config, tmp: Path) -> None:
    """Well-typed (each key the type of its default, each list item its declared type), finite, and the
    same after a trip through config.toml."""
    defaults = config.Config()
    for section in config.SECTIONS:
        for f in dataclasses.fields(getattr(cfg, section)):
            value, kind = getattr(getattr(cfg, section), f.name), type(getattr(getattr(defaults, section), f.name))
            items, item_kind = (value, f.metadata["item"]) if kind is list else ([value], kind)
            assert type(value) is kind and all(type(x) is item_kind for x in items), (section, f.name, value)
            assert all(math.isfinite(x) for x in items if isinstance(x, float)), (section, f.name, value)
    config.save(cfg, tmp / "config.toml")
    assert config.load(str(tmp / "config.toml")) == cfg


def test_config_files_and_overrides_are_valid_or_one_line(tmp_path):
    path = tmp_path / "case.toml"
    counts = {"cases": 0, "accepted": 0, "refused": 0}
    refused: list[tuple[bytes, list[str], str]] = []

    @settings(
        max_examples=CASES, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(doc=documents(), sets=overrides)
    def case(doc: bytes, sets: list[str]) -> None:
        counts["cases"] += 1
        path.write_bytes(doc)
        try:
            cfg = config.load(str(path), sets)
        except UserError as err:
            message = str(err)
            assert len(message.splitlines()) == 1, message
            assert message.startswith("config error: "), message
            counts["refused"] += 1
            refused.append((doc, sets, message))
            return
        counts["accepted"] += 1
        check_accepted(cfg, tmp_path)

    case()
    print(
        f"\nconfig fuzz: {counts['cases']} cases, {counts['accepted']} valid configs, "
        f"{counts['refused']} one-line errors"
    )
    assert counts["cases"] >= CASES and counts["accepted"] and counts["refused"]

    # The same refusals through the real front door: exit 2, the same one line, no traceback.
    cli_cases = [c for c in refused if not any("\x00" in s or s.startswith("-") for s in c[1])]
    step = max(1, len(cli_cases) // CLI_CASES)
    chosen = cli_cases[::step][:CLI_CASES]

    def front_door(n: int) -> subprocess.CompletedProcess:
        doc, sets, _ = chosen[n]
        recipe = tmp_path / f"cli-{n}.toml"
        recipe.write_bytes(doc)
        args = [a for s in sets for a in ("--set", s)]
        return run_cli("train", str(recipe), *args, "--run-dir", str(tmp_path / f"run-{n}"), cwd=tmp_path, timeout=60)

    with ThreadPoolExecutor(4) as pool:  # the children are mostly imports: side by side, they fill both cores
        procs = list(pool.map(front_door, range(len(chosen))))
    for n, ((doc, sets, message), proc) in enumerate(zip(chosen, procs)):
        expected = message.replace(str(path), str(tmp_path / f"cli-{n}.toml"))
        assert (proc.returncode, proc.stderr.splitlines()) == (2, [expected]), (doc, sets)
        assert "Traceback" not in proc.stdout + proc.stderr
