"""`grpo-studio doctor RUN`: each rule of contract/diagnosis_rules.py on a run that shows its fault.

Three real trainings of the bundled model (trained once for the module): a run whose only reward is constant
(no learning signal, said first), a healthy run of the default recipe (one line, no findings) and an fp16 run
with a huge learning rate (diverged). The other rules on run directories written from rows with the schema's
metric names, every expected evidence worked out by hand from those rows."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_helpers import ROOT, run_cli

from grpo_studio.cli import main as front
from grpo_studio.contract import config as cfgmod
from grpo_studio.contract import diagnosis as dx
from grpo_studio.contract import diagnosis_rules as dxr
from grpo_studio.contract import metrics, rundir
from grpo_studio.contract.metrics import UnknownMetric

SMALL = ["train.prompts_per_step=4", "rollout.num_generations=4", "train.eval_every=0"]
HEALTHY_STEPS = 20


def _sets(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """The three real runs: const (4 steps), healthy (the default recipe, HEALTHY_STEPS steps), diverged."""
    root = tmp_path_factory.mktemp("doctor")
    (root / "const.py").write_text("def const(completions, **kwargs):\n    return [1.0] * len(completions)\n")
    plans = {
        "const": [*SMALL, "train.steps=4", f'rewards.funcs=["{root / "const.py"}:const"]'],
        "healthy": [f"train.steps={HEALTHY_STEPS}"],
        "diverged": [*SMALL, "model.dtype=fp16", "train.lr=1e3", "train.steps=30"],
    }
    for name, sets in plans.items():
        proc = run_cli("train", "tiny-arith", *_sets(*sets), "--run-dir", str(root / name), cwd=root, timeout=600)
        assert proc.returncode == (2 if name == "diverged" else 0), proc.stderr[-2000:]
    return {name: root / name for name in plans}


# ---- real runs ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_constant_reward_is_named_no_signal_first(trained):
    run = trained["const"]
    proc = run_cli("doctor", str(run), cwd=run.parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"{run}: finished, 4 steps; 2 findings, most important first",
        "1. [no-signal] no learning signal: groups with one reward for all",
        "   evidence: reward/frac_zero_std averaged 1 over steps 2-4",
        "   cause:    every reward function (const) scores every completion the same, so every advantage is 0 and "
        "those groups teach nothing",
        "   try:      --set rewards.funcs=correctness,format",
        "2. [no-signal] reward function 'const' is constant",
        "   evidence: rewards/const/std = 0 on all 4 steps (steps 1-4); rewards/const/mean 1",
        "   cause:    'const' gives every completion the same score, so it adds nothing to any advantage",
        "   try:      --set rewards.funcs=correctness,format",
    ]


@pytest.mark.slow
def test_the_default_recipe_is_healthy_in_one_line(trained):
    run = trained["healthy"]
    proc = run_cli("doctor", str(run), cwd=run.parent)
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    rows = [json.loads(x) for x in (run / rundir.METRICS).read_text().splitlines()]
    first, last = rows[0][metrics.REWARD], rows[-1][metrics.REWARD]
    assert last > first  # it learned
    assert line == (
        f"no findings: {HEALTHY_STEPS} steps, reward/mean {metrics.fmt(first)} -> {metrics.fmt(last)}; "
        f"none of the {len(dxr.RULES)} rules fired"
    )


@pytest.mark.slow
def test_json_is_only_json(trained):
    proc = run_cli("doctor", str(trained["const"]), "--json", cwd=trained["const"].parent)
    out = json.loads(proc.stdout)
    assert (out["state"], out["steps"], out["summary"]) == ("finished", 4, None)
    assert [f["title"] for f in out["findings"]] == [
        "no learning signal: groups with one reward for all",
        "reward function 'const' is constant",
    ]
    assert out["findings"][0]["suggestion_key"] == "rewards.funcs"
    assert out["findings"][0]["suggestion"] == "--set rewards.funcs=correctness,format"
    healthy = json.loads(run_cli("doctor", str(trained["healthy"]), "--json", cwd=trained["healthy"].parent).stdout)
    assert healthy["findings"] == [] and healthy["summary"].startswith(f"no findings: {HEALTHY_STEPS} steps")


@pytest.mark.slow
def test_a_diverged_run_is_an_error(trained):
    (f,) = dxr.diagnose(trained["diverged"])
    assert (f.severity, f.title, f.evidence, f.suggestion) == (
        "error",
        "the run diverged",
        "events.jsonl: diverged at step 6 after 5 skipped steps in a row (non-finite sampler probabilities)",
        "--set train.lr=100",
    )


# ---- runs written from rows -----------------------------------------------------------------------


def row(step: int, **values) -> dict:
    """A healthy step of a run with tiny-arith's reward functions, `values` (metric name with / as __) on top."""
    out = {
        metrics.STEP: step,
        metrics.TIME: 1_750_000_000.0 + step,
        metrics.REWARD: 1.0 + 0.05 * step,
        dx.ZERO_STD: 0.1,
        metrics.LOSS: -0.01,
        dx.GRAD_NORM: 0.5,
        dx.ENTROPY: 0.4,
        dx.CLIP: 0.0,
        metrics.K3: 1e-12,
        dx.LEN_MEAN: 5.0,
        dx.TRUNCATED: 0.0,
        metrics.reward_key("correctness"): 0.5 + 0.05 * step,
        metrics.reward_key("correctness", "std"): 0.9,
        metrics.reward_key("format"): 0.45,
        metrics.reward_key("format", "std"): 0.1,
    }
    out.update({name.replace("__", "/"): v for name, v in values.items()})
    metrics.check_row(out)
    return out


def write(path: Path, rows: list[dict], events=(), samples=(), sets=()) -> Path:
    path.mkdir(parents=True)
    cfgmod.save(cfgmod.load("tiny-arith", list(sets)), path / rundir.CONFIG)
    for name, lines in ((rundir.METRICS, rows), (rundir.EVENTS, events), (rundir.SAMPLES, samples)):
        (path / name).write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def only(path: Path) -> dx.Finding:
    (found,) = dxr.diagnose(path)
    return found


def test_healthy_rows_have_no_findings(tmp_path):
    run = write(tmp_path / "run", [row(s) for s in range(1, 10)])
    assert dxr.diagnose(run) == []
    assert dxr.healthy_line(dx.read_run(run)) == (
        "no findings: 9 steps, reward/mean 1.05 -> 1.45; none of the 14 rules fired"
    )


def test_a_collapsed_run_is_an_error(tmp_path):
    rows = [row(1)] + [row(s, reward__mean=0.0, grad_norm=0.0) for s in range(2, 7)]
    events = [{"time": 1.0, "event": "collapsed", "message": "collapsed: ...", "step": 6, "bad_steps": 5}]
    f = only(write(tmp_path / "run", rows, events, sets=["train.lr=50"]))
    assert (f.severity, f.title, f.evidence, f.suggestion) == (
        "error",
        "the run collapsed",
        "events.jsonl: collapsed at step 6 after 5 steps in a row with reward and gradient exactly 0",
        "--set train.lr=5",
    )


def test_skipped_steps_above_a_tenth(tmp_path):
    events = [
        {"time": 0.0, "event": "skipped_step", "message": "", "step": s, "cause": "non-finite gradients"}
        for s in (5, 6)
    ]
    rows = [row(s, **({"loss": None, "grad_norm": None} if s in (5, 6, 7) else {})) for s in range(1, 21)]
    f = only(write(tmp_path / "a", rows, events))
    assert (f.severity, f.title, f.evidence, f.suggestion) == (
        "error",
        "steps skipped for NaN or inf",
        "3 of 20 steps skipped or non-finite (steps 5, 6, 7); causes: non-finite gradients",
        "--set train.lr=0.0002",
    )
    rows = [row(s, **({"loss": None} if s in (5, 6) else {})) for s in range(1, 21)]  # 2 of 20: not above a tenth
    assert dxr.diagnose(write(tmp_path / "b", rows)) == []


def samples(step: int, equal_groups: int, groups: int = 2) -> list[dict]:
    return [
        {
            "step": step,
            "prompt": f"{g}+1=",
            "completion": "<answer>2</answer>",
            "advantage": 0.0 if g < equal_groups else (1.0 if i % 2 else -1.0),
            "rewards": {"correctness": 0.0},
        }
        for g in range(groups)
        for i in range(4)
    ]


def test_zero_variance_from_samples_without_the_metric(tmp_path):
    rows = [{k: v for k, v in row(s).items() if k != dx.ZERO_STD} for s in range(1, 4)]
    sampled = [x for s in range(1, 4) for x in samples(s, equal_groups=1)]  # 4 of 8 completions each step
    f = only(write(tmp_path / "a", rows, samples=sampled))
    assert (f.severity, f.evidence, f.suggestion) == (
        "no-signal",
        "samples.jsonl (completions in all-zero-advantage groups) averaged 0.5 over steps 1-3",
        "--set rollout.num_generations=16",
    )
    assert f.cause.startswith("every completion of a prompt scores the same (all right or all wrong)")
    cold = write(tmp_path / "b", rows, samples=sampled, sets=["rollout.temperature=0.7"])
    assert only(cold).suggestion == "--set rollout.temperature=1.0"
    sampled = [x for s in range(1, 4) for x in samples(s, equal_groups=1, groups=3)]  # 4 of 12: below half
    assert dxr.diagnose(write(tmp_path / "c", rows, samples=sampled)) == []


def test_zero_variance_ranks_above_warnings_below_errors(tmp_path):
    rows = [
        row(s, reward__frac_zero_std=0.75, completion__truncated_frac=0.5, **({"loss": None} if s in (2, 3) else {}))
        for s in range(1, 10)
    ]
    found = dxr.diagnose(write(tmp_path / "run", rows))
    assert [(f.severity, f.title) for f in found] == [
        ("error", "steps skipped for NaN or inf"),
        ("no-signal", "no learning signal: groups with one reward for all"),
        ("warning", "many completions truncated"),
    ]
    assert found[1].evidence == "reward/frac_zero_std averaged 0.75 over steps 7-9"
    assert found[2].evidence == "completion/truncated_frac averaged 0.5 over steps 7-9"
    assert found[2].suggestion == "--set rollout.max_completion_len=16"


def test_a_constant_function_beside_a_varying_one(tmp_path):
    rows = [row(s, rewards__format__std=0.0, rewards__format__mean=0.5) for s in range(1, 7)]
    f = only(write(tmp_path / "run", rows))
    assert (f.severity, f.title, f.evidence, f.suggestion) == (
        "no-signal",
        "reward function 'format' is constant",
        "rewards/format/std = 0 on all 6 steps (steps 1-6); rewards/format/mean 0.5",
        "--set rewards.funcs=correctness",
    )


def test_a_task_too_hard_is_no_signal_not_a_broken_correctness(tmp_path):
    """Every completion scores 0 on both of tiny-arith's functions: more completions per prompt, not removing
    them (the schema's default funcs are these same two)."""
    rows = [
        row(
            s,
            reward__frac_zero_std=1.0,
            rewards__correctness__mean=0.0,
            rewards__correctness__std=0.0,
            rewards__format__mean=0.0,
            rewards__format__std=0.0,
        )
        for s in range(1, 7)
    ]
    found = dxr.diagnose(write(tmp_path / "run", rows))
    assert [(f.title, f.suggestion) for f in found] == [
        ("no learning signal: groups with one reward for all", "--set rollout.num_generations=16"),
        (
            "format reward 'format' stuck at 0",
            "--set 'data.system_prompt=Give the final answer as <answer>N</answer>.'",
        ),
    ]
    assert found[0].cause.startswith("every completion of a prompt scores the same (all right or all wrong)")


def test_a_format_reward_stuck_at_zero(tmp_path):
    rows = [row(s, rewards__format__std=0.0, rewards__format__mean=0.0) for s in range(1, 7)]
    never = [{**x, "completion": "57"} for x in samples(6, 0)]
    f = only(write(tmp_path / "a", rows, samples=never))
    assert (f.severity, f.title, f.evidence, f.suggestion) == (
        "no-signal",
        "format reward 'format' stuck at 0",
        "rewards/format/mean = 0 on steps 4-6",
        "--set 'data.system_prompt=Give the final answer as <answer>N</answer>.'",
    )
    cut = [{**x, "completion": "<answer>5"} for x in samples(6, 0)]  # opened, cut before it closes
    assert only(write(tmp_path / "b", rows, samples=cut)).suggestion == "--set rollout.max_completion_len=16"


def test_entropy_collapse(tmp_path):
    entropy = [1.0, 1.0, 1.0, 0.5, 0.3, 0.2, 0.06, 0.05, 0.04]
    rows = [row(s, entropy=e) for s, e in enumerate(entropy, 1)]
    f = only(write(tmp_path / "a", rows))
    assert (f.title, f.evidence, f.suggestion) == (
        "entropy collapse",
        "entropy fell from 1 (steps 1-3) to 0.05 (steps 7-9), 0.05x",
        "--set train.lr=0.001",
    )
    updates = write(tmp_path / "b", rows, sets=["train.num_iterations=2"])  # the clip acts: clip-higher
    assert only(updates).suggestion == "--set algo.epsilon_high=0.28"
    rows = [row(s, entropy=e) for s, e in enumerate([1.0, 1.0, 1.0, 0.5, 0.3, 0.2, 0.2, 0.1, 0.15], 1)]
    assert dxr.diagnose(write(tmp_path / "c", rows)) == []  # 0.15x: not below a tenth


def test_k3_and_clip_spikes(tmp_path):
    rows = [
        row(s, **{"mismatch/k3": 1e-6 if s == 5 else 1e-12, "clip/region": 0.3 if s == 4 else 0.0})
        for s in range(1, 10)
    ]
    k3, clip = dxr.diagnose(write(tmp_path / "a", rows))
    assert (k3.title, k3.evidence, k3.suggestion) == (
        "sampler/trainer mismatch spikes",
        "mismatch/k3 1.00e-06 at step 5, 1.00e+06x the median 1.00e-12 of the steps before (1 such step of 9)",
        "--set algo.is_level=sequence",
    )
    assert (clip.title, clip.evidence, clip.suggestion) == (
        "clip share spikes",
        "clip/region 0.3 at step 4 (1 such step of 9)",
        "--set train.lr=0.001",
    )
    # bf16: 1.2e-3 is 12x its median but below bf16's normal k3 (1.5e-3): no spike
    rows = [row(s, **{"mismatch/k3": 1.2e-3 if s == 5 else 1e-4}) for s in range(1, 10)]
    assert dxr.diagnose(write(tmp_path / "b", rows, sets=["model.dtype=bf16"])) == []


def test_grad_norm_blowup(tmp_path):
    rows = [row(s, grad_norm=50.0 if s == 6 else 1.0) for s in range(1, 10)]
    f = only(write(tmp_path / "jump", rows))
    assert (f.title, f.evidence, f.suggestion) == (
        "gradient norm blow-ups",
        "grad_norm 50 at step 6, 50x the median 1 of the steps before (1 such step of 9)",
        "--set train.lr=0.001",
    )
    # a steady climb (x1.5 a step: 14x the run's median at the end) is not a blow-up: 3.4x the 5 steps before
    climb = [row(s, grad_norm=0.1 * 1.5**s) for s in range(1, 15)]
    assert dxr.diagnose(write(tmp_path / "climb", climb)) == []


def test_length_grows_while_correctness_stays_flat(tmp_path):
    lengths = [4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0]
    rows = [row(s, completion__len_mean=n, rewards__correctness__mean=0.5) for s, n in enumerate(lengths, 1)]
    f = only(write(tmp_path / "a", rows))
    assert (f.title, f.evidence, f.suggestion) == (
        "length grows while correctness stays flat",
        "completion/len_mean 5 -> 11 (steps 1-3 to steps 7-9) while rewards/correctness/mean 0.5 -> 0.5",
        "--set rewards.funcs=correctness,format,length_penalty",
    )
    rising = [row(s, completion__len_mean=n) for s, n in enumerate(lengths, 1)]  # correctness 0.6 -> 0.9
    assert dxr.diagnose(write(tmp_path / "b", rising)) == []


def test_mismatch_above_the_precisions_normal_range(tmp_path):
    rows = [row(s, **{"mismatch/k3": 0.05}) for s in range(1, 10)]
    f = only(write(tmp_path / "a", rows, sets=["model.dtype=bf16"]))
    assert (f.title, f.evidence, f.suggestion) == (
        "sampler/trainer mismatch above the precision's normal range",
        "mismatch/k3 median 0.05 over steps 7-9; normal for bf16: 0.0015 (docs/mismatch.md)",
        "--set model.dtype=fp16",
    )
    split = write(tmp_path / "b", rows, sets=["rollout.dtype=bf16"])  # fp32 trainer, bf16 sampler
    assert only(split).suggestion == "--set rollout.dtype=fp32"
    assert (
        dxr.diagnose(
            write(tmp_path / "c", [row(s, **{"mismatch/k3": 0.01}) for s in range(1, 10)], sets=["model.dtype=bf16"])
        )
        == []
    )  # 0.01 <= 10 x 1.5e-3
    lag0 = [row(s, **{"mismatch/k3": 0.05, "mismatch/lag0/k3": 1e-3}) for s in range(1, 10)]  # policy lag, not dtype
    assert dxr.diagnose(write(tmp_path / "d", lag0, sets=["model.dtype=bf16"])) == []


def test_moe_routers_disagreeing_suggest_router_replay(tmp_path):
    over = [row(s, **{"mismatch/router_disagree": 0.02, "mismatch/router_disagree/layer0": 0.03}) for s in range(1, 10)]
    f = only(write(tmp_path / "a", over))
    assert (f.title, f.evidence, f.suggestion) == (
        "MoE routers disagree between the sampler and the trainer",
        "mismatch/router_disagree averaged 0.02 over steps 7-9",
        "--set algo.router_replay=replay",
    )
    at = [row(s, **{"mismatch/router_disagree": 0.01}) for s in range(1, 10)]  # at ROUTER_SHARE: silent
    assert dxr.diagnose(write(tmp_path / "b", at)) == []


def test_eval_accuracy_falls_while_reward_rises(tmp_path):
    evals = {3: 0.6, 6: 0.5, 9: 0.4}
    rows = [row(s, **({"eval/accuracy": evals[s]} if s in evals else {})) for s in range(1, 10)]
    f = only(write(tmp_path / "run", rows))
    assert (f.title, f.evidence, f.suggestion) == (
        "eval accuracy falls while train reward rises",
        "eval/accuracy 0.6 at step 3 -> 0.4 at step 9; reward/mean 1.1 -> 1.4",
        "--set algo.beta=0.04",
    )


# ---- the command ----------------------------------------------------------------------------------


def test_a_missing_or_non_run_directory_is_one_line(tmp_path, capsys):
    assert front.main(["doctor", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == f"doctor error: RUN = '{tmp_path / 'nope'}': not found\n"
    assert front.main(["doctor", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"doctor error: RUN = '{tmp_path}': not a run directory (no config.toml, events.jsonl or metrics.jsonl)\n"
    )
    (tmp_path / "file").write_text("x")
    assert front.main(["doctor", str(tmp_path / "file")]) == 2
    assert capsys.readouterr().err == f"doctor error: RUN = '{tmp_path / 'file'}': not a folder\n"


def test_a_usage_mistake_is_the_commands_own_line(capsys):
    assert front.main(["doctor", "somerun", "--nope"]) == 2
    assert capsys.readouterr().err == "grpo-studio doctor: error: unrecognized arguments: --nope (see --help)\n"


def test_a_run_before_its_first_step_and_a_damaged_line(tmp_path, capsys):
    run = write(tmp_path / "run", [])
    assert front.main(["doctor", str(run)]) == 0
    assert capsys.readouterr().out == "no findings: no metrics rows yet\n"
    with open(run / rundir.METRICS, "a") as fh:
        being_written = '{"step": 3, "loss"'
        fh.write(json.dumps(row(1)) + "\nnot json\n" + json.dumps(row(2)) + "\n" + being_written)
    assert front.main(["doctor", str(run)]) == 0
    out = capsys.readouterr()
    assert out.out == "no findings: 2 steps, reward/mean 1.05 -> 1.1; none of the 14 rules fired\n"
    assert out.err == (
        f"warning: {run}/metrics.jsonl: skipped 1 malformed lines (not a JSON object with the fields the file needs)\n"
    )


def test_every_metric_the_rules_read_is_in_the_schema():
    with pytest.raises(UnknownMetric):
        dx._known("reward/frac_zero_stdd")
    assert all(
        metrics.lookup(name)
        for name in (dx.ZERO_STD, dx.ENTROPY, dx.GRAD_NORM, dx.CLIP, dx.LEN_MEAN, dx.TRUNCATED, dx.LAG0_K3)
    )


def test_the_doc_lists_every_rule_threshold_and_normal_k3():
    doc = (ROOT / "docs" / "doctor.md").read_text()
    assert re.findall(r"^\| `(\w+)` \|", doc, re.M) == [rule.__name__ for rule in dxr.RULES]
    names = [
        name
        for name, value in vars(dx).items()  # every threshold: a number, or NORMAL_K3's table
        if name.isupper() and isinstance(value, (int, float, dict)) and value is not dx.DTYPES
    ]
    assert len(names) >= 19
    assert [name for name in names if f"`{name}`" not in doc] == []
    for dtype, k3 in dx.NORMAL_K3.items():
        assert f"| {dtype} | {k3:.1e} |".replace("e-0", "e-") in doc, dtype
