"""Precision policy: the dtype table, the PrecisionPlan (FP8 flow, effective precisions, the mismatch
warning), the FP16 loss scaler."""

import math

import pytest
import torch

from grpo_studio.contract import config as C
from grpo_studio.contract.dtypes import DTYPES
from grpo_studio.contract.errors import UserError
from grpo_studio.contract.precision_plan import fp8_sides, plan, resolve
from grpo_studio.engine.precision.numerics import LossScaler, clip_grad_norm, torch_dtype


def test_dtypes():
    assert {n: torch_dtype(n) for n in DTYPES} == {
        "fp32": torch.float32,
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "fp8": torch.bfloat16,
    }
    assert C.DTYPES == ["fp32", "bf16", "fp16", "fp8"]
    assert {n: (d.train_bytes, d.rollout_bytes, d.mantissa_bits) for n, d in DTYPES.items()} == {
        "fp32": (4, 4, 23),
        "bf16": (2, 2, 7),
        "fp16": (2, 2, 10),
        "fp8": (2, 1, 3),
    }
    for d in DTYPES.values():  # the byte counts are the stored torch dtype's (fp8: its bf16 master weights)
        assert d.train_bytes == torch.empty(0, dtype=getattr(torch, d.torch)).element_size()
    assert [n for n, d in DTYPES.items() if d.loss_scaling] == ["fp16"]
    assert {n: d.ab_partner for n, d in DTYPES.items()} == {
        "fp32": "bf16",
        "bf16": "fp16",
        "fp16": "bf16",
        "fp8": "bf16",
    }


def cfg(model, rollout="", flow="auto"):
    c = C.Config()
    C.set_key(c, "model.dtype", model)
    C.set_key(c, "rollout.dtype", rollout)
    C.set_key(c, "precision.fp8_flow", flow)
    return c


@pytest.mark.parametrize(
    "model, rollout, flow, sides, name",
    [
        ("bf16", "", "auto", (False, False), None),
        ("fp16", "fp16", "auto", (False, False), None),
        ("fp8", "", "auto", (True, True), "unified"),  # rollout.dtype defaults to model.dtype
        ("bf16", "fp8", "auto", (False, True), "rollout_only"),  # the common BF16-train + FP8-rollout recipe
        ("bf16", "fp8", "unified", (True, True), "unified"),  # explicit flow wins
        ("fp8", "fp8", "rollout_only", (False, True), "rollout_only"),
        ("fp8", "bf16", "auto", (True, False), None),  # trainer-only fp8: not a flow
        ("bf16", "bf16", "unified", (False, False), None),  # no fp8 anywhere: the flow is moot
    ],
)
def test_fp8_flow_resolution(model, rollout, flow, sides, name):
    assert fp8_sides(model, rollout, flow) == sides
    p = resolve(cfg(model, rollout, flow))
    assert (p.train_fp8, p.rollout_fp8, p.flow) == (*sides, name)


def test_default_config_flow_is_auto_and_bad_flow_is_one_line():
    assert C.Config().precision.fp8_flow == "auto"
    with pytest.raises(UserError) as err:
        C.set_key(C.Config(), "precision.fp8_flow", "unify", from_text=True)
    assert "\n" not in str(err.value) and "unified" in str(err.value)


def test_effective_precisions():
    p = plan("fp8", "", "rollout_only")
    assert (p.train_compute, p.rollout_compute, p.rollout_dtype) == ("bf16", "fp8", "fp8")
    p = plan("fp32", "bf16")
    assert (p.train_compute, p.rollout_compute) == ("fp32", "bf16")
    assert [plan(d, "").loss_scaling for d in ("fp32", "bf16", "fp16", "fp8")] == [False, False, True, False]


@pytest.mark.parametrize(
    "model, rollout, flow",
    [
        ("fp32", "", "auto"),
        ("bf16", "bf16", "auto"),
        ("fp16", "fp16", "unified"),
        ("fp8", "", "auto"),
        ("fp8", "fp8", "unified"),
        ("bf16", "fp8", "unified"),
    ],
)
def test_no_warning_when_numerics_match(model, rollout, flow):
    assert plan(model, rollout, flow).warning is None


def test_warning_texts():
    w = plan("fp32", "bf16", "auto").warning
    assert w.startswith("precision warning: rollout runs in bf16 but the trainer in fp32: expect bf16-level")
    assert "set rollout.dtype = model.dtype" in w and "\n" not in w
    w = plan("fp16", "bf16", "auto").warning
    assert "rollout runs in bf16 but the trainer in fp16" in w and "bf16-level" in w
    w = plan("fp32", "fp16", "auto").warning
    assert "rollout runs in fp16 but the trainer in fp32: expect fp16-level" in w
    w = plan("bf16", "fp8", "auto").warning
    assert "rollout runs in fp8 but the trainer in bf16" in w and "precision.fp8_flow = 'unified'" in w
    assert "Jet-RL" in w
    assert plan("fp8", "fp8", "rollout_only").warning == w  # the same effective pair
    w = plan("fp8", "bf16", "auto").warning
    assert "rollout runs in bf16 but the trainer in fp8" in w and "rollout.dtype = 'fp8'" in w


# ---------------------------------------------------------------- LossScaler


def test_scale_and_unscale_are_exact_for_power_of_two_scales():
    s = LossScaler(init_scale=2.0**10)
    assert float(s.scale(torch.tensor(3.0))) == 3072.0
    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.float16))
    p.grad = torch.tensor([1024.0, -3.0, 2.0**-4], dtype=torch.float16)
    assert s.unscale_and_check([p]) is True
    assert p.grad.tolist() == [1.0, -3.0 / 1024, 2.0**-14]
    assert p.grad.dtype == torch.float16


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -float("inf")])
def test_non_finite_grads_are_detected_and_left_alone(bad):
    s = LossScaler(init_scale=4.0)
    a = torch.nn.Parameter(torch.zeros(2))
    b = torch.nn.Parameter(torch.zeros(2))
    a.grad = torch.tensor([4.0, 8.0])
    b.grad = torch.tensor([bad, 1.0])
    assert s.unscale_and_check([a, b]) is False
    assert a.grad.tolist() == [4.0, 8.0]  # not unscaled: the step is skipped anyway


def test_update_backoff_growth_and_counters():
    s = LossScaler(init_scale=1024.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    s.update(False)
    s.update(False)
    assert s.get_scale() == 1024.0
    s.update(False)  # third consecutive finite step → grow
    assert s.get_scale() == 2048.0
    s.update(False)
    s.update(False)
    s.update(True)  # overflow: shrink, reset the growth counter, count the skip
    assert s.get_scale() == 1024.0 and s.skipped_steps == 1
    s.update(False)
    s.update(False)
    assert s.get_scale() == 1024.0  # counter restarted after the overflow
    s.update(False)
    assert s.get_scale() == 2048.0
    assert s.metrics() == {"precision/loss_scale": 2048.0, "precision/skipped_steps": 1.0}


def test_scale_never_drops_below_min_scale():
    s = LossScaler(init_scale=4.0, backoff_factor=0.5, min_scale=1.0)
    for _ in range(5):
        s.update(True)
    assert s.get_scale() == 1.0 and s.skipped_steps == 5


def test_disabled_scaler_is_identity_but_still_counts_nan_steps():
    s = LossScaler(init_scale=2.0**16, enabled=False)
    loss = torch.tensor(2.0)
    assert s.scale(loss) is loss
    p = torch.nn.Parameter(torch.zeros(1))
    p.grad = torch.tensor([3.0])
    assert s.unscale_and_check([p]) and p.grad.item() == 3.0
    for _ in range(3):
        s.update(False)
    s.update(True)
    assert s.get_scale() == 1.0 and s.skipped_steps == 1


def test_state_dict_round_trip():
    s = LossScaler(init_scale=256.0, growth_interval=5)
    s.update(True)
    s.update(False)
    s.update(False)
    t = LossScaler()
    t.load_state_dict(s.state_dict())
    assert t.state_dict() == s.state_dict()
    for x in (t, s):
        for _ in range(3):
            x.update(False)
    assert t.get_scale() == s.get_scale() == 256.0  # 128 after backoff, grown after 5 finite steps


def test_from_config():
    c = cfg("fp16")
    C.set_key(c, "precision.loss_scale_init", 1024.0)
    C.set_key(c, "precision.loss_scale_growth_interval", 7)
    s = LossScaler.from_config(c, resolve(c))
    assert s.enabled and s.get_scale() == 1024.0 and s.growth_interval == 7
    assert not LossScaler.from_config(cfg("bf16"), resolve(cfg("bf16"))).enabled


def test_scaling_rescues_gradients_that_underflow_in_fp16():
    # fp32 master weight, fp16 compute; dL/dh = 1e-9 is below fp16's smallest subnormal (6e-8).
    def grad_with(scaler):
        w = torch.nn.Parameter(torch.ones(4))
        h = w.half()
        loss = h.float().sum() * 1e-9
        scaler.scale(loss).backward()
        assert scaler.unscale_and_check([w])
        return w.grad

    assert grad_with(LossScaler(enabled=False)).tolist() == [0.0] * 4  # flushed to zero
    g = grad_with(LossScaler(init_scale=2.0**16))
    # 2^16·1e-9 = 6.55e-5 survives in fp16 up to its rounding (rel. error ≤ 2^-11)
    assert g.tolist() == pytest.approx([1e-9] * 4, rel=2.0**-11)


def test_step_skips_on_fp16_overflow_then_recovers():
    # dL/dh = scale · 1 = 65536 overflows fp16 (max 65504): the first step is skipped and the
    # scale halves; at 32768 the step goes through with the exact unscaled gradient.
    w = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([w], lr=0.1)
    s = LossScaler(init_scale=2.0**16, growth_interval=100)
    results = []
    for _ in range(2):
        opt.zero_grad()
        s.scale(w.half().float().sum()).backward()
        results.append(s.step(opt, [w], max_norm=None))
    assert results[0] == (False, math.inf)
    assert w.grad is not None and w.grad.tolist() == [1.0] * 4
    assert results[1] == (True, 2.0)  # ‖(1,1,1,1)‖ = 2
    assert w.detach().tolist() == pytest.approx([0.9] * 4)  # one SGD step, not two (0.8 if both)
    assert s.skipped_steps == 1 and s.get_scale() == 2.0**15


def test_clip_after_unscale_uses_the_true_norm():
    # grads scaled by 2^8: clipping before unscaling would see norm 5·256; after, it sees 5.
    p = torch.nn.Parameter(torch.zeros(2))
    s = LossScaler(init_scale=256.0)
    p.grad = torch.tensor([3.0, 4.0]) * 256
    opt = torch.optim.SGD([p], lr=1.0)
    ok, norm = s.step(opt, [p], max_norm=1.0)
    assert ok and norm == pytest.approx(5.0)
    assert p.grad.tolist() == pytest.approx([0.6, 0.8], rel=1e-5)  # clipped to norm 1
    assert p.detach().tolist() == pytest.approx([-0.6, -0.8], rel=1e-5)


def test_clip_grad_norm_in_fp32_does_not_overflow_fp16():
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float16))
    p.grad = torch.full((4,), 60000.0, dtype=torch.float16)  # norm 120000 > fp16 max
    norm = clip_grad_norm([p], max_norm=1.0)
    assert norm == pytest.approx(120000.0)
    assert p.grad.float().tolist() == pytest.approx([0.5] * 4, rel=1e-3)
