"""`grpo-studio bench logprobs`: the report's shape, the chunked path's values and gradients equal to the
materialised one (oracle: the materialised path, autograd of log_softmax), its peak memory measured below the
materialised one's, and its flags refused in one line."""

from __future__ import annotations

import json

import pytest

from grpo_studio.cli.main import main

SMALL = ["--tokens", "256", "--vocab", "32768", "--hidden", "32", "--chunk", "8", "--repeats", "1", "--device", "cpu"]


@pytest.fixture(scope="module")
def report() -> dict:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["bench", "logprobs", "--json", *SMALL]) == 0
    return json.loads(out.getvalue())


def test_report_has_both_paths_for_both_heads(report):
    assert report["logits_mib"] == 32.0  # 256 × 32768 fp32
    assert list(report["heads"]) == ["frozen", "trained"]
    for rows in report["heads"].values():
        assert list(rows) == ["materialised", "chunked"]  # no Triton row without CUDA
        assert rows["materialised"]["peak_ratio"] == 1.0 and rows["materialised"]["time_ratio"] == 1.0
        assert all(r["seconds"] > 0 for r in rows.values())


@pytest.mark.parametrize("head", ["frozen", "trained"])
def test_chunked_equals_materialised_and_peaks_lower(report, head):
    chunked = report["heads"][head]["chunked"]
    keys = {"max_abs_logps", "max_abs_entropy", "max_abs_grad_hidden"} | (
        {"max_abs_grad_weight"} if head == "trained" else set()
    )
    assert keys <= chunked.keys() and ("max_abs_grad_weight" in chunked) == (head == "trained")
    for key in keys:
        assert chunked[key] < 1e-5, (key, chunked)
    # the materialised path holds [N, V] logits, their log-softmax and their gradient (≥ 2 × 32 MiB at once);
    # the chunked one [8, V] buffers (1 MiB each)
    assert report["heads"][head]["materialised"]["peak_mib"] >= 64
    assert chunked["peak_ratio"] < 0.5, report["heads"][head]


@pytest.mark.parametrize(
    "argv, line",
    [
        (["--tokens", "0"], "bench error: --tokens = 0: must be >= 1"),
        (["--chunk", "-3"], "bench error: --chunk = -3: must be >= 1"),
        (["--temperature", "0"], "bench error: --temperature = 0.0: must be > 0"),
        (["--device", "cuda"], "bench error: --device = 'cuda': no CUDA device here; use cpu or auto"),
    ],
)
def test_bad_flags_are_refused_in_one_line(argv, line, capsys):
    assert main(["bench", "logprobs", *argv]) == 2
    assert capsys.readouterr().err == line + "\n"
