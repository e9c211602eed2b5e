"""The fault suite's hostile cases for the Samples tab's index of samples.jsonl (contract/samples_index.py) and for
forks written beside their parent (studio/fork.py); benchmarks/fault_probes.py says how they run. A hostile file
(a 10 MB line, binary garbage, a step no trainer writes, a file truncated, rewritten or swapped for a FIFO or a
folder while it is indexed) never raises, never blocks, and leaves an index equal to one built fresh from what the
file then holds; a fork whose parent went away is one line and leaves no half-written run behind."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

from .fault_probes import named_probes

CATEGORY = "samples"


def _rows(steps: int, per_step: int = 16) -> bytes:
    from .ui_bench import sample_row

    rng = random.Random(0)
    rows = [sample_row(step, i, 4, rng) for step in range(1, steps + 1) for i in range(per_step)]
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def _built(path: Path):
    from ..contract.samples_index import SamplesIndex

    index = SamplesIndex(path)
    for _ in range(10_000):
        if not (index.update() or index.pending):
            break
    return index


def _same(grown, fresh) -> str | None:
    a = (list(grown.offsets), list(grown.steps), list(grown.group_ids), grown.offset)
    b = (list(fresh.offsets), list(fresh.steps), list(fresh.group_ids), fresh.offset)
    return None if a == b else f"grown index of {len(grown)} rows differs from a fresh one of {len(fresh)}"


def a_10_mb_line_is_indexed_and_shown_clipped(tmp: Path) -> str | None:
    """One completion of 10 MB between ordinary rows: indexed, found by a search at its end, shown cut."""
    from ..studio.widgets.samples_panel import MAX_CELL_CHARS, clipped

    path = tmp / "samples.jsonl"
    big = dict(json.loads(_rows(1).splitlines()[0]), completion="y" * (10 << 20) + "tail-marker")
    path.write_bytes(_rows(1) + json.dumps(big).encode() + b"\n" + _rows(1))
    index = _built(path)
    if len(index) != 33 or index.skipped:
        return f"{len(index)} rows indexed, {index.skipped} skipped; expected 33 and 0"
    if index.search("tail-marker")[0] != [16]:
        return "the search missed the end of the 10 MB row"
    shown = clipped(index.rows([16])[0])["completion"]
    return None if len(shown) < MAX_CELL_CHARS + 100 else f"the detail would hold {len(shown):,} characters"


def binary_garbage_between_rows_is_skipped_and_counted(tmp: Path) -> str | None:
    path = tmp / "samples.jsonl"
    junk = bytes(random.Random(1).randrange(256) for _ in range(4096)).replace(b"\n", b"") + b"\n"
    path.write_bytes(_rows(1) + junk + b"\xff\xfe{not json}\n" + b'{"step": 1e999}\n' + _rows(1))
    index = _built(path)
    if len(index) != 32 or index.skipped != 3:
        return f"{len(index)} rows, {index.skipped} skipped; expected 32 and 3"
    return None


def a_step_no_trainer_writes_is_skipped(tmp: Path) -> str | None:
    """A step of 10**30 (beyond int64) or 0: skipped and counted, the rest indexed."""
    path = tmp / "samples.jsonl"
    path.write_bytes(_rows(1) + b'{"step": 1000000000000000000000000000000, "rewards": {}}\n{"step": 0}\n')
    index = _built(path)
    return None if (len(index), index.skipped) == (16, 2) else f"{len(index)} rows, {index.skipped} skipped"


def a_file_truncated_while_indexed_starts_over(tmp: Path) -> str | None:
    from ..contract.samples_index import SamplesIndex

    path = tmp / "samples.jsonl"
    data = _rows(200)
    path.write_bytes(data)
    index = SamplesIndex(path, poll_bytes=64 << 10)
    index.update()  # part of it indexed
    with open(path, "r+b") as fh:
        fh.truncate(index.offset // 2)  # cut mid-line below what was indexed, then written on past it
    with open(path, "ab") as fh:
        fh.write(data)
    for _ in range(10_000):
        if not (index.update() or index.pending):
            break
    if index.generation != 1:
        return f"generation {index.generation} after a truncation: the index did not start over"
    return _same(index, _built(path))


def a_file_rewritten_in_place_starts_over(tmp: Path) -> str | None:
    """Rewritten longer, same inode: the byte before the index's offset is no longer a line end."""
    path = tmp / "samples.jsonl"
    path.write_bytes(_rows(2))
    index = _built(path)
    with open(path, "r+b") as fh:
        fh.write(b"   " + _rows(3))
    for _ in range(100):
        if not (index.update() or index.pending):
            break
    return _same(index, _built(path)) if index.generation == 1 else "a rewrite in place went unnoticed"


def a_fifo_or_a_folder_in_its_place_is_never_opened(tmp: Path) -> str | None:
    path = tmp / "samples.jsonl"
    path.write_bytes(_rows(2))
    index = _built(path)
    path.unlink()
    os.mkfifo(path)  # opening it for reading would block: the probe's time limit would say "hang"
    index.update()
    hits = index.search("What")
    if len(index) or hits != ([], False) or index.rows([0]) != [None]:
        return f"{len(index)} rows kept, search {hits}"
    path.unlink()
    path.mkdir()
    index.update()
    return None if len(index) == 0 and index.warnings else "a folder in its place was read or not said"


def a_search_for_escapes_and_non_ascii_finds_what_the_row_holds(tmp: Path) -> str | None:
    """Queries the JSON writer escapes (a quote, a backslash, a newline, é, an emoji) match the text, not the bytes."""
    from ..contract.samples_index import SamplesIndex

    texts = ['say "hi"', "back\\slash", "two\nlines", "café", "rocket 🚀", "plain"]
    base = json.loads(_rows(1).splitlines()[0])
    path = tmp / "samples.jsonl"
    path.write_bytes(b"".join(json.dumps(dict(base, completion=t)).encode() + b"\n" for t in texts))
    index = SamplesIndex(path)
    index.update()
    for i, query in enumerate(['"hi"', "k\\s", "o\nl", "CAFÉ", "🚀"]):
        got = index.search(query)[0]
        if got != [i]:
            return f"search {query!r} found rows {got}, expected [{i}]"
    return None


def a_fork_whose_parent_went_away_is_one_line_and_leaves_nothing(tmp: Path) -> str | None:
    """The parent deleted between the fork's plan and its writing: one UserError line, no fork folder."""
    from ..contract import config
    from ..contract.errors import UserError
    from ..contract.run_files import CHECKPOINTS, CONFIG
    from ..studio import fork

    parent = tmp / "runs" / "parent"
    (parent / CHECKPOINTS / "step-1").mkdir(parents=True)
    config.save(config.load("tiny-arith", ["train.steps=4"]), parent / CONFIG)
    plan = fork.plan(parent, "train.lr", "5e-06")
    shutil.rmtree(parent / CHECKPOINTS)  # gone meanwhile
    try:
        fork.make(plan)
    except UserError as err:
        line = err.line()
        if "\n" in line or not line.startswith("fork error: cannot write the fork of parent beside it in "):
            return f"said {line!r}"
        left = sorted(p.name for p in parent.parent.iterdir())
        return None if left == ["parent"] else f"left behind: {left}"
    return "no error"


def cases() -> list:
    probes = [
        a_10_mb_line_is_indexed_and_shown_clipped,
        binary_garbage_between_rows_is_skipped_and_counted,
        a_step_no_trainer_writes_is_skipped,
        a_file_truncated_while_indexed_starts_over,
        a_file_rewritten_in_place_starts_over,
        a_fifo_or_a_folder_in_its_place_is_never_opened,
        a_search_for_escapes_and_non_ascii_finds_what_the_row_holds,
        a_fork_whose_parent_went_away_is_one_line_and_leaves_nothing,
    ]
    return named_probes(CATEGORY, probes)
