"""DAPO dynamic sampling (algo.dynamic_sampling, engine/rollout/dynamic_sampling.py) in real runs of the bundled model,
against an oracle reward that knows which prompts have signal: an answer that `modulus` divides scores its
group's completions 0, 1, 0, 1; any other scores every completion 0.5 (all equal: no signal). The reward logs the prompts
of each call (one call per sampling round), so the rounds, kept and dropped groups are counted by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_studio.contract import config
from grpo_studio.contract.errors import UserError
from grpo_studio.contract.rundir import METRICS, read_rows

G, PROMPTS = 4, 4
ORACLE = '''
import json

def oracle(prompts, completions, answer, **kwargs):
    """0, 1, 0, 1 by the completion's place in its group where {modulus} divides the answer; else 0.5."""
    with open({log!r}, "a") as fh:
        fh.write(json.dumps(prompts[::{G}]) + "\\n")
    return [0.5 if int(a) % {modulus} else float(i % 2) for i, a in enumerate(answer)]
'''


def has_signal(prompt: str, modulus: int) -> bool:
    a, b = prompt.rstrip("=").split("+")
    return (int(a) + int(b)) % modulus == 0


def train(tmp_path: Path, name: str, *overrides: str, modulus: int = 2) -> tuple[Path, list[list[str]]]:
    """A short run with the oracle as its only reward (a group has signal when modulus divides its answer);
    its run directory and the prompts of each sampling round, in order."""
    from grpo_studio.engine.run.trainer import Trainer

    log = tmp_path / f"{name}.calls.jsonl"
    reward = tmp_path / f"{name}_oracle.py"
    reward.write_text(ORACLE.format(log=str(log), G=G, modulus=modulus))
    cfg = config.load(
        "tiny-arith",
        [
            f'rewards.funcs=["{reward}:oracle"]',
            f"rollout.num_generations={G}",
            f"train.prompts_per_step={PROMPTS}",
            "train.eval_every=0",
            "train.save_every=0",
            *overrides,
        ],
    )
    run = tmp_path / name
    assert Trainer(cfg, run).run() == "finished"
    return run, [json.loads(line) for line in log.read_text().splitlines()]


def by_step(rows: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for row in rows:
        out.setdefault(row["step"], []).append(row)
    return out


def hand_count(calls: list[list[str]], steps: int, max_rounds: int, modulus: int) -> list[dict]:
    """Per step, from the oracle's log alone: its rounds, and the prompts of the groups DAPO keeps (the first
    PROMPTS with signal in sampling order) and of those that fill a short rollout (the first without)."""
    out, i = [], 0
    for _ in range(steps):
        sampled: list[str] = []
        while True:
            sampled += calls[i]
            i += 1
            rounds = len(sampled) // PROMPTS
            if rounds == max_rounds or sum(has_signal(p, modulus) for p in sampled) >= PROMPTS:
                break
        kept = [p for p in sampled if has_signal(p, modulus)][:PROMPTS]
        fill = [p for p in sampled if not has_signal(p, modulus)][: PROMPTS - len(kept)]
        out.append({"rounds": rounds, "kept": kept, "fill": fill})
    assert i == len(calls)  # the run sampled no round more or less
    return out


def test_rounds_refill_the_rollout_with_groups_that_have_signal(tmp_path):
    steps = 3
    run, calls = train(
        tmp_path, "ds", f"train.steps={steps}", "algo.dynamic_sampling=true", "algo.dynamic_sampling_max_rounds=64"
    )
    expected = hand_count(calls, steps, 64, 2)
    assert any(e["rounds"] > 1 for e in expected)  # the test exercises a refill
    metrics = read_rows(run / METRICS)
    samples = by_step(read_rows(run / "samples.jsonl"))
    for step, (row, e) in enumerate(zip(metrics, expected, strict=True), start=1):
        assert row["sampling/rounds"] == e["rounds"]
        assert row["sampling/groups_kept"] == PROMPTS
        assert row["sampling/groups_dropped"] == (e["rounds"] - 1) * PROMPTS
        assert row["reward/frac_zero_std"] == 0.0
        trained = samples[step]
        assert len(trained) == PROMPTS * G
        assert [s["prompt"] for s in trained[::G]] == e["kept"]  # the first groups with signal, in order
        for g in range(PROMPTS):  # no group without signal: 0, 1, 0, 1 and advantages of both signs
            group = trained[g * G : (g + 1) * G]
            assert [s["rewards"]["oracle"] for s in group] == [0.0, 1.0, 0.0, 1.0]
            assert all(s["advantage"] != 0 for s in group)
    assert not [e for e in read_rows(run / "events.jsonl") if e["event"] == "warning"]


def test_the_round_limit_fills_with_the_first_dropped_groups_and_warns(tmp_path):
    # a multiple of 7 has signal: about one prompt in seven, too few for 4 in 2 rounds of 4
    steps, max_rounds, modulus = 3, 2, 7
    run, calls = train(
        tmp_path,
        "limit",
        f"train.steps={steps}",
        "algo.dynamic_sampling=true",
        f"algo.dynamic_sampling_max_rounds={max_rounds}",
        modulus=modulus,
    )
    expected = hand_count(calls, steps, max_rounds, modulus)
    short = [step for step, e in enumerate(expected, start=1) if len(e["kept"]) < PROMPTS]
    assert short  # the limit is reached
    metrics = read_rows(run / METRICS)
    samples = by_step(read_rows(run / "samples.jsonl"))
    for step, (row, e) in enumerate(zip(metrics, expected, strict=True), start=1):
        assert row["sampling/rounds"] == e["rounds"]
        assert row["sampling/groups_kept"] == len(e["kept"])
        assert row["sampling/groups_dropped"] == (e["rounds"] - 1) * PROMPTS
        trained = [s["prompt"] for s in samples[step][::G]]
        assert len(samples[step]) == PROMPTS * G  # the rollout keeps its shape
        assert sorted(trained) == sorted(e["kept"] + e["fill"])
        assert row["reward/frac_zero_std"] == pytest.approx(len(e["fill"]) / PROMPTS)
    warnings = [e for e in read_rows(run / "events.jsonl") if e["event"] == "warning"]
    assert [w["step"] for w in warnings] == short
    for w in warnings:
        e = expected[w["step"] - 1]
        assert w["message"] == (
            f"algo.dynamic_sampling: {len(e['kept'])} of {PROMPTS} groups with reward signal after "
            f"algo.dynamic_sampling_max_rounds = {max_rounds} rounds; {len(e['fill'])} groups whose rewards "
            f"are all equal (advantage 0) fill the rollout"
        )


@pytest.mark.parametrize("scale", ["group", "batch"])
def test_kept_groups_have_the_advantages_and_completions_of_the_same_groups_without_it(tmp_path, scale):
    """The first round samples what the run without dynamic sampling samples (same prompts, same seed); its
    groups with signal are trained with the same completions and, group-relative, the same advantages."""
    common = ["train.steps=1", "train.samples_every=1", f"algo.scale_rewards={scale}"]
    plain, _ = train(tmp_path, "plain", *common)
    ds, _ = train(tmp_path, "ds", *common, "algo.dynamic_sampling=true", "algo.dynamic_sampling_max_rounds=64")
    before, after = read_rows(plain / "samples.jsonl"), read_rows(ds / "samples.jsonl")
    groups = [before[g * G : (g + 1) * G] for g in range(PROMPTS)]
    kept = [g for g in groups if has_signal(g[0]["prompt"], 2)]
    assert 0 < len(kept) < PROMPTS  # the plain run trained groups without signal too
    got = {g[0]["prompt"]: g for g in (after[i * G : (i + 1) * G] for i in range(PROMPTS))}
    for group in kept:
        twin = got[group[0]["prompt"]]
        assert [s["completion"] for s in twin] == [s["completion"] for s in group]
        if scale == "group":  # "batch" divides by the std of the whole (other) batch
            assert [s["advantage"] for s in twin] == [s["advantage"] for s in group]
        else:
            assert [s["advantage"] > 0 for s in twin] == [s["advantage"] > 0 for s in group]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algo.dynamic_sampling_max_rounds=3"],
            "config error: algo.dynamic_sampling_max_rounds = 3: has no effect with algo.dynamic_sampling = false; "
            "set it true or leave this at 4",
        ),
        (
            ["algo.dynamic_sampling=true", "algo.dynamic_sampling_max_rounds=0"],
            "config error: algo.dynamic_sampling_max_rounds = 0: must be >= 1",
        ),
        (
            [
                "algo.dynamic_sampling=true",
                "rollout.colocate=false",
                "rollout.backend=vllm",
                "rollout.async_mode=one_step",
            ],
            "config error: algo.dynamic_sampling = true: with rollout.async_mode = 'one_step' the next rollout is "
            "requested before this one is scored, so no round can refill it; allowed with dynamic sampling: "
            "async_mode off",
        ),
        (
            ["algo.dynamic_sampling=true", "env.environment=calculator"],
            "config error: algo.dynamic_sampling = true: not with env.environment = 'calculator': multi-turn "
            "episodes are not resampled; allowed: false with an environment",
        ),
    ],
)
def test_what_cannot_work_is_refused_in_one_line(overrides, message):
    with pytest.raises(UserError) as err:
        config.load("tiny-arith", overrides)
    assert str(err.value) == message
