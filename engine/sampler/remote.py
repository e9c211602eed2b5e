"""The `rollout.colocate = false` sampler: a client of `grpo-studio rollout-serve` (engine/rollout_server).

Generation goes over HTTP (the server's VLLMBackend answers with the same token ids and μ as the
in-process backend); weights go over a torch.distributed group of their own (sampler/transport.py),
one broadcast per layer, each sync numbered: the server reports the version that produced each rollout
(rollout.async_mode = in_flight: a sync enters a running generation, and each token's version comes back).
With rollout.server empty the sampler starts the server itself (a subprocess on 127.0.0.1, its log in
the run directory's rollout_server.log, a secret of its own made for the run and handed over in the
child's environment) and stops it on close(). A named server gets the secret of rollout.server_secret_file
or GRPO_STUDIO_ROLLOUT_SECRET (sampler/auth.py); a request it refuses is one line naming why.

A server that stops answering for rollout.server_timeout seconds raises RolloutServerLost; the trainer
then writes a checkpoint, logs a `rollout_server_lost` event and ends the run (engine/run/trainer.py).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import torch

from ...contract.dtypes import DTYPES
from ...contract.errors import UserError
from . import auth, transport
from .base import Rollout, Sampling

START_LIMIT_S = 900  # an auto-started server's vLLM start-up (compiling on a slow CPU takes minutes)
LOG = "rollout_server.log"


class RolloutServerLost(RuntimeError):
    """The rollout server stopped answering (died, or hung past rollout.server_timeout)."""


@dataclasses.dataclass
class VersionedRollout(Rollout):
    policy_version: int = 0  # the weight sync that produced it (0: the checkpoint's weights)


class RemoteSampler:
    name = "vllm"  # what produced μ: a vLLM engine (the loss's rollout-correction default keys on it)

    def __init__(self, cfg, plan, log_dir: Path | None = None, emit_event=None):
        import requests

        self.http = requests.Session()
        self.timeout = cfg.rollout.server_timeout
        self.in_flight = cfg.rollout.async_mode == "in_flight"  # weights may enter a running generation
        self.emit = emit_event or (lambda kind, message, **kw: None)
        self.version = 0
        self.group = None
        self.process = None
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollout-request")
        self.pending: concurrent.futures.Future | None = None
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = DTYPES[plan.rollout_dtype].torch  # the engine dtype the server must run
        if cfg.rollout.server:
            self.address = cfg.rollout.server
            self.secret = auth.read_secret(cfg.rollout.server_secret_file, "rollout.server_secret_file")
            # where the secret came from (or would have): what a 401 names
            if cfg.rollout.server_secret_file or self.secret is None:
                self.secret_source = {"key": "rollout.server_secret_file", "value": cfg.rollout.server_secret_file}
            else:
                self.secret_source = {"key": auth.SECRET_ENV}
            self.http.headers.update(auth.header(self.secret))
            self._wait_until_up(self.timeout, f"no rollout server answers at {self.address}")
        else:
            self.address = self._start(cfg, log_dir)
        self._check_version()

    # ---- the server's life -------------------------------------------------------------------
    def _start(self, cfg, log_dir: Path | None) -> str:
        from ...contract.config import save

        folder = Path(tempfile.mkdtemp(prefix="grpo-rollout-server-"))
        save(cfg, folder / "config.toml")
        self.log = (log_dir or folder) / LOG
        port = transport.free_port()
        cmd = [sys.executable, "-m", "grpo_studio.engine.rollout_server", str(folder / "config.toml"), str(port)]
        self.secret = auth.new_secret()  # in the child's environment, which only this user can read
        self.secret_source = {"key": "rollout.server", "value": ""}
        env = {**os.environ, auth.SECRET_ENV: self.secret}
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        address = f"127.0.0.1:{port}"
        self.address = address
        self.http.headers.update(auth.header(self.secret))
        self._wait_until_up(START_LIMIT_S, f"the rollout server did not start (see {self.log})")
        self.emit("info", f"rollout server up on {address} (pid {self.process.pid}), log: {self.log}")
        return address

    def _wait_until_up(self, limit: float, failure: str) -> None:
        import requests

        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise UserError(
                    f"{failure}: it exited with code {self.process.returncode}: {self._log_tail()}", kind="rollout"
                )
            try:
                if self.http.get(self._url("health"), timeout=5).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        self.close()
        raise UserError(f"{failure} within {limit:g} s", key="rollout.server", value=self.address)

    def _log_tail(self) -> str:
        try:
            lines = [line for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return "no log"
        return lines[-1][:300] if lines else "empty log"

    def _check_version(self) -> None:
        """One line when the server's vLLM is not the trainer's (μ would come from other kernels), or its
        engine runs another dtype than the run's rollout dtype (it was started with another config)."""
        from ...contract.backend import installed_version

        info, ours = self._call("get", "version"), installed_version()
        problem = None
        if ours and info["vllm"] != ours:
            problem = f"runs vLLM {info['vllm']}, this trainer has vLLM {ours}; install the same version on both sides"
        elif info["dtype"] != self.dtype:
            problem = (
                f"runs its engine in {info['dtype']}, this run's rollout dtype is {self.dtype}; start it "
                f"with the run's config"
            )
        if problem:
            self.close()
            raise UserError(f"the server at {self.address} {problem}", key="rollout.server", value=self.address)

    def _url(self, path: str) -> str:
        return f"http://{self.address}/{path}"

    def _call(self, method: str, path: str, json=None, timeout: float | None = None):
        import requests

        try:
            answer = self.http.request(method, self._url(path), json=json, timeout=timeout or self.timeout)
        except requests.RequestException as err:
            raise RolloutServerLost(
                f"rollout server {self.address} lost during /{path}: {type(err).__name__}: {str(err)[:200]}"
            ) from None
        if answer.status_code == 401:
            if self.secret is None:
                why = (
                    f"the rollout server at {self.address} wants a secret this trainer does not have: give it its "
                    f"secret's file (mode 0600), or set {auth.SECRET_ENV}"
                )
            else:
                why = f"the rollout server at {self.address} refused this secret: it holds another one"
            raise UserError(why, **self.secret_source)
        if 400 <= answer.status_code < 500 and answer.status_code != 409:  # 409: it lost the weight group
            # this trainer's request, refused: the server was set up otherwise (another model, a smaller config)
            raise UserError(
                f"the rollout server refused /{path}: HTTP {answer.status_code} {self._why(answer)}",
                key="rollout.server",
                value=self.address,
            )
        if not answer.ok:
            raise RolloutServerLost(
                f"rollout server {self.address} failed /{path}: HTTP {answer.status_code} {self._why(answer)}"
            )
        return answer.json()

    @staticmethod
    def _why(answer) -> str:
        """The server's one line, {"error": ...}, or the start of whatever else answered."""
        try:
            return str(answer.json()["error"])[:300]
        except (ValueError, KeyError, TypeError):
            return answer.text[:300]

    # ---- rollout ---------------------------------------------------------------------------
    def generate(self, prompt_ids: list[list[int]], sampling: Sampling) -> VersionedRollout:
        return self.result(self.submit(prompt_ids, sampling))

    def submit(self, prompt_ids: list[list[int]], sampling: Sampling) -> concurrent.futures.Future:
        """Start a generation on the server; the trainer goes on (rollout.async_mode = one_step, in_flight)."""
        body = {
            "prompt_ids": [list(p) for p in prompt_ids],
            "sampling": dataclasses.asdict(sampling),
            "in_flight": self.in_flight,
        }
        self.pending = self.pool.submit(self._call, "post", "generate", body)
        return self.pending

    def result(self, future: concurrent.futures.Future) -> VersionedRollout:
        out = future.result()
        return VersionedRollout(
            completion_ids=torch.tensor(out["completion_ids"], dtype=torch.long),
            mask=torch.tensor(out["mask"], dtype=torch.float32),
            logprobs=torch.tensor(out["logprobs"], dtype=torch.float32),
            truncated=torch.tensor(out["truncated"], dtype=torch.bool),
            seconds=out["seconds"],
            policy_version=out["policy_version"],
            versions=torch.tensor(out["versions"], dtype=torch.long) if "versions" in out else None,
        )

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        return self._call("post", "score", {"sequences": sequences})["logprobs"]

    # ---- weight sync -----------------------------------------------------------------------
    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> None:
        """Broadcast the weights layer by layer while the server's /update_weights receives them, as version
        `version` (default: the last + 1; the trainer sends its starting weights as 0, since a server may
        hold another run's). A generation still running on the server finishes first, with the weights it
        started on (one_step), or takes these between two decode steps (in_flight)."""
        if self.pending is not None and not self.in_flight:
            self.pending.result()
        if self.group is None:
            self._open_group()
        parts = transport.chunks(named_tensors)
        self.version = self.version + 1 if version is None else version
        answer = self._beside(
            self._call,
            "post",
            "update_weights",
            {"version": self.version, "plan": transport.plan(parts)},
            lambda: transport.send(self.group, parts, self.device),
        )
        if answer["policy_version"] != self.version:
            raise RolloutServerLost(
                f"rollout server {self.address} took version {answer['policy_version']}, sent {self.version}"
            )

    def _open_group(self) -> None:
        host = self.address.rpartition(":")[0] or "127.0.0.1"
        host = "127.0.0.1" if host in ("localhost", "127.0.0.1") else transport.local_address(host)
        port = transport.free_port(host)
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        body = {"host": host, "port": port, "backend": backend, "timeout_s": self.timeout}
        self.group = self._beside(
            self._call,
            "post",
            "init_weights",
            body,
            lambda: transport.open_group(host, port, 0, backend, self.timeout),
            keep="mine",
        )

    def _beside(self, request, method, path, body, mine, keep="theirs"):
        """Run the HTTP request in a thread and `mine` here: both ends of one collective at once."""
        box: dict = {}

        def call():
            try:
                box["theirs"] = request(method, path, body)
            except Exception as err:  # re-raised below, in the trainer's thread
                box["error"] = err

        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        try:
            box["mine"] = mine()
        except RuntimeError as err:  # gloo/NCCL timeout: the peer never joined
            thread.join(self.timeout)
            raise box.get("error") or RolloutServerLost(
                f"rollout server {self.address}: weight transfer failed: {str(err)[:200]}"
            ) from None
        thread.join(self.timeout)
        if "error" in box:
            raise box["error"]
        if thread.is_alive():
            raise RolloutServerLost(f"rollout server {self.address} did not answer /{path} within {self.timeout:g} s")
        return box[keep]

    # ---- memory, end -----------------------------------------------------------------------
    def sleep(self) -> None:
        """The server has its own device: nothing to free here."""

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
