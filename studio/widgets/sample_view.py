"""One row of samples.jsonl as the Samples tab shows it: a table cell, and the detail under the table.

A one-completion row: the prompt exactly as the model saw it, then the completion.

A multi-turn row (an "episode" key, engine/rollout/episodes.py) shows the episode turn by turn, readable without
colour. Every turn starts with a header line that says whether its tokens were trained:

    ▶ model · trained               then each of its lines behind "┃ "
    │ env · masked (not trained)    then each of its lines behind "│ "

and a last line "stop: <reason> — <why>". The header follows the turn's own "trained" flag, so a turn is
never called trained unless the row says so. The text of every turn, the environment's included, is shown
as-is: chat-template special tokens such as <|im_start|>tool and <|im_end|> stay in the text (nothing is
stripped into a label), and every line break is kept (an empty gutter line is an empty line of the text,
e.g. the newline an environment turn starts with), so what was masked is exactly what is shown. Colour
(green trained, dim masked) only repeats what the markers already say.

A one-completion row written with its token counts (engine/rollout/sample_rows.py) shows the completion behind the
same gutters: "┃ " when its tokens were trained, "│ " when none were (e.g. cut at max_completion_len with
algo.mask_truncated_completions), and ⟦ ⟧ around the text of tokens left out of an otherwise trained one.
Above it, one line: the step, the group (its size and reward range), the advantage and each reward.

Filters (FILTERS, applied on the run's samples index: contract/samples_index.SamplesIndex.order): all (newest
first), best and worst (by advantage), zero-variance groups (every advantage of the group 0, the doctor's test:
contract/diagnosis.no_signal), truncated; and a search of prompt and text (SamplesIndex.search)."""

from __future__ import annotations

from rich.text import Text

from ...contract.diagnosis import no_signal  # the doctor's zero-variance group
from ...contract.metrics import fmt

TRAINED_GUTTER, MASKED_GUTTER = "┃ ", "│ "
TRAINED_STYLE, MASKED_STYLE = "green", "dim"


def episode(row: dict) -> dict | None:
    """The row's episode, or None for a one-completion row."""
    ep = row.get("episode")
    return ep if isinstance(ep, dict) and isinstance(ep.get("turns"), list) else None


def header(turn: dict) -> str:
    role = str(turn.get("role", "env"))
    return f"▶ {role} · trained" if turn.get("trained") else f"│ {role} · masked (not trained)"


def stop_line(ep: dict) -> str:
    why = ep.get("why")
    return f"stop: {ep.get('stop', '?')}" + (f" — {why}" if why else "")


def turn_lines(turn: dict) -> list[str]:
    """The header, then the turn's text line by line behind its gutter (empty lines keep a bare gutter)."""
    gutter = TRAINED_GUTTER if turn.get("trained") else MASKED_GUTTER
    return [header(turn)] + [(gutter + line).rstrip() for line in str(turn.get("text", "")).split("\n")]


def summary(ep: dict) -> str:
    turns = ep["turns"]
    model = sum(1 for t in turns if t.get("role") == "model")
    return f"{model} model turn{'s' * (model != 1)}, {len(turns) - model} env"


def table_cell(row: dict) -> str:
    """The table's completion cell: an episode's is led by its turns and stop reason."""
    text = repr(row.get("completion", ""))[1:-1]
    ep = episode(row)
    if ep is not None:
        text = f"[{summary(ep)} · {ep.get('stop', '?')}] {text}"
    return text[:120]


FILTERS = {"a": "all", "b": "best", "w": "worst", "z": "zero-variance", "t": "truncated"}


def scores_line(row: dict, group: list[dict]) -> str:
    rewards = [sum(v for v in (r.get("rewards") or {}).values() if v is not None) for r in group]
    where = f"step {row.get('step', '?')}"
    if row.get("group") is not None:
        spread = "all equal: zero variance" if no_signal(group) else f"{fmt(min(rewards))} … {fmt(max(rewards))}"
        where += f" · group {row['group']} ({len(group)} completions, rewards {spread})"
    parts = [where, f"advantage {fmt(row.get('advantage'))}"]
    parts += [f"{name} {fmt(value)}" for name, value in (row.get("rewards") or {}).items()]
    return " · ".join(parts)


def completion_lines(row: dict) -> tuple[str, list[str]]:
    """The completion's header and its lines behind their gutters (module docstring)."""
    text, n, trained = str(row.get("completion", "")), row["tokens"], row.get("trained", row["tokens"])
    cut = ", cut at max_completion_len" if row.get("truncated") else ""
    if trained == 0 and n:
        return f"completion ({n} tokens{cut}; none trained):", [(MASKED_GUTTER + x).rstrip() for x in text.split("\n")]
    marked, at = "", 0
    for start, end in row.get("masked", []):
        marked += text[at:start] + "⟦" + text[start:end] + "⟧"
        at = end
    marked += text[at:]
    what = "all trained" if trained == n else f"{trained} trained, ⟦ ⟧ masked"
    return f"completion ({n} tokens{cut}; {what}):", [(TRAINED_GUTTER + x).rstrip() for x in marked.split("\n")]


def detail(row: dict, group: list[dict] | None = None) -> str | Text:
    """The highlighted sample in full: the prompt exactly as the model saw it (chat template and all), its
    scores, then the completion, or the episode turn by turn (module docstring)."""
    prompt = f"prompt (as rendered):\n{row.get('prompt', '')}\n\n"
    if "tokens" in row:
        prompt += scores_line(row, group or [row]) + "\n"
    ep = episode(row)
    if ep is None:
        if "tokens" not in row:  # a row written before samples held token counts
            return f"{prompt}completion:\n{row.get('completion', '')}"
        head, lines = completion_lines(row)
        return prompt + "\n".join([head, *lines])
    out = Text(prompt)
    out.append(f"episode ({summary(ep)}; the rewards score the last model turn):\n", style="bold")
    for turn in ep["turns"]:
        style = TRAINED_STYLE if turn.get("trained") else MASKED_STYLE
        out.append("\n".join(turn_lines(turn)) + "\n", style=style)
    out.append(stop_line(ep), style="bold")
    return out
