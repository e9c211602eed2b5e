"""The fault suite's hostile cases for data (benchmarks/fault_probes.py says how they run): data files a careless
export or a stranger's dataset gives `data.source`. Byte-order marks, CRLF and long fields are read as the text
they hold; lone surrogates, malformed message lists, prompts that are not text, columns named twice and broken
records are refused in one line naming the row (engine/prompts/data.py, prompt_render.message_problem)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from .fault_cases import Case, train
from .fault_probes import Probe

CATEGORY = "data"
ROLES = "allowed: system, developer, user, assistant, tool"
ALLOWED_SOURCES = (
    "allowed: builtin:arith, a .jsonl/.json/.csv/.parquet file, or a Hugging Face dataset id like 'openai/gsm8k'"
)


def _rows(path: Path, *sets: str) -> list[dict]:
    from ..contract.config import load
    from ..engine.prompts import data

    return data.load_rows(load("tiny-arith", [f"data.source={path}", "data.eval_size=0", *sets]).data, "train")


def _write(path: Path, content: bytes | str) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8", errors="surrogatepass")
    return path


def jsonl(*rows) -> str:
    """JSONL text; json.dumps keeps a lone surrogate as its \\ud800 escape, as a real file spells it."""
    return "".join(json.dumps(r) + "\n" for r in rows)


def refused(name: str, content: bytes | str | None, why: str) -> Callable[[Path], str | None]:
    """A check: reading the file `name` is refused with exactly `data.source = '<path>': <why>`."""

    def check(tmp: Path) -> str | None:
        from ..contract.errors import UserError

        path = tmp / name if content is None else _write(tmp / name, content)  # None: made by the caller
        try:
            rows = _rows(path)
        except UserError as err:
            want = f"config error: data.source = '{path}': {why}"
            return None if str(err) == want else f"said {str(err)[:300]!r}, expected {want[:300]!r}"
        return f"read {len(rows)} rows, the first {rows[0]!r:.160}"

    return check


def reads(name: str, content: bytes | str, first: dict, count: int) -> Callable[[Path], str | None]:
    """A check: the file reads as `count` rows, the first one's source columns equal to `first`."""

    def check(tmp: Path) -> str | None:
        rows = _rows(_write(tmp / name, content))
        got = {k: v for k, v in rows[0].items() if k in first}
        return None if got == first and len(rows) == count else f"read {len(rows)} rows, the first {rows[0]!r:.200}"

    return check


def _parquet(columns: dict[str, list], names: list[str] | None = None) -> Callable[[Path], bytes]:
    def build() -> bytes:
        import io

        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_arrays([pa.array(v) for v in columns.values()], names=names or list(columns))
        out = io.BytesIO()
        pq.write_table(table, out)
        return out.getvalue()

    return build


def parquet_refused(name: str, build: Callable[[], bytes], why: str) -> Callable[[Path], str | None]:
    def check(tmp: Path) -> str | None:
        return refused(name, build(), why)(tmp)

    return check


def not_a_file(name: str, make: Callable[[Path], None], kind: str) -> Callable[[Path], str | None]:
    """A check: data.source a path that is not a regular file, refused saying what it is, never opened."""

    def check(tmp: Path) -> str | None:
        make(tmp / name)
        return refused(name, None, f"not a regular file ({kind}); {ALLOWED_SOURCES}")(tmp)

    return check


def user(text) -> dict:
    return {"role": "user", "content": text}


GOOD = {"prompt": "1+1=", "answer": "2"}
TEN_THOUSAND = [user("x") if i % 2 == 0 else {"role": "assistant", "content": "y"} for i in range(10_000)]


def probes() -> list[Probe]:
    row = "row 2, column 'prompt'"
    cases: dict[str, Callable[[Path], str | None]] = {
        "CSV with a byte-order mark": reads("bom.csv", "\ufeffprompt,answer\n1+1=,2\n", GOOD, 1),
        "JSONL with a byte-order mark": reads("bom.jsonl", "\ufeff" + jsonl(GOOD), GOOD, 1),
        "JSON array with a byte-order mark": reads("bom.json", "\ufeff" + json.dumps([GOOD, GOOD]), GOOD, 2),
        "CSV in CRLF with a CRLF inside a field": reads(
            "crlf.csv", 'prompt,answer\r\n"1+\r\n1=",2\r\n', {"prompt": "1+\r\n1=", "answer": "2"}, 1
        ),
        "JSONL in CRLF with blank lines": reads("crlf.jsonl", "\r\n" + jsonl(GOOD).replace("\n", "\r\n") * 2, GOOD, 2),
        "a 1 MiB CSV field": reads(
            "long.csv", "prompt,answer\n" + "7" * (1 << 20) + ",2\n", {"prompt": "7" * (1 << 20)}, 1
        ),
        "an escaped NUL in a prompt": reads(
            "nul.jsonl", jsonl({"prompt": "1\u00001=", "answer": "2"}), {"prompt": "1\u00001="}, 1
        ),
        "a lone surrogate in a prompt": refused(
            "surrogate.jsonl",
            jsonl(GOOD, {"prompt": "1+1=\ud800", "answer": "2"}),
            f"{row}: text that cannot be encoded as UTF-8 (surrogates not allowed: '\\ud800' at character 4); "
            "allowed: valid Unicode text",
        ),
        "a lone surrogate in a message": refused(
            "surrogate_msg.jsonl",
            jsonl(GOOD, {"prompt": [user("hi \udfff")], "answer": "2"}),
            f"{row}: text that cannot be encoded as UTF-8 (surrogates not allowed: '\\udfff' at character 3); "
            "allowed: valid Unicode text",
        ),
        "a lone surrogate in another column": refused(
            "surrogate_answer.jsonl",
            jsonl(GOOD, {"prompt": "1+1=", "answer": "\ud83d"}),
            "row 2, column 'answer': text that cannot be encoded as UTF-8 (surrogates not allowed: '\\ud83d' at "
            "character 0); allowed: valid Unicode text",
        ),
        "raw NUL bytes in a JSONL line": refused(
            "nul_raw.jsonl",
            b'{"prompt": "1+1=", \x00"answer": "2"}\n',
            "line 1 is not valid JSON (Expecting property name enclosed in double quotes)",
        ),
        "a CSV in Latin-1": refused(
            "latin1.csv",
            "prompt,answer\ncaf\u00e9,2\n".encode("latin-1"),
            "cannot read the file (not UTF-8 text (byte 0xe9 at offset 17))",
        ),
        "a row of empty CSV fields": refused(
            "empty.csv", "prompt,answer\n1+1=,2\n,\n", "row 2 has an empty prompt (column 'prompt')"
        ),
        "a CSV row longer than its header": refused(
            "wide.csv", "prompt,answer\n1+1=,2\n2+2=,4,extra\n", "row 2 has more fields than the header's 2"
        ),
        "a column named twice in a CSV header": refused(
            "twice.csv", "prompt,answer,prompt\na,1,b\n", "the header names column 'prompt' twice"
        ),
        "a key named twice in a JSONL record": refused(
            "twice.jsonl", '{"prompt": "a", "answer": "1", "prompt": "b"}\n', "line 1 names 'prompt' twice"
        ),
        "an empty record": refused(
            "empty_record.jsonl", jsonl(GOOD, {}), "row 2 has no column 'prompt' (row 1 has it)"
        ),
        "a null record": refused(
            "null.jsonl", jsonl(GOOD) + "null\n", "line 2 is null; every record must be an object with named columns"
        ),
        "an integer of 5,000 digits": refused(
            "bigint.jsonl",
            '{"prompt": "a", "answer": ' + "9" * 5000 + "}\n",
            "line 1 is not valid JSON (ValueError: Exceeds the limit (4300 digits) for integer string conversion: "
            "value has 5000 digits; use sys.set_int_max_str_digits() to increase the limit)",
        ),
        "nesting 100,000 deep": refused(
            "deep.jsonl",
            '{"prompt": "a", "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
            "line 1 nests deeper than Python's JSON reader allows",
        ),
        "a prompt column of numbers": refused(
            "numbers.jsonl",
            jsonl({"prompt": 12, "answer": "2"}),
            "row 1, column 'prompt' holds a number; allowed: text or a list of chat messages",
        ),
        "a prompt that is one message, not a list": refused(
            "one_message.jsonl",
            jsonl(GOOD, {"prompt": user("hi"), "answer": "2"}),
            f"{row} holds an object; allowed: text or a list of chat messages",
        ),
        "an empty message list": refused(
            "empty_list.jsonl", jsonl(GOOD, {"prompt": [], "answer": "2"}), f"{row}: the message list is empty"
        ),
        "a message without a role": refused(
            "no_role.jsonl",
            jsonl(GOOD, {"prompt": [{"content": "hi"}], "answer": "2"}),
            f"{row}: message 1 has no role; {ROLES}",
        ),
        "ShareGPT's from/value messages": refused(
            "sharegpt.jsonl",
            jsonl(GOOD, {"prompt": [{"from": "human", "value": "hi"}], "answer": "2"}),
            f"{row}: message 1 has no role (ShareGPT's from/value: rename them role/content); {ROLES}",
        ),
        "an unknown role": refused(
            "role.jsonl",
            jsonl(GOOD, {"prompt": [user("a"), {"role": "human", "content": "hi"}], "answer": "2"}),
            f"{row}: message 2 has role 'human'; {ROLES}",
        ),
        "None content": refused(
            "none_content.jsonl",
            jsonl(GOOD, {"prompt": [{"role": "user", "content": None}], "answer": "2"}),
            f'{row}: message 1 (user) has content null; allowed: text ("" for none)',
        ),
        "int content": refused(
            "int_content.jsonl",
            jsonl(GOOD, {"prompt": [user(7)], "answer": "2"}),
            f'{row}: message 1 (user) has content a number; allowed: text ("" for none)',
        ),
        "a message without content": refused(
            "no_content.jsonl",
            jsonl(GOOD, {"prompt": [{"role": "user"}], "answer": "2"}),
            f'{row}: message 1 (user) has no content; allowed: text ("" for none)',
        ),
        "nested message lists": refused(
            "nested.jsonl",
            jsonl(GOOD, {"prompt": [[user("hi")]], "answer": "2"}),
            f"{row}: message 1 is a list of 1, not an object with role and content",
        ),
        "only system turns": refused(
            "system_only.jsonl",
            jsonl(GOOD, {"prompt": [{"role": "system", "content": "be brief"}], "answer": "2"}),
            f"{row}: no user turn (roles: system)",
        ),
        "only assistant turns": refused(
            "assistant_only.jsonl",
            jsonl(GOOD, {"prompt": [{"role": "assistant", "content": "4"}] * 2, "answer": "2"}),
            f"{row}: no user turn (roles: assistant)",
        ),
        "messages with only whitespace": refused(
            "blank_messages.jsonl",
            jsonl(GOOD, {"prompt": [user(" \n")], "answer": "2"}),
            "row 2 has an empty prompt (column 'prompt')",
        ),
        "a 10,000-message row": reads(
            "long_chat.jsonl", jsonl({"prompt": TEN_THOUSAND, "answer": "2"}), {"answer": "2"}, 1
        ),
        "a row without a column the rows before it have": refused(
            "ragged.jsonl",
            jsonl(GOOD, GOOD, {"prompt": "3+3=", "ans": "6"}),
            "row 3 has no column 'answer' (rows 1-2 have it)",
        ),
        "a row with a column the rows before it lack": refused(
            "extra.jsonl", jsonl(GOOD, {**GOOD, "level": 2}), "row 2 has a column 'level' that row 1 lacks"
        ),
        "a CSV row shorter than its header": refused(
            "short.csv", "prompt,answer\r\n1+1=,2\r\n2+2=\r\n", "row 2 has fewer fields than the header's 2"
        ),
        "a raw U+2028 inside a JSONL string": reads(
            "u2028.jsonl",
            json.dumps({"prompt": "a\u2028b", "answer": "2"}, ensure_ascii=False) + "\n",
            {"prompt": "a\u2028b"},
            1,
        ),
        "a raw U+0085 inside a JSONL string": reads(
            "u0085.jsonl",
            json.dumps({"prompt": "a\u0085b", "answer": "2"}, ensure_ascii=False) + "\n",
            {"prompt": "a\u0085b"},
            1,
        ),
        "JSONL with CR-only line ends": reads("cr.jsonl", jsonl(GOOD, GOOD).replace("\n", "\r"), GOOD, 2),
        "a form-feed line before a bad row": refused(
            "formfeed.jsonl",
            jsonl(GOOD) + "\f\n" + jsonl({"prompt": 5, "answer": "1"}),
            "row 2 (line 3), column 'prompt' holds a number; allowed: text or a list of chat messages",
        ),
        "a FIFO named x.jsonl": not_a_file("fifo.jsonl", lambda path: os.mkfifo(path), "a FIFO"),
        "a folder named x.jsonl": not_a_file("dir.jsonl", lambda path: path.mkdir(), "a folder"),
        "a link to /dev/zero": not_a_file(
            "zero.jsonl", lambda path: path.symlink_to("/dev/zero"), "a link to a device"
        ),
        "parquet with a column named twice": parquet_refused(
            "twice.parquet",
            _parquet({"a": ["1+1="], "b": ["2"]}, names=["prompt", "prompt"]),
            "the file names column 'prompt' twice",
        ),
        "parquet with a prompt column of integers": parquet_refused(
            "ints.parquet",
            _parquet({"prompt": [1, 2], "answer": ["1", "2"]}),
            "row 1, column 'prompt' holds a number; allowed: text or a list of chat messages",
        ),
    }
    return [Probe(CATEGORY, name, check, timeout_s=30) for name, check in cases.items()]


def commands() -> list[Case]:
    """`train` on a hostile file: refused in one line before the model loads, no run directory left."""
    files = {
        "surrogate.jsonl": jsonl(GOOD, {"prompt": "\ud800", "answer": "2"}),
        "empty_list.jsonl": jsonl({"prompt": [], "answer": "2"}),
        "no_role.jsonl": jsonl({"prompt": [{"content": "hi"}], "answer": "2"}),
        "bom_missing_column.csv": "\ufeffquestion_text,answer\nhi,2\n",
        "twice.csv": "prompt,prompt\na,b\n",
        "numbers.jsonl": jsonl({"prompt": 5, "answer": "2"}),
        "long_chat.jsonl": jsonl({"prompt": TEN_THOUSAND, "answer": "2"}),
        "huge.csv": "prompt,answer\n" + "7" * 200_000 + ",2\n",
        "ragged.jsonl": jsonl(GOOD, GOOD, {"prompt": "3+3=", "ans": "6"}),
        "short_row.csv": "prompt,answer\n1+1=,2\n2+2=\n",
    }
    plain = ("--set", "data.chat_template=plain")  # the bundled model has no chat template of its own
    out = [
        Case(CATEGORY, f"train on {name}", train("--set", f"data.source={{tmp}}/{name}", *plain), files=files)
        for name in files
    ]
    out.append(
        Case(
            CATEGORY,
            "train on a FIFO",
            train("--set", "data.source={tmp}/fifo.jsonl", *plain),
            prepare=lambda t: os.mkfifo(t / "fifo.jsonl"),
        )
    )
    return out


def cases() -> list:
    return [*probes(), *commands()]
