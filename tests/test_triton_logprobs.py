"""The Triton log-prob path (engine/train/logprobs.py `triton_logps`: TRL's `trl.kernels` ChunkedLogProbFunction)
against the PyTorch one (ChunkedLogSoftmax): values, entropies and the gradients of hidden states and
lm_head, under Triton's CPU interpreter (TRITON_INTERPRET=1, set before triton imports, so in a
subprocess). The kernels run for real: TRL's torch fallbacks for non-CUDA devices are made to raise.
Oracle: the PyTorch path, itself checked against autograd of the formula in tests/test_logprobs.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CASES = {  # name -> (scale, softcap, temperature)
    "plain": (1.0, None, 1.0),
    "temperature": (1.0, None, 0.7),
    "scaled-and-softcapped": (0.5, 2.0, 0.8),
}

CHILD = r"""
import json, sys
import torch
from trl.kernels import chunked_logprob

def refuse(*a, **k):
    raise AssertionError("TRL fell back to torch: the Triton kernel did not run")

chunked_logprob._use_triton = lambda device: True
chunked_logprob._forward_tile = chunked_logprob._backward_tile = refuse
from grpo_studio.engine.train.logprobs import fused_logps, triton_logps

out = {}
for name, (scale, softcap, tau) in json.loads(sys.argv[1]).items():
    g = torch.Generator().manual_seed(len(name))
    h, w = torch.randn(7, 5, generator=g), torch.randn(37, 5, generator=g)  # 3-token chunks: ragged vocab tiles
    y, upstream = torch.randint(0, 37, (7,), generator=g), torch.randn(7, generator=g)
    results = []
    for path in (fused_logps, triton_logps):
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        logps, entropy = path(hh, ww, y, tau, 3, scale, softcap)
        (logps * upstream).sum().backward()
        results.append((logps.detach(), entropy, hh.grad, ww.grad))
    out[name] = {k: (a - b).abs().max().item() for k, a, b in zip(("logps", "entropy", "grad_hidden", "grad_weight"),
                                                                   *results)}
    out[name]["logps_scale"] = results[0][0].abs().max().item()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def differences() -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(CASES)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", list(CASES))
def test_triton_kernel_matches_pytorch_path(differences, case):
    d = differences[case]
    assert d["logps_scale"] > 1.0  # non-trivial log-probs (V = 37: ≈ −log 37 on average)
    for key in ("logps", "entropy", "grad_hidden", "grad_weight"):
        assert d[key] < 1e-5, (case, key, d)
