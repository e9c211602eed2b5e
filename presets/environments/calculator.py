"""A calculator tool for the model: an example environment in TRL's `environment_factory` shape.

Copy this file and change it to make your own environment: a class whose `reset(**row)` starts an episode
and whose public, typed methods with a Google-style docstring are the tools the model may call. The tool
parses the expression with `ast` (never `eval`) and allows only integers, + - * / and parentheses, with
limits on sizes, so nothing the model writes can run code or take long. There is no get_reward: the
correctness reward scores the model's final answer.

    env.environment = "calculator"            # this file, built in
    env.environment = "my_calc.py:Calculator"  # your copy
"""

from __future__ import annotations

import ast
import operator
from fractions import Fraction

MAX_CHARS = 200  # the longest expression accepted
MAX_VALUE = 10**15  # the largest number (literal, intermediate or result) accepted
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
ALLOWED = "allowed: integers, + - * / and parentheses, e.g. (12 * 7) + 5"


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        result = Fraction(node.value)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        result = -_value(node.operand) if isinstance(node.op, ast.USub) else _value(node.operand)
    elif isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        result = OPERATORS[type(node.op)](left, right)
    else:
        raise ValueError(f"{ast.unparse(node)[:40]!r} is not allowed; {ALLOWED}")
    if abs(result) > MAX_VALUE:
        raise ValueError(f"number too large (over {MAX_VALUE:.0e}); {ALLOWED}")
    return result


def evaluate(expression: str) -> str:
    """The value of an arithmetic expression, as text: an integer, or a decimal rounded to 6 places."""
    if len(expression) > MAX_CHARS:
        raise ValueError(f"expression longer than {MAX_CHARS} characters; {ALLOWED}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression; {ALLOWED}") from None
    result = _value(tree.body)
    if result.denominator == 1:
        return str(result.numerator)
    return f"{float(result):.6f}".rstrip("0")


class Calculator:
    """One episode's calculator: counts the calls the model makes."""

    def __init__(self):
        self.calls = 0

    def reset(self, **row) -> None:
        """A new episode (the row's columns are not needed): nothing is added to the prompt."""
        self.calls = 0

    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression on integers with + - * / and parentheses.

        Args:
            expression: The expression to evaluate, e.g. "(12 * 7) + 5".
        """
        self.calls += 1
        return evaluate(expression)
