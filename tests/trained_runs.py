"""Short runs written by the real trainer, for the studio tests that check what the studio shows
against the files (tests/conftest.py trains the bf16 and fp16 ones once per session: the `trained_runs`
fixture; tests/test_studio_screen_oracle.py trains the rest with `train_more`).

The reward functions below are loaded by path (rewards.funcs = ["tests/trained_runs.py:NAME"])."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

TRAINED_STEPS = 4
DTYPES = ("bf16", "fp16")
SHORT = [  # `train`'s runs (other tests read them as they are)
    f"train.steps={TRAINED_STEPS}",
    "train.prompts_per_step=2",
    "rollout.num_generations=2",
    "train.save_every=0",
    "train.eval_every=2",
    "train.eval_before=true",
    "data.eval_size=8",
]
NO_EVAL = ["train.eval_every=0", "train.eval_before=false"]
QUICK_EVAL = ["data.general_size=0"]  # the 8 held-out rows alone (the generalisation split adds 200)
HERE = Path(__file__).resolve()


def constant(completions, **kwargs):
    """The same reward for every completion: no group has any signal (every advantage 0)."""
    return [1.0] * len(completions)


def crash(completions, **kwargs):
    """SIGKILL the process that calls it: a trainer killed in its first step's rewards, before any row."""
    os.kill(os.getpid(), signal.SIGKILL)


def _train(recipe: str, run_dir: Path, sets: list[str], script=None) -> Path:
    from grpo_studio.contract import config
    from grpo_studio.engine.run.trainer import Trainer

    trainer = Trainer(config.load(recipe, sets), run_dir)
    if script is not None:
        trainer.grpo.sampler.generate = script(trainer)
    try:
        assert trainer.run() == "finished"
    finally:
        trainer.close()
    return run_dir


def train(root: Path) -> dict[str, Path]:
    """bf16 and fp16 runs of the bundled model, TRAINED_STEPS steps each, eval every 2 steps."""
    return {dtype: _train("tiny-arith", root / f"real-{dtype}", [f"model.dtype={dtype}", *SHORT]) for dtype in DTYPES}


def tool_script(trainer):
    """A scripted policy for recipe tool-calc: the first turn calls the calculator on the question's expression
    (a real tool call, run by the real environment), the next replies with the tool's result, or with one more
    on every other episode (so the groups' rewards differ). Log-probs are the policy's own of those tokens."""
    import torch

    from grpo_studio.engine.sampler.base import Rollout

    tok, policy = trainer.tokenizer, trainer.policy

    def reply(context: str, i: int) -> str:
        results = re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", context, re.S)
        if results:
            return f"{int(results[-1]) + i % 2}<|im_end|>"
        expression = re.findall(r"What is (.*?)\? Use the calculator", context)[-1]
        call = f'{{"name": "calculate", "arguments": {{"expression": "{expression}"}}}}'
        return f"<tool_call>{call}</tool_call><|im_end|>"

    def generate(prompt_ids, sampling):
        rows = [tok.encode(reply(tok.decode(ids), i), add_special_tokens=False) for i, ids in enumerate(prompt_ids)]
        rows = [row[: sampling.max_tokens] for row in rows]
        width = max(map(len, rows))
        logprobs = torch.zeros(len(rows), width)
        with torch.no_grad():
            for b, (ids, row) in enumerate(zip(prompt_ids, rows)):
                logits = policy(torch.tensor([list(ids) + row])).logits[0, len(ids) - 1 : -1].float()
                logprobs[b, : len(row)] = logits.log_softmax(-1).gather(1, torch.tensor(row)[:, None])[:, 0]
        eos = tok.eos_token_id
        return Rollout(
            completion_ids=torch.tensor([row + [eos] * (width - len(row)) for row in rows]),
            mask=torch.tensor([[1.0] * len(row) + [0.0] * (width - len(row)) for row in rows]),
            logprobs=logprobs,
            truncated=torch.tensor([row[-1] != eos for row in rows]),
        )

    return generate


def train_more(root: Path, smol_tiny_model: Path) -> dict[str, Path]:
    """fp32 (as `train`'s runs), a constant reward (zero signal), a tool-calc run of 2 steps whose scripted policy
    makes real calculator calls (a tiny Llama with SmolLM2's tokenizer), and a `grpo-studio train` whose trainer
    is killed before its first row (the supervisor marks it crashed)."""
    crashed = root / "real-crashed"
    killed = subprocess.Popen(
        [sys.executable, "-m", "grpo_studio.cli.main", "train", "tiny-arith", "--run-dir", str(crashed)]
        + [arg for s in [*SHORT, *NO_EVAL, f"rewards.funcs=['{HERE}:crash']"] for arg in ("--set", s)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    runs = {
        "fp32": _train("tiny-arith", root / "real-fp32", ["model.dtype=fp32", *SHORT, *QUICK_EVAL]),
        "constant": _train(
            "tiny-arith",
            root / "real-constant",
            [*SHORT, *QUICK_EVAL, "train.eval_before=false", f"rewards.funcs=['{HERE}:constant']"],
        ),
        "tool": _train(
            "tool-calc",
            root / "real-tool",
            [
                f"model.name={smol_tiny_model}",
                "warmup.source=",
                "warmup.steps=30",  # the default: no warm-up (the policy is scripted)
                "train.steps=2",
                "train.prompts_per_step=2",
                "rollout.num_generations=2",
                "train.save_every=0",
                *NO_EVAL,
            ],
            tool_script,
        ),
    }
    _, err = killed.communicate(timeout=600)
    assert b"killed by SIGKILL" in err, err.decode()[-2000:]  # `train` (the supervisor) marks the run crashed
    runs["crashed"] = crashed
    return runs
