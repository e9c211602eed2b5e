"""The built-in environments (presets/environments/) and their built-in tasks (engine/prompts/tasks.py) against oracles:
hand-checked values, a hand-traced game, and every task row's answer recomputed here independently."""

from __future__ import annotations

import importlib.util
import math
import re
from collections import Counter

import pytest

from grpo_studio.contract import bundled, environments
from grpo_studio.contract.config import DataConfig
from grpo_studio.engine.prompts import data, tasks

ENVS = bundled.PRESETS / "environments"


def preset(name: str):
    """A presets/environments module, loaded by path as a user's copy would be."""
    spec = importlib.util.spec_from_file_location(f"test_preset_{name}", ENVS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def instance(name: str):
    return environments.load(name).factory()


# ---- calculator ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("(12 * 7) + 5", "89"),
        ("100 - 4 * 3", "88"),  # precedence: 4 * 3 first
        ("(100 - 4) * 3", "288"),
        ("(2 + 3) * (4 - 9)", "-25"),
        ("-3 * -3", "9"),
        ("8 / 4", "2"),  # an exact quotient is an integer
        ("7 / 2", "3.5"),
        ("1 / 3", "0.333333"),
        ("  47*86+512 ", "4554"),
        ("((((1))))", "1"),
    ],
)
def test_calculator_computes(expression, expected):
    assert instance("calculator").calculate(expression) == expected


@pytest.mark.parametrize(
    "expression, why",
    [
        ("__import__('os')", "is not allowed"),
        ("2**99", "'2 ** 99' is not allowed"),
        ("2 ** 3", "is not allowed"),
        ("x + 1", "'x' is not allowed"),
        ("abs(-3)", "is not allowed"),
        ("1.5 + 2", "'1.5' is not allowed"),
        ("True + 1", "is not allowed"),
        ("7 // 2", "is not allowed"),
        ("7 % 2", "is not allowed"),
        ("[1, 2]", "is not allowed"),
        ("1 +", "not an arithmetic expression"),
        ("", "not an arithmetic expression"),
        ("1 / 0", "division by zero"),
        ("99999999 * 99999999", "number too large"),
        ("1" * 20, "number too large"),
        ("+".join(["1"] * 150), "longer than 200 characters"),
    ],
)
def test_calculator_refuses(expression, why):
    calc = instance("calculator")
    with pytest.raises(ValueError, match=re.escape(why)) as err:
        calc.calculate(expression)
    if why.endswith("not allowed"):
        assert "allowed: integers, + - * / and parentheses" in str(err.value)


def test_calculator_counts_calls_and_reset_clears_them():
    calc = instance("calculator")
    calc.calculate("1 + 1")
    calc.calculate("2 * 2")
    assert calc.calls == 2
    assert calc.reset(prompt="What is 1 + 1?", answer="2") is None
    assert calc.calls == 0


# ---- lookup ----------------------------------------------------------------------------------------------


def test_lookup_table_is_fixed_unique_and_in_range():
    people = preset("lookup").people()
    assert people == preset("lookup").people()  # seeded: the same table every time
    assert len(people) == 200
    assert len({p["name"].lower() for p in people}) == 200
    assert all(1800 <= p["year"] <= 1999 for p in people)
    assert all(re.fullmatch(r"[A-Z][a-z]+ [A-Z][a-z]+", p["name"]) for p in people)
    assert all(re.fullmatch(r"[A-Z][a-z]+", p["town"]) for p in people)
    assert people[0] == {"name": "Drathvou Tordrein", "year": 1892, "town": "Tinhaven"}  # docs quote this row


def test_lookup_returns_the_row_case_insensitively():
    env = instance("lookup")
    assert env.reset(prompt="q", answer="1892") is None
    assert env.lookup("Drathvou Tordrein") == "Drathvou Tordrein: born 1892 in Tinhaven"
    assert env.lookup("  drathvou   TORDREIN ") == "Drathvou Tordrein: born 1892 in Tinhaven"
    for p in preset("lookup").people():
        assert env.lookup(p["name"]) == f"{p['name']}: born {p['year']} in {p['town']}"
    assert env.calls == 202


def test_lookup_unknown_name_raises():
    env = instance("lookup")
    with pytest.raises(ValueError, match=r"^no person named 'Zorvath Quell'$"):
        env.lookup(" Zorvath Quell ")
    with pytest.raises(ValueError, match="no person named"):
        env.lookup("Drathvou")  # half a name is not a name


# ---- guess_number -----------------------------------------------------------------------------------------


def test_guess_number_hand_trace():
    env = instance("guess_number")
    first = env.reset(prompt="Guess the number.", secret=37, answer="37")
    assert [m["role"] for m in first] == ["system", "user"]
    assert first[1]["content"] == "I am thinking of a number between 1 and 50. Guess it: reply with just a number."
    bits = lambda b: {"range_halving": b}  # noqa: E731 - log2 of the range before over after (26..50, 26..39, 37)
    assert env.step("25") == (
        [{"role": "user", "content": "Higher."}],
        False,
        None,
        {"valid": True, "guesses": 1, "metrics": bits(1.0)},
    )
    assert env.step("Maybe 40?") == (
        [{"role": "user", "content": "Lower."}],
        False,
        None,
        {"valid": True, "guesses": 2, "metrics": bits(math.log2(25 / 14))},
    )
    assert env.step("I guess 37") == ([], True, 1.0, {"valid": True, "guesses": 3, "metrics": bits(math.log2(14))})


def test_guess_number_invalid_replies_are_not_guesses():
    env = instance("guess_number")
    env.reset(secret="5")  # a string column (a CSV row) works too
    invalid = (
        [{"role": "user", "content": "Reply with just a number between 1 and 50."}],
        False,
        None,
        {"valid": False},
    )
    assert env.step("no idea") == invalid
    assert env.step("") == invalid
    assert env.step("51") == invalid
    assert env.step("0") == invalid
    assert env.step("between 1 and 10, say 3") == (
        [{"role": "user", "content": "Higher."}],
        False,
        None,
        {"valid": True, "guesses": 1, "metrics": {"range_halving": math.log2(50 / 47)}},
    )
    assert env.step("5")[1:3] == (True, 1.0)
    env.reset(secret=5)
    assert env.step("5")[3] == {"valid": True, "guesses": 1, "metrics": {"range_halving": math.log2(50)}}  # anew


# ---- the built-in tasks ------------------------------------------------------------------------------------


def test_tool_arith_rows_answers():
    rows = tasks.tool_arith()
    assert len(rows) == 2000 and rows == tasks.tool_arith()
    kinds = Counter()
    for row in rows:
        m = re.fullmatch(r"What is (.+)\? Use the calculator, then reply with only the number\.", row["prompt"])
        expression = m.group(1)
        assert re.fullmatch(r"[\d ()+\-*]+", expression)
        assert row["answer"] == str(eval(expression, {"__builtins__": {}}))  # python's own arithmetic
        assert int(row["answer"]) >= 0
        assert "*" in expression  # every row multiplies
        kinds[re.sub(r"\d+", "N", expression)] += 1
        assert max(int(n) for n in re.findall(r"\d+", expression)) >= 12
    assert set(kinds) == {"(N * N) + N", "(N * N) - N", "(N + N) * N", "N * N + N * N"}
    assert min(kinds.values()) > 400
    assert len({r["prompt"] for r in rows}) > 1990


def test_lookup_rows_answers():
    people = {p["name"]: p for p in preset("lookup").people()}
    rows = tasks.lookup()
    assert len(rows) == 400
    seen = Counter()
    for row in rows:
        m = re.fullmatch(
            r"In what (year|town) was (.+) born\? Use the lookup tool, then reply with only the \1\.", row["prompt"]
        )
        what, name = m.groups()
        assert row["answer"] == str(people[name][what])
        seen[what] += 1
    assert seen == {"year": 200, "town": 200}


def test_guess_number_rows():
    rows = tasks.guess_number()
    assert len(rows) == 500
    assert Counter(r["secret"] for r in rows) == {k: 10 for k in range(1, 51)}
    assert all(r["answer"] == str(r["secret"]) and r["prompt"] == "Guess the number." for r in rows)
    assert [r["secret"] for r in rows[:10]] != sorted(r["secret"] for r in rows[:10])  # shuffled


@pytest.mark.parametrize(
    "source, train, columns",
    [
        ("builtin:tool-arith", 1800, {"prompt", "answer"}),
        ("builtin:lookup", 200, {"prompt", "answer"}),
        ("builtin:guess-number", 300, {"prompt", "answer", "secret"}),
    ],
)
def test_new_tasks_load_through_data(source, train, columns):
    assert source in data.BUILTIN
    config = DataConfig(source=source)
    rows, evals = data.load_rows(config, "train"), data.load_rows(config, "eval")
    assert (len(rows), len(evals)) == (train, 200)
    assert set(rows[0]) == columns
    if source != "builtin:guess-number":  # its 500 rows are 50 games, each 10 times
        assert not {r["prompt"] for r in evals} & {r["prompt"] for r in rows}


# ---- loading by name -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, cls, shape, tools, has_reward",
    [
        ("calculator", "Calculator", "tools", ["calculate"], False),
        ("lookup", "Lookup", "tools", ["lookup"], False),
        ("guess_number", "GuessNumber", "turns", [], True),
    ],
)
def test_builtin_names_load(name, cls, shape, tools, has_reward):
    env = environments.load(name)
    assert (env.name, env.shape, env.tools, env.has_reward) == (cls, shape, tools, has_reward)
    if shape == "tools":
        (schema,) = environments.schemas(env.factory(), env)
        assert schema["function"]["name"] == tools[0]
        assert list(schema["function"]["parameters"]["properties"]) == [
            "expression" if name == "calculator" else "name"
        ]
