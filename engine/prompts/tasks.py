"""Built-in tasks for chat models, generated offline (pure python, seeded): data.source = builtin:NAME.

    builtin:chat-arith     "What is 7 + 4? Reply with only the number."  answer "11"
                           every a + b with a, b in 0..20 (441 rows)
    builtin:word-problems  GSM8K-shaped one- and two-step word problems (2,000 rows): `question`, and
                           `answer` = a worked solution ending in "#### N", read as GSM8K is
                           (the reasoning system prompt, the built-in GSM8K rewards)
    builtin:tool-arith     "What is (47 * 86) + 512? Use the calculator, then reply with only the number."
                           answer "4554": a two-digit product plus or minus a 3-digit number, a sum times a
                           two-digit number, or two products added, too big for a small model's head
                           (2,000 rows; env.environment = "calculator")
    builtin:lookup         "In what year was Drathvou Tordrein born? Use the lookup tool, then reply with only
                           the year." answer "1892", and the town variant: the 200 invented people of
                           presets/environments/lookup.py (400 rows; env.environment = "lookup")
    builtin:guess-number   "Guess the number." with a `secret` column (1..50), answer the secret
                           (500 rows; env.environment = "guess_number", whose messages are the real prompt)

Whole conversations for the supervised warm-up (warmup.source), a `messages` column each: the question, one
tool call, the real tool's result and the answer:
    builtin:tool-arith-demos  500 expressions of builtin:tool-arith's kinds, from another seed
    builtin:lookup-demos      400 questions about 200 other invented people, none of them in the lookup table
and worked answers in the layout a recipe asks for:
    builtin:word-problems-demos  64 problems of builtin:word-problems' kinds, from another seed and none of its
                                 questions, solved in the reasoning prompt's <reasoning>/<answer> layout
    builtin:guess-number-demos   the 50 games of builtin:guess-number (one per secret) played by binary search:
                                 each guess the middle of the range the answers so far leave, at most 6 guesses

builtin:arith, the bundled tiny model's task, lives in engine/prompts/arith.py. Held-out rows: data.eval_size
(auto: 200), a seeded slice as for a file, taken in whole groups of rows that ask the same question
(`QUESTION`: a + b with b + a for chat-arith, the text otherwise), so no question is on both sides of the split.

Generalisation splits (`GENERAL`, data.general_size rows, auto 200), evaluated beside the held-out rows: what
training never shows.
    builtin:chat-arith     eight other phrasings ("Add 7 and 4.", "What is the sum of 7 and 4?", ...), half of
                           them with an operand from 21 to 60 (training's stop at 20)
    builtin:word-problems  five other wordings ("A shop had 212 tickets. It sold 75 of them. ..."), other names
                           and things, numbers up to 300 (training's stay under 110)
"""

from __future__ import annotations

import importlib.util
import random

from ...contract import bundled

SEED = 20_261_125
NAMES = [
    "Ava",
    "Ben",
    "Chloe",
    "Dan",
    "Emma",
    "Finn",
    "Grace",
    "Hugo",
    "Isla",
    "Jack",
    "Lena",
    "Omar",
    "Priya",
    "Sam",
    "Tara",
    "Yusuf",
]
THINGS = ["apples", "pencils", "stickers", "marbles", "books", "cookies", "stamps", "shells", "cards", "coins"]


def chat_arith() -> list[dict]:
    return [
        {"prompt": f"What is {a} + {b}? Reply with only the number.", "answer": str(a + b)}
        for a in range(21)
        for b in range(21)
    ]


GENERAL_PHRASINGS = [  # none of them chat_arith's "What is a + b? Reply with only the number."
    "Add {a} and {b}.",
    "What is the sum of {a} and {b}?",
    "Compute {a} plus {b}. Give just the result.",
    "{a} + {b} = ?",
    "How much is {a} added to {b}?",
    "Calculate {a} + {b}.",
    "If you have {a} and get {b} more, how many do you have?",
    "Tell me the total of {a} and {b}, as a number.",
]


def chat_arith_general() -> list[dict]:
    """chat-arith's generalisation split in a seeded order: each of GENERAL_PHRASINGS in turn for two rows, one
    with operands 0..20 (a new phrasing only), the other with one from 21 to 60 (a new range too); 882 rows."""
    rng = random.Random(SEED + 4)
    inside = [(a, b) for a in range(21) for b in range(21)]
    beyond = [(a, b) for a in range(61) for b in range(61) if max(a, b) > 20]
    rng.shuffle(inside), rng.shuffle(beyond)
    pairs = [pair for two in zip(inside, beyond) for pair in two]
    return [
        {"prompt": GENERAL_PHRASINGS[i // 2 % len(GENERAL_PHRASINGS)].format(a=a, b=b), "answer": str(a + b)}
        for i, (a, b) in enumerate(pairs)
    ]


def _problem(rng: random.Random) -> tuple[str, str, int]:
    """(question, worked solution, answer) of one word problem."""
    name, other = rng.sample(NAMES, 2)
    thing = rng.choice(THINGS)
    kind = rng.randrange(5)
    if kind == 0:
        a, b = rng.randint(2, 60), rng.randint(2, 40)
        return (
            f"{name} has {a} {thing}. {other} gives {name} {b} more. How many {thing} does {name} have now?",
            f"{name} starts with {a} {thing} and gets {b} more, so {a} + {b} = {a + b}.",
            a + b,
        )
    if kind == 1:
        a = rng.randint(10, 90)
        b = rng.randint(1, a - 1)
        return (
            f"{name} had {a} {thing} and gave {b} of them to {other}. How many {thing} does {name} have left?",
            f"{name} gives away {b} of {a} {thing}, so {a} - {b} = {a - b}.",
            a - b,
        )
    if kind == 2:
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return (
            f"{name} fills {a} bags with {b} {thing} each. How many {thing} are in the bags altogether?",
            f"{a} bags of {b} {thing} hold {a} * {b} = {a * b}.",
            a * b,
        )
    if kind == 3:
        b, q = rng.randint(2, 9), rng.randint(2, 12)
        return (
            f"{name} shares {b * q} {thing} equally among {b} friends. How many {thing} does each friend get?",
            f"{b * q} {thing} shared by {b} friends is {b * q} / {b} = {q} each.",
            q,
        )
    a, b, c = rng.randint(5, 40), rng.randint(2, 30), rng.randint(1, 20)
    c = min(c, a + b - 1)
    return (
        f"{name} has {a} {thing}, buys {b} more, then gives {c} to {other}. How many {thing} does {name} have now?",
        f"After buying, {name} has {a} + {b} = {a + b}. After giving {c} away, {a + b} - {c} = {a + b - c}.",
        a + b - c,
    )


def word_problems(count: int = 2000) -> list[dict]:
    rng = random.Random(SEED)
    rows = []
    for _ in range(count):
        question, solution, answer = _problem(rng)
        rows.append({"question": question, "answer": f"{solution}\n#### {answer}"})
    return rows


OTHER_NAMES = ["Aisha", "Bruno", "Carmen", "Dmitri", "Elif", "Felix", "Hana", "Ivan", "Kofi", "Lucia", "Mateo", "Nora"]
OTHER_THINGS = ["buttons", "tickets", "beads", "nails", "oranges", "pebbles", "balloons", "candles"]


def _other_problem(rng: random.Random) -> tuple[str, int]:
    """(question, answer) of a word problem worded as none of _problem's, with other names, other things and
    numbers up to 300 (training's stay under 110)."""
    name, other = rng.sample(OTHER_NAMES, 2)
    thing = rng.choice(OTHER_THINGS)
    kind = rng.randrange(5)
    if kind == 0:
        a, b = rng.randint(60, 300), rng.randint(40, 200)
        return f"There are {a} {thing} in a box and {name} puts in another {b}. How many {thing} are in the box?", a + b
    if kind == 1:
        a = rng.randint(90, 300)
        b = rng.randint(1, a - 1)
        return f"A shop had {a} {thing}. It sold {b} of them. How many {thing} are left in the shop?", a - b
    if kind == 2:
        a, b = rng.randint(12, 25), rng.randint(3, 12)
        return f"Each of {a} shelves holds {b} {thing}. How many {thing} do the shelves hold in total?", a * b
    if kind == 3:
        b, q = rng.randint(3, 12), rng.randint(12, 25)
        return f"{name} packs {b * q} {thing} into {b} equal boxes. How many {thing} go in each box?", q
    a, b, c = rng.randint(40, 150), rng.randint(30, 100), rng.randint(20, 60)
    return (
        f"{name} collects {a} {thing} on Monday and {b} on Tuesday, then loses {c}. How many {thing} does {name} have?",
        a + b - c,
    )


def word_problems_general(count: int = 1000) -> list[dict]:
    """word-problems' generalisation split: `count` questions of _other_problem, answers in GSM8K's form."""
    rng = random.Random(SEED + 5)
    return [{"question": q, "answer": f"#### {n}"} for q, n in (_other_problem(rng) for _ in range(count))]


def _expression(rng: random.Random) -> tuple[str, int]:
    """One 2-3 step integer expression and its value (never negative)."""
    kind = rng.randrange(4)
    a, b = rng.randint(12, 99), rng.randint(12, 99)
    if kind == 0:
        c = rng.randint(100, 999)
        return f"({a} * {b}) + {c}", a * b + c
    if kind == 1:
        c = rng.randint(100, min(999, a * b - 1))
        return f"({a} * {b}) - {c}", a * b - c
    if kind == 2:
        a, b, c = rng.randint(100, 999), rng.randint(10, 99), rng.randint(12, 99)
        return f"({a} + {b}) * {c}", (a + b) * c
    c, d = rng.randint(12, 99), rng.randint(2, 9)
    return f"{a} * {b} + {c} * {d}", a * b + c * d


def tool_arith(count: int = 2000) -> list[dict]:
    rng = random.Random(SEED + 1)
    rows = []
    for _ in range(count):
        expression, value = _expression(rng)
        prompt = f"What is {expression}? Use the calculator, then reply with only the number."
        rows.append({"prompt": prompt, "answer": str(value)})
    return rows


def _preset(name: str):
    """presets/environments/NAME.py, loaded by path: the presets stay standalone examples."""
    path = bundled.PRESETS / "environments" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"grpo_studio_preset_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lookup() -> list[dict]:
    rows = []
    for person in _preset("lookup").people():
        name = person["name"]
        rows.append(
            {
                "prompt": f"In what year was {name} born? Use the lookup tool, then reply with only the year.",
                "answer": str(person["year"]),
            }
        )
        rows.append(
            {
                "prompt": f"In what town was {name} born? Use the lookup tool, then reply with only the town.",
                "answer": person["town"],
            }
        )
    random.Random(SEED + 2).shuffle(rows)
    return rows


def guess_number(repeats: int = 10) -> list[dict]:
    rows = [{"prompt": "Guess the number.", "secret": k, "answer": str(k)} for k in range(1, 51)] * repeats
    random.Random(SEED + 3).shuffle(rows)
    return [dict(row) for row in rows]


# ---- demonstrations for the supervised warm-up (warmup.source) ---------------------------------------------
def _tool_demo(question: str, tool: str, arguments: dict, result: str, answer: str) -> dict:
    """One whole conversation: the question, the tool call, the tool's result, the answer."""
    call = {"type": "function", "function": {"name": tool, "arguments": arguments}}
    return {
        "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": tool, "content": result},
            {"role": "assistant", "content": answer},
        ]
    }


def tool_arith_demos(count: int = 500) -> list[dict]:
    calculator, rng = _preset("calculator"), random.Random(SEED + 11)
    rows = []
    for _ in range(count):
        expression, _value = _expression(rng)
        result = calculator.evaluate(expression)  # the real tool's answer
        question = f"What is {expression}? Use the calculator, then reply with only the number."
        rows.append(_tool_demo(question, "calculate", {"expression": expression}, result, result))
    return rows


def lookup_demos(count: int = 200) -> list[dict]:
    lookup_env = _preset("lookup")
    known = {p["name"].lower() for p in lookup_env.people()}
    others = [p for p in lookup_env.people(seed=SEED + 12, count=count + 40) if p["name"].lower() not in known]
    rows = []
    for person in others[:count]:
        result = lookup_env.describe(person)
        for what, answer in (("year", str(person["year"])), ("town", person["town"])):
            question = (
                f"In what {what} was {person['name']} born? Use the lookup tool, then reply with only the {what}."
            )
            rows.append(_tool_demo(question, "lookup", {"name": person["name"]}, result, answer))
    random.Random(SEED + 13).shuffle(rows)
    return rows


def word_problems_demos(count: int = 64) -> list[dict]:
    from ...rewards.builtin import SYSTEM_PROMPT  # the system prompt word-problems' rows render with

    trained = {row["question"] for row in word_problems()}
    rng, rows = random.Random(SEED + 14), []
    while len(rows) < count:
        question, solution, answer = _problem(rng)
        if question not in trained:
            reply = f"<reasoning>\n{solution}\n</reasoning>\n<answer>\n{answer}\n</answer>"
            rows.append({"messages": _conversation(SYSTEM_PROMPT, question, reply)})
    return rows


def _conversation(system: str, *turns: str) -> list[dict]:
    """A system message, then user and assistant turns alternating."""
    roles = ("user", "assistant")
    return [{"role": "system", "content": system}] + [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]


def guess_number_demos() -> list[dict]:
    game = _preset("guess_number")
    rows = []
    for secret in range(game.LOW, game.HIGH + 1):
        env, turns, done = game.GuessNumber(), [], False
        first = env.reset(secret=secret)
        while not done:  # binary search: the middle of the range the answers so far leave
            guess = str((env.low + env.high) // 2)
            replies, done, _reward, _info = env.step(guess)
            turns += [guess] + [m["content"] for m in replies]
        rows.append({"messages": _conversation(first[0]["content"], first[1]["content"], *turns)})
    return rows


def _operands(row: dict) -> frozenset:
    """chat-arith's question up to order: 'What is 7 + 4?' and 'What is 4 + 7?' are one."""
    a, b = (int(n) for n in row["prompt"].removeprefix("What is ").split("?")[0].split(" + "))
    return frozenset((a, b))


def _text(row: dict) -> str:
    return str(row.get("prompt", row.get("question")))


# the question a row asks, for holding out whole questions (guess-number's games share their text: none)
QUESTION = {
    "builtin:chat-arith": _operands,
    "builtin:word-problems": _text,
    "builtin:tool-arith": _text,
    "builtin:lookup": _text,
}


def hold_out(source: str, rows: list[dict], order: list[int], size: int) -> tuple[set[int], set[int]]:
    """(held out, trained on) row indices: `size` rows taken in `order`, each with every row asking the same
    question (QUESTION[source]); of the group that reaches `size`, the rows past it are on neither side."""
    question = QUESTION.get(source)
    if question is None:
        return set(order[:size]), set(order[size:])
    groups: dict = {}
    for i in order:
        groups.setdefault(question(rows[i]), []).append(i)
    held: list[int] = []
    for group in groups.values():  # in the order of each group's first row
        if len(held) >= size:
            break
        held += group
    held = held[:size]
    taken = {question(rows[i]) for i in held}
    return set(held), {i for i in order if question(rows[i]) not in taken}


TASKS = {
    "builtin:chat-arith": chat_arith,
    "builtin:word-problems": word_problems,
    "builtin:tool-arith": tool_arith,
    "builtin:lookup": lookup,
    "builtin:guess-number": guess_number,
    "builtin:tool-arith-demos": tool_arith_demos,
    "builtin:lookup-demos": lookup_demos,
    "builtin:word-problems-demos": word_problems_demos,
    "builtin:guess-number-demos": guess_number_demos,
}

GENERAL = {  # builtin:arith's: engine/prompts/arith.py
    "builtin:chat-arith": chat_arith_general,
    "builtin:word-problems": word_problems_general,
}
