"""Issue 40's data cases: a lone surrogate in a prompt, a CSV with a byte-order mark, message-list rows without a
role, with content that is not text, or empty; and a model config with a number that is not finite. Each is read
right or refused in one line naming the row (or the file and field), exit 2, no run directory; the hostile suite
(benchmarks/hostile_data.py, hostile_cache.py) holds the rest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_helpers import run_cli

from grpo_studio.contract import bundled, model_card
from grpo_studio.contract.config import load
from grpo_studio.contract.errors import UserError
from grpo_studio.engine.model import policy_loader
from grpo_studio.engine.prompts import data

ROLES = "allowed: system, developer, user, assistant, tool"
GOOD_ROW = {"prompt": "1+1=", "answer": "2"}


def rows_of(path: Path, *sets: str) -> list[dict]:
    return data.load_rows(load("tiny-arith", [f"data.source={path}", "data.eval_size=0", *sets]).data, "train")


def refusal(path: Path) -> str:
    with pytest.raises(UserError) as err:
        rows_of(path)
    return str(err.value)


def jsonl(path: Path, *rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # a lone surrogate stays its \\ud800 escape
    return path


def one_line_refusal(proc, line: str, run: Path) -> None:
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [line]
    assert not run.exists()


def test_a_csv_with_a_byte_order_mark_reads_its_first_column(tmp_path):
    path = tmp_path / "excel.csv"
    path.write_bytes(b"\xef\xbb\xbfprompt,answer\r\n1+1=,2\r\n2+2=,4\r\n")
    assert rows_of(path) == [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]
    path.write_bytes(b"\xef\xbb\xbfquestion_text,answer\r\nhi,2\r\n")  # the columns listed are the file's, no BOM
    assert refusal(path) == (
        f"config error: data.prompt_column = 'prompt': no such column in {path}; columns: question_text, answer"
    )


def test_json_and_jsonl_with_a_byte_order_mark(tmp_path):
    (tmp_path / "a.jsonl").write_text('\ufeff{"prompt": "1+1=", "answer": "2"}\n')
    (tmp_path / "a.json").write_text('\ufeff[{"prompt": "1+1=", "answer": "2"}]')
    for name in ("a.jsonl", "a.json"):
        assert rows_of(tmp_path / name) == [{"prompt": "1+1=", "answer": "2"}]


def test_a_lone_surrogate_is_refused_with_its_row_and_column(tmp_path):
    path = jsonl(tmp_path / "s.jsonl", {"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=\ud800", "answer": "4"})
    assert refusal(path) == (
        f"config error: data.source = '{path}': row 2, column 'prompt': text that cannot be encoded as UTF-8 "
        "(surrogates not allowed: '\\ud800' at character 4); allowed: valid Unicode text"
    )
    path = jsonl(tmp_path / "m.jsonl", {"prompt": [{"role": "user", "content": "ok"}], "tag": {"k": ["\udc00"]}})
    assert refusal(path) == (
        f"config error: data.source = '{path}': row 1, column 'tag': text that cannot be encoded as UTF-8 "
        "(surrogates not allowed: '\\udc00' at character 0); allowed: valid Unicode text"
    )


@pytest.mark.parametrize(
    "prompt, why",
    [
        ([], "the message list is empty"),
        ([{"content": "hi"}], f"message 1 has no role; {ROLES}"),
        ([{"role": "user", "content": "a"}, {"role": "usr", "content": "b"}], f"message 2 has role 'usr'; {ROLES}"),
        ([{"role": "user", "content": 5}], 'message 1 (user) has content a number; allowed: text ("" for none)'),
        ([{"role": "user", "content": None}], 'message 1 (user) has content null; allowed: text ("" for none)'),
        (
            [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            'message 1 (user) has content a list of 1; allowed: text ("" for none)',
        ),
        ([[{"role": "user", "content": "hi"}]], "message 1 is a list of 1, not an object with role and content"),
        (
            [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}],
            "no user turn (roles: system, assistant)",
        ),
    ],
)
def test_malformed_message_lists_are_refused_with_the_row(tmp_path, prompt, why):
    path = jsonl(tmp_path / "chat.jsonl", {"prompt": [{"role": "user", "content": "fine"}]}, {"prompt": prompt})
    assert refusal(path) == f"config error: data.source = '{path}': row 2, column 'prompt': {why}"


def test_valid_message_lists_are_kept_as_they_are(tmp_path):
    chat = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "", "tool_calls": []},
        {"role": "tool", "content": "4"},
    ]
    assert rows_of(jsonl(tmp_path / "chat.jsonl", {"prompt": chat, "answer": "4"}))[0]["prompt"] == chat


def test_a_prompt_that_is_not_text_is_refused(tmp_path):
    path = jsonl(tmp_path / "n.jsonl", {"prompt": 12, "answer": "12"})
    assert refusal(path) == (
        f"config error: data.source = '{path}': row 1, column 'prompt' holds a number; allowed: text or a list "
        "of chat messages"
    )


def test_columns_named_twice_are_refused(tmp_path):
    (tmp_path / "t.csv").write_text("prompt,answer,prompt\n1+1=,2,x\n")
    assert refusal(tmp_path / "t.csv") == (
        f"config error: data.source = '{tmp_path}/t.csv': the header names column 'prompt' twice"
    )
    (tmp_path / "t.jsonl").write_text('{"prompt": "a", "prompt": "b"}\n')
    assert (
        refusal(tmp_path / "t.jsonl")
        == f"config error: data.source = '{tmp_path}/t.jsonl': line 1 names 'prompt' twice"
    )


def test_train_refuses_a_surrogate_and_an_empty_message_list_before_loading(tmp_path):
    """The issue's tokenizer traceback and its silent "[]" prompt, as a user meets them."""
    surrogate = jsonl(tmp_path / "s.jsonl", {"prompt": "1+1=", "answer": "2"}, {"prompt": "\ud800", "answer": "2"})
    empty = jsonl(tmp_path / "e.jsonl", {"prompt": [], "answer": "2"})
    run = tmp_path / "run"
    proc = run_cli("train", "tiny-arith", "--set", f"data.source={surrogate}", "--run-dir", str(run), cwd=tmp_path)
    one_line_refusal(
        proc,
        f"config error: data.source = '{surrogate}': row 2, column 'prompt': text that cannot be encoded as UTF-8 "
        "(surrogates not allowed: '\\ud800' at character 0); allowed: valid Unicode text",
        run,
    )
    proc = run_cli("train", "tiny-arith", "--set", f"data.source={empty}", "--run-dir", str(run), cwd=tmp_path)
    one_line_refusal(
        proc, f"config error: data.source = '{empty}': row 1, column 'prompt': the message list is empty", run
    )


# ---- a model config with numbers that are not finite -------------------------------------------------------


def nan_model(folder: Path, text: str) -> Path:
    folder.mkdir()
    config = (bundled.bundled_model("tiny-arith") / "config.json").read_text()
    (folder / "config.json").write_text(config.replace('"rms_norm_eps": 1e-06', text))
    return folder


@pytest.mark.parametrize(
    "text, field, value",
    [
        ('"rms_norm_eps": NaN', "rms_norm_eps", "nan"),
        ('"rms_norm_eps": 1e-06, "rope_scaling": {"factor": Infinity}', "rope_scaling.factor", "inf"),
        ('"rms_norm_eps": 1e-06, "scales": [1.0, -Infinity]', "scales[1]", "-inf"),
        ('"rms_norm_eps": 1e999', "rms_norm_eps", "inf"),
        ('"rms_norm_eps": {"__float__": "NaN"}', "rms_norm_eps", "nan"),  # transformers 5's own spelling
    ],
)
def test_a_non_finite_model_config_is_refused_before_loading(tmp_path, text, field, value):
    folder = nan_model(tmp_path / "m", text)
    with pytest.raises(UserError) as err:
        policy_loader.resolve_model_path(str(folder))
    assert str(err.value) == (
        f"config error: model.name = '{folder}': {folder}/config.json sets {field} = {value}; allowed: finite numbers"
    )
    with pytest.raises(UserError) as err:  # the VRAM planner's card reader says the same as a vram error
        model_card.load(str(folder))
    assert str(err.value).startswith(f"vram error: model.name = '{folder}': {folder}/config.json sets {field} = ")


def test_a_finite_config_and_an_unparsable_one_pass_the_check(tmp_path):
    """Every bundled config is finite; a config.json that is not JSON is the loader's to name (test_validation)."""
    model_card.check_model_folder(bundled.bundled_model("tiny-arith"), "tiny-arith")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    model_card.check_model_folder(bad, str(bad))


def test_train_with_rms_norm_eps_nan_exits_2_and_leaves_no_run(tmp_path):
    """The issue's case: it trained to NaN and exited 0."""
    folder = nan_model(tmp_path / "m", '"rms_norm_eps": NaN')
    run = tmp_path / "run"
    proc = run_cli("train", "tiny-arith", "--set", f"model.name={folder}", "--run-dir", str(run), cwd=tmp_path)
    one_line_refusal(
        proc,
        f"config error: model.name = '{folder}': {folder}/config.json sets rms_norm_eps = nan; allowed: finite numbers",
        run,
    )


# ---- rows that disagree on their columns, line endings, files that are not regular files --------------------


def test_a_row_without_a_column_the_rows_before_it_have_is_refused(tmp_path):
    """The issue's row 3 with prompt/ans: it trained until step 1 hit KeyError: 'answer' in the reward call."""
    path = jsonl(tmp_path / "r.jsonl", GOOD_ROW, GOOD_ROW, {"prompt": "3+3=", "ans": "6"})
    assert refusal(path) == f"config error: data.source = '{path}': row 3 has no column 'answer' (rows 1-2 have it)"
    path = jsonl(tmp_path / "x.jsonl", GOOD_ROW, {**GOOD_ROW, "level": 2})
    assert refusal(path) == f"config error: data.source = '{path}': row 2 has a column 'level' that row 1 lacks"


def test_train_refuses_a_row_missing_a_column_before_loading(tmp_path):
    path = jsonl(tmp_path / "r.jsonl", GOOD_ROW, GOOD_ROW, {"prompt": "3+3=", "ans": "6"})
    run = tmp_path / "run"
    proc = run_cli(
        "train",
        "tiny-arith",
        "--set",
        "train.steps=1",
        "--set",
        f"data.source={path}",
        "--run-dir",
        str(run),
        cwd=tmp_path,
    )
    one_line_refusal(
        proc, f"config error: data.source = '{path}': row 3 has no column 'answer' (rows 1-2 have it)", run
    )


def test_a_csv_row_shorter_than_its_header_is_refused(tmp_path):
    path = tmp_path / "short.csv"
    path.write_text("prompt,answer\r\n1+1=,2\r\n2+2=\r\n")
    assert refusal(path) == f"config error: data.source = '{path}': row 2 has fewer fields than the header's 2"


def test_jsonl_lines_end_at_newlines_only_and_rows_name_their_line(tmp_path):
    """U+2028, U+0085 and a form feed are text (json.dumps(ensure_ascii=False) writes them raw); \\r and \\r\\n
    end lines as \\n does. A row refused after a blank line names the line a parse error would."""
    rows = [{"prompt": "a\u2028b", "answer": "1"}, {"prompt": "c\u0085d\fe", "answer": "2"}]
    path = tmp_path / "raw.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert rows_of(path) == rows
    path.write_text(json.dumps(GOOD_ROW) + "\r" + json.dumps(GOOD_ROW) + "\r")
    assert rows_of(path) == [GOOD_ROW, GOOD_ROW]
    path.write_text(json.dumps(GOOD_ROW) + "\n\f\n\n" + json.dumps({"prompt": 5, "answer": "1"}) + "\n")
    assert refusal(path) == (
        f"config error: data.source = '{path}': row 2 (line 4), column 'prompt' holds a number; allowed: text or a "
        "list of chat messages"
    )
    path.write_text(json.dumps(GOOD_ROW) + "\n\f\n\n{\n")
    assert refusal(path) == (
        f"config error: data.source = '{path}': line 4 is not valid JSON (Expecting property name enclosed in double "
        "quotes)"
    )


def test_a_source_that_is_not_a_regular_file_says_what_it_is(tmp_path):
    import os

    allowed = (
        "allowed: builtin:arith, a .jsonl/.json/.csv/.parquet file, or a Hugging Face dataset id like 'openai/gsm8k'"
    )
    os.mkfifo(tmp_path / "fifo.jsonl")  # opening it would block until a writer came
    (tmp_path / "dir.jsonl").mkdir()
    (tmp_path / "zero.jsonl").symlink_to("/dev/zero")
    for name, kind in [
        ("fifo.jsonl", "a FIFO"),
        ("dir.jsonl", "a folder"),
        ("zero.jsonl", "a link to a device"),
        ("gone.jsonl", None),
    ]:
        why = f"not a regular file ({kind})" if kind else "file not found"
        assert refusal(tmp_path / name) == f"config error: data.source = '{tmp_path / name}': {why}; {allowed}"
    with pytest.raises(UserError) as err:
        rows_of(Path("/dev/zero"))
    assert str(err.value) == f"config error: data.source = '/dev/zero': not a regular file (a device); {allowed}"
    os.mkfifo(tmp_path / "m.gguf")
    with pytest.raises(UserError) as err:
        policy_loader.resolve_model_path(str(tmp_path / "m.gguf"))
    assert str(err.value) == f"config error: model.name = '{tmp_path}/m.gguf': not a regular file (a FIFO)"


# ---- a model config with a number outside its field's domain ----------------------------------------------------


@pytest.mark.parametrize(
    "text, field, shown, allowed",
    [
        ('"rms_norm_eps": -1.0', "rms_norm_eps", "-1.0", "a number > 0"),
        ('"rms_norm_eps": 0', "rms_norm_eps", "0", "a number > 0"),
        ('"rms_norm_eps": true', "rms_norm_eps", "true", "a number > 0"),
        ('"rms_norm_eps": "NaN"', "rms_norm_eps", '"NaN"', "a number > 0"),
        ('"rms_norm_eps": null', "rms_norm_eps", "null", "a number > 0"),
        ('"rms_norm_eps": 1e-06, "rope_theta": ' + "1" * 400, "rope_theta", "an integer of 400 digits", "a number > 0"),
        ('"rms_norm_eps": 1e-06, "num_hidden_layers": 0', "num_hidden_layers", "0", "an integer from 1 to 2147483647"),
        ('"rms_norm_eps": 1e-06, "text_config": {"hidden_size": 2.5}', "text_config.hidden_size", "2.5", "an integer"),
        ('"rms_norm_eps": 1e-06, "attention_dropout": 1.5', "attention_dropout", "1.5", "a number from 0 to 1"),
    ],
)
def test_a_config_field_outside_its_domain_is_refused_before_loading(tmp_path, text, field, shown, allowed):
    """rms_norm_eps = -1 trained to NaN every step and finished; a 400-digit rope_theta was torch's OverflowError
    naming no field; true, "NaN" and 0 were transformers' "Validation error for field 'rms_norm_eps':"."""
    folder = nan_model(tmp_path / "m", text)
    with pytest.raises(UserError) as err:
        policy_loader.resolve_model_path(str(folder))
    assert str(err.value).startswith(
        f"config error: model.name = '{folder}': {folder}/config.json sets {field} = {shown}; allowed: {allowed}"
    )
    with pytest.raises(UserError) as err:
        model_card.load(str(folder))
    assert str(err.value).startswith(f"vram error: model.name = '{folder}': {folder}/config.json sets {field} = ")


def test_null_where_transformers_derives_the_value_and_the_bundled_configs_pass(tmp_path):
    model_card.check_model_folder(nan_model(tmp_path / "m", '"rms_norm_eps": 1e-06, "head_dim": null'), "m")
    assert (
        model_card.out_of_domain(json.loads((bundled.bundled_model("tiny-arith") / "config.json").read_text())) is None
    )


def test_train_with_rms_norm_eps_negative_exits_2_and_leaves_no_run(tmp_path):
    folder = nan_model(tmp_path / "m", '"rms_norm_eps": -1.0')
    run = tmp_path / "run"
    proc = run_cli("train", "tiny-arith", "--set", f"model.name={folder}", "--run-dir", str(run), cwd=tmp_path)
    one_line_refusal(
        proc,
        f"config error: model.name = '{folder}': {folder}/config.json sets rms_norm_eps = -1.0; allowed: a number > 0",
        run,
    )


def test_a_config_transformers_refuses_says_why_past_its_colon(tmp_path):
    """transformers' "Validation error for field 'x':" puts the reason on its next line."""
    folder = nan_model(tmp_path / "m", '"rms_norm_eps": 1e-06')
    config = folder / "config.json"
    config.write_text(config.read_text().replace('"max_window_layers": 28', '"max_window_layers": "x"'))
    with pytest.raises(UserError) as err:
        policy_loader.load_base(str(folder), torch.float32)
    assert str(err.value) == (
        f"config error: model.name = '{folder}': could not load (StrictDataclassFieldValidationError: Validation "
        "error for field 'max_window_layers': TypeError: Field 'max_window_layers' expected int, got str (value: "
        "'x'))"
    )
