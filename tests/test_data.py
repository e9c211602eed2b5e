"""Datasets: local JSONL/CSV/Parquet, GSM8K format, column mapping, held-out eval split, HF
datasets offline, chat templates; and a GSM8K-format file training on the bundled model."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path

import pytest

from grpo_studio.contract.config import load
from grpo_studio.contract.errors import UserError
from grpo_studio.engine.prompts import data, prompt_render
from grpo_studio.rewards.builtin import SYSTEM_PROMPT

GSM8K = [
    {"question": "Janet has 16 eggs and eats 3. How many are left?", "answer": "16 - 3 = <<16-3=13>>13\n#### 13"},
    {"question": "A shirt costs $1,000 and a hat $200. Total?", "answer": "1000 + 200 = 1200\n#### 1,200"},
    {"question": "What is 7 - 10?", "answer": "7 - 10 = -3\n#### -3"},
    {"question": "Half of 5?", "answer": "5 / 2 = 2.5\n#### 2.5"},
    {"question": "What is 6 * 7?", "answer": "#### 42"},
    {"question": "What is 9 + 9?", "answer": "#### 18"},
]


def cfg_for(source, *extra):
    return load("tiny-arith", [f"data.source={source}", *extra]).data


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def tokenizer(random_tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(random_tiny_model)


def test_jsonl_csv_parquet_give_the_same_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"q": f"{a}+{a}=", "sol": str(2 * a)} for a in range(5)]
    write_jsonl(tmp_path / "d.jsonl", rows)
    with (tmp_path / "d.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["q", "sol"])
        writer.writeheader()
        writer.writerows(rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    loaded = [
        data.load_rows(
            cfg_for(tmp_path / f"d.{ext}", "data.prompt_column=q", "data.answer_column=sol", "data.eval_size=0"),
            "train",
        )
        for ext in ("jsonl", "csv", "parquet")
    ]
    assert loaded[0] == loaded[1] == loaded[2]
    assert loaded[0][3] == {"q": "3+3=", "sol": "6", "prompt": "3+3=", "answer": "6"}


def test_gsm8k_format_is_understood(tmp_path):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    rows = data.load_rows(cfg_for(path, "data.eval_size=0"), "train")
    assert [r["answer"] for r in rows] == ["13", "1200", "-3", "2.5", "42", "18"]
    assert rows[0]["prompt"] == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": GSM8K[0]["question"]},
    ]
    assert rows[0]["question"] == GSM8K[0]["question"]  # every source column stays for the rewards
    no_system = data.load_rows(cfg_for(path, "data.eval_size=0", "data.system_prompt="), "train")
    assert no_system[0]["prompt"] == GSM8K[0]["question"]


def test_eval_split_is_a_seeded_held_out_slice(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", GSM8K)
    cfg = cfg_for(path, "data.eval_size=2")
    train, evals = data.load_rows(cfg, "train"), data.load_rows(cfg, "eval")
    assert len(train) == 4 and len(evals) == 2
    questions = sorted(r["question"] for r in train + evals)
    assert questions == sorted(r["question"] for r in GSM8K)
    assert data.load_rows(cfg, "eval") == evals  # same slice every time


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["data.eval_size=6"],
            "config error: data.eval_size = 6: {p} has 6 rows; allowed: 0 to 5 (rows held out for evaluation)",
        ),
        (
            ["data.eval_split=test"],
            "config error: data.eval_split = 'test': picks a part of a Hugging Face dataset and "
            "data.source = '{p}' is a file; allowed: '' (hold rows out with data.eval_size)",
        ),
        (
            ["data.split=test"],
            "config error: data.split = 'test': picks a part of a Hugging Face dataset and "
            "data.source = '{p}' is a file; allowed: 'train' (hold rows out with data.eval_size)",
        ),
        (
            ["data.subset=main"],
            "config error: data.subset = 'main': picks a part of a Hugging Face dataset and "
            "data.source = '{p}' is a file; allowed: '' (hold rows out with data.eval_size)",
        ),
        (
            ["data.prompt_column=text"],
            "config error: data.prompt_column = 'text': no such column in {p}; columns: question, answer",
        ),
        (
            ["data.answer_column=solution"],
            "config error: data.answer_column = 'solution': no such column in {p}; columns: question, answer",
        ),
    ],
)
def test_data_errors_are_one_line(tmp_path, extra, message):
    path = write_jsonl(tmp_path / "g.jsonl", GSM8K)
    with pytest.raises(UserError) as err:
        data.load_rows(cfg_for(path, *extra), "train")
    assert str(err.value) == message.format(p=path)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(UserError) as err:
        data.load_rows(cfg_for(tmp_path / "nope.jsonl"), "train")
    assert str(err.value) == (
        f"config error: data.source = '{tmp_path}/nope.jsonl': file not found; allowed: "
        f"builtin:arith, a .jsonl/.json/.csv/.parquet file, or a Hugging Face dataset id "
        f"like 'openai/gsm8k'"
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": oops}\n')
    with pytest.raises(UserError, match=r"^config error: data.source = '.*bad.jsonl': line 2 is not valid JSON"):
        data.load_rows(cfg_for(bad), "train")


def test_hf_dataset_offline_fails_with_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(UserError) as err:
        data.load_rows(cfg_for("openai/gsm8k", "data.subset=main"), "train")
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(
        "config error: data.source = 'openai/gsm8k': could not load this Hugging Face dataset (split 'train'): "
    )
    assert text.endswith("offline? save it as a local .jsonl/.csv/.parquet file and set data.source to that path")


def test_prompt_rendering(tmp_path, tokenizer):
    gsm = write_jsonl(tmp_path / "g.jsonl", GSM8K)
    row = data.load_rows(cfg_for(gsm, "data.eval_size=0"), "train")[4]
    # the bundled tokenizer has no chat template: our own system+question prompt falls back to plain
    assert getattr(tokenizer, "chat_template", None) is None
    assert prompt_render.prompt_text(row, cfg_for(gsm), tokenizer) == SYSTEM_PROMPT.strip() + "\n\nWhat is 6 * 7?\n"
    # a tokenizer with a template uses it
    tokenizer.chat_template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    assert (
        prompt_render.prompt_text(row, cfg_for(gsm), tokenizer)
        == f"<system>{SYSTEM_PROMPT}<user>What is 6 * 7?<assistant>"
    )
    assert prompt_render.prompt_text(row, cfg_for(gsm, "data.chat_template=plain"), tokenizer).startswith("Respond in")
    given = cfg_for(gsm, "data.chat_template={% for m in messages %}{{ m.content | upper }}|{% endfor %}")
    assert prompt_render.prompt_text(row, given, tokenizer).endswith("|WHAT IS 6 * 7?|")
    # a text prompt is one user turn under the tokenizer's template; 'none' keeps it as it is (TRL's way)
    arith = load("tiny-arith").data
    first = data.load_rows(arith, "train")[0]
    assert prompt_render.prompt_text(first, arith, tokenizer) == "<user>0+0=<assistant>"
    assert prompt_render.prompt_text(first, dataclasses.replace(arith, chat_template="none"), tokenizer) == "0+0="
    assert prompt_render.prompt_text(first, dataclasses.replace(arith, chat_template="plain"), tokenizer) == "0+0="
    tokenizer.chat_template = None
    assert prompt_render.prompt_text(first, arith, tokenizer) == "0+0="  # no template: text as it is


def test_conversational_data_without_a_template_is_a_clear_error(tmp_path, tokenizer):
    conv = write_jsonl(tmp_path / "chat.jsonl", [{"prompt": [{"role": "user", "content": "2+2="}], "answer": "4"}] * 3)
    cfg = cfg_for(conv, "data.eval_size=0")
    row = data.load_rows(cfg, "train")[0]
    with pytest.raises(UserError) as err:
        prompt_render.prompt_text(row, cfg, tokenizer)
    assert str(err.value) == (
        f"config error: data.chat_template = 'auto': {tokenizer.name_or_path} has no chat "
        f"template but {conv} is conversational (column 'prompt' holds messages); set "
        f"data.chat_template to a Jinja template, a .jinja file, or 'plain'"
    )
    assert prompt_render.prompt_text(row, cfg_for(conv, "data.chat_template=plain"), tokenizer) == "2+2=\n"


def test_gsm8k_file_trains_with_the_gsm8k_reward_set(tmp_path, request):
    from grpo_studio.engine.run.trainer import Trainer

    model = "tiny-arith"
    path = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K * 2)
    funcs = ["xmlcount", "soft_format", "strict_format", "int", "correctness"]
    cfg = load(
        "tiny-arith",
        [
            f"model.name={model}",
            f"data.source={path}",
            "data.eval_size=2",
            f"rewards.funcs={json.dumps(funcs)}",
            "rewards.weights=[1, 1, 1, 1, 1]",
            "train.steps=3",
            "train.prompts_per_step=2",
            "rollout.num_generations=2",
            "rollout.max_prompt_len=256",
            "rollout.max_completion_len=16",
            "train.save_every=0",
        ],
    )
    assert Trainer(cfg, tmp_path / "run").run() == "finished"
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        for fn in funcs:
            assert math.isfinite(r[f"rewards/{fn}/mean"]) and math.isfinite(r[f"rewards/{fn}/std"])
        assert r["rewards/correctness/mean"] in (0.0, 0.5, 1.0, 1.5, 2.0)
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["prompt"] and isinstance(s["prompt"], (str, list)) for s in samples)
    assert set(samples[0]["rewards"]) == set(funcs)
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert not [e for e in events if e["event"] == "reward_error"]


def test_encode_prompts_adds_no_special_tokens_and_refuses_a_longer_prompt():
    class Tok:  # one id per character, plus a BOS that add_special_tokens=True would add
        def encode(self, text, add_special_tokens=True):
            return ([1] if add_special_tokens else []) + [ord(c) for c in text]

    assert prompt_render.encode_prompts(Tok(), ["abcd", "xy"], 4) == [[97, 98, 99, 100], [120, 121]]
    with pytest.raises(UserError) as err:  # cutting either end would lose the template's head or its tail
        prompt_render.encode_prompts(Tok(), ["abcd", "xy"], 3)
    assert str(err.value) == (
        "config error: rollout.max_prompt_len = 3: a prompt renders to 4 tokens; allowed: "
        "at least 4, or shorter prompts"
    )


def test_mix_seed_and_the_prompt_stream_order():
    assert data.mix_seed(0, 5) == 5 and data.mix_seed(2, 7) == 2_000_013
    import random

    order = list(range(4))
    random.Random(1_000_004).shuffle(order)  # seed 1, epoch 1
    stream = data.PromptStream([{"i": i} for i in range(4)], seed=1)
    stream.restore({"epoch": 1, "index": 0})
    assert [r["i"] for r in stream.take(4)] == order
