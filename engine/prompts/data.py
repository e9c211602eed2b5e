"""Prompts: the built-in arithmetic task, local JSONL/JSON/CSV/Parquet files, Hugging Face datasets.

`load_rows(data, split)` returns rows as dicts with TRL-style columns: `prompt` (text, or chat
messages for conversational data) and `answer` (the reference), plus every other column of the
source, which reward functions receive as keyword arguments.

    GSM8K format   rows with `question` and `answer` = "...#### 72" are understood as is:
                   prompt = [system: the reasoning prompt, user: question], answer = "72"
    column mapping data.prompt_column / data.answer_column name the source columns
    eval split     data.eval_split (a HF split) or a seeded held-out slice of data.eval_size rows
                   (-1 = auto: 200 for a built-in task, none for other data; `eval_size(data)`)
    eval source    data.eval_source: a file or a HF dataset (its split data.eval_split) whose rows are the eval
                   rows, read and normalised as data.source's are; data.source is then trained on whole

prompt_render.py renders a row's prompt for the model (data.chat_template) and checks its length.
`PromptStream` walks the rows in a seeded order with a cursor that checkpoints save; `mix_seed`
derives every per-epoch, per-step and per-prompt seed from a run's seed.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import random
import stat
from pathlib import Path

from ...contract.config import DataConfig
from ...contract.errors import UserError, describe, did_you_mean, user_path
from . import arith, tasks
from .prompt_render import BuiltMessages, kind_of, message_problem

EVAL_SEED = 1234
FILE_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
BUILTIN_EVAL_SIZE = 200  # a built-in task's held-out rows under data.eval_size = -1 (auto)
BUILTIN = ["builtin:arith", *tasks.TASKS]

_cache: dict[tuple, list[dict]] = {}


def _err(key: str, value, why: str) -> UserError:
    return UserError(why, key=f"data.{key}", value=value)


# ---- reading sources ----------------------------------------------------------------------------


class _Twice(ValueError):
    """A record or a header names one column twice (the reader would keep one of them silently)."""


def _object(pairs: list[tuple]) -> dict:
    """json's object hook: a dict, refusing a key given twice."""
    obj = dict(pairs)
    if len(obj) < len(pairs):
        seen: set = set()
        raise _Twice(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return obj


def _refuse_twice(names: list, source: str, where: str) -> None:
    try:
        _object([(n, None) for n in names])
    except _Twice as err:
        raise _err("source", source, f"{where} names column {err.args[0]!r} twice") from None


def _json(text: str, source: str, where: str):
    try:
        return json.loads(text, object_pairs_hook=_object)
    except _Twice as err:
        raise _err("source", source, f"{where} names {err.args[0]!r} twice") from None
    except json.JSONDecodeError as err:
        raise _err("source", source, f"{where} is not valid JSON ({err.msg})") from None
    except RecursionError:
        raise _err("source", source, f"{where} nests deeper than Python's JSON reader allows") from None
    except ValueError as err:  # an integer over 4,300 digits
        raise _err("source", source, f"{where} is not valid JSON ({describe(err)})") from None


def _read_file(path: Path, source: str) -> list[dict]:
    """A file's records; a UTF-8 byte-order mark (Excel's CSV) is not part of the first column's name."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            _refuse_twice(pq.read_schema(path).names, source, "the file")  # read_table fails on them unnamed
            return pq.read_table(path).to_pylist()
        if suffix == ".csv":
            csv.field_size_limit(1 << 30)  # the default 128 KiB refuses a long prompt as a malformed file
            with path.open(newline="", encoding="utf-8-sig") as fh:
                reader = csv.DictReader(fh)
                _refuse_twice(reader.fieldnames or [], source, "the header")
                rows = [dict(r) for r in reader]
                width = len(reader.fieldnames or [])
            for number, row in enumerate(rows, 1):
                if None in row:  # DictReader's key for the fields past the header's
                    raise _err("source", source, f"row {number} has more fields than the header's {width}")
                if None in row.values():  # DictReader's value for the header's fields past the row's
                    raise _err("source", source, f"row {number} has fewer fields than the header's {width}")
            return rows
        text = path.read_text(encoding="utf-8-sig")  # universal newlines: \r\n and \r read as \n
        if suffix == ".json" and text.lstrip().startswith("["):
            rows = _json(text, source, "the file")
            lines = None
        else:  # a line ends at \n only: U+2028, U+0085 or a form feed is text inside a JSON string
            rows, lines = [], []
            for n, line in enumerate(text.split("\n"), 1):
                if line.strip():
                    rows.append(_json(line, source, f"line {n}"))
                    lines.append(n)
    except UserError:
        raise
    except Exception as err:  # unreadable parquet, bad encoding, ...
        raise _err("source", source, f"cannot read the file ({describe(err)})") from None
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            where = f"line {lines[i]}" if lines else f"record {i + 1}"
            raise _err(
                "source", source, f"{where} is {kind_of(row)}; every record must be an object with named columns"
            )
    return FileRows(rows, lines)


class FileRows(list):
    """A file's rows, with the file line each JSONL row was read from (`lines`, None for other files), so a
    row's refusal can name the line a parse error would: "row 3 (line 5)" where blank lines set them apart."""

    def __init__(self, rows: list[dict], lines: list[int] | None):
        super().__init__(rows)
        self.lines = lines


def _row_where(rows: list[dict], number: int) -> str:
    """ "row N", with its file line where it differs (FileRows)."""
    lines = getattr(rows, "lines", None)
    line = lines[number - 1] if lines else number
    return f"row {number}" if line == number else f"row {number} (line {line})"


def not_regular(path: Path) -> str | None:
    """What `path` is when it exists but is not a regular file (stat follows a link; never opened, so a FIFO
    never blocks): "a FIFO", "a link to a device", "a folder"; None for a regular file or no file."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        kind = "a device"
    return f"not a regular file ({'a link to ' * path.is_symlink()}{kind})"


def _read_hub(data: DataConfig, split: str) -> list[dict]:
    try:
        import datasets
    except ImportError:
        raise _err(
            "source",
            data.source,
            "the 'datasets' package is not installed; pip install datasets, or give a local .jsonl/.csv/.parquet file",
        ) from None
    try:
        ds = datasets.load_dataset(data.source, data.subset or None, split=split)
    except Exception as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        raise _err(
            "source",
            data.source,
            f"could not load this Hugging Face dataset (split {split!r}): {reason}; "
            f"offline? save it as a local .jsonl/.csv/.parquet file and set "
            f"data.source to that path",
        ) from None
    return [dict(r) for r in ds]


def _is_file(source: str, key: str = "data.source") -> bool:
    """Whether `source` (data.source, or `key`'s value) names a local file (by its suffix, or because the path
    exists)."""
    with user_path(key, source):
        path = Path(source).expanduser()
        return path.suffix.lower() in FILE_SUFFIXES or path.exists()


def _source_rows(data: DataConfig, split_name: str) -> list[dict]:
    with user_path("data.source", data.source):  # a name too long, a NUL byte, '~nosuchuser/x'
        path = Path(data.source).expanduser()
        if _is_file(data.source):
            if not path.is_file():
                raise _err(
                    "source",
                    data.source,
                    f"{not_regular(path) or 'file not found'}; allowed: builtin:arith, a .jsonl/.json/.csv/"
                    ".parquet file, or a Hugging Face dataset id like 'openai/gsm8k'",
                )
            if path.suffix.lower() not in FILE_SUFFIXES:
                raise _err(
                    "source", data.source, f"unsupported file type {path.suffix!r}; allowed: {', '.join(FILE_SUFFIXES)}"
                )
            key = (str(path.resolve()), path.stat().st_mtime_ns)
            if key not in _cache:
                _cache[key] = _read_file(path, data.source)
            return _cache[key]
    if data.source in tasks.TASKS:
        if data.source not in _cache:
            _cache[data.source] = tasks.TASKS[data.source]()
        return _cache[data.source]
    if data.source.startswith("builtin:"):
        raise _err(
            "source",
            data.source,
            f"unknown built-in task; allowed: {', '.join(BUILTIN)}{did_you_mean(data.source, BUILTIN)}",
        )
    key = (data.source, data.subset, split_name)
    if key not in _cache:
        _cache[key] = _read_hub(data, split_name)
    return _cache[key]


def source_rows(source: str, key: str) -> list[dict]:
    """The rows of a dataset named as data.source names one (a built-in task, a file, a Hub id), read for
    another key (warmup.source), whose mistakes then name that key."""
    try:
        return _source_rows(DataConfig(source=source), "train")
    except UserError as err:
        if err.key != "data.source":
            raise
        raise UserError(err.why, key=key, value=source, allowed=err.allowed) from None


# ---- normalising rows ---------------------------------------------------------------------------


def is_gsm8k(rows: list[dict]) -> bool:
    """GSM8K format: `question` and `answer` columns, answers ending in '#### N'."""
    head = rows[:20]
    return bool(head) and all("question" in r and "####" in str(r.get("answer", "")) for r in head)


def _columns(row: dict) -> str:
    return ", ".join(map(str, row))


def _prompt_column(data: DataConfig, rows: list[dict]) -> str:
    if data.prompt_column in rows[0]:
        return data.prompt_column
    if data.prompt_column == "prompt":  # the default: fall back to the usual names
        for alt in ("question", "problem", "instruction", "input"):
            if alt in rows[0]:
                return alt
    raise _err("prompt_column", data.prompt_column, f"no such column in {data.source}; columns: {_columns(rows[0])}")


SYSTEM_CHOICES = ("auto", "default", "none")  # data.system_prompt's named values; any other text is the prompt


def system_prompt(data: DataConfig, gsm8k: bool) -> str:
    """The system message the loader adds, "" for none: 'auto' = the reasoning prompt for GSM8K-format data;
    'default' (or "") and 'none' add none ('none' also keeps the template's own default out, at render time)."""
    from ...rewards.builtin import SYSTEM_PROMPT

    if data.system_prompt == "auto":
        return SYSTEM_PROMPT if gsm8k else ""
    return "" if data.system_prompt in SYSTEM_CHOICES else data.system_prompt


def normalize(rows: list[dict], data: DataConfig, environment: bool = False) -> list[dict]:
    """Source rows -> rows with `prompt` and `answer` (see the module doc); `environment`: an environment's reset
    completes each prompt, so an empty one is allowed (TRL's placeholder prompts when it owns the data)."""
    if not rows:
        raise _err("source", data.source, "the dataset has no rows")
    _refuse_ragged(rows, data)
    gsm8k = is_gsm8k(rows)
    pcol, acol = _prompt_column(data, rows), data.answer_column
    if acol not in rows[0] and acol != "answer":
        raise _err("answer_column", acol, f"no such column in {data.source}; columns: {_columns(rows[0])}")
    system = system_prompt(data, gsm8k)
    out = []
    for number, row in enumerate(rows, 1):
        where = _row_where(rows, number)
        new, prompt = dict(row), _prompt(row.get(pcol), where, pcol, data, environment)
        _refuse_unencodable(row, where, data)
        if isinstance(prompt, str) and system:
            prompt = BuiltMessages([{"role": "system", "content": system}, {"role": "user", "content": prompt}])
        elif isinstance(prompt, list) and system and prompt[0]["role"] != "system":
            prompt = [{"role": "system", "content": system}, *prompt]
        new["prompt"] = prompt
        if acol in row:
            answer = row[acol]
            if gsm8k and acol == "answer" or "####" in str(answer):
                answer = str(answer).split("####")[-1].strip().replace(",", "")
            new["answer"] = answer
        out.append(new)
    return out


def _refuse_ragged(rows: list[dict], data: DataConfig) -> None:
    """Every row has the first row's columns and no other (reward functions receive each column for every
    row): the first row that differs is refused naming the column."""
    first = rows[0].keys()
    for number, row in enumerate(rows[1:], 2):
        if row.keys() == first:
            continue
        before = "row 1" if number == 2 else f"rows 1-{number - 1}"
        missing = [c for c in first if c not in row]
        if missing:
            why = f"has no column {missing[0]!r} ({before} {'has' if number == 2 else 'have'} it)"
        else:
            extra = next(c for c in row if c not in first)
            why = f"has a column {extra!r} that {before} {'lacks' if number == 2 else 'lack'}"
        raise _err("source", data.source, f"{_row_where(rows, number)} {why}")


def _prompt(value, where: str, column: str, data: DataConfig, environment: bool = False) -> str | list[dict]:
    """A row's prompt: text, or a list of chat messages (prompt_render.message_problem); anything else, an
    empty one (unless an environment completes it), or messages that are not a chat are refused naming the row."""
    if isinstance(value, (list, tuple)):
        problem = message_problem(value)
        if problem:
            raise _err("source", data.source, f"{where}, column {column!r}: {problem}")
        text = "".join(m["content"] for m in value)
        value = list(value)
    elif value is None or isinstance(value, str):
        text = value = value or ""
    else:
        raise _err(
            "source",
            data.source,
            f"{where}, column {column!r} holds {kind_of(value)}; allowed: text or a list of chat messages",
        )
    if not text.strip() and not environment:
        raise _err("source", data.source, f"{where} has an empty prompt (column {column!r})")
    return value


def _refuse_unencodable(row: dict, where: str, data: DataConfig) -> None:
    """Text no tokenizer can take (a lone surrogate such as '\\ud800', which JSON escapes can spell) in any
    column, at any depth, refused naming the row and the column."""
    stack = [*row.items(), *((column, column) for column in row if isinstance(column, str))]
    while stack:
        column, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as err:
                raise _err(
                    "source",
                    data.source,
                    f"{where}, column {column!r}: text that cannot be encoded as UTF-8 ({err.reason}: "
                    f"{value[err.start]!r} at character {err.start}); allowed: valid Unicode text",
                ) from None
        elif isinstance(value, dict):
            stack += [(column, v) for v in value.values()]
            stack += [(column, k) for k in value if isinstance(k, str)]
        elif isinstance(value, (list, tuple)):
            stack += [(column, v) for v in value]


def eval_size(data: DataConfig) -> int:
    """Rows held out for evaluation: data.eval_size, or for -1 (auto) the bundled recipe's 200 held-out
    built-in task's rows and none of a user's data (as TRL, which holds out nothing unless asked); none with
    data.eval_source, whose rows are the eval rows (config_rules refuses a size > 0 beside it)."""
    if data.eval_source:
        return 0
    if data.eval_size >= 0:
        return data.eval_size
    return BUILTIN_EVAL_SIZE if data.source in BUILTIN else 0


GENERAL_SOURCES = ["builtin:arith", *tasks.GENERAL]  # the built-in tasks with a generalisation split


def general_size(data: DataConfig) -> int:
    """Rows of the generalisation split (engine/prompts/tasks.py): data.general_size, or for -1 (auto) 200 where
    the task has one; a size the task cannot give is refused in one line."""
    has = data.source in GENERAL_SOURCES
    if data.general_size < 0:
        return BUILTIN_EVAL_SIZE if has else 0
    if data.general_size and not has:
        raise _err(
            "general_size",
            data.general_size,
            f"{data.source} has no generalisation split; allowed: 0 or -1 (auto), or a data.source of "
            f"{', '.join(GENERAL_SOURCES)}",
        )
    pool = len(_general_rows(data.source))
    if data.general_size > pool:
        raise _err(
            "general_size",
            data.general_size,
            f"{data.source}'s generalisation split has {pool} rows; allowed: 0 to {pool}",
        )
    return data.general_size


def _general_rows(source: str) -> list[dict]:
    if source == "builtin:arith":
        return arith.rows("general", len(arith.general_pairs()))
    if (source, "general") not in _cache:
        _cache[source, "general"] = tasks.GENERAL[source]()
    return _cache[source, "general"]


def split_summary(data: DataConfig, train: list[dict], evals: list[dict], general: list[dict] = ()) -> str:
    """The `info` event line that says what a run trains and evaluates on."""
    if data.eval_source:
        held = f"{len(evals)} eval rows from data.eval_source"
    elif data.eval_split:
        held = f"{len(evals)} eval rows from split {data.eval_split!r}"
    elif evals:
        held = f"{len(evals)} held out for evaluation (data.eval_size)"
    else:
        held = "no held-out rows (set data.eval_size to hold some out)"
    beside = f", {len(general)} of the generalisation split (data.general_size)" if general else ""
    return f"data: {len(train)} training rows, {held}{beside}"


def load_rows(data: DataConfig, split: str, environment: bool = False) -> list[dict]:
    """Rows of the 'train', 'eval' or 'general' (generalisation) split; `environment`: see normalize."""
    _refuse_hub_only_keys(data)
    if split == "general":
        size = general_size(data)
        return normalize(_general_rows(data.source)[:size], data) if size else []
    if split == "eval" and data.eval_source:
        return _eval_source_rows(data, environment)
    if data.source == "builtin:arith":  # read as a file's rows are: columns, system prompt
        _check_eval_size(data, len(arith.all_pairs()))
        rows = arith.rows(split, eval_size(data))
        return normalize(rows, data) if rows else []
    if split == "eval" and data.eval_split:
        return normalize(_source_rows(data, data.eval_split), data, environment)
    source = _source_rows(data, data.split)
    rows = normalize(source, data, environment)
    if data.eval_split or data.eval_source:  # a separate eval split or source: train on everything
        return rows if split == "train" else []
    _check_eval_size(data, len(rows))
    order = list(range(len(rows)))
    random.Random(EVAL_SEED).shuffle(order)
    held, trained = tasks.hold_out(data.source, source, order, eval_size(data))  # a built-in task: whole questions
    return [r for i, r in enumerate(rows) if i in (held if split == "eval" else trained)]


def _refuse_hub_only_keys(data: DataConfig) -> None:
    """data.split, data.subset and data.eval_split pick parts of a Hugging Face dataset: a file or a built-in
    task has none, and reading one of them anyway would train (or evaluate) on the whole of it. data.eval_split
    is data.eval_source's split where that is set."""
    for key, value, unset, source in (
        ("split", data.split, "train", "source"),
        ("subset", data.subset, "", "source"),
        ("eval_split", data.eval_split, "", "eval_source" if data.eval_source else "source"),
    ):
        named = getattr(data, source)
        if value == unset or not named.startswith("builtin:") and not _is_file(named, f"data.{source}"):
            continue
        what = "a built-in task" if named.startswith("builtin:") else "a file"
        instead = "" if source == "eval_source" else " (hold rows out with data.eval_size)"
        raise _err(
            key,
            value,
            f"picks a part of a Hugging Face dataset and data.{source} = {named!r} is {what}; "
            f"allowed: {unset!r}{instead}",
        )


def _eval_source_rows(data: DataConfig, environment: bool) -> list[dict]:
    """data.eval_source's rows, normalised as data.source's (its columns, its system prompt): a file, or a
    Hugging Face dataset's data.eval_split (with data.subset). A mistake in them is one line naming data.eval_source."""
    source = data.eval_source
    allowed = "allowed: a .jsonl/.json/.csv/.parquet file, or a Hugging Face dataset id with data.eval_split"
    if source.startswith("builtin:"):
        raise _err("eval_source", source, f"a built-in task holds its evaluation rows out itself; {allowed}")
    if _is_file(source, "data.eval_source"):
        path = Path(source).expanduser()
        if not path.is_file():
            raise _err("eval_source", source, f"{not_regular(path) or 'file not found'}; {allowed}")
    elif not data.eval_split:
        raise _err(
            "eval_split",
            "",
            f"data.eval_source = {source!r} names a Hugging Face dataset; name its split, e.g. 'test'",
        )
    as_source = dataclasses.replace(data, source=source)
    try:
        return normalize(_source_rows(as_source, data.eval_split), as_source, environment)
    except UserError as err:
        if err.key != "data.source":
            raise
        raise UserError(err.why, key="data.eval_source", value=source, allowed=err.allowed) from None


def _check_eval_size(data: DataConfig, n_rows: int) -> None:
    size = eval_size(data)
    if size and size >= n_rows:
        hub = not data.source.startswith("builtin:") and not _is_file(data.source)
        raise _err(
            "eval_size",
            data.eval_size,
            f"{data.source} has {n_rows} rows; allowed: 0 to {n_rows - 1} "
            f"(rows held out for evaluation){', or set data.eval_split' * hub}",
        )


# ---- the prompt stream --------------------------------------------------------------------------


def mix_seed(seed: int, k: int) -> int:
    """Seed number k derived from `seed` (epoch, step, prompt offset): seed · 1_000_003 + k, so the
    streams of different run seeds stay apart for k below the prime 1_000_003."""
    return seed * 1_000_003 + k


class PromptStream:
    """Seeded shuffled epochs over `rows`; `state()`/`restore()` make resume exact."""

    def __init__(self, rows: list[dict], seed: int):
        if not rows:
            raise UserError("no training rows left after holding out the eval split", key="data.eval_size")
        self.rows, self.seed = rows, seed
        self.epoch, self.index = 0, 0
        self._order = self._shuffled(0)

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        random.Random(mix_seed(self.seed, epoch)).shuffle(order)
        return order

    def take(self, k: int) -> list[dict]:
        batch = []
        while len(batch) < k:
            if self.index >= len(self._order):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._shuffled(self.epoch)
            batch.append(self.rows[self._order[self.index]])
            self.index += 1
        return batch

    def state(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    def restore(self, state: dict) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self._order = self._shuffled(self.epoch)
