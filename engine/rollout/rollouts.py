"""Where the trainer's batches come from: prompts → rollout (G completions each, with the sampler's
log-probs μ) → rewards → group-relative advantages, one GenerationBatch per rollout. With
rollout.async_mode = one_step or in_flight the next rollout is requested before the trainer trains on this
one; every token's policy lag is kept, and train.max_staleness leaves the stalest out of the loss."""

from __future__ import annotations

import dataclasses
import math
import time

import torch

from ... import rewards as reward_lib
from ...contract import metrics as schema
from ...contract.config import Config
from ...rewards.runner import report as report_problems
from ..faults import out_of_memory
from ..prompts import data, prompt_render
from ..sampler import Sampling
from ..sampler.base import Rollout
from . import dynamic_sampling, sample_rows
from .advantages import compute_advantages
from .batching import LossInputs, join_prompt_completion
from .episodes import (
    Episodes,
    EveryEpisodeFailed,
    every_episode_failed,
    reward_problems,
)
from .episodes import metrics as episode_metrics


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

    def __init__(
        self,
        cfg: Config,
        dist,
        prompts: data.PromptStream,
        tokenizer,
        sampler,
        reward_fns,
        device,
        rundir,
        episodes=None,
    ):
        self.cfg, self.dist, self.prompts, self.tokenizer, self.sampler = cfg, dist, prompts, tokenizer, sampler
        self.reward_fns, self.device, self.rundir = reward_fns, device, rundir
        self.episodes: Episodes | None = episodes  # env.environment: each completion is an episode
        self.reward_names = [name for name, _ in reward_fns]
        weights = cfg.rewards.weights or [1.0] * len(reward_fns)
        if episodes and episodes.env.has_reward:  # the environment's reward: a column of its own, weight 1 (TRL)
            name, k = episodes.env.name, 2
            while name in self.reward_names:  # a class named as a reward function: E, E_2, as rewards name twins
                name, k = f"{episodes.env.name}_{k}", k + 1
            self.reward_names.append(name)
            weights = [*weights, 1.0]
        self.reward_weights = torch.tensor(weights)
        self.step_no = self.version = 0  # of the rollout being made (the trainer's step and policy version)
        self.pending: dict | None = None  # rollout.async_mode = one_step / in_flight: the next rollout, being sampled

    def next(self, step_no: int, version: int) -> GenerationBatch:
        """Sample prompts_per_step × steps_per_generation prompts G times each, score them and compute the
        group-relative advantages: one rollout, as the batch of the optimizer steps that train on it.
        step_no: optimizer steps done; version: weight syncs to the sampler done."""
        self.step_no, self.version = step_no, version
        cfg, t, G = self.cfg, self.cfg.train, self.cfg.rollout.num_generations
        # 1-2. Rollout (G completions per prompt, μ = the sampler's per-token log-probs) → rewards; with
        #      algo.dynamic_sampling in rounds until its groups have reward signal (DAPO, arXiv 2503.14476).
        sampling = {}
        if cfg.algo.dynamic_sampling:
            scored, sampling = dynamic_sampling.fill(
                self._scored,
                self.reward_weights,
                G,
                cfg.algo.dynamic_sampling_max_rounds,
                self.tokenizer.pad_token_id,
                self.dist,
                lambda message: self.rundir.event("warning", message, step=self.step_no + 1),
            )
        else:
            scored = self._scored(0)
        request, out, waited, texts, table = scored.request, scored.out, scored.waited, scored.texts, scored.table
        prompts, prompt_ids, episodes = request["prompts"], request["prompt_ids"], request.get("episodes")
        mask = out.mask.to(self.device)
        # → group-relative advantages (of the kept groups): GRPO's, or pass@k's (algo.advantage)
        rewards = torch.tensor(table, dtype=torch.float32)
        advantages, metrics = compute_advantages(
            rewards, self.reward_weights, G, cfg.algo.scale_rewards, cfg.algo.advantage, cfg.algo.pass_k
        )
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
            prompt_ids, out.completion_ids, scored.per_prompt, self.tokenizer.pad_token_id, self.device
        )
        lengths = out.mask.sum(1)  # the model's tokens: an episode's environment tokens are not its length
        metrics.update(self._reward_metrics(rewards))
        if episodes:
            metrics.update(episode_metrics(episodes, self.episodes.env.tools, out.seconds))
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
        metrics.update(sampling)
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
            samples=sample_rows.rows(
                [p for p in prompts for _ in range(scored.per_prompt)],
                texts,
                table,
                advantages,
                self.reward_names,
                G,
                out,
                mask,
                lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
                episodes,
            ),
        )

    def _scored(self, round_no: int) -> dynamic_sampling.Scored:
        """One round of this rollout's prompts sampled (round_no > 0: algo.dynamic_sampling's next prompts)
        and scored by the reward functions (TRL signature, every dataset column as a keyword)."""
        with out_of_memory("rollout", self.step_no + 1, self.rundir.dir):
            request, out, waited = self._sample(round_no)
        self.sampler.sleep()  # colocated vLLM frees its memory for training; it wakes on the next generate
        G, episodes = self.cfg.rollout.num_generations, request.get("episodes")
        if episodes:  # the rewards score an episode's last model turn; each episode has its own prompt
            self.episodes.release(episodes)  # their instances are done with: a __del__ runs guarded
            texts, per_prompt = [e.answer for e in episodes], 1
        else:
            texts, per_prompt = self.tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True), G
        table = self._table(request["rows"], G, texts, episodes)
        return dynamic_sampling.Scored(request, out, waited, texts, table, per_prompt)

    def _table(self, rows: list[dict], n: int, texts: list[str], episodes) -> list[list[float]]:
        """[N][F] rewards of n completions per row, one column per reward_names entry: the reward functions',
        then an environment's own (episodes)."""
        table = self.score(self.reward_fns, rows, n, texts)
        if episodes and self.episodes.env.has_reward:
            table = [[*scores, math.nan if e.reward is None else e.reward] for scores, e in zip(table, episodes)]
            state = getattr(self.reward_fns, "seen", None)
            report_problems(self.reward_names[-1], reward_problems(episodes), state, self._reward_error)
        if episodes:  # an episode the environment never started is no sample of its group: unscored
            table = [[math.nan] * len(scores) if e.turns == 0 else scores for scores, e in zip(table, episodes)]
        return table

    def _request(self, at_step: int, round_no: int = 0) -> dict:
        """The prompts and sampling settings of the rollout whose first update is optimizer step at_step + 1,
        and the weights it is sampled with (step: optimizer steps done; version: weight syncs done)."""
        cfg, r, t = self.cfg, self.cfg.rollout, self.cfg.train
        rows = self.dist.shard(self.prompts.take(t.prompts_per_step * t.steps_per_generation))  # this rank's share
        seed = data.mix_seed(t.seed, at_step)
        if round_no:  # a later round of algo.dynamic_sampling samples with a seed of its own
            seed = data.mix_seed(seed, round_no)
        sampling = Sampling.of(r, seed)
        request = {"rows": rows, "sampling": sampling, "step": self.step_no, "version": self.version}
        if not self.episodes:  # an episode renders its own prompt when it starts
            request["prompts"] = [prompt_render.prompt_text(row, cfg.data, self.tokenizer) for row in rows]
            request["prompt_ids"] = prompt_render.encode_prompts(self.tokenizer, request["prompts"], r.max_prompt_len)
        return request

    def _sample(self, round_no: int) -> tuple[dict, Rollout, float]:
        """This rollout's request, its completions and the seconds the trainer waited for them. With
        rollout.async_mode = one_step (verl's one-step off-policy) they were requested one rollout ago, from
        the rollout server, and the next request goes out now, before this rollout's updates: the server
        samples rollout k+1 with the weights before them while the trainer trains on rollout k (lag 1). With
        in_flight the weight sync after rollout k enters that generation between two decode steps
        (PipelineRL): the tokens after it have lag 0."""
        t = self.cfg.train
        start = time.perf_counter()
        if self.cfg.rollout.async_mode == "off":
            request = self._request(self.step_no, round_no)
            if self.episodes:  # config.validate allows no other async_mode
                stuck = self.episodes.still_running()
                if self.dist.any(stuck is not None):  # a skipped step, until train.max_bad_steps end the run
                    raise EveryEpisodeFailed(stuck or "calls into the environment still run on another rank")
                out, episodes = self.episodes.run(
                    self.sampler,
                    request["rows"],
                    self.cfg.rollout.num_generations,
                    request["sampling"],
                    self.cfg.data.prompt_column,
                )
                failed = every_episode_failed(episodes)
                if self.dist.any(failed is not None):  # nothing to train on: a skipped step, on every rank
                    self.episodes.release(episodes)
                    raise EveryEpisodeFailed(failed or "the environment failed every episode on another rank")
                request.update(episodes=episodes, prompt_ids=[e.prompt_ids for e in episodes])
                request["prompts"] = self.tokenizer.batch_decode(request["prompt_ids"])
            else:
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

    def eval_scores(self, rows: list[dict], sampling: Sampling) -> tuple[list[list[float]], list[str]]:
        """Evaluation: sampling.n completions per row (with an environment, episodes), scored as a rollout's are
        ([N][F], one column per reward_names entry, NaN where unscored); and the texts scored (an episode's last
        model turn), row by row."""
        episodes = None
        if self.episodes:
            _, episodes = self.episodes.run(self.sampler, rows, sampling.n, sampling, self.cfg.data.prompt_column)
            self.episodes.release(episodes)
            texts = [e.answer for e in episodes]
        else:
            prompts = [prompt_render.prompt_text(row, self.cfg.data, self.tokenizer) for row in rows]
            ids = prompt_render.encode_prompts(self.tokenizer, prompts, self.cfg.rollout.max_prompt_len)
            out = self.sampler.generate(ids, sampling)
            texts = self.tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)
        return self._table(rows, sampling.n, texts, episodes), texts

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
        for j, name in enumerate(self.reward_names):
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
