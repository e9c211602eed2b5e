"""The fault suite's hostile cases for the readers of a run directory (benchmarks/fault_probes.py says how they
run): FIFOs, devices, sockets and links where a run's files belong, files that never end, grow while read, are
replaced or cut short while read, rows out of step order or repeated, a last line still being written, and run
names no terminal should print raw. Each damages a finished 6-step synthetic run (benchmarks/synthetic_run.py).

Whatever could block (a FIFO, a device) is a probe: the command runs as a child process with a time limit, or
the reader runs on the probe's thread, which the suite gives up on at the probe's limit, so a regression is a
"hang", never a stuck test run. The expected lines are written out here by hand: they are the oracle."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

from .fault_cases import READ, Case
from .fault_probes import Probe

CATEGORY = "readers"
STEPS = 6
CHILD_S = 60  # a command's time limit (a probe's own is CHILD_S + 30)
FIFO = "not a regular file (a FIFO); read as empty"
ZERO = "not a regular file (a link to a character device); read as empty"
HUGE = 10 << 30  # a sparse file: no disk used
CAP = "10.0 GiB, over the 1.0 GiB a reader takes of a file; read its"


# ---- helpers ------------------------------------------------------------------------------------


def run_in(tmp: Path, total: int = STEPS) -> Path:
    """Run r: STEPS rows of a `total`-step run."""
    from .synthetic_run import write_run

    return write_run(tmp / "runs" / "r", STEPS, total=total)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def rewrite(path: Path, lines: list[dict], end: str = "\n") -> None:
    path.write_text("\n".join(json.dumps(row) for row in lines) + end)


def fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def link(path: Path, target: Path | str) -> None:
    path.unlink(missing_ok=True)
    os.symlink(target, path)


def sparse(path: Path, size: int = HUGE) -> Path:
    with open(path, "ab") as fh:
        fh.truncate(size)
    return path


def cli(tmp: Path, *argv: str) -> tuple[int | None, str, str]:
    """`grpo-studio ARGV` as a child process in tmp: (exit code, or None when it ran past CHILD_S; stdout; stderr)."""
    from .faults_bench import run_process

    done = run_process(list(argv), tmp, CHILD_S)
    return (None, "", "") if done.code is None else (done.code, done.stdout, done.stderr)


def same(what: str, got, want) -> str | None:
    return None if got == want else f"{what}: {got!r}, expected {want!r}"


def first(*checks: str | None) -> str | None:
    return next((c for c in checks if c), None)


def summary(tmp: Path) -> dict:
    from ..contract.run_state import run_summaries

    (row,) = run_summaries(tmp / "runs")
    return row


def summary_is(
    tmp: Path,
    step: int,
    warnings: list[str],
    state: str = "finished",
    reward_step: int | None = None,
    total: int | None = STEPS,
):
    """The runs list's row of run r: its step (of `total`, from `started`), state, warnings and the reward
    shown (step `reward_step`'s)."""
    row = summary(tmp)
    check = first(
        same("runs' step", (row["step"], row["total"]), (step, total)),
        same("runs' state", row["state"], state),
        same("runs' warnings", row["warnings"], warnings),
    )
    if check or reward_step is None:
        return check
    want = next(r["reward/mean"] for r in rows(tmp / "good.jsonl") if r["step"] == reward_step)
    return same("runs' reward", row["reward"], want)


def doctor_reads(tmp: Path, steps: list[int], warnings: list[str]) -> str | None:
    from ..contract.diagnosis import read_run
    from ..contract.run_reader import Warnings

    warn = Warnings()
    view = read_run(tmp / "runs" / "r", warn)
    return first(
        same("doctor's steps", [r["step"] for r in view.rows], steps), same("doctor's warnings", warn, warnings)
    )


def studio_reads(tmp: Path, steps: list[int], warnings: list[str]):
    from ..studio.rundata import RunData

    data = RunData(tmp / "runs" / "r")
    data.drain()
    check = first(
        same("the studio's steps", data.steps, steps), same("the studio's warnings", data.warnings(), warnings)
    )
    return check, data


# ---- FIFOs, devices, sockets, links -------------------------------------------------------------


def runs_fifo_metrics(tmp: Path) -> str | None:
    fifo(run_in(tmp) / "metrics.jsonl")
    code, out, err = cli(tmp, "runs", "runs")
    return first(
        same("exit", code, 0),
        same("row", out.splitlines()[1].split()[:4] if code == 0 else None, ["r", "finished", "0/6", "bf16"]),
        same("stderr", err, f"warning: r/metrics.jsonl: {FIFO}\n"),
    )


def report_fifo_events(tmp: Path) -> str | None:
    run = run_in(tmp)
    fifo(run / "events.jsonl")
    code, out, err = cli(tmp, "report", str(run), "--out", str(tmp / "report"))
    page = (tmp / "report" / "index.html").read_text() if code == 0 else ""
    return first(
        same("exit", code, 0),
        same("stderr", err, f"warning: {run}/events.jsonl: {FIFO}\n"),
        same("steps shown", "<th>steps</th><td>6/6</td>" in page, True),
    )


def doctor_zero_metrics(tmp: Path) -> str | None:
    run = run_in(tmp)
    link(run / "metrics.jsonl", "/dev/zero")
    code, out, err = cli(tmp, "doctor", str(run))
    return first(
        same("exit", code, 0),
        same("stdout", out, "no findings: no metrics rows yet\n"),
        same("stderr", err, f"warning: {run}/metrics.jsonl: {ZERO}\n"),
    )


def doctor_fifo_samples(tmp: Path) -> str | None:
    run = run_in(tmp)
    fifo(run / "samples.jsonl")
    code, out, err = cli(tmp, "doctor", str(run), "--json")
    found = json.loads(out) if code == 0 else {}
    return first(
        same("exit", code, 0),
        same("steps", found.get("steps"), STEPS),
        same("stderr", err, f"warning: {run}/samples.jsonl: {FIFO}\n"),
    )


def studio_fifo_histograms(tmp: Path) -> str | None:
    fifo(run_in(tmp) / "histograms.jsonl")
    check, data = studio_reads(tmp, list(range(1, 7)), [f"histograms.jsonl: {FIFO}"])
    return check or same("histogram", data.histogram, None)


def runs_fifo_config(tmp: Path) -> str | None:
    fifo(run_in(tmp) / "config.toml")
    return summary_is(tmp, 6, [f"config.toml: {FIFO}"]) or same("dtype", summary(tmp)["dtype"], "?")


def runs_fifo_lock(tmp: Path) -> str | None:
    fifo(run_in(tmp) / "trainer.pid")
    return summary_is(
        tmp, 6, ["trainer.pid: cannot be read (not a trainer's lock); read as no trainer holding the run"]
    )


def runs_zero_lock_and_events(tmp: Path) -> str | None:
    run = run_in(tmp)
    link(run / "trainer.pid", "/dev/zero")
    link(run / "events.jsonl", "/dev/urandom")
    return summary_is(
        tmp,
        6,
        [
            "events.jsonl: not a regular file (a link to a character device); read as empty",
            "trainer.pid: cannot be read (not a trainer's lock); read as no trainer holding the run",
        ],
        state="created",
    )  # the total: config.toml's train.steps, as report's


def runs_socket_metrics(tmp: Path) -> str | None:
    path = run_in(tmp) / "metrics.jsonl"
    path.unlink()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        return summary_is(tmp, 0, ["metrics.jsonl: not a regular file (a socket); read as empty"])


def runs_symlink_loop(tmp: Path) -> str | None:
    link(run_in(tmp) / "metrics.jsonl", "metrics.jsonl")
    return summary_is(tmp, 0, ["metrics.jsonl: cannot be read (too many levels of symbolic links); read as empty"])


def export_fifo_manifest(tmp: Path) -> str | None:
    """export's checkpoint listing meets a FIFO where a checkpoint's manifest belongs: no complete checkpoint."""
    from ..contract.errors import UserError
    from ..engine.out.export import find_checkpoint

    run = run_in(tmp)
    (run / "checkpoints" / "step-6").mkdir(parents=True)
    fifo(run / "checkpoints" / "step-6" / "manifest.json")
    try:
        find_checkpoint(run, None)
    except UserError as err:
        return same(
            "refusal",
            err.line(),
            f"export error: RUN = '{run}': no complete checkpoint under checkpoints/ (a "
            "run writes one at its end and every train.save_every steps)",
        )
    return "a FIFO manifest was taken as a complete checkpoint"


# ---- files too large, or growing ----------------------------------------------------------------


def huge_link_out(tmp: Path) -> str | None:
    """metrics.jsonl a link out of the run directory to a 10 GB file without a newline."""
    link(run_in(tmp) / "metrics.jsonl", sparse(tmp / "elsewhere"))
    cap = f"metrics.jsonl: {CAP} first 1.0 GiB"
    return first(summary_is(tmp, 0, [cap]), doctor_reads(tmp, [], [cap]))


def rows_then_hole(tmp: Path) -> str | None:
    """Six whole rows, then a 10 GB hole (a torn append the size of a disk): the rows are still found."""
    run = run_in(tmp)
    sparse(run / "metrics.jsonl")
    cap = f"metrics.jsonl: {CAP} first 1.0 GiB"
    return first(summary_is(tmp, 6, [cap]), doctor_reads(tmp, list(range(1, 7)), [cap]))


def huge_config(tmp: Path) -> str | None:
    sparse(run_in(tmp) / "config.toml")
    return summary_is(tmp, 6, ["config.toml: over 4194304 bytes, more than it ever holds; read as empty"])


def events_without_start(tmp: Path) -> str | None:
    """10 GB of events.jsonl before its last line, and no `started` to stop at: the backward read stops at 1 GiB."""
    run = run_in(tmp)
    finished = (run / "events.jsonl").read_text().splitlines()[-1]
    sparse(run / "events.jsonl", HUGE)
    with open(run / "events.jsonl", "a") as fh:
        fh.write(f"\n{finished}\n")
    return summary_is(tmp, 6, [f"events.jsonl: {CAP} last 1.0 GiB"])  # the total: config.toml's


def growing_metrics(tmp: Path) -> str | None:
    """A writer appends 1000 rows every 10 ms, without end, while each reader reads: each ends (a read takes the
    file as long as it was when opened), with whole rows in step order."""
    from ..contract.run_reader import last_step_row, read_rows
    from ..studio.rundata import RunData

    path = run_in(tmp) / "metrics.jsonl"
    stop, written = threading.Event(), [STEPS]

    def grow():
        with open(path, "a") as fh:
            while not stop.wait(0.01):
                block = range(written[0] + 1, written[0] + 1001)
                fh.write("".join(json.dumps({"step": s, "time": 1.0}) + "\n" for s in block))
                fh.flush()
                written[0] += 1000

    writer = threading.Thread(target=grow, daemon=True)
    writer.start()
    try:
        got = [r["step"] for r in read_rows(path)]
        last = (last_step_row(path)[0] or {}).get("step", 0)
        data = RunData(path.parent)
        data.drain(limit=50)
    finally:
        stop.set()
        writer.join()
    return first(
        same("read_rows' steps", got, list(range(1, len(got) + 1))),
        same("the last step is one written", 1 <= last <= written[0], True),
        same("the studio's steps", data.steps, list(range(1, len(data.steps) + 1))),
    )


# ---- rows out of step order, repeated, or still being written -----------------------------------

SHUFFLED = [3, 1, 6, 2, 5, 4]  # steps 1, 2, 5, 4 come after a higher one: 4 out of order
MOVED = "metrics.jsonl: 4 rows out of step order; read in step order"
REPEATED = "metrics.jsonl: 1 rows repeating a step; read in step order; a repeated step's last row kept"


def shuffle(tmp: Path) -> None:
    path = run_in(tmp) / "metrics.jsonl"
    (tmp / "good.jsonl").write_bytes(path.read_bytes())
    by_step = {r["step"]: r for r in rows(path)}
    rewrite(path, [by_step[s] for s in SHUFFLED])


def repeat_step_2(tmp: Path) -> None:
    """Step 2's row written again after step 6, with another reward: the later write is the one kept."""
    path = run_in(tmp) / "metrics.jsonl"
    good = rows(path)
    good[1]["reward/mean"] = 99.0
    (tmp / "good.jsonl").write_text("".join(json.dumps(r) + "\n" for r in good))
    with open(path, "a") as fh:
        fh.write(json.dumps(good[1]) + "\n")


def runs_shuffled(tmp: Path) -> str | None:
    shuffle(tmp)
    return summary_is(tmp, 6, [MOVED], reward_step=6)


def doctor_shuffled(tmp: Path) -> str | None:
    shuffle(tmp)
    return doctor_reads(tmp, list(range(1, 7)), [MOVED])


def studio_shuffled(tmp: Path) -> str | None:
    shuffle(tmp)
    check, data = studio_reads(tmp, list(range(1, 7)), [MOVED])
    good = [r["reward/mean"] for r in rows(tmp / "good.jsonl")]
    return check or same("the studio's rewards", data.series("reward/mean")[1], good)


def runs_repeated(tmp: Path) -> str | None:
    repeat_step_2(tmp)
    return summary_is(tmp, 6, [REPEATED], reward_step=6)


def studio_repeated(tmp: Path) -> str | None:
    repeat_step_2(tmp)
    check, data = studio_reads(tmp, list(range(1, 7)), [REPEATED])
    good = [r["reward/mean"] for r in rows(tmp / "good.jsonl")]
    return check or same("the studio's rewards (step 2: 99)", data.series("reward/mean")[1], good)


def doctor_repeated(tmp: Path) -> str | None:
    from ..contract.diagnosis import read_run

    repeat_step_2(tmp)
    view = read_run(tmp / "runs" / "r")
    return doctor_reads(tmp, list(range(1, 7)), [REPEATED]) or same(
        "step 2's reward", view.rows[1]["reward/mean"], 99.0
    )


def histogram_older_last(tmp: Path) -> str | None:
    """histograms.jsonl: step 6's histogram, then an older step's appended: the studio shows step 6's."""
    path = run_in(tmp) / "histograms.jsonl"
    (hist,) = rows(path)
    rewrite(path, [hist, {**hist, "step": 3, "zero": 7}])
    check, data = studio_reads(tmp, list(range(1, 7)), [])
    return check or same("histogram step", data.histogram["step"], 6)


def whole_row_unterminated(tmp: Path) -> Path:
    """A whole JSON row of step 7 of 7 appended without its newline: still being written."""
    path = run_in(tmp, STEPS + 1) / "metrics.jsonl"
    (tmp / "good.jsonl").write_bytes(path.read_bytes())
    with open(path, "a") as fh:
        fh.write(json.dumps({**rows(path)[-1], "step": 7, "reward/mean": 123.0}))
    return path


def runs_unterminated(tmp: Path) -> str | None:
    """The backward reader (runs' last row) leaves it out."""
    whole_row_unterminated(tmp)
    return summary_is(tmp, 6, [], reward_step=6, total=STEPS + 1)


def doctor_unterminated(tmp: Path) -> str | None:
    """The forward reader (doctor, resume) leaves it out."""
    whole_row_unterminated(tmp)
    return doctor_reads(tmp, list(range(1, 7)), [])


def studio_unterminated(tmp: Path) -> str | None:
    """The studio's tail waits for its newline, then takes it."""
    path = whole_row_unterminated(tmp)
    check, data = studio_reads(tmp, list(range(1, 7)), [])
    with open(path, "a") as fh:
        fh.write("\n")
    data.poll()
    return check or same("steps once its newline came", data.steps, list(range(1, 8)))


def finished_unterminated(tmp: Path) -> str | None:
    """events.jsonl's `finished` still being written: the run's state is not taken from it."""
    path = run_in(tmp) / "events.jsonl"
    path.write_text(path.read_text().rstrip("\n"))
    from ..contract.run_state import run_state

    return same("state", run_state(path.parent).state, "crashed")


def started_unterminated(tmp: Path) -> str | None:
    """events.jsonl's only line, `started`, still being written: the run's start is config.toml's time."""
    from ..contract.run_state import started_at

    run = run_in(tmp)
    (run / "events.jsonl").write_text(json.dumps({"time": 5.0, "event": "started", "total_steps": STEPS}))
    return same("started", started_at(run), (run / "config.toml").stat().st_mtime)


# ---- a row before the tail, rows beyond the total, a line over 16 MiB -------------------------------

MOVED_99 = "metrics.jsonl: 99 rows out of step order; read in step order"


def runs_row_before_tail(tmp: Path) -> str | None:
    """Step 100 first, then 1..99 of ~4 KB (over the 256 KiB tail, which is in order): runs shows 100/100 and
    says doctor's line."""
    run = run_in(tmp, 100)
    rewrite(
        run / "metrics.jsonl", [{"step": s, "reward/mean": s / 100, "pad": "x" * 4000} for s in [100, *range(1, 100)]]
    )
    return first(summary_is(tmp, 100, [MOVED_99], total=100), doctor_reads(tmp, list(range(1, 101)), [MOVED_99]))


def concatenated_wrong_way(tmp: Path) -> str | None:
    """Steps 51..100, then 1..50 (two halves concatenated the wrong way round): runs shows 100, not 50."""
    run = run_in(tmp, 100)
    halves = [*range(51, 101), *range(1, 51)]
    rewrite(run / "metrics.jsonl", [{"step": s, "reward/mean": s / 100, "pad": "x" * 8000} for s in halves])
    moved = "metrics.jsonl: 50 rows out of step order; read in step order"
    return summary_is(tmp, 100, [moved], total=100)


def beyond(step: int) -> Callable[[Path], None]:
    def damage(tmp: Path) -> None:
        path = run_in(tmp) / "metrics.jsonl"
        (tmp / "good.jsonl").write_bytes(path.read_bytes())
        with open(path, "a") as fh:
            fh.write(json.dumps({**rows(path)[-1], "step": step, "reward/mean": -99.0}) + "\n")

    return damage


BEYOND = "metrics.jsonl: 1 rows with a step beyond the run's 6 steps; left out"


def runs_step_99_of_6(tmp: Path) -> str | None:
    beyond(99)(tmp)
    return summary_is(tmp, 6, [BEYOND], reward_step=6)


def runs_step_10_30_of_6(tmp: Path) -> str | None:
    beyond(10**30)(tmp)
    return summary_is(tmp, 6, [BEYOND], reward_step=6)


def doctor_step_99_of_6(tmp: Path) -> str | None:
    beyond(99)(tmp)
    return doctor_reads(tmp, list(range(1, 7)), [BEYOND])


def studio_step_10_30_of_6(tmp: Path) -> str | None:
    beyond(10**30)(tmp)
    check, data = studio_reads(tmp, list(range(1, 7)), [BEYOND])
    return check or same("the studio's step", (data.step, data.total_steps), (6, 6))


def resumed_total_counts(tmp: Path) -> str | None:
    """A later `started` (a resume to 8 steps) raises the total: step 7 is then the run's state, no warning."""
    beyond(7)(tmp)
    with open(tmp / "runs" / "r" / "events.jsonl", "a") as fh:
        fh.write(json.dumps({"time": 2e9, "event": "started", "message": "resume", "total_steps": 8}) + "\n")
    return summary_is(tmp, 7, [], state="crashed", total=8)


def studio_samples_line_over_16_mib(tmp: Path) -> str | None:
    """A samples.jsonl line over 16 MiB that ends inside one of the studio's reads: skipped and said, as doctor
    says it."""
    run = run_in(tmp)
    with open(run / "samples.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 6, "completion": "b" * ((16 << 20) + 1)}) + "\n")
    skipped = "samples.jsonl: skipped 1 malformed lines (not a JSON object with the fields the file needs)"
    check, data = studio_reads(tmp, list(range(1, 7)), [skipped])
    return check or doctor_reads(tmp, list(range(1, 7)), [skipped])


def runs_names_malformed_file(tmp: Path) -> str | None:
    """A row whose step is `true`: runs names metrics.jsonl, as every other reader does."""
    with open(run_in(tmp) / "metrics.jsonl", "a") as fh:
        fh.write('{"step": true, "reward/mean": 1.0}\n')
    code, _, err = cli(tmp, "runs", "runs")
    line = "metrics.jsonl: skipped 1 malformed lines (not a JSON object with the fields the file needs)"
    return first(same("exit", code, 0), same("stderr", err, f"warning: r/{line}\n"))


def runs_fifo_events_total(tmp: Path) -> str | None:
    """events.jsonl a FIFO: runs takes the total from config.toml, as report does (6/6, not 6/?)."""
    fifo(run_in(tmp) / "events.jsonl")
    code, out, _ = cli(tmp, "runs", "runs")
    return first(same("exit", code, 0), same("step", out.splitlines()[1].split()[2] if code == 0 else None, "6/6"))


# ---- what the trainer cannot write into: refused before anything loads --------------------------------


def refused_train(tmp: Path, name: str, make: Callable[[Path], str], resume: bool) -> str | None:
    """`train` (a new run into {tmp}/X, or --resume of run r) with `name` made by `make` (which returns the
    refusal's words for it): exit 2, that one line, nothing written."""
    run = run_in(tmp) if resume else tmp / "X"
    run.mkdir(exist_ok=True)
    (run / name).unlink(missing_ok=True)
    what = make(run / name)
    before = sorted(os.listdir(run))
    argv = ["--resume", str(run)] if resume else ["tiny-arith", "--set", "train.steps=1", "--run-dir", str(run)]
    code, _, err = cli(tmp, "train", *argv)
    want = f"run error: {run / name}: {what}; move it away, then start the trainer again\n"
    return first(same("exit", code, 2), same("stderr", err, want), same("entries", sorted(os.listdir(run)), before))


def make_fifo(path: Path) -> str:
    os.mkfifo(path)
    return "not a regular file (a FIFO)"


def make_dev_zero(path: Path) -> str:
    os.symlink("/dev/zero", path)
    return "not a regular file (a link to a character device)"


def make_dangling(path: Path) -> str:
    os.symlink(path.parent / "nowhere" / "x", path)
    return "a link to nothing"


def make_loop(path: Path) -> str:
    os.symlink(path.name, path)
    return "too many levels of symbolic links"


def make_socket(path: Path) -> str:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()
    return "not a regular file (a socket)"


def train_refused(name: str, make: Callable[[Path], str], resume: bool = False) -> Callable[[Path], str | None]:
    return lambda tmp: refused_train(tmp, name, make, resume)


# ---- files that change while read; names ----------------------------------------------------------


def churn(tmp: Path, change: Callable[[Path, int], None], read: Callable[[Path], list[int]], ok) -> str | None:
    """`change(path, i)` in a loop on one thread while `read(path)` runs 200 times on this one: every read
    ends, and `ok(steps)` holds for each."""
    path = run_in(tmp) / "metrics.jsonl"
    (tmp / "good.jsonl").write_bytes(path.read_bytes())
    stop = threading.Event()

    def loop():
        i = 0
        while not stop.is_set():
            change(path, i)
            i += 1

    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    try:
        bad = next((steps for steps in (read(path) for _ in range(200)) if not ok(steps)), None)
    finally:
        stop.set()
        worker.join()
    return None if bad is None else f"read {bad} from a file being changed"


def replaced_while_read(tmp: Path) -> str | None:
    """metrics.jsonl replaced (renamed over, as a resume's cut does) again and again: each read is one version."""
    from ..contract.run_reader import read_rows

    def change(path: Path, i: int) -> None:
        tmp_file = path.with_name(".metrics.jsonl.tmp")
        lines = tmp.joinpath("good.jsonl").read_text().splitlines(keepends=True)
        tmp_file.write_text("".join(lines[: 3 if i % 2 else 6]))
        os.replace(tmp_file, path)

    return churn(
        tmp, change, lambda p: [r["step"] for r in read_rows(p)], lambda s: s in ([1, 2, 3], [1, 2, 3, 4, 5, 6])
    )


def truncated_while_read(tmp: Path) -> str | None:
    """metrics.jsonl cut to nothing and written again in place, again and again: each read is a prefix."""
    from ..contract.run_reader import last_step_row, read_rows

    def change(path: Path, i: int) -> None:
        data = tmp.joinpath("good.jsonl").read_bytes()
        with open(path, "r+b") as fh:
            fh.truncate(0)
            fh.write(data)

    def read(path: Path) -> list[int]:
        last = last_step_row(path)[0]
        return [r["step"] for r in read_rows(path)] + ([last["step"]] if last else [])

    def ok(steps: list[int]) -> bool:  # a prefix 1..k, then the last row's step (at most 6)
        k = len(steps) - 1
        return steps[:-1] == list(range(1, k + 1)) and 1 <= steps[-1] <= STEPS if steps else True

    return churn(tmp, change, read, ok)


def odd_name(tmp: Path) -> str | None:
    """A run folder named with a newline, an escape sequence and a byte that is not UTF-8: `runs` prints it as
    one escaped cell, never raw bytes a terminal would act on."""
    run_in(tmp)
    os.rename(os.fsencode(tmp / "runs" / "r"), os.fsencode(tmp / "runs") + b"/r\nx\x1b[2J\xff")
    code, out, err = cli(tmp, "runs", "runs")
    return first(
        same("exit", code, 0),
        same("stderr", err, ""),
        same("stdout lines", len(out.splitlines()), 2),
        same("the name", out.splitlines()[1].split()[0] if code == 0 else None, "r\\nx\\x1b[2J\\xff"),
    )


PROBES: list[tuple[str, Callable[[Path], str | None]]] = [
    ("runs: metrics.jsonl a FIFO", runs_fifo_metrics),
    ("report: events.jsonl a FIFO", report_fifo_events),
    ("doctor: metrics.jsonl a link to /dev/zero", doctor_zero_metrics),
    ("doctor: samples.jsonl a FIFO", doctor_fifo_samples),
    ("studio: histograms.jsonl a FIFO", studio_fifo_histograms),
    ("runs: config.toml a FIFO", runs_fifo_config),
    ("runs: trainer.pid a FIFO", runs_fifo_lock),
    ("runs: trainer.pid and events.jsonl links to devices", runs_zero_lock_and_events),
    ("runs: metrics.jsonl a socket", runs_socket_metrics),
    ("runs: metrics.jsonl a symlink loop", runs_symlink_loop),
    ("export: a checkpoint's manifest.json a FIFO", export_fifo_manifest),
    ("metrics.jsonl a link out to a 10 GB file", huge_link_out),
    ("metrics.jsonl: six rows, then a 10 GB hole", rows_then_hole),
    ("runs: config.toml of 10 GB", huge_config),
    ("runs: 10 GB of events.jsonl, no started", events_without_start),
    ("metrics.jsonl growing while read", growing_metrics),
    ("runs: metrics rows shuffled", runs_shuffled),
    ("doctor: metrics rows shuffled", doctor_shuffled),
    ("studio: metrics rows shuffled", studio_shuffled),
    ("runs: a step's row repeated", runs_repeated),
    ("doctor: a step's row repeated", doctor_repeated),
    ("studio: a step's row repeated", studio_repeated),
    ("studio: an older histogram last", histogram_older_last),
    ("runs: a whole row without its newline", runs_unterminated),
    ("doctor: a whole row without its newline", doctor_unterminated),
    ("studio: a whole row without its newline", studio_unterminated),
    ("events.jsonl: finished without its newline", finished_unterminated),
    ("events.jsonl: started without its newline", started_unterminated),
    ("metrics.jsonl replaced while read", replaced_while_read),
    ("metrics.jsonl truncated while read", truncated_while_read),
    ("runs: a run name with a newline, ESC and a non-UTF-8 byte", odd_name),
    ("runs: step 100 first, then 1..99 (a row out of order before the tail)", runs_row_before_tail),
    ("runs: two halves of metrics.jsonl concatenated the wrong way", concatenated_wrong_way),
    ("runs: a row of step 99 in a 6-step run", runs_step_99_of_6),
    ("runs: a row of step 10**30 in a 6-step run", runs_step_10_30_of_6),
    ("doctor: a row of step 99 in a 6-step run", doctor_step_99_of_6),
    ("studio: a row of step 10**30 in a 6-step run", studio_step_10_30_of_6),
    ("runs: a resume's later started raises the total", resumed_total_counts),
    ("studio: a samples.jsonl line over 16 MiB", studio_samples_line_over_16_mib),
    ("runs: a malformed line names its file", runs_names_malformed_file),
    ("runs: events.jsonl a FIFO, the total from config.toml", runs_fifo_events_total),
    ("train: a new run with metrics.jsonl a FIFO", train_refused("metrics.jsonl", make_fifo)),
    ("train: a new run with events.jsonl a FIFO", train_refused("events.jsonl", make_fifo)),
    ("train: a new run with samples.jsonl a link to /dev/zero", train_refused("samples.jsonl", make_dev_zero)),
    ("train: a new run with histograms.jsonl a socket", train_refused("histograms.jsonl", make_socket)),
    ("train: a new run with events.jsonl a link to nothing", train_refused("events.jsonl", make_dangling)),
    ("train --resume: histograms.jsonl a FIFO", train_refused("histograms.jsonl", make_fifo, resume=True)),
    ("train --resume: stdout.log a link loop", train_refused("stdout.log", make_loop, resume=True)),
]


def cases() -> list:
    out: list = [Probe(CATEGORY, name, check, timeout_s=CHILD_S + 30) for name, check in PROBES]
    for what, damage in (
        ("metrics rows shuffled", shuffle),
        ("a step's row repeated", repeat_step_2),
        ("a whole row without its newline", whole_row_unterminated),
    ):
        for argv in (
            ["runs", "{tmp}/runs"],
            ["report", "{tmp}/runs/r", "--out", "{tmp}/report"],
            ["doctor", "{tmp}/runs/r"],
        ):
            out.append(Case(CATEGORY, f"{argv[0]} command: {what}", argv, expect=READ, prepare=damage))
    return out
