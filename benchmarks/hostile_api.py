"""The fault suite's hostile cases for the Python API (docs/python-api.md; benchmarks/fault_probes.py says how
they run). Each probe runs a user's script in a fresh interpreter, as a user would: a GRPOConfig or GRPOTrainer
argument the studio cannot honour is one line on stderr and a non-zero exit, never a traceback, with nothing
written; a reward function that raises trains on (its samples None, a `reward_error` event)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .fault_probes import Probe

CATEGORY = "python api"
HEAD = """
from datasets import Dataset
from grpo_studio import GRPOConfig, GRPOTrainer

def reward_len(completions, **kwargs):
    return [float(len(c)) for c in completions]

def args(out, **kw):
    return GRPOConfig(out, max_steps=1, per_device_train_batch_size=4, num_generations=4, max_completion_length=4,
                      bf16=False, **kw)

data = Dataset.from_dict({"prompt": ["1+1=", "2+2=", "3+3=", "4+4="]})
"""


def _script(tmp: Path, body: str, timeout_s: float = 240) -> tuple[int, str, str]:
    path = tmp / "script.py"
    path.write_text(HEAD + body)
    done = subprocess.run(
        [sys.executable, str(path), str(tmp / "run")], capture_output=True, text=True, timeout=timeout_s, cwd=tmp
    )
    return done.returncode, done.stdout, done.stderr


def _one_line(tmp: Path, body: str, expected: str) -> str | None:
    code, _, err = _script(tmp, body)
    lines = [line for line in err.splitlines() if line.strip() and "kernels" not in line]
    if code == 0:
        return "the script exited 0"
    if "Traceback" in err or len(lines) != 1:
        return f"not one line on stderr: {err[-400:]!r}"
    if not lines[0].startswith(expected):
        return f"stderr {lines[0]!r} does not start with {expected!r}"
    if (tmp / "run" / "config.toml").exists():
        return "a refused run wrote config.toml"
    return None


def refused_field(tmp: Path) -> str | None:
    return _one_line(
        tmp, "args('run', push_to_hub=True)\n", "GRPOConfig error: push_to_hub = true: grpo-studio does not upload"
    )


def indivisible_batch(tmp: Path) -> str | None:
    return _one_line(
        tmp,
        "GRPOConfig('run', per_device_train_batch_size=3, num_generations=4)\n",
        "GRPOConfig error: generation_batch_size = 3: generation_batch_size (3) must be divisible by num_generations (4)",
    )


def partial_groups(tmp: Path) -> str | None:
    """TRL takes 4 completions a step with 8 generations (half a group); the studio says why it cannot."""
    return _one_line(
        tmp,
        "GRPOTrainer('tiny-arith', reward_len, GRPOConfig('run', per_device_train_batch_size=4, num_generations=8, "
        "steps_per_generation=2), data)\n",
        "GRPOConfig error: per_device_train_batch_size = 4: per_device_train_batch_size (4) x world size (1)",
    )


def no_prompt_column(tmp: Path) -> str | None:
    return _one_line(
        tmp,
        "GRPOTrainer('tiny-arith', reward_len, args('run'), Dataset.from_dict({'text': ['a', 'b']}))\n",
        "GRPOTrainer error: train_dataset: no 'prompt' column (columns: text)",
    )


def output_dir_is_a_file(tmp: Path) -> str | None:
    (tmp / "run").write_text("not a folder")
    return _one_line(
        tmp, "GRPOTrainer('tiny-arith', reward_len, args('run'), data).train()\n", "GRPOTrainer error: output_dir = "
    )


def rollout_func_given(tmp: Path) -> str | None:
    return _one_line(
        tmp,
        "GRPOTrainer('tiny-arith', reward_len, args('run'), data, rollout_func=lambda p, t: {})\n",
        "GRPOTrainer error: rollout_func = '<lambda>': grpo-studio samples with its own sampler",
    )


def optimizer_given(tmp: Path) -> str | None:
    return _one_line(
        tmp,
        "import torch\nopt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1)\n"
        "GRPOTrainer('tiny-arith', reward_len, args('run'), data, optimizers=(opt, None))\n",
        "GRPOTrainer error: optimizers = '(SGD, NoneType)': grpo-studio builds its own AdamW",
    )


def no_reward_source(tmp: Path) -> str | None:
    return _one_line(
        tmp,
        "GRPOTrainer('tiny-arith', None, args('run'), data)\n",
        "GRPOTrainer error: reward_funcs = None: no reward source",
    )


def eval_strategy_steps(tmp: Path) -> str | None:
    return _one_line(
        tmp,
        "GRPOTrainer('tiny-arith', reward_len, args('run', eval_strategy='steps', eval_steps=1), data)\n",
        "GRPOTrainer error: eval_dataset = None: eval_strategy = 'steps' evaluates an eval_dataset, and none was passed",
    )


def reward_model_not_a_model(tmp: Path) -> str | None:
    (tmp / "empty").mkdir()
    return _one_line(
        tmp,
        "GRPOTrainer('tiny-arith', ['empty'], args('run'), data)\n",
        "GRPOTrainer error: reward_funcs[0] = 'empty': cannot load a sequence-classification model from it",
    )


def quantization_fp4(tmp: Path) -> str | None:
    return _one_line(
        tmp,
        "from peft import LoraConfig\nfrom transformers import BitsAndBytesConfig\n"
        "GRPOTrainer('tiny-arith', reward_len, args('run'), data, peft_config=LoraConfig(r=4),\n"
        "            quantization_config=BitsAndBytesConfig(load_in_4bit=True))\n",
        "GRPOTrainer error: quantization_config.bnb_4bit_quant_type = 'fp4': set 'nf4'",
    )


def iterable_dataset_without_steps(tmp: Path) -> str | None:
    return _one_line(
        tmp,
        "GRPOTrainer('tiny-arith', reward_len, GRPOConfig('run', per_device_train_batch_size=4, num_generations=4),\n"
        "            data.to_iterable_dataset())\n",
        "GRPOConfig error: max_steps = -1: an IterableDataset has no length: set max_steps > 0",
    )


def reward_raises(tmp: Path) -> str | None:
    """A reward function that raises: the step trains on (its samples None), one reward_error event."""
    code, out, err = _script(
        tmp,
        "def broken(completions, **kw):\n    raise RuntimeError('boom')\n"
        "GRPOTrainer('tiny-arith', [reward_len, broken], args(__import__('sys').argv[1]), data).train()\n",
    )
    if code != 0:
        return f"exit {code}: {err[-400:]!r}"
    events = [json.loads(line) for line in (tmp / "run" / "events.jsonl").read_text().splitlines()]
    kinds = [e.get("kind") or e.get("event") for e in events]
    if "reward_error" not in kinds or "finished" not in kinds:
        return f"events {kinds}"
    if "grpo-studio attach" not in out:
        return "no attach hint printed"
    return None


def environment_without_steps(tmp: Path) -> str | None:
    """No train_dataset: TRL's placeholder prompts need max_steps to say how long."""
    return _one_line(
        tmp,
        "class Env:\n    def reset(self, **kw):\n        return 'go'\n    def get_reward(self):\n        return 1.0\n"
        "GRPOTrainer('tiny-arith', args=GRPOConfig('run', bf16=False), environment_factory=Env)\n",
        "GRPOConfig error: max_steps = -1: with no train_dataset, set max_steps > 0",
    )


def resume_without_a_run(tmp: Path) -> str | None:
    return _one_line(
        tmp,
        "GRPOTrainer('tiny-arith', reward_len, args('run'), data).train(resume_from_checkpoint=True)\n",
        "GRPOTrainer error: resume_from_checkpoint = true: run holds no run to resume",
    )


def prefix_tuning(tmp: Path) -> str | None:
    return _one_line(
        tmp,
        "from peft import PrefixTuningConfig\n"
        "GRPOTrainer('tiny-arith', reward_len, args('run'), data, "
        "peft_config=PrefixTuningConfig(task_type='CAUSAL_LM', num_virtual_tokens=4))\n",
        "GRPOTrainer error: peft_config = 'PrefixTuningConfig': grpo-studio trains LoRA adapters only",
    )


def callback_stops(tmp: Path) -> str | None:
    """A callback that sets control.should_training_stop after step 1 of 3: stopped there, with a checkpoint."""
    code, out, err = _script(
        tmp,
        "class Stop:\n    def on_step_end(self, args, state, control, **kw):\n"
        "        control.should_training_stop = True\n"
        "GRPOTrainer('tiny-arith', reward_len, GRPOConfig(__import__('sys').argv[1], max_steps=3, "
        "per_device_train_batch_size=4, num_generations=4, max_completion_length=4, bf16=False), data, "
        "callbacks=[Stop]).train()\n",
    )
    if code != 0:
        return f"exit {code}: {err[-400:]!r}"
    steps = [json.loads(line)["step"] for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    if steps != [1]:
        return f"metrics steps {steps}, expected [1]"
    if not (tmp / "run" / "checkpoints" / "step-1").is_dir():
        return "no checkpoint at the stop"
    if "stopped at step 1" not in out:
        return f"stdout does not say 'stopped at step 1': {out[-300:]!r}"
    return None


def cases() -> list:
    fast = [
        refused_field,
        indivisible_batch,
        partial_groups,
        no_prompt_column,
        output_dir_is_a_file,
        rollout_func_given,
        optimizer_given,
        no_reward_source,
        eval_strategy_steps,
        reward_model_not_a_model,
        quantization_fp4,
        iterable_dataset_without_steps,
        environment_without_steps,
        resume_without_a_run,
        prefix_tuning,
    ]
    return [Probe(CATEGORY, f.__name__.replace("_", " "), f, timeout_s=240) for f in fast] + [
        Probe(CATEGORY, "reward raises", reward_raises, timeout_s=300),
        Probe(CATEGORY, "callback stops", callback_stops, timeout_s=300),
    ]
