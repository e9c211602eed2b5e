"""One row of samples.jsonl as the Samples tab shows it: a table cell, and the detail under the table.

A one-completion row: the prompt exactly as the model saw it, then the completion.

A multi-turn row (an "episode" key, engine/episodes.py) shows the episode turn by turn, readable without
colour. Every turn starts with a header line that says whether its tokens were trained:

    ▶ model · trained               then each of its lines behind "┃ "
    │ env · masked (not trained)    then each of its lines behind "│ "

and a last line "stop: <reason> — <why>". The header follows the turn's own "trained" flag, so a turn is
never called trained unless the row says so. The text of every turn, the environment's included, is shown
as-is: chat-template special tokens such as <|im_start|>tool and <|im_end|> stay in the text (nothing is
stripped into a label), and every line break is kept (an empty gutter line is an empty line of the text,
e.g. the newline an environment turn starts with), so what was masked is exactly what is shown. Colour
(green trained, dim masked) only repeats what the markers already say."""

from __future__ import annotations

from rich.text import Text

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


def detail(row: dict) -> str | Text:
    """The highlighted sample in full: the prompt exactly as the model saw it (chat template and all), then
    the completion, or the episode turn by turn (module docstring)."""
    prompt = f"prompt (as rendered):\n{row.get('prompt', '')}\n\n"
    ep = episode(row)
    if ep is None:
        return f"{prompt}completion:\n{row.get('completion', '')}"
    out = Text(prompt)
    out.append(f"episode ({summary(ep)}; the rewards score the last model turn):\n", style="bold")
    for turn in ep["turns"]:
        style = TRAINED_STYLE if turn.get("trained") else MASKED_STYLE
        out.append("\n".join(turn_lines(turn)) + "\n", style=style)
    out.append(stop_line(ep), style="bold")
    return out
