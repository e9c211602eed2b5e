"""Numerics between the sampler and the trainer: how a step computes, and how far the two drift apart.

numerics       torch dtypes, the FP16 dynamic loss scaler, gradient clipping
fp8            FP8 (e4m3) linear layers, shared by the rollout and the trainer
mismatch       rollout/train mismatch telemetry from (μ, π, mask)

May import: contract.
"""
