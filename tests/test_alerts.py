"""Alerts (docs/alerts.md): the rule grammar and its one-line errors, once-per-crossing firing, delivery
(events.jsonl, a webhook POST to a server started here on 127.0.0.1, notify-send), and a real run whose
bf16 rollout under an fp32 trainer crosses mismatch/k3 thresholds: each rule fires exactly once per
crossing, counted from metrics.jsonl by an independent rule (maximal runs of true rows)."""

from __future__ import annotations

import http.server
import itertools
import json
import math
import os
import socket
import stat
import threading

import pytest
from cli_helpers import run_cli

from grpo_studio.contract import alert_rules, config, rundir
from grpo_studio.contract.errors import UserError
from grpo_studio.engine.out.alerts import Alerts

GRAMMAR = (
    "'<metric> <op> <number> [for <N> steps]' (op: >, >=, <, <=), '<metric> is nan [for <N> steps]', or 'defaults'"
)


# ---- the grammar -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, metric, op, threshold, steps",
    [
        ("mismatch/k3 > 1e-3", "mismatch/k3", ">", 1e-3, 1),
        ("mismatch/k3>1e-3", "mismatch/k3", ">", 1e-3, 1),
        ("reward/mean < 0.1 for 20 steps", "reward/mean", "<", 0.1, 20),
        ("grad_norm is nan", "grad_norm", "is nan", None, 1),
        ("loss IS NaN for 3 steps", "loss", "is nan", None, 3),
        ("entropy <= -.5 for 1 step", "entropy", "<=", -0.5, 1),
        ("rewards/correctness/mean >= 1", "rewards/correctness/mean", ">=", 1.0, 1),
    ],
)
def test_rules_parse(text, metric, op, threshold, steps):
    rule = alert_rules.parse(text, reward_funcs=["correctness"])
    assert (rule.metric, rule.op, rule.threshold, rule.steps) == (metric, op, threshold, steps)


def test_defaults_expand_to_the_default_rules():
    rules = alert_rules.parse_all(["loss > 1", "defaults"])
    assert [r.text for r in rules] == ["loss > 1", *alert_rules.DEFAULT_RULES]


@pytest.mark.parametrize(
    "setting, message",
    [
        (
            'alerts.rules=["mismatch/k4 > 1e-3"]',
            "config error: alerts.rules[0] = 'mismatch/k4 > 1e-3': 'mismatch/k4' is "
            "not a metric the trainer writes (did you mean 'mismatch/k3'?)",
        ),
        (
            'alerts.rules=["loss > 1", "k3 >> 1"]',
            f"config error: alerts.rules[1] = 'k3 >> 1': not an alert rule; write {GRAMMAR}",
        ),
        (
            'alerts.rules=["loss is finite"]',
            f"config error: alerts.rules[0] = 'loss is finite': not an alert rule; write {GRAMMAR}",
        ),
        (
            'alerts.rules=["loss > 1 for 0 steps"]',
            "config error: alerts.rules[0] = 'loss > 1 for 0 steps': 'for N steps' needs 1 <= N <= 1000000",
        ),
        (
            'alerts.rules=["rewards/corectness/mean < 0.5"]',
            "config error: alerts.rules[0] = 'rewards/corectness/mean < 0.5': 'rewards/corectness/mean' is not a metric "
            "the trainer writes (did you mean 'rewards/correctness/mean'?)",
        ),
        (
            "alerts.on=finished,exploded",
            "config error: alerts.on[1] = 'exploded': allowed: finished, crashed, stopped, diverged, collapsed",
        ),
        (
            "alerts.webhook=ftp://example.org/hook",
            "config error: alerts.webhook = 'ftp://example.org/hook': an http:// "
            "or https:// URL with a host, e.g. https://hooks.example.com/alerts, or "
            "empty for none",
        ),
        ("report.to=mlflow", "config error: report.to[0] = 'mlflow': allowed: tensorboard, trackio, wandb"),
    ],
)
def test_bad_alert_and_report_settings_are_one_line_with_exit_2(setting, message, tmp_path):
    proc = run_cli("train", "tiny-arith", "--set", setting, "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [message]
    assert not (tmp_path / "run").exists()  # refused before the run directory or the model


# ---- once per crossing ---------------------------------------------------------------------------

NAN, INF = math.nan, math.inf


@pytest.mark.parametrize(
    "rule, values, fires_at",
    [
        ("loss > 1", [0, 2, 3, 0, 2], [2, 5]),  # re-armed by the 0 at step 4
        ("loss > 1 for 2 steps", [2, 0, 2, 2, 2, 0, 2, 2], [4, 8]),  # two rows in a row, once per run
        ("loss is nan", [1, NAN, None, 1, INF], [2, 5]),  # null and inf are not finite
        ("loss < 0.5", [0.1, NAN, 0.1], [1, 3]),  # a NaN row is not below: re-arms
        ("loss is nan for 2 steps", [NAN, 1, NAN, NAN, NAN], [4]),
        ("mismatch/k3 > 1e-3", [2e-3, "absent", 3e-3, 0, 5e-3], [1, 5]),  # a row without k3 changes nothing
    ],
)
def test_a_rule_fires_once_per_crossing(rule, values, fires_at):
    crossings = alert_rules.Crossings([alert_rules.parse(rule)])
    metric = crossings.rules[0].metric
    fired = []
    for step, value in enumerate(values, start=1):
        row = {"step": step} if value == "absent" else {"step": step, metric: value}
        fired += [step for _ in crossings.update(row)]
    assert fired == fires_at


# ---- delivery --------------------------------------------------------------------------------------


class Hook(http.server.ThreadingHTTPServer):
    """A webhook receiver on 127.0.0.1: keeps each POSTed JSON body; answers with `status`."""

    def __init__(self, status: int = 200):
        received, self.status = [], status

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(handler):
                body = handler.rfile.read(int(handler.headers["Content-Length"]))
                received.append((handler.headers["Content-Type"], json.loads(body)))
                handler.send_response(self.status)
                handler.end_headers()

            def log_message(handler, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.received = received
        self.url = f"http://127.0.0.1:{self.server_address[1]}/hook"
        threading.Thread(target=self.serve_forever, daemon=True).start()


@pytest.fixture
def hook():
    server = Hook()
    yield server
    server.shutdown()
    server.server_close()


def alerts_for(tmp_path, *sets: str) -> tuple[Alerts, rundir.RunWriter]:
    writer = rundir.RunWriter(tmp_path / "run")
    return Alerts(config.load("tiny-arith", list(sets)), writer), writer


def test_an_alert_is_an_event_and_a_webhook_post(tmp_path, hook):
    alerts, writer = alerts_for(
        tmp_path, 'alerts.rules=["loss is nan"]', "alerts.on=crashed", f"alerts.webhook={hook.url}"
    )
    alerts.row({"step": 1, "loss": 0.5})
    alerts.row({"step": 2, "loss": NAN})
    alerts.event("finished", "finished at step 2", 2)  # not in alerts.on
    alerts.event("crashed", "RuntimeError: boom", 2)
    events = [{k: v for k, v in e.items() if k != "time"} for e in rundir.read_events(writer.dir)]
    assert events == [
        {
            "event": "alert",
            "message": "loss is nan: loss = – at step 2",
            "rule": "loss is nan",
            "metric": "loss",
            "value": None,
            "step": 2,
        },
        {"event": "alert", "message": "run crashed: RuntimeError: boom", "rule": "on crashed", "step": 2},
    ]
    assert [kind for kind, _ in hook.received] == ["application/json"] * 2
    payloads = [{k: v for k, v in body.items() if k != "time"} for _, body in hook.received]
    where = {"event": "alert", "run": "run", "run_dir": str(writer.dir.resolve())}
    assert payloads == [{**where, **{k: v for k, v in e.items() if k != "event"}} for e in events]


@pytest.mark.parametrize("status", [500, None])  # the server answers 500; nothing listens on the port
def test_a_failing_webhook_is_a_warning_never_a_crash(tmp_path, status):
    server = Hook(status) if status else None
    if server:
        url = server.url
    else:
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{free.getsockname()[1]}/hook"
    alerts, writer = alerts_for(tmp_path, 'alerts.rules=["loss > 1"]', f"alerts.webhook={url}")
    alerts.row({"step": 1, "loss": 2.0})
    if server:
        server.shutdown()
        server.server_close()
    events = rundir.read_events(writer.dir)
    assert [e["event"] for e in events] == ["alert", "warning"]
    reason = "HTTPError: HTTP Error 500: Internal Server Error" if status else "URLError: <urlopen error [Errno 111]"
    assert events[1]["message"].startswith(f"alert not delivered by webhook {url}: {reason}"), events[1]["message"]


def test_desktop_notification_runs_notify_send(tmp_path, monkeypatch):
    """notify-send talks to a desktop bus, which this machine has none of: a notify-send on PATH here records
    its arguments instead."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "notify-send"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" >> {tmp_path / 'calls'}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    alerts, _ = alerts_for(tmp_path, 'alerts.rules=["entropy < 0.05"]', "alerts.desktop=true")
    alerts.row({"step": 3, "entropy": 0.01})
    assert (tmp_path / "calls").read_text().splitlines() == [
        "grpo-studio: run",
        "entropy < 0.05: entropy = 0.01 at step 3",
    ]


def test_desktop_without_notify_send_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError) as err:
        alerts_for(tmp_path, "alerts.desktop=true")
    assert str(err.value) == (
        "config error: alerts.desktop = true: notify-send is not on PATH (Debian: apt install "
        "libnotify-bin); set it to false"
    )


# ---- a real run ------------------------------------------------------------------------------------

THRESHOLDS = [f"{m}e{e}" for e in range(-9, -2) for m in (1, 3)]  # k3 of a bf16 rollout is ~1e-6..1e-4 here
STEPS = 9


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    """fp32 trainer, bf16 rollout (the mismatch story of docs/mismatch.md), with k3 rules at log-spaced
    thresholds, one of them for 2 steps, alerts on finished, and a webhook."""
    from grpo_studio.engine.run.trainer import Trainer

    server = Hook()
    rules = [f"mismatch/k3 > {t}" for t in THRESHOLDS] + [f"mismatch/k3 > {t} for 2 steps" for t in THRESHOLDS]
    cfg = config.load(
        "tiny-arith",
        [
            f"train.steps={STEPS}",
            "train.prompts_per_step=2",
            "rollout.num_generations=2",
            "train.save_every=0",
            "rollout.backend=hf",
            "rollout.dtype=bf16",
            f"alerts.rules={json.dumps(rules)}",
            "alerts.on=finished",
            f"alerts.webhook={server.url}",
        ],
    )
    run_dir = tmp_path_factory.mktemp("alerts") / "bf16"
    trainer = Trainer(cfg, run_dir)
    try:
        assert trainer.run() == "finished"
    finally:
        trainer.close()
        server.shutdown()
        server.server_close()
    return run_dir, rules, [body for _, body in server.received]


def crossings_expected(values: list[float], threshold: float, n: int) -> list[int]:
    """Steps where a maximal run of rows above the threshold reaches its n-th row."""
    out, step = [], 1
    for above, run in itertools.groupby(values, key=lambda v: v > threshold):
        length = len(list(run))
        if above and length >= n:
            out.append(step + n - 1)
        step += length
    return out


def test_k3_rules_fire_once_per_crossing_in_a_real_run(bf16_run):
    run_dir, rules, _ = bf16_run
    rows = rundir.read_rows(run_dir / rundir.METRICS)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    k3 = [r["mismatch/k3"] for r in rows]
    alerts = [e for e in rundir.read_events(run_dir) if e["event"] == "alert"]
    fired = {rule: [e["step"] for e in alerts if e["rule"] == rule] for rule in rules}
    expected = {rule: crossings_expected(k3, float(rule.split()[2]), 2 if "for 2" in rule else 1) for rule in rules}
    assert fired == expected, k3
    # the run exercised both halves of "once per crossing": a rule true on consecutive rows that fired once,
    # and a rule that re-armed and fired again
    assert any(len(steps) == 1 and sum(v > float(r.split()[2]) for v in k3) > 1 for r, steps in fired.items()), k3
    assert any(len(steps) > 1 for steps in fired.values()), k3
    assert [e["message"] for e in alerts if e["rule"] == "on finished"] == [f"run finished: finished at step {STEPS}"]


def test_the_webhook_received_every_alert_of_the_run(bf16_run):
    run_dir, _, received = bf16_run
    alerts = [e for e in rundir.read_events(run_dir) if e["event"] == "alert"]
    assert len(received) == len(alerts) > 0
    for body, event in zip(received, alerts):
        assert (body["event"], body["run"], body["run_dir"]) == ("alert", "bf16", str(run_dir.resolve()))
        assert {k: body[k] for k in event if k not in ("event", "time")} == {
            k: v for k, v in event.items() if k not in ("event", "time")
        }


# ---- the studio ------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_dashboard_highlights_an_alert_and_rings_the_bell_for_a_live_one(tmp_path):
    """The events log shows an alert as a highlighted line; an alert that arrives while the dashboard is open
    rings the bell once per poll, the replayed history does not. (The bell is counted: no terminal here.)"""
    from textual.app import App
    from textual.widgets import RichLog, TabbedContent

    from grpo_studio.benchmarks.synthetic_run import write_run
    from grpo_studio.studio.screens.dashboard_screen import EVENT_STYLE, DashboardScreen
    from tests.studio_helpers import anyio_backend  # noqa: F401

    run_dir = write_run(tmp_path / "run", steps=4, total=10, state="running")
    writer = rundir.RunWriter(run_dir)
    writer.event("alert", "mismatch/k3 > 1e-3: mismatch/k3 = 2.00e-03 at step 3", rule="mismatch/k3 > 1e-3", step=3)

    class Host(App):
        bells = 0

        def bell(self) -> None:
            Host.bells += 1

        def on_mount(self) -> None:
            self.push_screen(DashboardScreen(run_dir, poll_s=3600, live_hardware=False))

    app = Host()
    async with app.run_test(size=(120, 40)) as pilot:
        dash = app.screen
        dash.query_one(TabbedContent).active = "events"  # a hidden RichLog defers what it is given
        await pilot.pause()
        dash.run.poll()
        dash._events()
        await pilot.pause()
        log = dash.query_one("#events-log", RichLog)
        alert_lines = [line for line in log.lines if "mismatch/k3 > 1e-3" in line.text]
        assert len(alert_lines) == 1 and Host.bells == 0  # the history: highlighted, silent
        assert all(
            str(seg.style) == EVENT_STYLE["alert"]
            for seg in alert_lines[0]
            if seg.text.strip() and not seg.text.strip()[0].isdigit()
        )
        writer.event("alert", "run crashed: RuntimeError: boom", rule="on crashed", step=4)
        writer.event("alert", "loss is nan: loss = – at step 4", rule="loss is nan", step=4)
        dash.run.poll()
        dash._events()
        await pilot.pause()
        assert Host.bells == 1
        assert sum("run crashed" in line.text or "loss is nan" in line.text for line in log.lines) == 2
