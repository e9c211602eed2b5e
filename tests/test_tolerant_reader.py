"""One tolerant reader (contract/run_reader.py) for `grpo-studio runs`, `report`, `attach` and the studio:
every odd file in a run directory is one warning line and a best effort, never a traceback.

Each damage kind is applied to a small synthetic run directory (benchmarks/synthetic_run.py: 6 of 6 steps,
finished), then each reader reads it: the real CLI as a child process (`attach` under Textual's headless
driver, which renders the dashboard, saves a screenshot and exits) and the studio's RunData in-process.
Each asserts the exit code, no traceback, the exact warning lines, and that the good rows still show."""

from __future__ import annotations

import errno
import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_studio.benchmarks.synthetic_run import write_run
from grpo_studio.contract import config as cfgmod
from grpo_studio.contract import metrics
from grpo_studio.contract.errors import UserError
from grpo_studio.contract.run_files import CHECKPOINTS, CONFIG, EVENTS, METRICS, PIDFILE
from grpo_studio.studio.rundata import RunData
from tests.cli_helpers import ENV, ROOT
from tests.studio_helpers import anyio_backend  # noqa: F401  (the pilot test runs on asyncio)

STEPS = 6
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
TEXT = "not a JSON object with the fields"

M_PERM = "metrics.jsonl: cannot be read (permission denied); read as empty"
E_PERM = "events.jsonl: cannot be read (permission denied); read as empty"
M_DIR = "metrics.jsonl: cannot be read (a folder, not a file); read as empty"
PID = "trainer.pid: cannot be read (not a trainer's lock); read as no trainer holding the run"
CKPT = "checkpoints: a file, not a folder; read as no checkpoints"
HUGE = "metrics.jsonl: 1 numbers NaN, Infinity or beyond a float's range; read as missing"
NAN = "metrics.jsonl: 2 numbers NaN, Infinity or beyond a float's range; read as missing"
UTF = "config.toml: not UTF-8 text (byte 0xff at offset 0); its settings are not shown"
TYPE = "config.toml: train = 5 is not a [train] table; left out"
JUNK = f"metrics.jsonl: skipped 1 malformed lines ({TEXT} the file needs)"
EVENT_JUNK = f"skipped malformed lines (1 in {METRICS}): {TEXT} the file needs"
LOAD = "LOAD"  # attach: config.toml does not load as a config (the line is the config loader's own)


def _set_reward(run: Path, index: int, literal: str) -> None:
    lines = (run / METRICS).read_text().splitlines()
    lines[index] = re.sub(rf'"{re.escape(metrics.REWARD)}": [^,}}]*', f'"{metrics.REWARD}": {literal}', lines[index])
    (run / METRICS).write_text("\n".join(lines) + "\n")


def _nan(run: Path) -> None:
    _set_reward(run, 2, "NaN")
    _set_reward(run, 3, "Infinity")


def _metrics_dir(run: Path) -> None:
    (run / METRICS).unlink()
    (run / METRICS).mkdir()


def _big_events(run: Path) -> None:  # over 8 MiB: 60,000 ordinary events between started and finished
    lines = (run / EVENTS).read_text().splitlines()
    info = json.dumps({"time": 1.0, "event": "info", "message": "x" * 100})
    (run / EVENTS).write_text("\n".join([lines[0], *[info] * 60_000, *lines[1:]]) + "\n")
    assert (run / EVENTS).stat().st_size > 8 << 20


# kind -> (damage, runs: (state, step shown, dtype), rundata steps, warnings of: runs, attach, rundata/report)
KINDS = {
    "metrics_unreadable": (
        lambda run: (run / METRICS).chmod(0),
        ("finished", "0/6", "bf16"),
        0,
        [M_PERM],
        [M_PERM],
        [M_PERM],
    ),
    "events_unreadable": (
        lambda run: (run / EVENTS).chmod(0),
        ("created", "6/?", "bf16"),
        STEPS,
        [E_PERM],
        [E_PERM],
        [E_PERM],
    ),
    "metrics_is_a_folder": (_metrics_dir, ("finished", "0/6", "bf16"), 0, [M_DIR], [M_DIR], [M_DIR]),
    "pidfile_is_a_folder": (lambda run: (run / PIDFILE).mkdir(), ("finished", "6/6", "bf16"), STEPS, [PID], [PID], []),
    "checkpoints_is_a_file": (
        lambda run: (run / CHECKPOINTS).write_text("x"),
        ("finished", "6/6", "bf16"),
        STEPS,
        [CKPT],
        [CKPT],
        [],
    ),
    "huge_integer": (
        lambda run: _set_reward(run, -1, str(10**400)),
        ("finished", "6/6", "bf16"),
        STEPS,
        [HUGE],
        [HUGE],
        [HUGE],
    ),
    "nan_and_infinity": (_nan, ("finished", "6/6", "bf16"), STEPS, [], [], [NAN]),
    "config_not_utf8": (
        lambda run: (run / CONFIG).write_bytes(b"\xff" + (run / CONFIG).read_bytes()),
        ("finished", "6/6", "?"),
        STEPS,
        [UTF],
        [UTF, LOAD],
        [UTF],
    ),
    "config_wrong_type": (
        lambda run: (run / CONFIG).write_text('train = 5\n[model]\ndtype = "bf16"\n'),
        ("finished", "6/6", "bf16"),
        STEPS,
        [TYPE],
        [TYPE, LOAD],
        [TYPE],
    ),
    "events_over_8_mib": (_big_events, ("finished", "6/6", "bf16"), STEPS, [], [], []),
    "junk_last_line_200_kb": (
        lambda run: open(run / METRICS, "a").write("j" * 200_000 + "\n"),
        ("finished", "6/6", "bf16"),
        STEPS,
        [JUNK],
        [JUNK],
        [JUNK],
    ),
}
CHMOD = {"metrics_unreadable", "events_unreadable"}


def kinds():
    for kind in KINDS:
        marks = [pytest.mark.skipif(IS_ROOT, reason="root reads chmod 000 files")] if kind in CHMOD else []
        yield pytest.param(kind, marks=marks, id=kind)


@pytest.fixture
def damaged(request, tmp_path) -> tuple[str, Path]:
    kind = request.param
    run = write_run(tmp_path / "runs" / "run", STEPS)
    KINDS[kind][0](run)
    yield kind, run
    for path in (run / METRICS, run / EVENTS):  # let tmp_path's cleanup remove it
        if path.exists():
            path.chmod(0o755 if path.is_dir() else 0o644)


def cli(*args: str, env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "grpo_studio.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**ENV, **(env or {})},
        timeout=300,
    )


def warning_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning:")]


def expected(lines: list[str], label: str, run: Path) -> list[str]:
    out = []
    for line in lines:
        if line == LOAD:
            with pytest.raises(UserError) as err:
                cfgmod.load(str(run / CONFIG))
            out.append(
                f"warning: {label}/{CONFIG}: does not load ({err.value.line()}); the setup screen starts "
                f"from tiny-arith"
            )
        else:
            out.append(f"warning: {label}/{line}")
    return out


@pytest.mark.parametrize("damaged", kinds(), indirect=True)
def test_runs(damaged):
    kind, run = damaged
    state, step, dtype = KINDS[kind][1]
    out = cli("runs", str(run.parent))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert out.stdout.splitlines()[1].split()[:4] == ["run", state, step, dtype]
    assert warning_lines(out.stderr) == expected(KINDS[kind][3], "run", run)
    assert out.stderr.count("\n") == len(warning_lines(out.stderr))  # nothing else on stderr


@pytest.mark.parametrize("damaged", kinds(), indirect=True)
def test_report(damaged, tmp_path):
    kind, run = damaged
    out = cli("report", str(run), "--out", str(tmp_path / "report"))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert warning_lines(out.stderr) == expected(KINDS[kind][5], str(run), run)
    assert out.stderr.count("\n") == len(warning_lines(out.stderr))
    assert out.stdout.startswith(f"report: {tmp_path / 'report' / 'index.html'} (")
    page = (tmp_path / "report" / "index.html").read_text()
    assert f"<th>steps</th><td>{KINDS[kind][2]}/{STEPS}</td>" in page
    for line in KINDS[kind][5]:  # the page's warnings say it too (malformed lines in the dashboard's wording)
        assert html.escape(EVENT_JUNK if line == JUNK else line) in page


@pytest.mark.parametrize("damaged", kinds(), indirect=True)
def test_attach(damaged, tmp_path):
    """The real `grpo-studio attach` under Textual's headless driver: the dashboard renders, a screenshot
    is saved, the app exits 0."""
    kind, run = damaged
    env = {
        "TEXTUAL_DRIVER": "textual.drivers.headless_driver:HeadlessDriver",
        "TEXTUAL_SCREENSHOT": "1",
        "TEXTUAL_SCREENSHOT_LOCATION": str(tmp_path),
        "TEXTUAL_SCREENSHOT_FILENAME": "shot.svg",
    }
    out = cli("attach", str(run), "--runs-dir", str(run.parent), env=env)
    assert out.returncode == 0 and "Traceback" not in out.stderr + out.stdout, out.stderr[-3000:]
    assert warning_lines(out.stderr) == expected(KINDS[kind][4], str(run), run)
    svg = (tmp_path / "shot.svg").read_text()
    screen = html.unescape(" ".join(re.findall(r">([^<]*)</text>", svg))).replace("\xa0", " ")
    state = KINDS[kind][1][0]
    assert state in screen and (f"{STEPS}/{STEPS}" in screen) == (KINDS[kind][2] == STEPS)


@pytest.mark.parametrize("damaged", kinds(), indirect=True)
def test_rundata(damaged):
    kind, run = damaged
    data = RunData(run)
    data.drain()
    assert data.steps == list(range(1, KINDS[kind][2] + 1))
    assert data.warnings() == KINDS[kind][5]
    events = [EVENT_JUNK if line == JUNK else line for line in KINDS[kind][5]]  # the dashboard's older wording
    assert [e["message"] for e in data.events if e["event"] == "warning"] == events
    for key in data.columns:  # charts never receive NaN, Infinity or a number beyond a float
        xs, ys = data.series(key)
        assert all(isinstance(y, float) and abs(y) < float("inf") for y in ys), key
    assert data.state() == KINDS[kind][1][0]
    if kind == "nan_and_infinity":
        assert data.series(metrics.REWARD)[0] == [1, 2, 5, 6]
    data.beta(), data.dtype(), data.reward_funcs(), data.eta_s()  # the config's readers take what is left


def test_report_on_a_full_disk_is_one_line(tmp_path):
    """No space left while `report` writes its first PNG: one `report error:` line, exit 2."""
    run = write_run(tmp_path / "run", STEPS)
    out_dir = tmp_path / "report"
    code = (
        "import errno, os, sys\n"
        "from matplotlib.figure import Figure\n"
        "def full(self, path, *a, **k):\n"
        "    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))\n"
        "Figure.savefig = full\n"
        "from grpo_studio.cli.main import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, "report", str(run), "--out", str(out_dir)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=ENV,
        timeout=300,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == (
        f"report error: cannot write {out_dir / 'reward.png'}: "
        f"{os.strerror(errno.ENOSPC).lower()}; the report in {out_dir} is not complete\n"
    )


@pytest.mark.anyio
async def test_the_studio_lists_and_opens_every_damaged_run(tmp_path):
    """The studio's runs list (F3) shows every damaged run, and opening each (enter) draws its dashboard."""
    from grpo_studio.studio.app import StudioApp
    from grpo_studio.studio.screens.runs_list_screen import RunsScreen
    from tests.studio_helpers import wait_until

    root = tmp_path / "runs"
    for kind, (damage, *_rest) in KINDS.items():
        if not (IS_ROOT and kind in CHMOD):
            damage(write_run(root / kind, STEPS))
    app = StudioApp(cfgmod.load("tiny-arith"), "tiny-arith", root, live_hardware=False, poll_s=3600)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.press("f3")
        await wait_until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.rows)
        runs = app.screen
        assert sorted(r["name"] for r in runs.rows) == sorted(p.name for p in root.iterdir())
        for i, row in enumerate(list(runs.rows)):
            runs.query_one("#runs-table").move_cursor(row=i)
            await pilot.press("enter")
            await wait_until(pilot, lambda: app.screen is not runs)
            assert app.screen.run.dir == row["path"]
            await pilot.pause()
            await pilot.press("escape")
            await wait_until(pilot, lambda: app.screen is runs)


@pytest.mark.parametrize(
    "kind, name, what",
    [
        ("pidfile_is_a_folder", PIDFILE, "a folder, not a trainer's lock"),
        ("checkpoints_is_a_file", CHECKPOINTS, "a file, not a folder"),
        ("metrics_is_a_folder", METRICS, "a folder, not a file"),
    ],
)
def test_resume_refuses_an_odd_entry_in_one_line_writing_nothing(kind, name, what, tmp_path):
    """What a resume must write into (the lock, checkpoints/, the streams) is refused before it writes."""
    run = write_run(tmp_path / "run", STEPS)
    KINDS[kind][0](run)
    before = sorted((p.relative_to(run), p.stat().st_size) for p in run.rglob("*"))
    out = cli("train", "--resume", str(run))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.splitlines()[-1] == (
        f"run error: {run / name}: {what}; move it away, then start the trainer again"
    )
    assert sorted((p.relative_to(run), p.stat().st_size) for p in run.rglob("*")) == before
