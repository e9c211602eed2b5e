"""Built-in reward functions, each in TRL's signature:

    fn(prompts, completions, **columns) -> list[float | None]

`completions` are strings, or chat messages (`[{"role": "assistant", "content": ...}]`) for
conversational data; every function accepts both. `None` means "not applicable".

The functions work as plain TRL reward functions with the `[rewards]` defaults (DEFAULT, the
<reasoning>/<answer> layout of the GSM8K GRPO recipes). Inside grpo-studio, `configure()`
binds the run's RewardsConfig (its markers and options). Scores and curves: docs/rewards.md.
"""

from __future__ import annotations

import re
from fractions import Fraction

from ..contract.config import RewardsConfig as Options  # the [rewards] keys shape the built-ins

DEFAULT = Options()

# The reasoning system prompt of the GSM8K GRPO notebooks (willccbb's gist, Unsloth's Qwen/Llama GRPO).
SYSTEM_PROMPT = """
Respond in the following format:
<reasoning>
...
</reasoning>
<answer>
...
</answer>
"""

# ---- text helpers ------------------------------------------------------------------------------

_NUMBER = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)", re.ASCII)
_INTEGER = re.compile(r"-?[0-9]+", re.ASCII)


def text_of(completion) -> str:
    """The completion's text: a string as is; chat messages -> the last message's content."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    if isinstance(completion, (list, tuple)):
        return text_of(completion[-1]) if completion else ""
    return "" if completion is None else str(completion)


def _normalize(answer: str) -> str:
    """'$1,234.' -> '1234'; the unicode minus becomes '-'; surrounding whitespace goes."""
    t = answer.strip().replace("\u2212", "-").replace(",", "").replace("$", "").replace(" ", "")
    return t[:-1] if t.endswith(".") and len(t) > 1 else t


def parse_number(answer: str | None) -> Fraction | None:
    """Exact value of an answer that is one number (ASCII digits, optional sign/decimals/commas/$)."""
    if answer is None:
        return None
    t = _normalize(str(answer))
    return Fraction(t) if _NUMBER.fullmatch(t) else None


def reference_answer(reference) -> str:
    """The reference in a dataset column; GSM8K's full solution '… #### 72' gives '72'."""
    text = str(reference)
    return text.split("####")[-1].strip() if "####" in text else text.strip()


def extract_answer(text: str, opts: Options = DEFAULT) -> str | None:
    """The answer in a completion: group 1 (or the match) of the last `answer_regex` match when
    set; otherwise the content of the last solution block (<answer>…</answer> by default);
    otherwise what follows the last '####'. None when there is none."""
    if opts.answer_regex:
        matches = list(re.finditer(opts.answer_regex, text, re.DOTALL))
        if not matches:
            return None
        last = matches[-1]
        return (last.group(1) if last.re.groups else last.group(0)).strip()
    block = re.compile(re.escape(opts.solution_start) + r"(.*?)" + re.escape(opts.solution_end), re.DOTALL)
    matches = block.findall(text)
    if matches:
        return matches[-1].strip()
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip()
        return tail.splitlines()[0].strip() if tail else None
    return None


def answer_key(answer: str):
    """What two answers agree on: a number's exact value ('1,000' and '1000.0'), else the trimmed,
    case-folded text. Correctness compares answers by it; maj@k votes by it (engine/run/evaluation.py)."""
    number = parse_number(answer)
    return number if number is not None else " ".join(answer.split()).casefold()


def answers_match(answer: str | None, reference) -> bool:
    """Whether an answer equals the reference by answer_key (an empty reference matches nothing)."""
    if answer is None:
        return False
    key = answer_key(reference_answer(reference))
    return key != "" and answer_key(answer) == key


def _answers(completions, opts: Options) -> list[str | None]:
    return [extract_answer(text_of(c), opts) for c in completions]


# ---- the GSM8K set -----------------------------------------------------------------------------


def correctness(prompts, completions, answer, opts: Options = DEFAULT, **kwargs) -> list[float]:
    """+2.0 when the extracted answer equals the reference (numbers by value), else 0.0."""
    return [2.0 if answers_match(a, ref) else 0.0 for a, ref in zip(_answers(completions, opts), answer)]


def int_answer(prompts, completions, opts: Options = DEFAULT, **kwargs) -> list[float]:
    """+0.5 when the extracted answer is an integer (e.g. '-12', '1,000'), else 0.0."""
    return [0.5 if a is not None and _INTEGER.fullmatch(_normalize(a)) else 0.0 for a in _answers(completions, opts)]


def soft_format(prompts, completions, opts: Options = DEFAULT, **kwargs) -> list[float]:
    """+0.5 when the completion starts with a reasoning block followed by a solution block (any whitespace)."""
    o = opts
    pattern = re.compile(
        r"\s*"
        + re.escape(o.reasoning_start)
        + r".*?"
        + re.escape(o.reasoning_end)
        + r"\s*"
        + re.escape(o.solution_start)
        + r".*?"
        + re.escape(o.solution_end),
        re.DOTALL,
    )
    return [0.5 if pattern.match(text_of(c)) else 0.0 for c in completions]


def strict_format(prompts, completions, opts: Options = DEFAULT, **kwargs) -> list[float]:
    """+0.5 for exactly '<reasoning>\\n…\\n</reasoning>\\n<answer>\\n…\\n</answer>' (one final newline allowed)."""
    o = opts
    pattern = re.compile(
        r"\A"
        + re.escape(o.reasoning_start)
        + r"\n.*?\n"
        + re.escape(o.reasoning_end)
        + r"\n"
        + re.escape(o.solution_start)
        + r"\n.*?\n"
        + re.escape(o.solution_end)
        + r"\n?\Z",
        re.DOTALL,
    )
    return [0.5 if pattern.match(text_of(c)) else 0.0 for c in completions]


def xmlcount(prompts, completions, opts: Options = DEFAULT, **kwargs) -> list[float]:
    """+0.125 for each of the four tag lines appearing exactly once; -0.001 per non-blank
    character after the closing solution tag."""
    o = opts
    scores = []
    for c in completions:
        text = text_of(c)
        score = 0.0
        score += 0.125 if text.count(o.reasoning_start + "\n") == 1 else 0.0
        score += 0.125 if text.count("\n" + o.reasoning_end + "\n") == 1 else 0.0
        score += 0.125 if text.count("\n" + o.solution_start + "\n") == 1 else 0.0
        score += 0.125 if text.count("\n" + o.solution_end) == 1 else 0.0
        if o.solution_end in text:
            score -= 0.001 * len(text.rsplit(o.solution_end, 1)[1].strip())
        scores.append(round(score, 6))
    return scores


def _math_parse(text: str, timeout):
    from math_verify import parse

    return parse(text, parsing_timeout=timeout)


def math_verify(prompts, completions, answer, opts: Options = DEFAULT, **kwargs) -> list[float | None]:
    """1.0 when math-verify finds the answer equal to the reference (LaTeX, \\boxed{}, fractions,
    1/2 = 0.5 = \\frac{2}{4}), else 0.0; None when the reference does not parse. The answer is the
    extracted one (solution block, answer_regex, ####) when there is one, else the whole completion.
    Like TRL's accuracy_reward: https://github.com/huggingface/Math-Verify (parse + verify)."""
    import logging
    import threading

    from math_verify import verify

    # math-verify's timeouts use signal.alarm, which works in the main thread only (TRL does the same);
    # elsewhere rewards.timeout_s bounds the whole call.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    if timeout is None:
        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).setLevel(logging.ERROR)
    scores = []
    for c, ref in zip(completions, answer):
        gold_text = reference_answer(ref)
        gold = _math_parse(gold_text, timeout) or _math_parse(f"${gold_text}$", timeout)
        if not gold:
            scores.append(None)
            continue
        text = text_of(c)
        guess = _math_parse(extract_answer(text, opts) or text, timeout)
        scores.append(1.0 if guess and verify(gold, guess, timeout_seconds=timeout) else 0.0)
    return scores


# ---- the seed's neighbourhood reward -------------------------------------------------------------


def proximity_score(answer: str | None, reference) -> float | None:
    """2.0 exact; otherwise max(-1, 1 - 2e) with e = |guess - ref| / max(|ref|, 1); -1.0 when the
    completion has no numeric answer; None when the reference is not a number."""
    ref = parse_number(reference_answer(reference))
    if ref is None:
        return None
    guess = parse_number(answer)
    if guess is None:
        return -1.0
    if guess == ref:
        return 2.0
    err = abs(guess - ref) / max(abs(ref), Fraction(1))
    if err >= 1:
        return -1.0
    return max(-1.0, 1.0 - 2.0 * float(err))


def proximity(prompts, completions, answer, opts: Options = DEFAULT, **kwargs) -> list[float | None]:
    """Closer numeric answers score more: exact 2.0, then 1 - 2·relative error down to -1.0."""
    return [proximity_score(a, ref) for a, ref in zip(_answers(completions, opts), answer)]


# ---- templates, length, keywords, regex -----------------------------------------------------------


def format_pattern(opts: Options) -> re.Pattern:
    o = opts
    reasoning = r"\s*" + re.escape(o.reasoning_start) + r".+?" + re.escape(o.reasoning_end) + r"\s*"
    reasoning = reasoning if o.format_require_reasoning else f"(?:{reasoning})?"
    body = r"-?\$?[0-9][0-9,]*(?:\.[0-9]+)?" if o.format_numeric else r".+?"
    return re.compile(
        r"\A\s*"
        + reasoning
        + re.escape(o.solution_start)
        + r"\s*"
        + body
        + r"\s*"
        + re.escape(o.solution_end)
        + r"\s*\Z",
        re.DOTALL | re.ASCII,
    )


def format(prompts, completions, opts: Options = DEFAULT, **kwargs) -> list[float]:  # noqa: A001 - public name
    """+0.5 when the completion is exactly [reasoning block] + solution block (a number by default)."""
    pattern = format_pattern(opts)
    return [0.5 if pattern.match(text_of(c)) else 0.0 for c in completions]


def length_penalty(prompts, completions, opts: Options = DEFAULT, **kwargs) -> list[float]:
    """0 inside [length_min, length_max] characters; outside, minus the relative overshoot, down to -1."""
    lo, hi = opts.length_min, opts.length_max
    scores = []
    for c in completions:
        n = len(text_of(c))
        if n > hi:
            scores.append(-min(1.0, (n - hi) / hi))
        elif n < lo:
            scores.append(-min(1.0, (lo - n) / lo))
        else:
            scores.append(0.0)
    return scores


def _keyword_list(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [w.strip() for w in value.split(",") if w.strip()]
    return [str(w).strip() for w in value if str(w).strip()]


def keyword(prompts, completions, opts: Options = DEFAULT, keywords=None, **kwargs) -> list[float | None]:
    """Share of the required keywords present (case-insensitive); None when none are required."""
    scores = []
    for i, c in enumerate(completions):
        words = _keyword_list(keywords[i]) if keywords is not None else list(opts.keywords)
        if not words:
            scores.append(None)
            continue
        text = text_of(c).casefold()
        scores.append(sum(1 for w in words if w.casefold() in text) / len(words))
    return scores


def regex_match(prompts, completions, opts: Options = DEFAULT, **kwargs) -> list[float]:
    """1.0 when rewards.regex is found in the completion, else 0.0."""
    pattern = re.compile(opts.regex)
    return [1.0 if pattern.search(text_of(c)) else 0.0 for c in completions]


def code_exec(prompts, completions, opts: Options = DEFAULT, **kwargs) -> list[float | None]:
    """Share of the row's test cases that the completion's Python passes, run in the sandbox;
    None for rows without tests."""
    from . import sandbox

    tests = kwargs.get(opts.code_tests_column)
    if tests is None:
        return [None] * len(completions)
    limits = sandbox.Limits(
        wall_s=opts.code_timeout_s,
        cpu_s=max(1, int(opts.code_timeout_s + 0.999)),
        memory_mb=opts.code_memory_mb,
        max_output=opts.code_max_output,
    )
    jobs = [(sandbox.extract_code(text_of(c)), t) for c, t in zip(completions, tests)]
    results = sandbox.run_many(
        [(code, sandbox.normalize_tests(t)) for code, t in jobs], limits, workers=opts.code_workers, mode=opts.sandbox
    )
    return [None if not sandbox.normalize_tests(t) else r.score for (_, t), r in zip(jobs, results)]


# ---- the registry: name -> (function, one-line description, score range) ---------------------------

REGISTRY: dict[str, tuple] = {
    "correctness": (correctness, "+2 when the extracted answer equals the reference (GSM8K, <answer>, ####)", "{0, 2}"),
    "int": (int_answer, "+0.5 when the extracted answer is an integer", "{0, 0.5}"),
    "soft_format": (soft_format, "+0.5 for reasoning then solution tags, any whitespace", "{0, 0.5}"),
    "strict_format": (strict_format, "+0.5 for the exact tag layout, newlines included", "{0, 0.5}"),
    "xmlcount": (xmlcount, "+0.125 per tag line present once, -0.001 per trailing character", "(-inf, 0.5]"),
    "proximity": (proximity, "closer numbers score more: exact 2, else 1 - 2*rel. error, floor -1", "[-1, 1) or 2"),
    "format": (format, "+0.5 for exactly [reasoning] + solution markers (configurable template)", "{0, 0.5}"),
    "length_penalty": (
        length_penalty,
        "minus the relative overshoot outside [length_min, length_max] chars",
        "[-1, 0]",
    ),
    "keyword": (keyword, "share of required keywords present (rewards.keywords or a 'keywords' column)", "[0, 1]"),
    "regex_match": (regex_match, "1 when rewards.regex matches the completion", "{0, 1}"),
    "code_exec": (code_exec, "share of test cases the completion's Python passes, sandboxed", "[0, 1]"),
    "math_verify": (
        math_verify,
        "1 when math-verify finds the answer equal to the reference (LaTeX, \\boxed, "
        "fractions); needs the [math] extra",
        "{0, 1}",
    ),
}


def configure(name: str, opts: Options):
    """The registered function `name` with `opts` bound, keeping TRL's signature and the name."""
    fn = REGISTRY[name][0]

    def reward(prompts, completions, **kwargs):
        return fn(prompts, completions, opts=opts, **kwargs)

    reward.__name__ = reward.__qualname__ = name
    reward.__doc__ = fn.__doc__
    return reward
