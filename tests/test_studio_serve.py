"""`textual serve grpo-studio` gives browser access on localhost only, and streams the studio."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

TEXTUAL = shutil.which("textual", path=str(Path(sys.executable).parent)) or shutil.which("textual")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(TEXTUAL is None, reason="needs textual-dev")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_textual_serve_binds_localhost_and_streams_the_setup_screen(tmp_path):
    websockets = pytest.importorskip("websockets")
    port = _free_port()
    studio = shutil.which("grpo-studio", path=str(Path(sys.executable).parent)) or "grpo-studio"
    # textual serve runs a Python script as `python SCRIPT`: the venv's python must come first on PATH
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    server = subprocess.Popen(
        [TEXTUAL, "serve", "--port", str(port), studio],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline, listening = time.time() + 60, []
        while time.time() < deadline and not listening:
            listening = [
                c.laddr.ip
                for c in psutil.net_connections("tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr.port == port
            ]
            time.sleep(0.2)
        assert listening == ["127.0.0.1"]  # loopback only

        async def screen_text() -> str:
            async with websockets.connect(f"ws://127.0.0.1:{port}/ws?width=80&height=24") as ws:
                await ws.send(json.dumps(["resize", {"width": 80, "height": 24}]))
                got = ""
                while "VRAM" not in got:
                    msg = await asyncio.wait_for(ws.recv(), timeout=60)
                    got += msg if isinstance(msg, str) else msg.decode("utf-8", "replace")
                return got

        text = asyncio.run(screen_text())
        assert "grpo-studio" in text and "VRAM" in text
    finally:
        server.terminate()
        server.wait(timeout=30)
