"""GRPOTrainer's arguments and methods on the bundled tiny model (fast): peft_config reaches config.toml, the five
TRL callbacks fire with TRL's state fields, train(resume_from_checkpoint=True) continues from the newest checkpoint,
save_model() writes a model from_pretrained reads, and environment_factory without a dataset trains on TRL's
placeholder prompts."""

from __future__ import annotations

import json
import tomllib

import pytest

from grpo_studio.contract.run_files import checkpoint_folders

pytest.importorskip("peft")
pytest.importorskip("datasets")

PROMPTS = ["1+1=", "2+2=", "3+3=", "4+4="]


def reward_spread(completions, **kwargs):
    """A reward that differs between completions, so every step updates the adapter."""
    return [float(sum(map(ord, c)) % 7) for c in completions]


def args(out, **kw):
    from grpo_studio import GRPOConfig

    return GRPOConfig(
        str(out), per_device_train_batch_size=4, num_generations=4, max_completion_length=4, bf16=False, **kw
    )


class Recorder:
    """A transformers TrainerCallback as TRL users write one: records each event with TRL's state fields."""

    def __init__(self):
        self.seen = []

    def _note(self, event, state, **kw):
        self.seen.append((event, state.global_step, state.epoch, len(state.log_history), kw))

    def on_train_begin(self, args, state, control, **kw):
        self._note("begin", state)

    def on_step_end(self, args, state, control, **kw):
        self._note("step_end", state)

    def on_log(self, args, state, control, logs=None, **kw):
        self._note("log", state, logs=dict(logs))

    def on_save(self, args, state, control, **kw):
        self._note("save", state)

    def on_train_end(self, args, state, control, **kw):
        self._note("end", state)


def rows_of(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """Two steps of tiny-arith with a LoraConfig and a callback, saving every step."""
    from datasets import Dataset
    from peft import LoraConfig

    from grpo_studio import GRPOTrainer

    run = tmp_path_factory.mktemp("api") / "run"
    recorder = Recorder()
    trainer = GRPOTrainer(
        "tiny-arith",
        reward_spread,
        args(run, max_steps=2, save_steps=1, logging_steps=1, learning_rate=1e-3),
        Dataset.from_dict({"prompt": PROMPTS}),
        callbacks=[recorder],
        peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["v_proj", "q_proj"]),
    )
    trainer.train()
    return run, trainer, recorder


def test_peft_config_is_the_runs_lora(lora_run):
    run, _, _ = lora_run
    model = tomllib.loads((run / "config.toml").read_text())["model"]
    assert (model["lora_rank"], model["lora_alpha"], model["lora_dropout"]) == (4, 8.0, 0.0)
    assert model["lora_target_modules"] == ["q_proj", "v_proj"]


def test_callbacks_fire_with_trls_state_fields(lora_run):
    run, _, recorder = lora_run
    rows = rows_of(run)
    assert [step for step, _ in checkpoint_folders(run)] == [1, 2]  # save_steps=1
    # transformers' order: on_step_end, then on_log, then on_save, each step; one prompt a step of 4 -> epoch step/4
    expected = [("begin", 0, 0, 0)]
    for step in (1, 2):
        expected += [
            ("step_end", step, step / 4, step - 1),
            ("log", step, step / 4, step),
            ("save", step, step / 4, step),
        ]
    expected.append(("end", 2, 0.5, 2))
    assert [seen[:4] for seen in recorder.seen] == expected
    logs = [seen[4]["logs"] for seen in recorder.seen if seen[0] == "log"]
    for row, log in zip(rows, logs, strict=True):  # TRL's names, the step's own values (logging_steps=1)
        assert log["reward"] == pytest.approx(row["reward/mean"])
        assert log["loss"] == pytest.approx(row["loss"])
        assert log["learning_rate"] == pytest.approx(row["lr"])
        assert log["epoch"] == row["step"] / 4


def test_resume_continues_after_the_newest_checkpoint(lora_run, tmp_path):
    import shutil

    from datasets import Dataset
    from peft import LoraConfig

    from grpo_studio import GRPOTrainer

    first, _, _ = lora_run
    run = tmp_path / "run"
    shutil.copytree(first, run)
    recorder = Recorder()
    trainer = GRPOTrainer(
        "tiny-arith",
        reward_spread,
        args(run, max_steps=3, save_steps=1, logging_steps=1, learning_rate=1e-3),
        Dataset.from_dict({"prompt": PROMPTS}),
        callbacks=[recorder],
        peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["v_proj", "q_proj"]),
    )
    trainer.train(resume_from_checkpoint=True)
    assert [row["step"] for row in rows_of(run)] == [1, 2, 3]  # the first run's two rows, then step 3 alone
    assert recorder.seen[0][:3] == ("begin", 2, 0.5)
    assert [s[:2] for s in recorder.seen if s[0] == "step_end"] == [("step_end", 3)]
    assert [step for step, _ in checkpoint_folders(run)] == [1, 2, 3]


def test_save_model_writes_the_merged_lora_model(lora_run, tmp_path):
    """The saved folder loads with from_pretrained: the LoRA's modules (q_proj, v_proj) differ from the base, every
    other weight is the base's own."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_studio.engine.model import policy_loader

    _, trainer, _ = lora_run
    trainer.save_model(str(tmp_path / "saved"))
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "saved").state_dict()
    base = AutoModelForCausalLM.from_pretrained(policy_loader.resolve_model_path("tiny-arith")).state_dict()
    AutoTokenizer.from_pretrained(tmp_path / "saved")
    assert saved.keys() == base.keys()
    changed = {name for name in base if not torch.equal(saved[name], base[name])}
    assert changed and all(name.endswith(("q_proj.weight", "v_proj.weight")) for name in changed), changed


class Counter:
    """TRL's environment example on tiny-arith: reset() writes the prompt, get_reward() scores the episode."""

    def reset(self, **kwargs):
        self.target = 3
        return "1+2="

    def get_reward(self):
        return 1.0

    def add(self, a: int, b: int) -> int:
        """
        Adds two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return a + b


def test_placeholder_prompts_are_allowed_where_an_environment_completes_them():
    """TRL's placeholder (an empty user turn) passes the data loader with an environment, and only there."""
    from grpo_studio.contract.config import load
    from grpo_studio.contract.errors import UserError
    from grpo_studio.engine.prompts import data

    cfg = load("tiny-arith", ["data.system_prompt=none"]).data
    placeholder = [{"prompt": [{"role": "user", "content": ""}]}] * 2
    assert [row["prompt"] for row in data.normalize(placeholder, cfg, environment=True)] == [
        [{"role": "user", "content": ""}]
    ] * 2
    with pytest.raises(UserError, match=r"row 1 has an empty prompt \(column 'prompt'\)"):
        data.normalize(placeholder, cfg)


def test_environment_factory_without_a_dataset_writes_trls_placeholders(tmp_path):
    """No train_dataset: generation_batch_size // num_generations placeholder rows (TRL grpo_trainer.py), and
    max_steps <= 0 refused in one line."""
    from grpo_studio import GRPOTrainer
    from grpo_studio.contract.errors import UserError

    trainer = GRPOTrainer(
        "tiny-arith", args=args(tmp_path / "run", max_steps=1, steps_per_generation=2), environment_factory=Counter
    )
    assert trainer.rows == [{"prompt": [{"role": "user", "content": ""}]}] * 2  # 4 * 2 // 4
    assert trainer.config.data.chat_template == "auto" and trainer.config.env.environment.startswith("py:")
    with pytest.raises(UserError) as refused:
        GRPOTrainer("tiny-arith", args=args(tmp_path / "other"), environment_factory=Counter)
    assert str(refused.value).startswith("GRPOConfig error: max_steps = -1: with no train_dataset, set max_steps > 0")
