"""Alerts: `alerts.rules` evaluated on each metrics row, and `alerts.on` run events, delivered.

The grammar and the once-per-crossing logic are torch-free (contract/alert_rules.py). Each firing
is an `alert` event in events.jsonl (the studio shows it highlighted, with the bell), the terminal bell
when the trainer's stderr is a terminal, a desktop notification (alerts.desktop: notify-send) and a JSON
POST to alerts.webhook. A notification that fails is a `warning` event, never a crashed run.
docs/alerts.md is the user's page.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
import urllib.request

from ...contract import alert_rules
from ...contract.config import Config
from ...contract.errors import UserError, describe
from ...contract.metrics import STEP, fmt
from ...contract.rundir import RunWriter

NOTIFY_TIMEOUT_S = 5.0  # a slow webhook or desktop bus holds the step this long at most


class Alerts:
    def __init__(self, cfg: Config, writer: RunWriter):
        self.crossings = alert_rules.Crossings(alert_rules.parse_all(cfg.alerts.rules, cfg.rewards.funcs))
        self.on, self.webhook, self.writer = set(cfg.alerts.on), cfg.alerts.webhook, writer
        self.desktop = shutil.which("notify-send") if cfg.alerts.desktop else None
        if cfg.alerts.desktop and self.desktop is None:
            raise UserError(
                "notify-send is not on PATH (Debian: apt install libnotify-bin); set it to false",
                key="alerts.desktop",
                value=True,
            )

    def row(self, row: dict) -> None:
        for rule, value in self.crossings.update(row):
            self.fire(
                f"{rule.text}: {rule.metric} = {fmt(value)} at step {row[STEP]}",
                rule=rule.text,
                metric=rule.metric,
                value=value if math.isfinite(value) else None,
                step=row[STEP],
            )

    def event(self, kind: str, message: str, step: int) -> None:
        if kind in self.on:
            self.fire(f"run {kind}: {message}", rule=f"on {kind}", step=step)

    def fire(self, message: str, **fields) -> None:
        self.writer.event("alert", message, **fields)
        if sys.stderr.isatty():
            sys.stderr.write("\a")
            sys.stderr.flush()
        run = self.writer.dir.name
        if self.desktop:
            self._try(
                "desktop notification",
                lambda: subprocess.run(
                    [self.desktop, f"grpo-studio: {run}", message],
                    check=True,
                    capture_output=True,
                    timeout=NOTIFY_TIMEOUT_S,
                ),
            )
        if self.webhook:
            payload = {
                "event": "alert",
                "run": run,
                "run_dir": str(self.writer.dir.resolve()),
                "message": message,
                "time": time.time(),
                **fields,
            }
            request = urllib.request.Request(
                self.webhook,
                data=json.dumps(payload).encode(),
                headers={"Content-Type": "application/json"},
                method="POST",
            )
            self._try(
                f"webhook {self.webhook}", lambda: urllib.request.urlopen(request, timeout=NOTIFY_TIMEOUT_S).close()
            )

    def _try(self, what: str, send) -> None:
        try:
            send()
        except Exception as err:  # OSError, HTTPError, a timeout, notify-send's exit status: the run goes on
            self.writer.event("warning", f"alert not delivered by {what}: {describe(err)}")
