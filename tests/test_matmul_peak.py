"""engine/train/flops.py's matmul peak: measured on torch.mm and F.linear, cached per machine with the conditions
it was measured under, and measured again once when a step beats it (hand numbers, a fake measurement)."""

from __future__ import annotations

import json

import pytest
import torch

from grpo_studio.engine.train import flops

GFLOP = 1e9


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_STUDIO_CACHE", str(tmp_path))
    monkeypatch.setattr(flops.os, "getloadavg", lambda: (0.5, 0.5, 0.5))  # an idle machine
    monkeypatch.setitem(flops.SIZES, "cpu", (32, 64))  # quick
    return tmp_path / "matmul_peak.json"


def fake_measurement(monkeypatch, *rates: float) -> list[float]:
    """measure_peak returns `rates` in turn (FLOP/s); more calls fail the test."""
    left = list(rates)
    monkeypatch.setattr(flops, "measure_peak", lambda device, dtype: left.pop(0))
    return left


def test_the_peak_is_measured_on_both_kernels_and_cached_with_its_conditions(cache, monkeypatch):
    ops = []
    monkeypatch.setattr(flops.torch, "mm", lambda a, b, _mm=torch.mm: ops.append("mm") or _mm(a, b))
    monkeypatch.setattr(flops.F, "linear", lambda a, b, _lin=flops.F.linear: ops.append("linear") or _lin(a, b))
    first = flops.matmul_peak("cpu", torch.float32)
    assert first > 0 and {"mm", "linear"} <= set(ops)
    [entry] = json.loads(cache.read_text()).values()
    assert entry["flop_s"] == first and entry["dtype"] == "float32" and entry["device"] == "cpu"
    assert entry["torch"] == torch.__version__ and entry["threads"] == torch.get_num_threads()
    assert entry["trials"] == flops.TRIALS and entry["sizes"] == [32, 64] and entry["date"][:2] == "20"
    assert entry["load_1min"] == 0.5
    fake_measurement(monkeypatch)  # cached: no measurement
    assert flops.matmul_peak("cpu", torch.float32) == first
    fake_measurement(monkeypatch, 3 * GFLOP)
    assert flops.matmul_peak("cpu", torch.bfloat16) == 3 * GFLOP  # another dtype: its own entry
    assert len(json.loads(cache.read_text())) == 2


def test_a_fresh_measurement_keeps_the_best(cache, monkeypatch):
    fake_measurement(monkeypatch, 5 * GFLOP, 2 * GFLOP, 9 * GFLOP)
    assert flops.matmul_peak("cpu", torch.float16) == 5 * GFLOP
    assert flops.matmul_peak("cpu", torch.float16, fresh=True) == 5 * GFLOP  # measured lower: the best stays
    assert flops.matmul_peak("cpu", torch.float16, fresh=True) == 9 * GFLOP
    assert flops.matmul_peak("cpu", torch.float16) == 9 * GFLOP


def test_a_stale_low_peak_is_measured_again_and_mfu_uses_the_new_one(cache, monkeypatch):
    """A cached fp16 peak of 0.75 GFLOP/s (the old torch.mm-only figure); a step of 60 GFLOP in 2 s (30 GFLOP/s)
    would read MFU 4000%: the peak is measured again (50 GFLOP/s) and MFU = 60e9 / 2 / 50e9 = 0.6."""
    fake_measurement(monkeypatch, 0.75 * GFLOP, 50 * GFLOP)
    events = []
    peak = flops.Peak("cpu", torch.float16, lambda kind, message, **extra: events.append((kind, message, extra)))
    assert peak.flop_s == 0.75 * GFLOP
    assert peak.mfu(60 * GFLOP / 2.0, step=3) == pytest.approx(0.6)
    assert peak.flop_s == 50 * GFLOP
    assert [(kind, extra) for kind, _, extra in events] == [("info", {"step": 3})]
    assert "0.75 → 50 GFLOP/s" in events[0][1]
    assert json.loads(cache.read_text()).popitem()[1]["flop_s"] == 50 * GFLOP  # the cache holds the new peak
    assert peak.mfu(40 * GFLOP, step=4) == pytest.approx(0.8) and len(events) == 1


def test_a_step_above_the_re_measured_peak_is_reported_as_it_is_and_flagged_once(cache, monkeypatch):
    fake_measurement(monkeypatch, 10 * GFLOP, 20 * GFLOP)  # no third measurement: re-measured once per run
    events = []
    peak = flops.Peak("cpu", torch.float32, lambda kind, message, **extra: events.append((kind, message)))
    assert peak.mfu(30 * GFLOP, step=1) == pytest.approx(1.5)  # 30 / 20, not capped
    assert peak.mfu(25 * GFLOP, step=2) == pytest.approx(1.25)
    assert [kind for kind, _ in events] == ["info", "warning"]
    assert events[1][1].startswith("MFU above the measured peak: peak stale")


def test_a_cpu_peak_measured_on_busy_cpus_is_used_not_cached(cache, monkeypatch):
    monkeypatch.setattr(flops.os, "getloadavg", lambda: (float(flops.os.cpu_count()), 0.0, 0.0))
    fake_measurement(monkeypatch, 0.2 * GFLOP, 60 * GFLOP)
    assert flops.matmul_peak("cpu", torch.float32) == 0.2 * GFLOP
    assert not cache.exists()
    assert flops.matmul_peak("cpu", torch.float32) == 60 * GFLOP  # measured again: nothing was cached
