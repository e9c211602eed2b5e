"""The `hf` rollout backend: a decode loop of its own (transformers' `generate`'s, less the rows that have ended)
on its own copy of the policy in rollout.dtype.

It keeps a separate model (like vLLM does), so the rollout precision can differ from the
trainer's and weight sync after each optimizer step goes through the same `load_weights` path
as the vLLM backend. Each token is drawn, and its μ read, from the *processed* scores (after
temperature, top-k, top-p), one step at a time (SampledLogprobs): μ is the distribution actually drawn from.
A row that has drawn its EOS leaves the decode batch (HFBackend._decode); the draws are those of
generate keeping every row (tests/test_hf_decode_rows.py).
With top-k/top-p and algo.logprob_support = sampler it also returns the tokens kept at each position
(Rollout.support), so the trainer's π is renormalised on the same set (docs/mismatch.md, "Truncated sampling").

Each distinct prompt is computed once: its tokens but the last run through the model into a KV cache, which is
repeated for its G samples; the decode then starts from the last prompt token (issue 27: the prompt is most of
a GSM8K-shaped rollout's tokens). The samples are drawn as without it (the same draws, from scores equal to
fp32 rounding).

A 4-bit base (model.load_in_4bit) is sampled unmerged: this copy holds the same NF4 base (quantising the
same weights gives the same codes) under the same LoRA adapters, and the sync copies the adapters
(engine/model/weights.py). Merging them would have to dequantise, add and re-quantise, a different base.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

import torch

from ..model.moe import RouteRecorder, routers
from ..model.policy_loader import add_lora, device, load_base, quantization
from ..precision.numerics import torch_dtype
from .base import NonFiniteSampling, Rollout, Sampling, pack_support, rollout_from, truncates


def _keep_training_kernel(model) -> None:
    """On CPUs with AVX512-BF16, bitsandbytes re-packs a Linear4bit's weight for inference the first time it
    runs in eval mode without grad, and that kernel computes in bf16 (bf16 absmax and activations) whatever
    the compute dtype: an fp32 rollout would sample bf16 GEMMs. The sampler keeps the layout and kernel the
    trainer's forward uses, so both sides compute the same function."""
    import bitsandbytes as bnb

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False


class SampledLogprobs:
    """Each step's draw and its μ: from the scores after the temperature, top-k and top-p warpers, a token drawn by
    inverse CDF (`draw`) and log μ of it kept. generate's own sampling (torch.multinomial) draws an exponential
    for every vocabulary entry of every row at every step: on a CPU that was 8.5 s of a 44 s GSM8K-shaped rollout
    (64 rows × 49,152 entries × 128 steps); one uniform per row and a cumulative sum do the same draw. Keeping
    only log μ of the drawn token, not generate's output_scores (every step's B × V scores: 1.6 GB there).

    Every step draws one uniform for each of the B rows, those still decoding or not, so a row's draws are the
    same whichever rows have finished. With `keep_support` it also keeps each step's kept set, the tokens the
    warpers left finite (the support μ is renormalised over), bit-packed: B × V/8 bytes a step
    (algo.logprob_support = sampler). A finished row reads 0 (rollout_from masks it)."""

    def __init__(self, rows: int, keep_support: bool = False):
        self.rows = rows
        self.logps: list[torch.Tensor] = []
        self.supports: list[torch.Tensor] | None = [] if keep_support else None

    def __call__(self, scores: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        """The tokens [len(live), 1] drawn from the warped `scores` of the rows `live` (indices of the B rows)."""
        u = torch.rand(self.rows, 1, device=scores.device)[live]
        logp = torch.log_softmax(scores.float(), dim=-1)
        token = draw(logp, u)
        self.logps.append(logp.new_zeros(self.rows).index_copy_(0, live, logp.gather(1, token).squeeze(1)))
        if self.supports is not None:
            packed = pack_support(torch.isfinite(scores))
            self.supports.append(packed.new_zeros(self.rows, packed.shape[1]).index_copy_(0, live, packed))
        return token

    def result(self, ids: torch.Tensor) -> torch.Tensor:
        """log μ [B, T] of the completion tokens `ids` [B, T]."""
        if ids.shape[1] == 0:
            return ids.new_zeros(ids.shape, dtype=torch.float32)
        return torch.stack(self.logps[: ids.shape[1]], dim=1)

    def support(self, ids: torch.Tensor) -> torch.Tensor | None:
        """The packed kept sets [B, T, ceil(V/8)] of the completion tokens `ids` [B, T] (None: not kept)."""
        if self.supports is None or ids.shape[1] == 0:
            return None
        return torch.stack(self.supports[: ids.shape[1]], dim=1)


def draw(logp: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
    """One token [B, 1] per row from the distribution exp(logp) [B, V], by inverse CDF: the first column
    whose cumulative probability exceeds the row's uniform draw `u` [B, 1] (drawn here when None; a
    zero-probability column never does)."""
    cdf = logp.exp().cumsum(dim=-1)
    total = cdf[:, -1:]
    if not bool(torch.isfinite(total).all()):
        raise NonFiniteSampling("non-finite sampler probabilities")
    if u is None:
        u = torch.rand(total.shape, device=logp.device)
    return torch.searchsorted(cdf, u * total, right=True).clamp_(max=logp.shape[-1] - 1)


def warpers(sampling: Sampling) -> list:
    """generate's own sampling warpers for `sampling`, in its order (temperature, top-k, top-p)."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    out = [TemperatureLogitsWarper(sampling.temperature)] if sampling.temperature != 1.0 else []
    if sampling.top_k:
        out.append(TopKLogitsWarper(top_k=sampling.top_k))
    if sampling.top_p < 1.0:
        out.append(TopPLogitsWarper(top_p=sampling.top_p))
    return out


class HFBackend:
    name = "hf"

    def __init__(self, model_path: str, tokenizer, plan, model_cfg=None, keep_support: bool = False):
        """`model_cfg`: the run's model.* keys, read for a 4-bit base (its quantisation and adapters);
        `keep_support`: a truncated rollout returns each position's kept set (Rollout.support)."""
        self.tokenizer = tokenizer
        self.keep_support = keep_support
        self.device = device()
        dtype = torch_dtype(plan.rollout_dtype)
        quant = quantization(model_cfg, dtype) if model_cfg is not None else None
        model = load_base(model_path, dtype, quant)
        if quant:
            model = add_lora(model, model_cfg)
            _keep_training_kernel(model)
        self.model = model.to(self.device).eval()
        self.model.generation_config.pad_token_id = tokenizer.pad_token_id
        if plan.rollout_fp8:
            from ..precision.fp8 import apply_fp8

            apply_fp8(self.model)
        self._params = dict(self.model.named_parameters())
        # an MoE's sampled experts, for router telemetry and replay (engine/model/moe.py)
        self.routes = RouteRecorder(self.model) if routers(self.model) else None

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], sampling: Sampling) -> Rollout:
        start = time.perf_counter()
        rows = [ids for ids in prompt_ids for _ in range(sampling.n)]
        width = max(map(len, rows))
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=self.device)
        attention = torch.arange(width).unsqueeze(0) >= torch.tensor([width - len(r) for r in rows]).unsqueeze(1)
        if self.routes is not None:
            self.routes.clear()
        cache = self._prompt_cache(input_ids[:: sampling.n], attention[:: sampling.n], sampling.n)
        recorder = SampledLogprobs(len(rows), self.keep_support and truncates(sampling))
        torch.manual_seed(sampling.seed)
        ids = self._decode(input_ids, attention.long().to(self.device), cache, sampling, recorder)
        eos = self.tokenizer.eos_token_id
        rollout = rollout_from(ids, recorder.result(ids), eos, pad, start, recorder.support(ids))
        if self.routes is not None:
            rollout.routes = self.routes.routes(sampling.n, cache is not None, attention, rollout.mask)
        return rollout

    def _decode(self, input_ids, attention, cache, sampling: Sampling, recorder: SampledLogprobs) -> torch.Tensor:
        """The completion ids [B, steps] of the left-padded prompts `input_ids` [B, W] (`cache`: the KV cache of
        their first W − 1 tokens, or None), one token a step, pad after a row's EOS, until every row has ended or
        max_tokens; what transformers' generate does with our processors (EOS masked before min_tokens, the
        warpers, the draw), and no other: the model's generation_config (a repetition penalty, say) is not read,
        as vLLM does not read it either.

        A row that has ended leaves the batch, its KV cache rows with it (generate keeps every row until the
        longest ends: with lengths geometric around half the cap, a third of the decode rows were padding). The
        draws stay those of the whole batch (SampledLogprobs). An MoE's router recorder keeps every row, as
        generate does, so its routes keep their layout (engine/model/moe.py)."""
        B, eos, pad = input_ids.shape[0], self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        positions = (attention.cumsum(-1) - 1).clamp(min=0)  # generate's own position ids under left padding
        step_ids, step_pos = (input_ids, positions) if cache is None else (input_ids[:, -1:], positions[:, -1:])
        live, ended = torch.arange(B, device=self.device), torch.zeros(B, dtype=torch.bool, device=self.device)
        out = torch.full((B, sampling.max_tokens), pad, dtype=input_ids.dtype, device=self.device)
        shrink = self.routes is None
        for t in range(sampling.max_tokens):
            step = self.model(
                input_ids=step_ids,
                attention_mask=attention,
                position_ids=step_pos,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            cache, scores = step.past_key_values, step.logits[:, -1, :].float()
            if t < sampling.min_tokens:
                scores[:, eos] = -math.inf  # generate's MinNewTokensLengthLogitsProcessor
            for warp in warpers(sampling):
                scores = warp(step_ids, scores)
            token = recorder(scores, live)
            token = torch.where(ended[live].unsqueeze(1), pad, token)  # without shrinking: pad after EOS
            out[live, t] = token.squeeze(1)
            ended[live] |= token.squeeze(1) == eos
            if bool(ended.all()):
                return out[:, : t + 1]
            keep = ~ended[live] if shrink else torch.ones(len(live), dtype=torch.bool, device=self.device)
            if not bool(keep.all()):
                cache.batch_select_indices(keep.nonzero().squeeze(1))
                live, token, attention, step_pos = live[keep], token[keep], attention[keep], step_pos[keep]
            attention = torch.cat([attention, attention.new_ones(len(live), 1)], dim=1)
            step_ids, step_pos = token, step_pos[:, -1:] + 1
        return out

    def _prompt_cache(self, prompt_ids: torch.Tensor, attention: torch.Tensor, n: int):
        """The KV cache of each distinct prompt less its last token, repeated n times (None for n = 1)."""
        from transformers import DynamicCache

        if n < 2 or prompt_ids.shape[1] < 2:
            return None
        att = attention.long().to(self.device)
        cache = DynamicCache(config=self.model.config)
        positions = (att.cumsum(-1) - 1).clamp(min=0)  # generate's own position ids under left padding
        self.model(
            input_ids=prompt_ids[:, :-1],
            attention_mask=att[:, :-1],
            position_ids=positions[:, :-1],
            past_key_values=cache,
            use_cache=True,
        )
        cache.batch_repeat_interleave(n)
        return cache

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in named_tensors:
            self._params[name].copy_(tensor.to(self._params[name].dtype))

    def sleep(self) -> None:
        """Nothing to release: the hf backend's copy stays resident (see vLLM's rollout.sleep)."""

    def close(self) -> None:
        self.model = None
