"""Where the trainer's batches come from: prompts → rollout (G completions each, with the sampler's
log-probs μ) → rewards → group-relative advantages, one GenerationBatch per rollout. With
rollout.async_mode = one_step or in_flight the next rollout is requested before the trainer trains on this
one; every token's policy lag is kept, and train.max_staleness leaves the stalest out of the loss."""

from __future__ import annotations

import dataclasses
import math
import time

import torch

from grpo_studio.contract import metrics as schema
from grpo_studio.contract.config import Config
from grpo_studio.engine import data, prompt_render
from grpo_studio.engine import rewards as reward_lib
from grpo_studio.engine.advantages import compute_advantages
from grpo_studio.engine.batching import join_prompt_completion
from grpo_studio.engine.faults import out_of_memory
from grpo_studio.engine.losses import LossInputs
from grpo_studio.engine.sampler import Sampling
from grpo_studio.engine.sampler.base import Rollout


@dataclasses.dataclass
class GenerationBatch:
    """One rollout and what the optimizer steps that train on it read (TRL's buffered generation batch)."""

    step: int  # optimizer steps done when it was sampled
    rollout: Rollout  # completions, μ, completion mask, truncation (CPU)
    lags: torch.Tensor  # [B, T] policy versions between each token's sampler and the trained weights
    input_ids: torch.Tensor  # [B, P + T] prompts + completions
    attention: torch.Tensor
    inputs: LossInputs  # advantages, loss mask, μ, π_old (None with one update per rollout)
    num_items: torch.Tensor  # dapo's normaliser of one optimizer step
    metrics: dict  # rewards, completions and (from its first step) mismatch: on each of its rows
    samples: list | None  # its samples.jsonl rows, until written


class Rollouts:
    """The rollouts of one trainer (this rank's share of each step's prompts)."""

    def __init__(self, cfg: Config, dist, prompts: data.PromptStream, tokenizer, sampler, reward_fns, device, rundir):
        self.cfg, self.dist, self.prompts, self.tokenizer, self.sampler = cfg, dist, prompts, tokenizer, sampler
        self.reward_fns, self.device, self.rundir = reward_fns, device, rundir
        self.reward_weights = torch.tensor(cfg.rewards.weights or [1.0] * len(reward_fns))
        self.step_no = self.version = 0  # of the rollout being made (the trainer's step and policy version)
        self.pending: dict | None = None  # rollout.async_mode = one_step / in_flight: the next rollout, being sampled

    def next(self, step_no: int, version: int) -> GenerationBatch:
        """Sample prompts_per_step × steps_per_generation prompts G times each, score them and compute the
        group-relative advantages: one rollout, as the batch of the optimizer steps that train on it.
        step_no: optimizer steps done; version: weight syncs to the sampler done."""
        self.step_no, self.version = step_no, version
        cfg, r, t = self.cfg, self.cfg.rollout, self.cfg.train
        # 1. Rollout: G completions per prompt, with μ = the sampler's per-token log-probs.
        with out_of_memory("rollout", self.step_no + 1, self.rundir.dir):
            request, out, waited = self._sample()
        rows, prompts, prompt_ids = request["rows"], request["prompts"], request["prompt_ids"]
        self.sampler.sleep()  # colocated vLLM frees its memory for training; it wakes on the next generate
        mask = out.mask.to(self.device)
        texts = self.tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)

        # 2. Rewards (TRL signature, every dataset column as a keyword) → group-relative advantages.
        G = r.num_generations
        table = self.score(self.reward_fns, rows, G, texts)
        rewards = torch.tensor(table, dtype=torch.float32)
        advantages, metrics = compute_advantages(rewards, self.reward_weights, G, cfg.algo.scale_rewards)
        if cfg.algo.mask_truncated_completions:
            mask = mask * (~out.truncated).float().unsqueeze(1).to(self.device)
        # token lag = versions between the weights that sampled it (in_flight: per token) and the ones trained
        sampled_by = getattr(out, "policy_version", request["version"])
        versions = torch.full_like(out.completion_ids, sampled_by) if out.versions is None else out.versions
        lags = version - versions
        stale = (lags > (t.max_staleness if t.max_staleness >= 0 else math.inf)) & out.mask.bool()
        mask = mask * (~stale).float().to(self.device)  # tokens too stale leave the loss (PipelineRL's max lag)
        metrics["policy/dropped_tokens"] = float(stale.sum())

        input_ids, attention = join_prompt_completion(
            prompt_ids, out.completion_ids, G, self.tokenizer.pad_token_id, self.device
        )
        lengths = out.mask.sum(1)
        metrics.update(self._reward_metrics(rewards))
        metrics.update(
            {
                "completion/len_mean": lengths.mean().item(),
                "completion/len_max": lengths.max().item(),
                "completion/truncated_frac": out.truncated.float().mean().item(),
                "perf/rollout_tok_s": lengths.sum().item() / max(out.seconds, 1e-9),
                "policy/version": float(sampled_by),
                # the trainer's idle time waiting for the rollout, and the share of its sampling that was hidden
                "perf/trainer_wait_s": waited,
                "perf/overlap_frac": min(1.0, max(0.0, 1.0 - waited / max(out.seconds, 1e-9))),
            }
        )
        return GenerationBatch(
            step=request["step"],
            rollout=out,
            lags=lags,
            input_ids=input_ids,
            attention=attention,
            inputs=LossInputs(
                logps=None,
                old_logps=None,
                advantages=advantages.to(self.device),
                mask=mask,
                rollout_logps=out.logprobs.to(self.device),
            ),
            # dapo's normaliser, TRL's: the rollout's active tokens, spread over its steps_per_generation steps
            num_items=self.dist.total(mask.sum()) / t.steps_per_generation,
            metrics=metrics,
            samples=self._samples([p for p in prompts for _ in range(G)], texts, table, advantages),
        )

    def _request(self, at_step: int) -> dict:
        """The prompts and sampling settings of the rollout whose first update is optimizer step at_step + 1,
        and the weights it is sampled with (step: optimizer steps done; version: weight syncs done)."""
        cfg, r, t = self.cfg, self.cfg.rollout, self.cfg.train
        rows = self.dist.shard(self.prompts.take(t.prompts_per_step * t.steps_per_generation))  # this rank's share
        prompts = [prompt_render.prompt_text(row, cfg.data, self.tokenizer) for row in rows]
        sampling = Sampling(
            n=r.num_generations,
            max_tokens=r.max_completion_len,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            seed=data.mix_seed(t.seed, at_step),
        )
        return {
            "rows": rows,
            "prompts": prompts,
            "prompt_ids": prompt_render.encode_prompts(self.tokenizer, prompts, r.max_prompt_len),
            "sampling": sampling,
            "step": self.step_no,
            "version": self.version,
        }

    def _sample(self) -> tuple[dict, Rollout, float]:
        """This rollout's request, its completions and the seconds the trainer waited for them. With
        rollout.async_mode = one_step (verl's one-step off-policy) they were requested one rollout ago, from
        the rollout server, and the next request goes out now, before this rollout's updates: the server
        samples rollout k+1 with the weights before them while the trainer trains on rollout k (lag 1). With
        in_flight the weight sync after rollout k enters that generation between two decode steps
        (PipelineRL): the tokens after it have lag 0."""
        t = self.cfg.train
        start = time.perf_counter()
        if self.cfg.rollout.async_mode == "off":
            request = self._request(self.step_no)
            out = self.sampler.generate(request["prompt_ids"], request["sampling"])
            return request, out, time.perf_counter() - start
        request = self.pending or self._submit(self.step_no)
        out = self.sampler.result(request["future"])
        waited = time.perf_counter() - start
        self.prompts.restore(request["cursor"])  # its prompts are taken now, not when requested
        following = self.step_no + t.steps_per_generation * t.num_iterations
        self.pending = self._submit(following) if following < t.steps else None
        return request, out, waited

    def _submit(self, at_step: int) -> dict:
        """Request a rollout and leave the prompt stream where it was: a checkpoint saved while the rollout
        is in flight holds a cursor before its prompts, so a resumed run requests them again (the same
        prompts and seed), neither skipping nor repeating them. _sample moves the cursor on when it is taken."""
        before = self.prompts.state()
        request = self._request(at_step)
        request["cursor"] = self.prompts.state()
        self.prompts.restore(before)
        request["future"] = self.sampler.submit(request["prompt_ids"], request["sampling"])
        return request

    def score(self, funcs, rows: list[dict], n: int, completions: list[str]) -> list[list[float]]:
        """Rewards for n completions per row, called as TRL does: the raw prompts, and every other
        dataset column as a keyword argument."""
        repeat = lambda values: [v for v in values for _ in range(n)]  # noqa: E731
        columns = {k: repeat(row[k] for row in rows) for k in rows[0] if k != "prompt"}
        return reward_lib.score(
            funcs, repeat(row["prompt"] for row in rows), completions, columns, on_error=self._reward_error
        )

    def _reward_metrics(self, rewards: torch.Tensor) -> dict:
        out = {}
        for j, (name, _) in enumerate(self.reward_fns):
            col = rewards[:, j]
            col = col[~torch.isnan(col)]
            out[schema.reward_key(name, "mean")] = col.mean().item() if col.numel() else float("nan")
            out[schema.reward_key(name, "std")] = col.std().item() if col.numel() > 1 else 0.0
        return out

    def _reward_error(self, name: str, message: str, index, **fields) -> None:
        self.rundir.event(
            "reward_error",
            f"reward {name!r} failed: {message}",
            function=name,
            sample=index,
            step=self.step_no + 1,
            **fields,
        )

    def _samples(self, prompts, texts, table, advantages) -> list[dict]:
        """samples.jsonl rows of one rollout, less their step (the step that writes them)."""
        names = [n for n, _ in self.reward_fns]
        return [
            {
                "prompt": p,
                "completion": c,
                "advantage": a,
                "rewards": {n: (None if math.isnan(v) else v) for n, v in zip(names, row)},
            }
            for p, c, row, a in zip(prompts, texts, table, advantages.tolist())
        ]
