"""LossScaler and clip_grad_norm at their edges: argument checks, defaults, the exact state it saves and
restores, unscaling at small scales, and clipping compared with torch.nn.utils.clip_grad_norm_."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_studio.engine.precision.numerics import LossScaler, clip_grad_norm


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(growth_factor=1.0), "growth_factor = 1.0: must be > 1"),
        (dict(backoff_factor=0.0), "backoff_factor = 0.0: must be in (0, 1)"),
        (dict(backoff_factor=1.0), "backoff_factor = 1.0: must be in (0, 1)"),
        (dict(backoff_factor=1.5), "backoff_factor = 1.5: must be in (0, 1)"),
        (dict(growth_interval=0), "growth_interval = 0: must be >= 1"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError) as err:
        LossScaler(**kwargs)
    assert str(err.value) == message


def test_arguments_at_their_limits_are_accepted():
    s = LossScaler(growth_factor=1.0001, backoff_factor=0.999, growth_interval=1)
    s.update(False)  # interval 1: every finite step grows
    assert s.get_scale() == 2.0**16 * 1.0001


def test_defaults_and_the_saved_state_are_exactly_these():
    assert LossScaler().state_dict() == {
        "scale": 65536.0,
        "growth_tracker": 0,
        "skipped_steps": 0,
        "init_scale": 65536.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 2000,
        "min_scale": 1.0,
        "enabled": True,
    }
    assert LossScaler(min_scale=4.0).state_dict()["min_scale"] == 4.0
    off = LossScaler(init_scale=1024.0, min_scale=4.0, enabled=False)  # disabled: scale and floor are 1
    assert (off.get_scale(), off.min_scale, off.state_dict()["enabled"]) == (1.0, 1.0, False)


def test_load_state_dict_restores_every_setting():
    source = LossScaler(init_scale=512.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=7, min_scale=8.0)
    source.update(True)
    source.update(False)
    target = LossScaler()
    target.load_state_dict(source.state_dict())
    assert (
        target.state_dict()
        == source.state_dict()
        == {
            "scale": 128.0,
            "growth_tracker": 1,
            "skipped_steps": 1,
            "init_scale": 512.0,
            "growth_factor": 4.0,
            "backoff_factor": 0.25,
            "growth_interval": 7,
            "min_scale": 8.0,
            "enabled": True,
        }
    )
    off = LossScaler(enabled=False)
    off.load_state_dict(source.state_dict())
    assert off.enabled is True
    on = LossScaler()
    on.load_state_dict(LossScaler(enabled=False).state_dict())
    assert on.enabled is False
    legacy = {k: v for k, v in source.state_dict().items() if k in ("scale", "growth_tracker", "skipped_steps")}
    kept = LossScaler(enabled=False)
    kept.load_state_dict(legacy)  # an older checkpoint without the settings keeps the scaler's own
    assert kept.enabled is False and kept.growth_factor == 2.0 and kept.get_scale() == 128.0


def test_unscale_at_a_scale_of_two():
    s = LossScaler(init_scale=2.0)
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.tensor([4.0, -1.0])
    assert s.unscale_and_check([p]) and p.grad.tolist() == [2.0, -0.5]


def _param(values):
    p = torch.nn.Parameter(torch.zeros(len(values)))
    p.grad = torch.tensor(values)
    return p


def test_clip_grad_norm_matches_torch():
    """Same pre-clip norm and clipped grads as torch (coefficient max_norm / (norm + 1e-6)); a small norm
    (0.005) makes the 1e-6 visible. Ours sums in float64, so agreement is to float32 rounding."""
    for values, max_norm in (([3.0, 4.0], 1.0), ([30.0, -40.0, 1.0], 2.5), ([0.1, 0.2], 1.0), ([0.003, 0.004], 0.001)):
        ours, theirs = _param(values), _param(values)
        norm = clip_grad_norm([ours], max_norm)
        ref = torch.nn.utils.clip_grad_norm_([theirs], max_norm)
        assert norm == pytest.approx(float(ref), rel=1e-6)
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-6, atol=0)


def test_clip_grad_norm_at_exactly_the_limit_and_without_grads():
    p = _param([1.0])
    assert clip_grad_norm([p], 1.0) == 1.0 and p.grad.tolist() == [1.0]  # not above the limit: untouched
    assert clip_grad_norm([torch.nn.Parameter(torch.zeros(2))], 1.0) == 0.0  # no grads at all
    q = _param([3.0, 4.0])
    assert clip_grad_norm([q], 0.0) == 5.0 and q.grad.tolist() == [3.0, 4.0]  # 0 = measure only
    r = _param([math.inf, 1.0])
    assert clip_grad_norm([r], 1.0) == math.inf and r.grad.tolist() == [math.inf, 1.0]
