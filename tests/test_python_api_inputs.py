"""What TRL's GRPOTrainer takes beyond functions and a Dataset, on the bundled tiny model: reward models (an object
with its processing class, a saved folder, an id loaded as TRL loads one), async reward functions, an
IterableDataset with an extra column the rewards read, and quantization_config; and what is refused, one line each.

The oracles: a reward model's score is the model itself called by hand on prompt + completion with its tokenizer
(TRL's logits[:, 0]); an async reward's is the hand value of its formula; the rows an IterableDataset gives are its
first ceil(max_steps * generation_batch_size / num_generations); config.toml's keys for a BitsAndBytesConfig."""

from __future__ import annotations

import asyncio
import json
import tomllib

import pytest
import torch

from grpo_studio.contract.errors import UserError
from grpo_studio.engine.model import policy_loader

pytest.importorskip("datasets")
pytest.importorskip("peft")

BASE = policy_loader.resolve_model_path("tiny-arith")
PROMPTS = ["1+1=", "2+2=", "3+3=", "4+4=", "5+5=", "6+6=", "7+7=", "8+8="]


def args(out, **kw):
    from grpo_studio import GRPOConfig

    return GRPOConfig(
        str(out), per_device_train_batch_size=4, num_generations=4, max_completion_length=4, bf16=False, **kw
    )


def sequence_classifier(seed: int, name_or_path: str | None = None):
    """A tiny random sequence-classification model with tiny-arith's shape (its tokenizer fits)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(BASE, num_labels=1)
    if name_or_path is not None:
        config._name_or_path = name_or_path
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(config).eval()
    with torch.no_grad():
        model.score.weight.normal_(0, 1.0)  # scores far enough apart to tell completions apart
    return model


def by_hand(model, tokenizer, text: str) -> float:
    """TRL's reward: the model's first logit at the last token of prompt + completion, no special tokens added."""
    ids = tokenizer(text, add_special_tokens=False).input_ids
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, 0].item()


async def digits_matching(completions, target, **kwargs):
    """An async reward (TRL awaits these): 1 for each completion character equal to the row's `target` digit."""
    await asyncio.sleep(0)
    return [float(sum(ch == t for ch in c)) for c, t in zip(completions, target, strict=True)]


def stream():
    """An IterableDataset's source: endless rows with an extra column, `target`."""
    for n in range(10**9):
        yield {"prompt": PROMPTS[n % len(PROMPTS)], "target": str((2 * (n % len(PROMPTS) + 1)) % 10)}


@pytest.fixture(scope="module")
def rewarded_run(tmp_path_factory):
    """One step: a reward-model object with a processing class, a saved reward-model folder and an async function,
    on an IterableDataset; remove_unused_columns=False keeps `target` for the async reward, as TRL."""
    from datasets import IterableDataset
    from transformers import AutoTokenizer

    from grpo_studio import GRPOTrainer

    tmp = tmp_path_factory.mktemp("api-inputs")
    tokenizer = AutoTokenizer.from_pretrained(BASE)
    in_memory = sequence_classifier(0, name_or_path="my-org/judge")
    saved = sequence_classifier(1)
    saved.save_pretrained(tmp / "saved-rm")
    tokenizer.save_pretrained(tmp / "saved-rm")
    trainer = GRPOTrainer(
        "tiny-arith",
        [in_memory, str(tmp / "saved-rm"), digits_matching],
        args(tmp / "run", max_steps=1, save_strategy="no", remove_unused_columns=False),
        IterableDataset.from_generator(stream),
        reward_processing_classes=[tokenizer, None, None],
    )
    trainer.train()
    run = tmp / "run"
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    return run, trainer, samples, row, (in_memory, saved, tokenizer)


def test_reward_models_score_prompt_plus_completion_as_trl(rewarded_run):
    run, trainer, samples, row, (in_memory, saved, tokenizer) = rewarded_run
    # the object is saved to RUN/reward_models/<its id's last part> with its processing class; the folder is read
    # where it is
    funcs = tomllib.loads((run / "config.toml").read_text())["rewards"]["funcs"]
    assert funcs[:2] == [f"rm:{run / 'reward_models' / 'judge'}", f"rm:{run.parent / 'saved-rm'}"]
    assert funcs[2].startswith("py:")
    assert len(samples) == 4
    for s in samples:
        text = s["prompt"] + s["completion"]
        assert s["rewards"]["rm_judge"] == pytest.approx(by_hand(in_memory, tokenizer, text), abs=1e-4)
        assert s["rewards"]["rm_saved-rm"] == pytest.approx(by_hand(saved, tokenizer, text), abs=1e-4)
    for name in ("rm_judge", "rm_saved-rm"):
        assert len({s["rewards"][name] for s in samples}) > 1  # the completions differ, and so do their scores
        assert row[f"rewards/{name}/mean"] == pytest.approx(sum(s["rewards"][name] for s in samples) / 4, abs=1e-5)


def test_an_async_reward_is_awaited_with_the_extra_column(rewarded_run):
    _, trainer, samples, row, _ = rewarded_run
    targets = {r["prompt"]: r["target"] for r in trainer.rows}
    for s in samples:
        assert s["rewards"]["digits_matching"] == sum(ch == targets[s["prompt"]] for ch in s["completion"])
    mean = sum(s["rewards"]["digits_matching"] for s in samples) / 4
    assert row["rewards/digits_matching/mean"] == pytest.approx(mean)


def test_an_iterable_dataset_gives_the_prompts_max_steps_needs(rewarded_run, tmp_path):
    """TRL streams one generation batch (generation_batch_size / num_generations prompts) per generation: the API
    reads that many for max_steps steps, from the stream's start, and writes them as the run's data."""
    from datasets import IterableDataset

    from grpo_studio import GRPOTrainer

    run, trainer, _, _, _ = rewarded_run
    first = [row for _, row in zip(range(1), stream())]
    assert trainer.rows == first  # max_steps 1, 4 completions of 4 generations: one prompt
    written = [json.loads(line) for line in (run / "data" / "train.jsonl").read_text().splitlines()]
    assert written == first
    longer = GRPOTrainer(
        "tiny-arith",
        digits_matching,
        args(tmp_path / "b", max_steps=3, steps_per_generation=2, remove_unused_columns=False),
        IterableDataset.from_generator(stream),
    )
    assert longer.rows == [row for _, row in zip(range(6), stream())]  # ceil(3 * 8 / 4)
    with pytest.raises(UserError) as refused:
        GRPOTrainer("tiny-arith", digits_matching, args(tmp_path / "c"), IterableDataset.from_generator(stream))
    assert str(refused.value) == (
        "GRPOConfig error: max_steps = -1: an IterableDataset has no length: set max_steps > 0, as TRL"
    )


def test_a_reward_model_id_is_loaded_as_trl_loads_one(tmp_path):
    """A name that is no saved folder, or any name given with a processing class, is loaded with
    AutoModelForSequenceClassification.from_pretrained(name, num_labels=1) and saved into the run with that class."""
    from transformers import AutoTokenizer

    from grpo_studio import GRPOTrainer

    folder = tmp_path / "rm"
    sequence_classifier(2).save_pretrained(folder)
    AutoTokenizer.from_pretrained(BASE).save_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(BASE, padding_side="left")
    trainer = GRPOTrainer(
        "tiny-arith",
        str(folder),
        args(tmp_path / "run", max_steps=1),
        [{"prompt": p} for p in PROMPTS],
        reward_processing_classes=tokenizer,
    )
    assert trainer.config.rewards.funcs == [f"rm:{tmp_path / 'run' / 'reward_models' / 'rm'}"]
    [(_, model, given)] = trainer.saved_rewards
    assert given is tokenizer and model.config.num_labels == 1


@pytest.mark.parametrize(
    "funcs, classes, line",
    [
        (
            ["NO_FOLDER"],
            None,
            "GRPOTrainer error: reward_funcs[0] = 'NO_FOLDER': cannot load a sequence-classification model from it",
        ),
        (
            ["MODEL"],
            None,
            "GRPOTrainer error: reward_funcs[0] = '': no tokenizer found for this reward model's id; pass it in "
            "reward_processing_classes",
        ),
        (
            [len, len],
            [None],
            "GRPOTrainer error: reward_processing_classes: the number of reward processing classes (1) must match the "
            "number of reward functions (2)",
        ),
    ],
)
def test_reward_model_mistakes_are_one_line(tmp_path, funcs, classes, line):
    from grpo_studio import GRPOTrainer

    (tmp_path / "empty").mkdir()
    known = {"NO_FOLDER": str(tmp_path / "empty"), "MODEL": sequence_classifier(0, name_or_path="")}
    funcs = [known.get(f, f) if isinstance(f, str) else f for f in funcs]
    with pytest.raises(UserError) as refused:
        GRPOTrainer("tiny-arith", funcs, args(tmp_path / "run", max_steps=1), [{"prompt": "1+1="}], None, None, classes)
    message = str(refused.value).replace(str(tmp_path / "empty"), "NO_FOLDER")
    assert message.startswith(line) and "\n" not in message


# ---- quantization_config ----------------------------------------------------------------------------------------


def lora():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])


@pytest.mark.parametrize("double_quant", [True, False])
def test_a_4bit_nf4_config_is_the_studios_qlora(tmp_path, double_quant):
    """BitsAndBytesConfig(load_in_4bit, nf4) -> model.load_in_4bit and model.double_quant; one step trains."""
    pytest.importorskip("bitsandbytes")
    from transformers import BitsAndBytesConfig

    from grpo_studio import GRPOTrainer

    quantization = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=double_quant
    )
    run = tmp_path / "run"
    trainer = GRPOTrainer(
        "tiny-arith",
        digits_matching,
        args(run, max_steps=1, save_strategy="no", remove_unused_columns=False),
        [{"prompt": p, "target": "2"} for p in PROMPTS],
        quantization_config=quantization,
        peft_config=lora(),
    )
    model = trainer.config.model
    assert (model.load_in_4bit, model.double_quant, model.lora_rank) == (True, double_quant, 4)
    if double_quant:  # one of the two trains: the engine's 4-bit path itself is tests/test_qlora.py's
        trainer.train()
        written = tomllib.loads((run / "config.toml").read_text())["model"]
        assert (written["load_in_4bit"], written["double_quant"]) == (True, True)
        assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1]


@pytest.mark.parametrize(
    "kw, peft, line",
    [
        (
            {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
            False,
            "GRPOTrainer error: quantization_config = 'BitsAndBytesConfig': a 4-bit base cannot be fine-tuned in full; "
            "pass a LoraConfig as peft_config (QLoRA)",
        ),
        (
            {"load_in_8bit": True},
            True,
            "GRPOTrainer error: quantization_config = 'BitsAndBytesConfig': grpo-studio quantises the base to 4-bit "
            "NF4 only: BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4')",
        ),
        (
            {"load_in_4bit": True},  # bitsandbytes' default quant type is fp4
            True,
            "GRPOTrainer error: quantization_config.bnb_4bit_quant_type = 'fp4': set 'nf4' (QLoRA's NormalFloat4)",
        ),
        (
            {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": torch.bfloat16},
            True,
            "GRPOTrainer error: quantization_config.bnb_4bit_compute_dtype = 'bfloat16': the base computes in "
            "model.dtype (float32, from bf16/fp16); set that or leave float32",
        ),
        (
            {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "llm_int8_skip_modules": ["q_proj"]},
            True,
            "GRPOTrainer error: quantization_config.llm_int8_skip_modules = ['q_proj']: grpo-studio quantises every "
            "linear but lm_head; remove it",
        ),
    ],
)
def test_quantization_the_studio_cannot_honour_is_one_line(tmp_path, kw, peft, line):
    from transformers import BitsAndBytesConfig

    from grpo_studio import GRPOTrainer

    with pytest.raises(UserError) as refused:
        GRPOTrainer(
            "tiny-arith",
            len,
            args(tmp_path / "run", max_steps=1),
            [{"prompt": "1+1="}],
            quantization_config=BitsAndBytesConfig(**kw),
            peft_config=lora() if peft else None,
        )
    assert str(refused.value) == line


def test_quantization_with_a_model_object_is_ignored_as_trl_does(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from grpo_studio import GRPOTrainer

    trainer = GRPOTrainer(
        AutoModelForCausalLM.from_pretrained(BASE),
        len,
        args(tmp_path / "run", max_steps=1),
        [{"prompt": "1+1="}],
        quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4"),
    )
    assert trainer.config.model.load_in_4bit is False
    assert capsys.readouterr().err == (
        "You passed `quantization_config` to the trainer, but your model is already instantiated. The "
        "`quantization_config` will be ignored.\n"
    )


def test_an_eval_strategy_transformers_has_not_is_one_line(tmp_path):
    """Evaluation itself: tests/test_python_api_eval.py."""
    from grpo_studio import GRPOTrainer

    with pytest.raises(UserError) as refused:
        GRPOTrainer(
            "tiny-arith",
            len,
            args(tmp_path / "run", max_steps=1, eval_strategy="best"),
            [{"prompt": "1+1="}],
            eval_dataset=[{"prompt": "2+2="}],
        )
    assert str(refused.value) == "GRPOConfig error: eval_strategy = 'best': allowed: 'no', 'steps', 'epoch'"
