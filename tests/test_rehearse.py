"""`grpo-studio train --rehearse` (engine/run/rehearsal.py): one real step on the longest prompt at the full completion
length before the run, its peak memory next to the planner's, nothing of it in the run directory."""

from __future__ import annotations

import json
import re
import types

import pytest
from cli_helpers import ROOT, run_cli

from grpo_studio.contract import config
from grpo_studio.contract.rundir import EVENTS, METRICS, read_events

LINE = re.compile(
    r"^rehearsal: one step on the longest prompt \((\d+) tokens\) at (\d+) completion tokens, "
    r"micro-batch 128 \(auto: the whole step\): "
    r"peak ([\d.]+) GiB measured \(([^)]*)\), ([\d.]+) GiB planned \(host RAM\)$",
    re.M,
)
PREFLIGHT = re.compile(
    r"^pre-flight: ([\d.]+) GiB planned, ([\d.]+) GiB free on host RAM; micro-batch auto = 128 rows \(the whole step\)$",
    re.M,
)


def longest_by_hand(cfg: config.Config) -> int:
    """The longest training prompt in tokens, as the pre-load prompt-length check measures it."""
    from grpo_studio.engine.model import policy_loader
    from grpo_studio.engine.prompts import data, prompt_render

    rows = data.load_rows(cfg.data, "train")
    tokenizer = policy_loader.load_tokenizer(policy_loader.resolve_model_path(cfg.model.name))
    return prompt_render.check_prompt_lengths(rows, cfg.data, tokenizer, cfg.rollout.max_prompt_len)


@pytest.fixture(scope="module")
def rehearsed(tmp_path_factory):
    run = tmp_path_factory.mktemp("rehearse") / "run"
    out = run_cli("train", "tiny-arith", "--set", "train.steps=1", "--run-dir", str(run), "--rehearse", cwd=ROOT)
    return run, out


def test_the_cli_prints_the_rehearsal_next_to_the_plan_and_the_run_keeps_nothing_of_it(rehearsed):
    run, out = rehearsed
    assert out.returncode == 0, out.stderr
    (planned_preflight, _free) = PREFLIGHT.search(out.stdout).groups()
    match = LINE.search(out.stdout)
    assert match, out.stdout
    _prompt, _completion, measured, how, planned = match.groups()
    assert float(measured) > 0 and "ru_maxrss" in how  # this machine has no GPU: the peak RSS growth
    assert planned == planned_preflight
    assert out.stdout.index("rehearsal:") < out.stdout.index("run directory:")  # before the run starts
    rows = [json.loads(line) for line in (run / METRICS).read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]  # train.steps rows: the rehearsal's step is not among them
    running, event = [e for e in read_events(run) if e["event"] == "rehearsal"]  # its phase while it ran, its result
    assert running["phase"] == "running" and event["phase"] == "done"
    assert event["message"] == match.group(0)
    assert event["measured_gib"] > 0 and f"{event['planned_gib']:.2f}" == planned
    kinds = [e["event"] for e in read_events(run)]
    assert kinds.index("rehearsal") < kinds.index("started")
    assert (run / EVENTS).is_file() and not list(run.glob("*rehears*"))


def test_the_rehearsal_takes_the_longest_prompt_at_the_longest_completion(rehearsed):
    _run, out = rehearsed
    prompt, completion = map(int, LINE.search(out.stdout).groups()[:2])
    cfg = config.load("tiny-arith", ["train.steps=1"])
    assert prompt == longest_by_hand(cfg)
    assert completion == cfg.rollout.max_completion_len


def test_the_longest_prompt_of_a_file_and_every_completion_full(tmp_path):
    """One prompt much longer than the others: the step runs on it, every completion at max_completion_len."""
    from grpo_studio.engine.run import rehearsal

    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(20)]
    rows[7] = {"prompt": "12345+67890+11111+22222+33333=", "answer": "146901"}
    source = tmp_path / "d.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = config.load(
        "tiny-arith",
        [
            f"data.source={source}",
            "rollout.max_prompt_len=64",
            "rollout.max_completion_len=12",
            "rollout.num_generations=2",
            "train.prompts_per_step=2",
        ],
    )
    result = rehearsal.rehearse(cfg, 1.0, 100.0, "host RAM")
    assert result.prompt_tokens == longest_by_hand(cfg) > 8
    assert result.completion_tokens == 12
    assert result.measured_gib > 0 and result.fits
    assert result.line().startswith(f"rehearsal: one step on the longest prompt ({result.prompt_tokens} tokens) at 12 ")


def test_a_peak_over_the_free_memory_stops_the_run_in_one_line(tmp_path, monkeypatch, capsys):
    """The trainer process (--no-supervisor) with a device that has almost nothing free: the rehearsal's peak is
    refused in one line naming both numbers, and the new run's directory is left as it was (none)."""
    from grpo_studio.cli import main as cli_main
    from grpo_studio.contract.planner import preflight

    monkeypatch.setattr(preflight, "devices", lambda: [preflight.Device("cpu", "host RAM", 1.0, 0.001)])
    run = tmp_path / "run"
    code = cli_main.main(
        [
            "train",
            "--no-supervisor",
            "tiny-arith",
            "--set",
            "train.steps=1",
            "--set",
            "rollout.num_generations=2",
            "--set",
            "train.prompts_per_step=2",
            "--run-dir",
            str(run),
            "--rehearse",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert re.search(r"rehearsal step peaked at [\d.]+ GiB and host RAM has 0\.00 GiB free", err), err
    assert not run.exists()


def test_rehearse_is_refused_with_several_processes(tmp_path):
    out = run_cli(
        "train",
        "tiny-arith",
        "--set",
        "train.parallel=ddp",
        "--nproc",
        "2",
        "--run-dir",
        str(tmp_path / "r"),
        "--rehearse",
        cwd=ROOT,
    )
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == [out.stderr.strip()] and "--nproc = 2" in out.stderr
    assert "--rehearse" in out.stderr and not (tmp_path / "r").exists()


@pytest.mark.anyio
async def test_the_setup_screen_launches_with_rehearse(tmp_path, monkeypatch):
    """ctrl+b on the setup screen launches as ctrl+r does, with `train --rehearse`."""
    from grpo_studio.studio import hardware, launcher
    from grpo_studio.studio.app import StudioApp

    monkeypatch.setattr(hardware, "gpus", lambda: [])
    commands = []
    exited = types.SimpleNamespace(pid=0, poll=lambda: 0)  # a trainer that has ended: the app reaps it
    monkeypatch.setattr(launcher.subprocess, "Popen", lambda cmd, **kw: commands.append(cmd) or exited)
    app = StudioApp(config.load("tiny-arith"), "tiny-arith", tmp_path / "runs", live_hardware=False)
    monkeypatch.setattr(app, "open_run", lambda run_dir: None)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("ctrl+b")
        await pilot.pause()
    (cmd,) = commands
    assert cmd[3] == "train" and cmd[-1] == "--rehearse"
