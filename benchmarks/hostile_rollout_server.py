"""The fault suite's hostile cases for the rollout server (benchmarks/fault_probes.py says how they run): what a
stranger on the machine (or the network) sends its port, and what a careless hand gives `rollout-serve`.

Requests without the secret, with a wrong one, or with it where it does not belong are refused with 401 before the
body is read; an authenticated request that is malformed, oversize, out of the model's vocabulary or context, or an
update plan that does not match the served model's parameters, is a 4xx with one line and reaches neither the
engine nor an allocation (engine/rollout_server/). The HTTP layer's probes run the real API and guard on a real
port around a stand-in backend (StandIn: no vLLM); the slow ones start the real server."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .fault_cases import Case, train
from .fault_probes import Probe

CATEGORY = "rollout server"
SECRET = "probe-secret-" + "x" * 20
NO_SECRET = "no valid secret: send the header 'Authorization: Bearer <secret>' (docs/rollout_server.md)"
ROLLOUT = ["--set", "rollout.backend=vllm", "--set", "rollout.vllm_enforce_eager=on"]


class StandIn:
    """A backend for the HTTP layer's probes: n one-token completions per prompt, every call and load recorded."""

    version, platform, vllm_dtype = "stand-in", "cpu", "bfloat16"

    def __init__(self):
        self.calls = []

    def generate(self, prompt_ids, sampling, between_steps=None):
        import torch

        from ..engine.sampler.base import Rollout

        self.calls.append("generate")
        rows = len(prompt_ids) * sampling.n
        return Rollout(
            torch.ones(rows, 1, dtype=torch.long),
            torch.ones(rows, 1),
            torch.zeros(rows, 1),
            torch.zeros(rows, dtype=torch.bool),
        )

    def score(self, sequences):
        self.calls.append("score")
        return [[0.0] * (len(s) - 1) for s in sequences]

    def load_weights(self, named_tensors):
        self.calls.append(("load", {name: t.clone() for name, t in named_tensors}))


def served():
    """The bundled tiny-arith's parameters and limits (vocabulary 64, context 80 as its recipe runs it)."""
    from ..engine.model import policy_loader
    from ..engine.rollout_server.http_api import Served
    from ..engine.sampler.vllm_sync import Checkpoint

    path = policy_loader.resolve_model_path("tiny-arith")
    return Served(Checkpoint(path).shapes(), 64, 80)


@contextlib.contextmanager
def stand_in_server(secret: str | None = SECRET, max_body: int = 2**20):
    """The real API and guard on a free loopback port around a StandIn; yields (base url, Server)."""
    import torch
    import uvicorn

    from ..engine.rollout_server.http_api import Server, build_app
    from ..engine.sampler import transport

    server = Server(StandIn(), torch.device("cpu"), served())
    port = transport.free_port()
    http = uvicorn.Server(uvicorn.Config(build_app(server, secret, max_body), port=port, log_level="critical"))
    thread = threading.Thread(target=http.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not http.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        http.should_exit = True
        thread.join(10)


def auth(secret: str = SECRET) -> dict:
    return {"Authorization": f"Bearer {secret}"}


JSON_AUTH = {**auth(), "content-type": "application/json"}  # what a raw `data=` body needs to be read as JSON


GENERATE = {"prompt_ids": [[3, 4, 5]], "sampling": {"n": 2, "max_tokens": 4}}
PLAN = [{"dtype": "float32", "tensors": [["model.norm.weight", [256]]]}]


def answered(method: str, path: str, expect: int, why: str | None, body=None, headers=None, data=None, **kw):
    """A check: the request gets HTTP `expect` with the one line {"error": why} (None: any one line), the
    stand-in engine sees no call, and the server still answers /health afterwards."""

    def check(tmp: Path) -> str | None:
        import requests

        with stand_in_server(**kw) as (url, server):
            args = {"json": body} if data is None else {"data": data}
            r = requests.request(method, url + path, headers=headers, timeout=30, **args)
            error = _error(r)
            if r.status_code != expect or error is None or (why is not None and error != why):
                return f"HTTP {r.status_code} {r.text[:300]!r}; expected {expect} {why!r}"
            if server.backend.calls or server.group is not None or server.version != 0:
                return f"reached the engine: {server.backend.calls[:1]}, group {server.group}, version {server.version}"
            if requests.get(url + "/health", timeout=10).json() != {"ok": True, "policy_version": 0}:
                return "/health changed"
        return None

    return check


def _error(r) -> str | None:
    """The answer's one-line error, or None when it is not {"error": "one line"}."""
    try:
        error = r.json()["error"]
    except (ValueError, KeyError, TypeError):
        return None
    return error if isinstance(error, str) and error and "\n" not in error else None


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sampling(**change) -> dict:
    return {"prompt_ids": [[3, 4, 5]], "sampling": {"n": 2, "max_tokens": 4, **change}}


def _plan(dtype="float32", *tensors) -> dict:
    return {
        "version": 1,
        "plan": [{"dtype": dtype, "tensors": [list(t) for t in tensors] or [["model.norm.weight", [256]]]}],
    }


def stranger_store_stays_unjoined(tmp: Path) -> str | None:
    """The issue's attack: a stranger hosts a TCPStore, asks the server to join it, then sends weights. Both
    requests are 401 and the server never connects to the store (it holds no client key)."""
    import requests
    import torch.distributed as dist

    port = _closed_port()
    store = dist.TCPStore("127.0.0.1", port, 2, True, timeout=datetime.timedelta(seconds=5), wait_for_workers=False)
    with stand_in_server() as (url, server):
        a = requests.post(url + "/init_weights", json={"host": "127.0.0.1", "port": port, "timeout_s": 3}, timeout=30)
        b = requests.post(url + "/update_weights", json=_plan(), timeout=30)
        time.sleep(0.5)
        health = requests.get(url + "/health", timeout=10).json()
    if (a.status_code, b.status_code) != (401, 401):
        return f"/init_weights {a.status_code}, /update_weights {b.status_code}"
    if server.group is not None or health["policy_version"] != 0 or store.num_keys() != 0:  # a client adds a key
        return f"group {server.group}, version {health['policy_version']}, store keys {store.num_keys()}"
    return None


def trainer_group_then_bad_plans(tmp: Path) -> str | None:
    """An authenticated trainer joins (a real gloo group), then sends plans that do not match the served model:
    each is 400 with one line before anything is received, and the group still carries a good update after."""
    import requests
    import torch

    from ..engine.sampler import transport

    port = _closed_port()
    with stand_in_server() as (url, server):
        box = {}
        joining = threading.Thread(
            target=lambda: box.update(
                r=requests.post(
                    url + "/init_weights",
                    headers=auth(),
                    json={"host": "127.0.0.1", "port": port, "timeout_s": 20},
                    timeout=60,
                )
            )
        )
        joining.start()
        group = transport.open_group("127.0.0.1", port, 0, "gloo", 20)
        joining.join(60)
        if box["r"].status_code != 200:
            return f"init: HTTP {box['r'].status_code} {box['r'].text[:200]}"
        for bad in (_plan("float32", ["model.norm.weight", [255]]), _plan("float32", ["lm_head.bias", [64]])):
            r = requests.post(url + "/update_weights", headers=auth(), json=bad, timeout=30)
            if r.status_code != 400 or _error(r) is None:
                return f"bad plan {bad['plan']}: HTTP {r.status_code} {r.text[:200]}"
        norm = torch.full((256,), 1337.0)
        parts = [[("model.norm.weight", norm)]]
        box.clear()
        sending = threading.Thread(
            target=lambda: box.update(
                r=requests.post(
                    url + "/update_weights",
                    headers=auth(),
                    json={"version": 7, "plan": transport.plan(parts)},
                    timeout=60,
                )
            )
        )
        sending.start()
        transport.send(group, parts, torch.device("cpu"))
        sending.join(60)
        loads = [c for c in server.backend.calls if c[0] == "load"]
        if box["r"].json() != {"policy_version": 7, "load_s": server.sync_s} or len(loads) != 1:
            return f"good update: {box['r'].text[:200]}, loads {len(loads)}"
        if not torch.equal(loads[0][1]["model.norm.weight"], norm):
            return "the loaded tensor is not the one sent"
    return None


def init_to_http(tmp: Path) -> str | None:
    """/init_weights pointed at the server's own HTTP port: 400 naming host:port within the request's timeout."""
    import requests

    with stand_in_server() as (url, server):
        port = int(url.rpartition(":")[2])
        body = {"host": "127.0.0.1", "port": port, "timeout_s": 2}
        r = requests.post(url + "/init_weights", headers=auth(), json=body, timeout=60)
        error = _error(r) or ""
        if r.status_code != 400 or not error.startswith(f"cannot join the weight group at 127.0.0.1:{port}: "):
            return f"HTTP {r.status_code} {r.text[:300]!r}"
        return None if server.group is None else "a group was opened"


def two_headers(tmp: Path) -> str | None:
    """Two Authorization headers, the right one first: 401 (a proxy may have added one; which is meant?)."""
    import http.client

    with stand_in_server() as (url, server):
        conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=30)
        conn.putrequest("GET", "/version")
        for value in (f"Bearer {SECRET}", "Bearer wrong"):
            conn.putheader("Authorization", value)
        conn.endheaders()
        answer = conn.getresponse()
        body = json.loads(answer.read())
        conn.close()
    return None if (answer.status, body) == (401, {"error": NO_SECRET}) else f"HTTP {answer.status} {body}"


def _raw(url: str, head: str, timeout: float = 30) -> bytes:
    """The answer to a request of headers alone (no byte of the body it announces), read until the server closes
    or stops answering within `timeout` (then the answer ends with b'<no answer>')."""
    with socket.create_connection(("127.0.0.1", int(url.rpartition(":")[2])), timeout=timeout) as conn:
        conn.sendall(head.encode())
        out = b""
        try:
            while chunk := conn.recv(65536):
                out += chunk
                if b"\r\n\r\n" in out and out.endswith(b"}"):
                    break
        except TimeoutError:
            out += b"<no answer>"
    return out


def unread_body(path: str, want: bytes, secret: str | None, headers: str = ""):
    """A check: a request announcing a 16 MB body, without sending it, is answered `want` (the status line and
    the one-line body) by a server whose limit is 1 GiB: the answer needs no byte of the body."""

    def check(tmp: Path) -> str | None:
        with stand_in_server(secret=secret, max_body=2**30) as (url, server):
            head = f"POST {path} HTTP/1.1\r\nHost: x\r\n{headers}Content-Length: 16000000\r\n\r\n"
            out = _raw(url, head)
            status, body = out.split(b"\r\n")[0], out.partition(b"\r\n\r\n")[2]
            if (status, body) != (want.split(b"\n")[0], want.split(b"\n")[1]):
                return f"answer {out[:300]!r}; expected {want!r}"
            return None if not server.backend.calls else "reached the engine"

    return check


def silent_store(tmp: Path) -> str | None:
    """/init_weights to a port that accepts and never answers (a TCPStore client waits for its first answer
    without a bound): 400 within the request's timeout_s (3 s) plus the probe's slack, and the transfer lock is
    let go: a second /init_weights, to a closed port, is answered too."""
    import requests

    with socket.socket() as silent, stand_in_server() as (url, server):
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        r = requests.post(
            url + "/init_weights", headers=auth(), json={"host": "127.0.0.1", "port": port, "timeout_s": 3}, timeout=30
        )
        want = (
            f"cannot join the weight group at 127.0.0.1:{port}: TimeoutError: no TCPStore answered within 3 s "
            "(the port accepts, but does not answer)"
        )
        if (r.status_code, _error(r)) != (400, want):
            return f"HTTP {r.status_code} {r.text[:300]!r}"
        closed = _closed_port()
        r = requests.post(
            url + "/init_weights",
            headers=auth(),
            json={"host": "127.0.0.1", "port": closed, "timeout_s": 1},
            timeout=30,
        )
        if r.status_code != 400 or not (_error(r) or "").startswith(
            f"cannot join the weight group at 127.0.0.1:{closed}"
        ):
            return f"the second /init_weights: HTTP {r.status_code} {r.text[:300]!r}"
        return None if server.group is None else "a group was opened"


class Refusing(StandIn):
    """A stand-in engine that raises `error` on every generation, as vLLM raises for what it will not run."""

    def __init__(self, error: Exception):
        super().__init__()
        self.error = error

    def generate(self, prompt_ids, sampling, between_steps=None):
        raise self.error


def engine_raises(make_error: Callable[[], Exception], want: int, why: str):
    """A check: a /generate that passes the API's checks but that the engine raises on: HTTP `want`, one line."""

    def check(tmp: Path) -> str | None:
        import requests

        with stand_in_server() as (url, server):
            server.backend = Refusing(make_error())
            r = requests.post(url + "/generate", headers=auth(), json=GENERATE, timeout=30)
            return None if (r.status_code, _error(r)) == (want, why) else f"HTTP {r.status_code} {r.text[:300]!r}"

    return check


def _vllm_validation_error() -> Exception:
    from vllm.exceptions import VLLMValidationError

    return VLLMValidationError("a check the API has not", parameter="x", value=1)


def accepted(headers: dict):
    """A check: GET /version with these headers is answered 200 with the server's versions."""

    def check(tmp: Path) -> str | None:
        import requests

        with stand_in_server() as (url, server):
            r = requests.get(url + "/version", headers=headers, timeout=30)
            return None if r.status_code == 200 and r.json()["vllm"] == "stand-in" else f"HTTP {r.status_code} {r.text}"

    return check


def _serve_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "grpo_studio.cli.main", "rollout-serve", "tiny-arith", *ROLLOUT, *args]


def serve_refused(args: list[str], env: dict, want: str, prepare: Callable[[Path], None] | None = None):
    """A check: `rollout-serve` with these arguments and environment exits 2 with exactly the line `want`
    ({tmp} in it and in the arguments: the probe's folder), before any engine starts."""

    def check(tmp: Path) -> str | None:
        if prepare:
            prepare(tmp)
        argv = [a.replace("{tmp}", str(tmp)) for a in _serve_argv(*args)]
        environ = {k: v for k, v in os.environ.items() if k != "GRPO_STUDIO_ROLLOUT_SECRET"} | env
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=120, env=environ, cwd=tmp, stdin=subprocess.DEVNULL
        )
        expected = want.replace("{tmp}", str(tmp)) + "\n"
        if (done.returncode, done.stderr) != (2, expected):
            return f"exit {done.returncode}, stderr {done.stderr[-400:]!r}; expected {expected!r}"
        return None

    return check


def _secret_file(text: str, mode: int = 0o600) -> Callable[[Path], None]:
    def prepare(tmp: Path) -> None:
        path = tmp / "secret"
        path.write_text(text)
        path.chmod(mode)

    return prepare


def _fifo(tmp: Path) -> None:
    os.mkfifo(tmp / "secret", 0o600)


MAKE = "make one with: (umask 077; openssl rand -hex 32 > FILE)"


def real_server_holds(tmp: Path) -> str | None:
    """The real `rollout-serve` (vLLM) with a secret file: the stranger's attack is 401 at every endpoint but
    /health, its oversize body 413; the trainer's bad requests one-line 4xx; its log has no C++ stack."""
    import requests

    secret = tmp / "secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    port = _closed_port()
    log = open(tmp / "server.log", "wb")
    process = subprocess.Popen(
        _serve_argv("--port", str(port), "--secret-file", str(secret)),
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                return f"the server did not start: {(tmp / 'server.log').read_text()[-400:]!r}"
            with contextlib.suppress(requests.RequestException):
                if requests.get(url + "/health", timeout=5).ok:
                    break
            time.sleep(0.5)
        checks = [
            ("get", "/version", None, {}, 401),
            ("post", "/init_weights", {"host": "127.0.0.1", "port": _closed_port()}, {}, 401),
            ("post", "/update_weights", _plan(), {}, 401),
            ("post", "/generate", _sampling(), {}, 401),
            ("post", "/score", {"sequences": [[3, 4]]}, {}, 401),
            ("post", "/update_weights", _plan("float32", ["model.norm.weight", [1, 256]]), auth(), 400),
            ("post", "/update_weights", _plan(), auth(), 409),
            ("post", "/generate", _sampling(bogus=1), auth(), 400),
            ("post", "/init_weights", {"host": "127.0.0.1", "port": _closed_port(), "timeout_s": 2}, auth(), 400),
        ]
        for method, path, body, headers, want in checks:
            r = requests.request(method, url + path, json=body, headers=headers, timeout=60)
            if r.status_code != want or _error(r) is None:
                return f"{path} {headers and 'with' or 'without'} the secret: HTTP {r.status_code} {r.text[:200]!r}"
        r = requests.post(url + "/generate", headers=auth(), data=b"x" * (30 * 2**20), timeout=60)
        if r.status_code != 413:
            return f"a 30 MB body: HTTP {r.status_code}"
        if requests.get(url + "/health", timeout=10).json() != {"ok": True, "policy_version": 0}:
            return "/health changed"
    finally:
        process.terminate()
        process.wait(60)
        log.close()
    text = (tmp / "server.log").read_text(errors="replace")
    if "frame #" in text or "Traceback" in text:
        return f"the server's log holds a stack: {text[-400:]!r}"
    return None


def cases() -> list:
    p = lambda name, check, timeout_s=60.0, slow=False: Probe(CATEGORY, name, check, timeout_s, slow)  # noqa: E731
    good = {"host": "127.0.0.1", "port": 1, "timeout_s": 2}
    return [
        # a stranger: every endpoint but /health, without the secret
        p("no secret: GET /version", answered("get", "/version", 401, NO_SECRET)),
        p("no secret: POST /generate", answered("post", "/generate", 401, NO_SECRET, GENERATE)),
        p("no secret: POST /score", answered("post", "/score", 401, NO_SECRET, {"sequences": [[3, 4]]})),
        p("no secret: POST /init_weights", answered("post", "/init_weights", 401, NO_SECRET, good)),
        p("no secret: POST /update_weights", answered("post", "/update_weights", 401, NO_SECRET, _plan())),
        p("no secret: an unknown path is 401, not 404", answered("get", "/admin", 401, NO_SECRET)),
        p("the stranger's store and weights (the issue's attack)", stranger_store_stays_unjoined),
        # a stranger guessing at the secret
        p("wrong secret", answered("post", "/generate", 401, NO_SECRET, GENERATE, auth("x" * 33))),
        p("empty secret", answered("post", "/generate", 401, NO_SECRET, GENERATE, {"Authorization": "Bearer "})),
        p("the secret and one character more", answered("get", "/version", 401, NO_SECRET, headers=auth(SECRET + "x"))),
        p(
            "the secret without 'Bearer'",
            answered("get", "/version", 401, NO_SECRET, headers={"Authorization": SECRET}),
        ),
        p("overlong secret (64 KiB)", answered("get", "/version", 401, NO_SECRET, headers=auth("s" * 65536))),
        p(
            "the secret in the query string",
            answered("post", f"/generate?secret={SECRET}&token={SECRET}", 401, NO_SECRET, GENERATE),
        ),
        p("two Authorization headers, one of them right", two_headers),
        p("30 MB body without the secret", answered("post", "/generate", 401, NO_SECRET, data=b"x" * (30 * 2**20))),
        # the trainer's side, authenticated: what a broken or hostile client sends
        p("30 MB body", answered("post", "/generate", 413, None, headers=auth(), data=b"x" * (30 * 2**20))),
        p(
            "chunked body over the limit",
            answered("post", "/generate", 413, None, headers=JSON_AUTH, data=(b"x" * 2**16 for _ in range(40))),
        ),
        p(
            "malformed JSON",
            answered(
                "post",
                "/generate",
                400,
                None,
                headers=JSON_AUTH,
                data=b'{"prompt_ids": [[1',
            ),
        ),
        p(
            "prompt_ids as text",
            answered(
                "post", "/generate", 400, None, {"prompt_ids": "1 2 3", "sampling": {"n": 1, "max_tokens": 1}}, auth()
            ),
        ),
        p(
            "a boolean for n",
            answered(
                "post", "/generate", 400, "sampling.n: Input should be a valid integer", _sampling(n=True), auth()
            ),
        ),
        p(
            "negative token id",
            answered(
                "post",
                "/generate",
                400,
                "prompt_ids[0] holds token id -1; the vocabulary is 0 to 63",
                {"prompt_ids": [[3, -1]], "sampling": {"n": 1, "max_tokens": 1}},
                auth(),
            ),
        ),
        p(
            "token id past the vocabulary",
            answered(
                "post",
                "/generate",
                400,
                "prompt_ids[0] holds token id 64; the vocabulary is 0 to 63",
                {"prompt_ids": [[64]], "sampling": {"n": 1, "max_tokens": 1}},
                auth(),
            ),
        ),
        p(
            "a prompt as long as the context (vLLM needs room for one token)",
            answered(
                "post",
                "/generate",
                400,
                "prompt_ids[0] has 80 tokens; 1 to 79 (the context of 80 less the one token vLLM generates)",
                {"prompt_ids": [[1] * 80], "sampling": {"n": 1, "max_tokens": 1}},
                auth(),
            ),
        ),
        p(
            "an empty prompt",
            answered(
                "post",
                "/generate",
                400,
                "prompt_ids[0] has 0 tokens; 1 to 79 (the context of 80 less the one token vLLM generates)",
                {"prompt_ids": [[]], "sampling": {"n": 1, "max_tokens": 1}},
                auth(),
            ),
        ),
        p(
            "negative max_tokens",
            answered(
                "post",
                "/generate",
                400,
                "sampling.max_tokens: Input should be greater than or equal to 1",
                _sampling(max_tokens=-5),
                auth(),
            ),
        ),
        p(
            "n of a billion",
            answered(
                "post",
                "/generate",
                400,
                "sampling.n: Input should be less than or equal to 1024",
                _sampling(n=10**9),
                auth(),
            ),
        ),
        p(
            "a 5,000-digit seed",
            answered(
                "post",
                "/generate",
                400,
                None,
                headers=JSON_AUTH,
                data=b'{"prompt_ids": [[1]], "sampling": {"n": 1, "max_tokens": 1, "seed": ' + b"9" * 5000 + b"}}",
            ),
        ),
        p(
            "NaN temperature",
            answered(
                "post",
                "/generate",
                400,
                "sampling.temperature: Input should be a finite number",
                headers=JSON_AUTH,
                data=b'{"prompt_ids": [[1]], "sampling": {"n": 1, "max_tokens": 1, "temperature": NaN}}',
            ),
        ),
        p(
            "unknown sampling key",
            answered(
                "post",
                "/generate",
                400,
                "sampling.logits_processors: Extra inputs are not permitted",
                _sampling(logits_processors="os.system"),
                auth(),
            ),
        ),
        p(
            "update before init",
            answered("post", "/update_weights", 409, "no weight group: POST /init_weights first", _plan(), auth()),
        ),
        p(
            "plan naming an unknown parameter",
            answered(
                "post",
                "/update_weights",
                400,
                "plan[0]: 'model.norm.weigth' is not a parameter of the served model (did you mean 'model.norm.weight'?)",
                _plan("float32", ["model.norm.weigth", [256]]),
                auth(),
            ),
        ),
        p(
            "plan with a wrong shape",
            answered(
                "post",
                "/update_weights",
                400,
                "plan[0]: model.norm.weight has shape [255]; the served model's is [256]",
                _plan("float32", ["model.norm.weight", [255]]),
                auth(),
            ),
        ),
        p(
            "plan with a huge shape",
            answered(
                "post",
                "/update_weights",
                400,
                "plan[0]: model.norm.weight has shape [4611686018427387904, 4611686018427387904]; the served model's is [256]",
                _plan("float32", ["model.norm.weight", [2**62, 2**62]]),
                auth(),
            ),
        ),
        p(
            "plan with an int64 dtype",
            answered(
                "post",
                "/update_weights",
                400,
                "plan[0].dtype = 'int64': allowed: float32, bfloat16, float16",
                _plan("int64"),
                auth(),
            ),
        ),
        p(
            "plan naming a parameter twice",
            answered(
                "post",
                "/update_weights",
                400,
                "plan[0]: model.norm.weight comes twice",
                _plan("float32", ["model.norm.weight", [256]], ["model.norm.weight", [256]]),
                auth(),
            ),
        ),
        p(
            "an empty plan",
            answered(
                "post",
                "/update_weights",
                400,
                "plan: List should have at least 1 item after validation, not 0",
                {"version": 1, "plan": []},
                auth(),
            ),
        ),
        p(
            "a negative version",
            answered(
                "post",
                "/update_weights",
                400,
                "version: Input should be greater than or equal to 0",
                {**_plan(), "version": -1},
                auth(),
            ),
        ),
        p(
            "init to a closed port",
            lambda tmp: answered("post", "/init_weights", 400, None, {**good, "port": _closed_port()}, auth())(tmp),
        ),
        p("init to a port that is no store (an HTTP server)", init_to_http),
        p(
            "init with nccl on a CPU server",
            answered(
                "post",
                "/init_weights",
                400,
                "backend 'nccl' needs a CUDA engine; this server's is on the CPU: use 'gloo'",
                {**good, "backend": "nccl"},
                auth(),
            ),
        ),
        p(
            "init with a day-long timeout",
            answered(
                "post",
                "/init_weights",
                400,
                "timeout_s: Input should be less than or equal to 86400",
                {**good, "timeout_s": 1e9},
                auth(),
            ),
        ),
        p("an authenticated trainer's group, bad plans, then a good update", trainer_group_then_bad_plans),
        p("init to a port that accepts and never answers (the lock is let go)", silent_store),
        # refused by route, method or content type before any byte of the body is read
        p(
            "POST /health announcing 16 MB, no secret on the server",
            unread_body("/health", b'HTTP/1.1 405 Method Not Allowed\n{"error": "POST /health: allowed: GET"}', None),
        ),
        p(
            "POST to an unknown path announcing 16 MB, no secret on the server",
            unread_body("/upload", b'HTTP/1.1 404 Not Found\n{"error": "POST /upload: no such endpoint"}', None),
        ),
        p(
            "POST /generate announcing 16 MB without the secret",
            unread_body(
                "/generate", b"HTTP/1.1 401 Unauthorized\n" + json.dumps({"error": NO_SECRET}).encode(), SECRET
            ),
        ),
        p(
            "POST /generate announcing 16 MB of text/plain",
            unread_body(
                "/generate",
                b'HTTP/1.1 415 Unsupported Media Type\n{"error": "the body must be JSON, sent with the header '
                b"'Content-Type: application/json' (got text/plain)\"}",
                SECRET,
                f"Authorization: Bearer {SECRET}\r\nContent-Type: text/plain\r\n",
            ),
        ),
        p(
            "a JSON body without Content-Type",
            answered(
                "post",
                "/generate",
                415,
                "the body must be JSON, sent with the header 'Content-Type: application/json' (got none)",
                headers=auth(),
                data=json.dumps(GENERATE).encode(),
            ),
        ),
        # what vLLM refuses: the API refuses it first, and anything else vLLM refuses is still the client's 400
        p(
            "temperature 100 (vLLM takes at most 2)",
            answered(
                "post",
                "/generate",
                400,
                "sampling.temperature: Input should be less than or equal to 2",
                _sampling(temperature=100.0),
                auth(),
            ),
        ),
        p(
            "min_tokens over max_tokens",
            answered(
                "post",
                "/generate",
                400,
                "sampling: min_tokens = 50 is over max_tokens = 4",
                _sampling(min_tokens=50),
                auth(),
            ),
        ),
        p(
            "a scored sequence as long as the context",
            answered(
                "post",
                "/score",
                400,
                "sequences[0] has 80 tokens; 1 to 79 (the context of 80 less the one token vLLM generates)",
                {"sequences": [[1] * 80]},
                auth(),
            ),
        ),
        p(
            "a request only vLLM's own checks refuse",
            engine_raises(
                _vllm_validation_error,
                400,
                "vLLM refused the request: VLLMValidationError: a check the API has not (parameter=x, value=1)",
            ),
        ),
        p(
            "an engine that fails (not the request's fault) is 500",
            engine_raises(
                lambda: RuntimeError("CUDA error: an illegal memory access"),
                500,
                "the server failed: RuntimeError: CUDA error: an illegal memory access",
            ),
        ),
        # the header as other clients write it
        p("'bearer' in lower case (the scheme is case-insensitive)", accepted({"Authorization": f"bearer {SECRET}"})),
        p("the secret with trailing whitespace", accepted({"Authorization": f"Bearer {SECRET} "})),
        p(
            "'Basic' with the secret",
            answered("get", "/version", 401, NO_SECRET, headers={"Authorization": f"Basic {SECRET}"}),
        ),
        # a careless hand at the command line
        p(
            "rollout-serve --host 0.0.0.0 without a secret",
            serve_refused(
                ["--host", "0.0.0.0"],
                {},
                "config error: --host = '0.0.0.0': binding beyond loopback needs a secret: --secret-file FILE (mode 0600) or GRPO_STUDIO_ROLLOUT_SECRET; see docs/rollout_server.md",
            ),
        ),
        p(
            "rollout-serve --secret-file missing",
            serve_refused(
                ["--secret-file", "{tmp}/nope"],
                {},
                "config error: --secret-file = '{tmp}/nope': cannot read it: No such file or directory",
            ),
        ),
        p(
            "rollout-serve --secret-file empty",
            serve_refused(
                ["--secret-file", "{tmp}/secret"],
                {},
                f"config error: --secret-file = '{{tmp}}/secret': the file is empty; {MAKE}",
                _secret_file("\n"),
            ),
        ),
        p(
            "rollout-serve --secret-file readable by others",
            serve_refused(
                ["--secret-file", "{tmp}/secret"],
                {},
                "config error: --secret-file = '{tmp}/secret': other users can read it (mode 0644); chmod 600 {tmp}/secret",
                _secret_file(SECRET, 0o644),
            ),
        ),
        p(
            "rollout-serve --secret-file too short",
            serve_refused(
                ["--secret-file", "{tmp}/secret"],
                {},
                f"config error: --secret-file = '{{tmp}}/secret': the file holds 7 characters; at least 16; {MAKE}",
                _secret_file("hunter2\n"),
            ),
        ),
        p(
            "rollout-serve --secret-file a FIFO",
            serve_refused(
                ["--secret-file", "{tmp}/secret"],
                {},
                "config error: --secret-file = '{tmp}/secret': not a regular file; a secret file is a plain file of mode 0600",
                _fifo,
            ),
        ),
        p(
            "rollout-serve with a secret file and the variable",
            serve_refused(
                ["--secret-file", "{tmp}/secret"],
                {"GRPO_STUDIO_ROLLOUT_SECRET": SECRET},
                "config error: --secret-file = '{tmp}/secret': give the secret once: GRPO_STUDIO_ROLLOUT_SECRET is set too; unset one of them",
                _secret_file(SECRET),
            ),
        ),
        p(
            "rollout-serve with an empty secret variable",
            serve_refused(
                [],
                {"GRPO_STUDIO_ROLLOUT_SECRET": ""},
                f"config error: GRPO_STUDIO_ROLLOUT_SECRET: the environment variable GRPO_STUDIO_ROLLOUT_SECRET is empty; {MAKE}",
            ),
        ),
        Case(
            CATEGORY, "rollout-serve --secret on the command line", ["rollout-serve", "tiny-arith", "--secret", SECRET]
        ),
        Case(
            CATEGORY,
            "train: rollout.server_secret_file without rollout.server",
            train(
                "tiny-arith",
                "--set",
                "rollout.colocate=false",
                "--set",
                "rollout.backend=vllm",
                "--set",
                "rollout.server_secret_file={tmp}/secret",
            ),
        ),
        p("the real server: a stranger and a broken trainer", real_server_holds, timeout_s=900, slow=True),
    ]
