"""The weight-sync tests' shared setup: a trainer policy, one fixed sequence, its per-token π, and one real
AdamW step that raises its likelihood (after which a sampler given the new weights must follow the new π)."""

from __future__ import annotations

import torch

from grpo_studio.contract.precision_plan import resolve
from grpo_studio.engine.model import policy_loader
from grpo_studio.engine.train.logprobs import token_logprobs

SEQUENCE = "12+3=<answer>15</answer>"


class PolicyStep:
    def __init__(self, cfg, model_path: str, tok):
        self.cfg = cfg
        self.policy = policy_loader.load_policy(cfg, model_path, resolve(cfg))
        self.seq = tok.encode(SEQUENCE, add_special_tokens=False) + [tok.eos_token_id]
        self.x = torch.tensor([self.seq])

    def _logps(self) -> torch.Tensor:
        with policy_loader.autocast(resolve(self.cfg)):
            return token_logprobs(self.policy, self.x, torch.ones_like(self.x), len(self.seq) - 1, 1.0)[0]

    def pi(self) -> torch.Tensor:
        """The trainer's per-token log-probs of the sequence (temperature 1)."""
        with torch.no_grad():
            return self._logps()[0].float()

    def adamw_step(self, lr: float = 2e-2) -> None:
        """One AdamW step on −mean log π of the sequence."""
        params = [p for p in self.policy.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=lr)
        (-self._logps().mean()).backward()
        opt.step()
