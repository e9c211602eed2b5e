"""Data-parallel GRPO (train.parallel = ddp, engine/run/distributed.py) with real torchrun subprocesses, gloo on CPU.

- one step on 2 ranks gives the LoRA weights of one process on the same global batch (1e-6, fp32), for
  every loss normalisation;
- a 2-process headless run of the bundled model trains 20 steps into one metrics.jsonl with global numbers,
  then resumes to 30;
- killing one rank ends the run with a `crashed` event naming it, and leaves no process behind;
- a non-finite rollout on one rank skips the step on all (no wait for the timeout), the other ranks'
  reward errors reach events.jsonl, and the eval rows are split across the ranks (the accuracy is one
  process's); per-rank time and memory are in the row.

Run as a script under torchrun (`python -m torch.distributed.run ... tests/test_distributed.py OUT LOSS...`),
this file is also the ranks' side of the first test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import psutil
import pytest
from cli_helpers import ENV, ROOT, run_cli

from grpo_studio.contract.rundir import read_rows

LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo")
STEP_SETS = [
    "train.steps=1",
    "train.prompts_per_step=4",
    "rollout.num_generations=4",
    "rollout.backend=hf",
    "train.save_every=0",
    "train.eval_every=0",
    "model.dtype=fp32",
    "train.lr=0.05",
    "train.grad_clip=0",
    "train.score_zero_advantage=true",  # one process gathers zero-advantage rows apart; ranks cannot (zero_advantage)
]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


class PromptSeeded:
    """The real sampler, called one prompt at a time with a seed derived from the prompt's tokens: a prompt's
    completions then do not depend on the rank or the batch it is sampled in, so one process and two ranks
    train on the same rollout (the hf sampler draws a batch's rows from one random stream)."""

    def __init__(self, inner, pad_id: int):
        self.inner, self.pad_id, self.name = inner, pad_id, inner.name
        self.prompts_seen = 0

    def generate(self, prompt_ids, sampling):
        import torch

        from grpo_studio.engine.sampler.base import Rollout

        self.prompts_seen += len(prompt_ids)
        parts = [
            self.inner.generate([ids], dataclasses.replace(sampling, seed=zlib.crc32(str(ids).encode())))
            for ids in prompt_ids
        ]
        width = max(p.completion_ids.shape[1] for p in parts)
        pad = lambda t, value: torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)
        return Rollout(
            torch.cat([pad(p.completion_ids, self.pad_id) for p in parts]),
            torch.cat([pad(p.mask, 0.0) for p in parts]),
            torch.cat([pad(p.logprobs, 0.0) for p in parts]),
            torch.cat([p.truncated for p in parts]),
        )

    def __getattr__(self, name):
        return getattr(self.inner, name)


def seeded(trainer, wrap=PromptSeeded) -> None:
    """The trainer's sampler wrapped (evaluate uses it), and the rollouts' as the trainer wraps it (distributed.py
    Agreeing)."""
    trainer.grpo.sampler = wrap(trainer.grpo.sampler, trainer.tokenizer.pad_token_id)
    trainer.grpo.rollouts.sampler = trainer.dist.agreeing(trainer.grpo.sampler)


def one_step(run_dir: Path, loss_type: str, parallel: str, *sets: str) -> dict:
    """Train one step; returns the trainable weights after it and the step's loss (rank 0's view). FSDP's
    sharded parameters and gradients are gathered whole (DTensor.full_tensor, a collective)."""
    from grpo_studio.contract import config
    from grpo_studio.engine.run.trainer import Trainer

    cfg = config.load("tiny-arith", [*STEP_SETS, f"algo.loss_type={loss_type}", f"train.parallel={parallel}", *sets])
    trainer = Trainer(cfg, run_dir)
    seeded(trainer)
    row = trainer.dist.reduce_metrics(trainer.step())
    trained = [(n, p) for n, p in trainer.policy.named_parameters() if p.requires_grad]
    whole = lambda t: t.full_tensor() if hasattr(t, "full_tensor") else t.clone()  # noqa: E731
    weights = {n: whole(p.detach()) for n, p in trained}
    grads = {n: whole(p.grad) for n, p in trained}  # the reduced gradient the optimizer stepped with
    trainer.grpo.sampler.close()
    return {"weights": weights, "grads": grads, "loss": row["loss"], "dist": trainer.dist}


def ranks_main(out: Path, loss_types: list[str]) -> None:
    """Each rank: one step per loss type; rank 0 saves the weights for the test to compare."""
    import torch

    results, group = {}, None
    for loss_type in loss_types:
        res = one_step(out / f"run-{loss_type}", loss_type, "ddp")
        group = res.pop("dist")
        results[loss_type] = res
    if group.main:
        torch.save(results, out / "ddp.pt")
    group.close()


class FailsOnce(PromptSeeded):
    """Rank 1's sampler: its first rollout is not finite (engine/sampler/base.py NonFiniteSampling)."""

    failed = False

    def generate(self, prompt_ids, sampling):
        from grpo_studio.engine.sampler.base import NonFiniteSampling

        if not self.failed and sampling.n > 1:  # a training rollout, not the eval's one sample per prompt
            self.failed = True
            raise NonFiniteSampling("the sampler's distribution holds NaN (test)")
        return super().generate(prompt_ids, sampling)


def broken_reward(*args, **kwargs):
    raise ValueError("rank 1's reward fails (test)")


def leftovers(run_dir: Path, parallel: str) -> dict:
    """Eval at start, then 2 steps: rank 1's first rollout is not finite, its rewards fail in the second."""
    from grpo_studio.contract import config
    from grpo_studio.engine.run.trainer import Trainer

    cfg = config.load(
        "tiny-arith",
        [
            *STEP_SETS,
            "train.steps=2",
            "data.eval_size=7",
            "data.general_size=0",
            "train.dist_timeout_s=60",
            f"train.parallel={parallel}",
        ],
    )
    trainer = Trainer(cfg, run_dir)
    seeded(trainer, FailsOnce if trainer.dist.rank == 1 else PromptSeeded)
    accuracy = trainer.evaluate()
    seen = trainer.grpo.sampler.prompts_seen
    rows = [trainer.dist.reduce_metrics(trainer.step())]
    if trainer.dist.rank == 1:
        trainer.grpo.rollouts.reward_fns = [(name, broken_reward) for name, _ in trainer.grpo.rollouts.reward_fns]
    rows.append(trainer.dist.reduce_metrics(trainer.step()))
    trainer.grpo.sampler.close()
    return {"accuracy": accuracy, "eval_prompts": trainer.dist.gather([seen]), "rows": rows, "dist": trainer.dist}


def leftovers_main(out: Path) -> None:
    import torch

    res = leftovers(out / "run", "ddp")
    group = res.pop("dist")
    if group.main:
        torch.save(res, out / "leftovers.pt")
    group.close()


def torchrun_results(script: str, out: Path, args, name: str):
    """`script`'s __main__ on 2 torchrun ranks with (out, *args); what rank 0 saved as out/name."""
    proc = subprocess.run(
        [*TORCHRUN, script, str(out), *args],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    import torch

    return torch.load(out / name)


@pytest.fixture(scope="module")
def ddp_steps(tmp_path_factory):
    return torchrun_results(__file__, tmp_path_factory.mktemp("ddp"), LOSS_TYPES, "ddp.pt")


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_ddp_step_equals_one_process(ddp_steps, loss_type, tmp_path):
    """The oracle: the one-process trainer's step on the whole global batch (same prompts, same completions).
    Gradients first: AdamW's first step is lr·g/(|g|+ε), blind to a gradient's scale, so a wrong normaliser
    would not show in the weights."""
    ref, ddp = one_step(tmp_path / "one", loss_type, "none"), ddp_steps[loss_type]
    assert ddp["loss"] == pytest.approx(ref["loss"], abs=1e-6)
    assert ddp["grads"].keys() == ref["grads"].keys() and any("lora_B" in n for n in ref["grads"])
    scale = max(g.abs().max().item() for g in ref["grads"].values())
    assert scale > 1e-4  # the step has a gradient to compare
    assert max((ref["grads"][n] - g).abs().max().item() for n, g in ddp["grads"].items()) <= 1e-6 * scale
    # peft starts every lora_B at zero: the step moved them, and both sides to the same weights
    assert max(w.abs().max().item() for n, w in ref["weights"].items() if "lora_B" in n) > 1e-3
    assert_same_first_adamw_step(ref, ddp, scale)


def assert_same_first_adamw_step(ref: dict, got: dict, scale: float) -> None:
    """The weights after AdamW's first step, lr·g/(|g| + ε), agree to 1e-6 wherever |g| ≥ 1e-4 of the largest:
    where g is near ε that step turns the fp32 rounding of a sum over other rows (other micro-batches, the
    ranks' reduce) into a weight difference up to lr, and there only the gradients (compared above) say more."""
    checked = 0
    for n, w in got["weights"].items():
        firm = ref["grads"][n].abs() >= 1e-4 * scale
        if firm.any():
            assert (ref["weights"][n] - w)[firm].abs().max().item() < 1e-6, n
        checked += int(firm.sum())
    assert checked > 0


RUN_SETS = [
    "--set",
    "train.parallel=ddp",
    "--set",
    "train.steps=20",
    "--set",
    "train.prompts_per_step=8",
    "--set",
    "train.save_every=10",
    "--set",
    "train.eval_every=0",
    "--set",
    "rollout.backend=hf",
]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """tiny-arith on 2 processes (torchrun via --nproc): 20 steps, then --resume to 30."""
    run = tmp_path_factory.mktemp("ddp-run") / "run"
    first = run_cli("train", "tiny-arith", "--run-dir", str(run), "--nproc", "2", *RUN_SETS, cwd=ROOT, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    rows20 = read_rows(run / "metrics.jsonl")
    second = run_cli("train", "--resume", str(run), "--nproc", "2", "--set", "train.steps=30", cwd=ROOT, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    return run, rows20, first.stdout


def test_two_processes_train_twenty_steps(ddp_run):
    run, rows, stdout = ddp_run
    assert [r["step"] for r in rows] == list(range(1, 21))
    assert stdout.count("step 20/20") == 1  # rank 0 reports, rank 1 does not
    reward = [r["reward/mean"] for r in rows]
    assert sum(reward[-5:]) / 5 > sum(reward[:5]) / 5
    events = read_rows(run / "events.jsonl")
    assert [e["event"] for e in events].count("started") == 2 and not any(e["event"] == "crashed" for e in events)


def test_leftovers_non_finite_rollout_reward_errors_and_eval_split(tmp_path):
    """Rank 1's non-finite rollout skips step 1 on rank 0 too (without it rank 0 would wait in the gradient
    all-reduce until train.dist_timeout_s and crash); rank 1's reward errors of step 2 are in rank 0's
    events.jsonl, naming rank 1; the 7 eval rows are split 3 + 4 and the accuracy is the one-process one (the
    per-prompt seeded sampler makes a prompt's completion independent of its batch)."""
    import torch

    proc = subprocess.run(
        [*TORCHRUN, str(Path(__file__)), str(tmp_path), "leftovers"],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = torch.load(tmp_path / "leftovers.pt")
    (skipped, taken) = res["rows"]
    assert skipped["step"] == 1 and skipped["loss"] != skipped["loss"]  # NaN: nothing trained
    assert taken["step"] == 2 and taken["loss"] == taken["loss"]
    events = read_rows(tmp_path / "run" / "events.jsonl")
    skips = [e for e in events if e["event"] == "skipped_step"]
    assert [(e["step"], e["cause"]) for e in skips] == [(1, "rank 1: the sampler's distribution holds NaN (test)")]
    errors = [e for e in events if e["event"] == "reward_error"]
    assert errors and all(e["rank"] == 1 and e["step"] == 2 and "rank 1's reward fails" in e["message"] for e in errors)
    assert res["eval_prompts"] == [3, 4]
    one = leftovers_one_process(tmp_path / "one")
    assert res["accuracy"] == one


def leftovers_one_process(run_dir: Path) -> float:
    from grpo_studio.contract import config
    from grpo_studio.engine.run.trainer import Trainer

    trainer = Trainer(config.load("tiny-arith", [*STEP_SETS, "data.eval_size=7", "data.general_size=0"]), run_dir)
    seeded(trainer)
    try:
        return trainer.evaluate()
    finally:
        trainer.grpo.sampler.close()


def test_metrics_are_global(ddp_run):
    """Every completion of both ranks is in samples.jsonl: the row's numbers are theirs, not one rank's."""
    from grpo_studio.engine.model import policy_loader

    run, _, _ = ddp_run
    tok = policy_loader.load_tokenizer(policy_loader.resolve_model_path("tiny-arith"))
    samples, hists = read_rows(run / "samples.jsonl"), {h["step"]: h for h in read_rows(run / "histograms.jsonl")}
    for row in read_rows(run / "metrics.jsonl")[:20]:
        for name in ("perf/step_s", "perf/comm_s", "mem/peak_gib"):  # each rank's own, and their max
            family, _, stat = name.rpartition("/")
            assert row[name] == max(row[f"{family}/rank0/{stat}"], row[f"{family}/rank1/{stat}"])
        assert not any("/rank2/" in key for key in row)
        mine = [s for s in samples if s["step"] == row["step"]]
        assert len(mine) == 8 * 8  # prompts_per_step × num_generations, from both ranks
        # a completion's tokens are its text's plus the EOS, except when cut at max_completion_len (8)
        lens = [len(tok(s["completion"], add_special_tokens=False).input_ids) for s in mine]
        assert row["completion/len_max"] == min(max(lens) + 1, 8)
        truncated = row["completion/truncated_frac"]
        assert row["completion/len_mean"] == pytest.approx(sum(lens) / len(lens) + 1 - truncated, abs=1e-6)
        assert row["reward/mean"] == pytest.approx(sum(sum(s["rewards"].values()) for s in mine) / len(mine), abs=1e-5)
        hist = hists[row["step"]]  # both ranks' tokens, and the global max in its highest non-empty bin
        assert hist["n"] == row["mismatch/tokens"] == sum(lens) + len(lens) * (1 - truncated)
        top = max((i for i, c in enumerate(hist["counts"]) if c), default=None)
        if top is not None and not hist["over"]:
            assert hist["edges"][top] <= row["mismatch/abs_dlogp_max"] < hist["edges"][top + 1]


def test_resume_to_thirty(ddp_run):
    run, rows20, _ = ddp_run
    rows = read_rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 31))
    assert rows[:20] == rows20
    assert (run / "checkpoints" / "step-30").is_dir()


@contextlib.contextmanager
def two_ranks_running(run: Path):
    """A 2-process run of 500 steps, once it has written 2 rows: (supervisor, every process under it, rank -> process).
    A test that fails ends what it started."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "grpo_studio.cli.main",
            "train",
            "tiny-arith",
            "--run-dir",
            str(run),
            "--nproc",
            "2",
            *RUN_SETS,
            "--set",
            "train.steps=500",
            "--set",
            "train.dist_timeout_s=4",
        ],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 240
        while len(read_rows(run / "metrics.jsonl")) < 2:
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"the run did not get going: {proc.returncode}\n{proc.stderr.read()[-3000:]}")
            time.sleep(0.5)
        family = psutil.Process(proc.pid).children(recursive=True)
        ranks = {int(p.environ()["RANK"]): p for p in family if "RANK" in p.environ()}
        assert sorted(ranks) == [0, 1]
        yield proc, family, ranks
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            for p in [*psutil.Process(proc.pid).children(recursive=True), proc]:
                p.kill()
            proc.wait()
    assert not psutil.wait_procs(family, timeout=30)[1], "processes left behind"
    assert not (run / "trainer.pid").exists()


@pytest.mark.parametrize(("sig", "said"), [(signal.SIGKILL, "died"), (signal.SIGSTOP, "did not answer (hung): killed")])
def test_a_lost_rank_ends_the_run(sig, said, tmp_path):
    """Rank 1 killed, or stopped (hung: rank 0's collective times out after train.dist_timeout_s)."""
    with two_ranks_running(tmp_path) as (proc, _, ranks):
        victim = ranks[1].pid
        os.kill(victim, sig)
    assert proc.returncode != 0
    crashed = [e for e in read_rows(tmp_path / "events.jsonl") if e["event"] == "crashed"]
    assert len(crashed) == 1 and f"rank 1 (pid {victim}) {said}" in crashed[0]["message"], crashed
    assert "train.dist_timeout_s = 4" in crashed[0]["message"]


def test_sigterm_stops_every_rank_after_the_same_step(tmp_path):
    with two_ranks_running(tmp_path) as (proc, _, _):
        proc.send_signal(signal.SIGTERM)
    assert proc.returncode == 0
    state = [e for e in read_rows(tmp_path / "events.jsonl") if e["event"] in ("stopped", "crashed", "finished")]
    steps = [r["step"] for r in read_rows(tmp_path / "metrics.jsonl")]
    assert [e["event"] for e in state] == ["stopped"] and state[0]["step"] == steps[-1] < 500
    assert (tmp_path / "checkpoints" / f"step-{steps[-1]}").is_dir()


REFUSED = [
    (
        ["--nproc", "2"],
        (
            "config error: train.parallel = 'none': 2 processes need train.parallel = 'ddp' or 'fsdp' "
            "(each trains on its share of the prompts); add --set train.parallel=ddp"
        ),
    ),
    (["--nproc", "0"], "config error: --nproc = 0: must be a whole number >= 1"),
    (
        ["--nproc", "2", "--set", "train.parallel=ddp", "--set", "train.prompts_per_step=3"],
        "config error: train.prompts_per_step = 3: must divide evenly among the 2 processes (each samples its share "
        "of the prompts)",
    ),
    (["--devices", "a,b"], "config error: --devices = 'a,b': a comma-separated list of GPU indices, e.g. 0,1"),
    (
        ["--nproc", "2", "--devices", "0", "--set", "train.parallel=ddp"],
        "config error: --devices = '0': --nproc 2 needs one device per process, 1 given",
    ),
    (
        ["--set", "train.parallel=fsdp", "--set", "train.shared_prefix=on"],
        (
            "config error: train.shared_prefix = 'on': not with train.parallel = 'fsdp': the shared-prefix pass calls the "
            "decoder outside the model's forward, where a rank holds only its shard; use 'auto' (off under fsdp) or 'off'"
        ),
    ),
    (
        ["--set", "train.parallel=fsdp", "--set", "model.logits_chunk=16"],
        (
            "config error: model.logits_chunk = 16: not with train.parallel = 'fsdp': the chunked lm_head reads its weight "
            "outside the model's forward, where a rank holds only its shard; use 0"
        ),
    ),
    (
        ["--set", "train.parallel=fsdp", "--set", "train.micro_batch_tokens=64"],
        (
            "config error: train.micro_batch_tokens = 64: not with train.parallel = 'fsdp': ranks would run different "
            "numbers of micro-batches and every sharded forward is a collective; use train.micro_batch_size"
        ),
    ),
    (
        ["--set", "train.parallel=fsdp", "--set", "model.dtype=fp8"],
        (
            "config error: model.dtype = 'fp8': not with train.parallel = 'fsdp': the fp8 linears are not sharded; use "
            "bf16 or train.parallel = 'ddp'"
        ),
    ),
    (["--set", "train.parallel=mpi"], "config error: train.parallel = 'mpi': allowed: none, ddp, fsdp"),
    (
        ["--set", "train.parallel=ddp", "--set", "algo.scale_rewards=batch"],
        (
            "config error: algo.scale_rewards = 'batch' with train.parallel = 'ddp': the batch std would be each rank's; "
            "use 'group' or 'none'"
        ),
    ),
    (["--set", "train.dist_timeout_s=0"], "config error: train.dist_timeout_s = 0.0: must be >= 1"),
]


@pytest.mark.parametrize(("args", "line"), REFUSED)
def test_refused_in_one_line(args, line, tmp_path):
    proc = run_cli("train", "tiny-arith", "--run-dir", str(tmp_path / "run"), *args, cwd=ROOT)
    assert (proc.returncode, proc.stderr.strip()) == (2, line)
    assert not (tmp_path / "run").exists()  # refused before anything starts


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--prompts", "15"],
            "bench error: --prompts = 15: must divide evenly among the 2 processes (each samples its "
            "share of the prompts)",
        ),
        (["--nproc", "1"], "bench error: --nproc = 1: must be >= 2"),
        (["--parallel", "zero3"], "bench error: --parallel = 'zero3': allowed: ddp, fsdp"),
    ],
)
def test_bench_scaling_refuses(args, line):
    proc = run_cli("bench", "scaling", *args, cwd=ROOT)
    assert (proc.returncode, proc.stderr.strip()) == (2, line)


if __name__ == "__main__":
    if sys.argv[2:] == ["leftovers"]:
        leftovers_main(Path(sys.argv[1]))
    else:
        ranks_main(Path(sys.argv[1]), sys.argv[2:])
