"""Mixture-of-experts routers: which experts each token went to, and the sampler's choices replayed in training.

In an MoE model the sampler and the trainer can send the same token to different experts (a bf16 sampler's
router logits round differently), and then no precision fix closes the gap. Rollout routing replay (R3, Ma et
al. 2025, "Stabilizing MoE Reinforcement Learning by Aligning Training and Inference Routers"): the training
forward uses the sampler's experts in place of its own top-k, with the gate weights still computed from the
trainer's router logits, so the router keeps its gradient.

Everything works on forward hooks on the routers (transformers' `*TopKRouter`, which return (logits, gate
weights, expert indices) for the block's flattened B·S rows; the experts only ever see the last two). Routes
are expert indices [rows, positions, MoE layers, k]; -1 marks a position with none (padding, or a token the
sampler never fed): there the router keeps its own top-k and nothing is compared.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ...contract.errors import UserError
from ...contract.metrics import ROUTER_DISAGREE
from ..precision.mismatch import router_lag_counts, router_lag_metrics

# model_type -> its router class; both compute gate weights as softmax over all experts, gathered, and
# renormalised over the k when norm_topk_prob (transformers' Qwen3MoeTopKRouter, OlmoeTopKRouter)
ROUTERS = {"qwen3_moe": "Qwen3MoeTopKRouter", "olmoe": "OlmoeTopKRouter"}
EXPERT_COUNT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def is_moe(config) -> bool:
    """Whether a transformers config describes a mixture-of-experts model (it names a count of experts)."""
    return any((getattr(config, f, 0) or 0) > 0 for f in EXPERT_COUNT_FIELDS)


def check_routers(config, key: str, value) -> None:
    """Refuse, in one line naming `key`, a model whose routers this module cannot hook: a dense model, or an
    MoE family other than ROUTERS."""
    model_type = getattr(config, "model_type", "")
    if not is_moe(config):
        raise UserError(
            f"replaying a mixture-of-experts model's routing, and model_type {model_type!r} has no experts; "
            "use it with an MoE model (qwen3_moe, olmoe) or set it to 'off'",
            key=key,
            value=value,
        )
    if model_type not in ROUTERS:
        raise UserError(
            f"the routers of MoE model_type {model_type!r} are not supported "
            f"(supported: {', '.join(ROUTERS)}); set it to 'off'",
            key=key,
            value=value,
        )


def routers(model) -> list[torch.nn.Module]:
    """The model's routers in layer order (inside a peft wrapper too); [] for a dense model."""
    names = set(ROUTERS.values())
    return [m for m in model.modules() if type(m).__name__ in names]


def replayed_scores(router, logits: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """The gate weights [N, k] of `experts` [N, k] from the router's own logits [N, E]: R3's weights, a
    differentiable function of the trainer's router (the same formula as the router's forward, on given
    indices in place of its top-k)."""
    weights = torch.softmax(logits, dim=-1, dtype=torch.float).gather(-1, experts)
    if router.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype)


class RouteRecorder:
    """Forward hooks recording each router call's expert indices, for a sampler's generate: `clear()` before
    it, `routes(...)` after. A call is one model forward: the prompt cache's, generate's prefill, then one per
    decoded token."""

    def __init__(self, model):
        self.calls: list[list[torch.Tensor]] = []  # calls[c][layer]: [N, k]
        self._hooks = [r.register_forward_hook(self._hook(i)) for i, r in enumerate(routers(model))]

    def _hook(self, layer: int):
        def hook(module, args, out):
            if layer == 0:
                self.calls.append([])
            self.calls[-1].append(out[2].detach())

        return hook

    def clear(self) -> None:
        self.calls = []

    def routes(self, n: int, cached: bool, attention: torch.Tensor, mask: torch.Tensor) -> Routes:
        """The Routes of a generate over B rows of left-padded prompts `attention` [B, W] and completions
        `mask` [B, T]; `cached`: its first call was the distinct prompts' cache (B / n rows, repeated n times
        after). The last sampled token is never fed: -1 there, as at padding."""
        rows = attention.shape[0]
        parts = []
        for c, layers in enumerate(self.calls):
            stacked = torch.stack(layers, dim=1)  # [N, L, k]
            part = stacked.view(rows // n if cached and c == 0 else rows, -1, *stacked.shape[1:]).cpu()
            parts.append(part.repeat_interleave(n, 0) if cached and c == 0 else part)
        fed = torch.cat(parts, 1)
        width = attention.shape[1]
        prompt = fed[:, :width].masked_fill(~attention.bool().cpu()[..., None, None], -1)
        completion = _pad_right(fed[:, width:], mask.shape[1]).masked_fill(~mask.bool().cpu()[..., None, None], -1)
        return Routes(prompt, completion)

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()


@dataclass
class Routes:
    """The sampler's experts for a rollout's rows: the prompts right-aligned (left padding is -1), the
    completions from their first column. Slicing by prompt width from the right and completion width from the
    left gives the routes of any trainer layout that left-pads prompts and trims (engine/rollout/batching.py)."""

    prompt: torch.Tensor  # [B, P, L, k] long
    completion: torch.Tensor  # [B, T, L, k] long

    def layout(self, rows: torch.Tensor | None, prompt_width: int, completion_width: int) -> torch.Tensor:
        """Routes [R, prompt_width + completion_width, L, k] of `rows` (None: all) in the trainer's layout."""
        prompt, completion = self.prompt, self.completion
        if rows is not None:
            prompt, completion = prompt[rows.cpu()], completion[rows.cpu()]
        have = prompt.shape[1]
        if have >= prompt_width:
            prompt = prompt[:, have - prompt_width :]
        else:
            prompt = torch.cat(
                [prompt.new_full((prompt.shape[0], prompt_width - have, *prompt.shape[2:]), -1), prompt], 1
            )
        return torch.cat([prompt, completion[:, :completion_width]], dim=1)

    @staticmethod
    def cat(parts: list[Routes]) -> Routes:
        """The routes of rollouts concatenated row-wise (prompts right-aligned to the widest)."""
        width = max(p.prompt.shape[1] for p in parts)
        length = max(p.completion.shape[1] for p in parts)
        return Routes(
            torch.cat([p.layout(None, width, 0) for p in parts]),
            torch.cat([_pad_right(p.completion, length) for p in parts]),
        )


def _pad_right(t: torch.Tensor, width: int) -> torch.Tensor:
    return torch.cat([t, t.new_full((t.shape[0], width - t.shape[1], *t.shape[2:]), -1)], 1)


class RouterReplay:
    """Persistent forward hooks on a policy's routers. `use(routes, lags)` sets the sampler's routes
    [B, S, L, k] of the next forwards and each position's policy lag [B, S] (those stay set, so gradient
    checkpointing's recompute in backward replays the same); with `replay` the routers' own top-k is replaced
    where a route is given (R3), else only compared. Each hooked forward counts, per layer, the tokens
    compared and those whose expert *set* differs between the sampler and what this forward used
    (`disagreement()`), and the same by policy lag (lag 0, lagged: engine/precision/mismatch.py), until
    `reset()`."""

    @staticmethod
    def for_policy(policy, mode: str) -> RouterReplay | None:
        """The hooks for algo.router_replay = `mode` on a policy: None for a model without hookable routers
        (mode off); a dense model or an unsupported MoE family with mode replay is refused in one line."""
        if mode != "off":
            check_routers(policy.config, "algo.router_replay", mode)
        return RouterReplay(policy, mode == "replay") if routers(policy) else None

    def __init__(self, model, replay: bool):
        self.replay, self.routes, self.lags, self.counting = replay, None, None, True
        self.layers = routers(model)
        self.compared = torch.zeros(len(self.layers), dtype=torch.long)
        self.differ = torch.zeros(len(self.layers), dtype=torch.long)
        self.by_lag = torch.zeros(2, 2, dtype=torch.long)  # router_lag_counts summed
        self._hooks = [r.register_forward_hook(self._hook(i)) for i, r in enumerate(self.layers)]

    def use(self, routes: torch.Tensor | None, lags: torch.Tensor | None = None) -> None:
        self.routes, self.lags = routes, lags

    def _hook(self, layer: int):
        def hook(router, args, out):
            if self.routes is None:
                return None
            logits, _, own = out
            given = self.routes[:, :, layer].reshape(-1, own.shape[-1]).to(own.device)
            if given.shape != own.shape:
                raise RuntimeError(f"router replay: routes for {given.shape[0]} tokens, the forward has {own.shape[0]}")
            has = (given >= 0).all(-1)
            used = torch.where(has.unsqueeze(-1), given, own) if self.replay else own
            if self.counting:  # gradient checkpointing's recompute counts its tokens again: the shares stay
                differ = differs(used, given)
                self.compared[layer] += int(has.sum())
                self.differ[layer] += int(differ.sum())
                if self.lags is not None:
                    self.by_lag += router_lag_counts(has, differ, self.lags.reshape(-1).to(has.device)).cpu()
            if not self.replay:
                return None
            return logits, replayed_scores(router, logits, used), used

        return hook

    def reset(self) -> None:
        self.compared.zero_()
        self.differ.zero_()
        self.by_lag.zero_()

    def metrics(self) -> dict[str, float]:
        """mismatch/router_disagree over all MoE layers, per layer and by policy lag, of the forwards since
        reset()."""
        compared = int(self.compared.sum())
        if not compared:
            return {}
        per_layer = {f"{ROUTER_DISAGREE}/layer{i}": share for i, share in enumerate(self.disagreement())}
        return {ROUTER_DISAGREE: int(self.differ.sum()) / compared, **per_layer, **router_lag_metrics(self.by_lag)}

    def disagreement(self) -> list[float]:
        """Per MoE layer: the share of compared tokens whose selected experts differ (nan where none)."""
        return [d / c if c else float("nan") for d, c in zip(self.differ.tolist(), self.compared.tolist())]

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()


def position_lags(lags: torch.Tensor, prompt_width: int, completion_width: int) -> torch.Tensor:
    """Each position's policy lag [R, prompt_width + completion_width] in the trainer's layout, from the
    completion tokens' lags [R, T]: a prompt's positions take its first completion token's lag (the weights
    whose forward over the prompt sampled that token)."""
    return torch.cat([lags[:, :1].expand(-1, prompt_width), lags[:, :completion_width]], 1)


def differs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[...] bool: positions routed in both `a` and `b` ([..., k], -1 = none) whose expert sets differ."""
    both = (a >= 0).all(-1) & (b >= 0).all(-1)
    return (a.sort(-1).values != b.sort(-1).values).any(-1) & both


def disagreement(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    """Per layer: the share of positions routed in both `a` and `b` ([..., L, k]) whose expert sets differ."""
    both = (a >= 0).all(-1) & (b >= 0).all(-1)  # [..., L]
    dims = tuple(range(both.dim() - 1))
    return (differs(a, b).sum(dims) / both.sum(dims).clamp(min=1)).tolist()


@contextlib.contextmanager
def uncounted(replay: RouterReplay | None):
    """Forwards that replay but are not counted (the reference policy's, under the same routers)."""
    if replay is None:
        yield
        return
    replay.counting = False
    try:
        yield
    finally:
        replay.counting = True
