"""Multi-turn rollouts: G episodes per prompt between the policy and an environment (env.environment).

An episode is one completion span after its prompt, as the trainer's forward sees it: the model's turns, and
between them the environment's tokens (tool results, the environment's replies, the next assistant header).

    prompt ids │ turn 1 (sampled, mask 1) │ env tokens (mask 0) │ turn 2 (sampled, mask 1) │ …

Every turn is sampled on exactly the ids the trainer will score, so μ and π see the same context:
- sampled ids are kept as generated, never re-tokenised from text;
- environment tokens are the prefix-difference of two renders of the conversation, one ending with the model's
  turn, one with the environment's messages and the generation prompt: everything after the model's end-of-turn
  token (the "\\n" separator and the next assistant header too) is the environment's, mask 0 (TRL's
  _get_tool_suffix_ids, on the episode's own conversation rather than a dummy one).

Environment tokens carry μ = 0 and mask 0, so they leave the policy-gradient and KL terms, the ratios, the
mismatch telemetry, every normaliser and the completion-length metrics, which all read the mask.

One token budget, rollout.max_completion_len, holds the model's and the environment's tokens: a turn is cut at
it (stop "length"), and environment messages that would leave no room for a model token are rolled back (stop
"length"). A turn without its end-of-turn token never runs its tool calls. env.max_turns = N gives the model N
turns and the environment N actions: the Nth turn's tool calls still run (get_reward sees them), their results
are not shown. Each episode ends with one stop reason of contract/environments.py STOPS.
"""

from __future__ import annotations

import dataclasses
import math
import time

import torch

from grpo_studio.contract import environments
from grpo_studio.contract.environments import STOPS, Environment, schemas
from grpo_studio.contract.errors import UserError
from grpo_studio.engine import data, tool_calls, tool_template
from grpo_studio.engine.prompt_render import is_conversational, refuse_longer, render_ids
from grpo_studio.engine.sampler.base import Rollout, Sampling
from grpo_studio.engine.tool_calls import EpisodeEnds, bounded


@dataclasses.dataclass
class Episode:
    """One episode: its environment instance, conversation and completion span, and how it went."""

    instance: object
    messages: list[dict]  # the conversation so far: the prompt's messages, then every turn
    tools: list[dict] | None  # the tool schemas the template lists (tools shape)
    prompt_ids: list[int] = dataclasses.field(default_factory=list)
    ids: list[int] = dataclasses.field(default_factory=list)  # the completion span: model and environment tokens
    mask: list[float] = dataclasses.field(default_factory=list)  # 1: sampled by the model, 0: the environment's
    logprobs: list[float] = dataclasses.field(default_factory=list)  # μ; 0 on environment tokens
    segments: list[dict] = dataclasses.field(default_factory=list)  # {"role": model|env, "text", "trained"}
    turns: int = 0
    calls: dict = dataclasses.field(default_factory=dict)  # tool name -> calls run
    attempted_calls: int = 0  # calls the model wrote, malformed and unknown ones too
    failed_calls: int = 0  # of those: malformed, unknown, raised or timed out
    stop: str | None = None  # one of STOPS once it ended
    why: str = ""  # what ended it, in words
    reward: float | None = None  # turns shape: the sum of step()'s rewards
    answer: str = ""  # the last model turn's text: what the reward functions score
    env_s: float = 0.0


class Episodes:
    """Episodes of one environment class through one sampler, rendered with one chat template."""

    def __init__(self, env: Environment, tokenizer, template: str, env_cfg, max_tokens: int):
        self.env, self.tokenizer, self.template, self.cfg = env, tokenizer, template, env_cfg
        self.max_tokens = max_tokens  # rollout.max_completion_len: model and environment tokens together
        self.eos = tokenizer.eos_token_id

    # ---- rendering ------------------------------------------------------------------------------
    def render(self, messages: list[dict], tools, generation: bool) -> list[int]:
        return render_ids(self.tokenizer, messages, self.template, tools, generation)

    def env_ids(self, episode: Episode, turn: dict, replies: list[dict]) -> list[int]:
        """The environment's tokens after the model's turn: the render with its replies and the generation
        prompt, less the render ending with the turn, cut after its end-of-turn token."""
        before = self.render(episode.messages + [turn], episode.tools, generation=False)
        ends = [i for i, t in enumerate(before) if t == self.eos]
        before = before[: ends[-1] + 1] if ends else before
        after = self.render(episode.messages + [turn] + replies, episode.tools, generation=True)
        if after[: len(before)] != before:
            raise EpisodeEnds(
                "error", "the chat template rendered the earlier turns differently (not prefix-preserving)"
            )
        return after[len(before) :]

    # ---- an episode's start ---------------------------------------------------------------------
    def start(self, row: dict, prompt_column: str) -> Episode:
        """A new episode of `row`: a fresh instance, reset with the row's columns (TRL's reset(**row))."""
        instance = self.env.factory()
        if self.env.shape == "turns":
            episode = Episode(instance, [], None)
            messages = self._timed(episode, lambda: instance.reset(**row), "reset")
            if not _is_messages(messages):
                raise EpisodeEnds("error", f"reset returned {type(messages).__name__}, not a list of messages")
            episode.messages = [dict(m) for m in messages]
            return episode
        prompt = row[prompt_column] if prompt_column in row else row["prompt"]
        messages = [dict(m) for m in prompt] if is_conversational(prompt) else [{"role": "user", "content": prompt}]
        episode = Episode(instance, messages, schemas(instance, self.env))
        observation = self._timed(episode, lambda: instance.reset(**row), "reset")
        if observation is not None:  # TRL: a string from reset is appended to the last user message
            if not isinstance(observation, str):
                raise EpisodeEnds("error", f"reset returned {type(observation).__name__}, not a string or None")
            messages[-1] = {**messages[-1], "content": messages[-1]["content"] + observation}
        return episode

    def _timed(self, episode: Episode, fn, what: str):
        start = time.perf_counter()
        try:
            return bounded(fn, self.cfg.tool_timeout_s, what)
        finally:
            episode.env_s += time.perf_counter() - start

    # ---- the episodes of one rollout ---------------------------------------------------------------
    def run(self, sampler, rows: list[dict], n: int, sampling: Sampling, prompt_column: str = "prompt"):
        """n episodes per row, turn by turn, every live episode's next turn in one generate call.
        Returns (Rollout over the completion spans, the episodes)."""
        episodes = []
        for row in rows:
            for _ in range(n):
                try:
                    episodes.append(self.start(row, prompt_column))
                except EpisodeEnds as end:  # a row the environment cannot start: an empty episode
                    episodes.append(Episode(None, [], None, stop=end.stop, why=str(end)))
        for episode in episodes:
            if episode.stop is None:
                episode.prompt_ids = self.render(episode.messages, episode.tools, generation=True)
        model_s, turn = 0.0, 0
        live = [e for e in episodes if e.stop is None]
        while live:
            budgets = [self.max_tokens - len(e.ids) for e in live]
            seed = sampling.seed if turn == 0 else data.mix_seed(sampling.seed, turn)  # turn 1 = the one-turn rollout
            start = time.perf_counter()
            out = sampler.generate(
                [e.prompt_ids + e.ids for e in live],
                dataclasses.replace(sampling, n=1, max_tokens=max(budgets), seed=seed),
            )
            model_s += time.perf_counter() - start
            for row, (episode, budget) in enumerate(zip(live, budgets)):
                k = int(out.mask[row].sum())
                ids, logprobs = out.completion_ids[row, :k].tolist(), out.logprobs[row, :k].tolist()
                ended = not bool(out.truncated[row]) and k <= budget  # its end-of-turn token is inside the budget
                self._model_turn(episode, ids[:budget], logprobs[:budget], ended)
            live = [e for e in episodes if e.stop is None]
            turn += 1
        for episode in episodes:
            self._score(episode)
        return self._rollout(episodes, model_s), episodes

    def _model_turn(self, episode: Episode, ids: list[int], logprobs: list[float], ended: bool) -> None:
        """Append a sampled turn; unless it ran out of budget, answer it (tools or step) and append the
        environment's tokens."""
        episode.ids += ids
        episode.mask += [1.0] * len(ids)
        episode.logprobs += logprobs
        episode.turns += 1
        text = self.tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=False)
        episode.answer = self.tokenizer.decode(ids, skip_special_tokens=True)
        episode.segments.append({"role": "model", "text": episode.answer, "trained": True})
        if not ended:  # a turn without its end-of-turn token never executes
            episode.stop, episode.why = "length", f"the turn reached rollout.max_completion_len = {self.max_tokens}"
            return
        turn = {"role": "assistant", "content": text}
        try:
            replies, done = self._respond(episode, text, ids)
        except EpisodeEnds as end:
            episode.stop, episode.why = end.stop, str(end)
            return
        if done:
            episode.stop, episode.why = "done", episode.why or "the episode is done"
            return
        if episode.turns >= self.cfg.max_turns:
            episode.stop, episode.why = "max_turns", f"env.max_turns = {self.cfg.max_turns} turns taken"
            return
        try:
            env_ids = self.env_ids(episode, turn, replies)
        except EpisodeEnds as end:
            episode.stop, episode.why = end.stop, str(end)
            return
        if len(episode.ids) + len(env_ids) >= self.max_tokens:  # no room left for a model token: rolled back
            episode.stop = "length"
            episode.why = f"the environment's {len(env_ids)} tokens would pass rollout.max_completion_len"
            return
        episode.messages += [turn, *replies]
        episode.ids += env_ids
        episode.mask += [0.0] * len(env_ids)
        episode.logprobs += [0.0] * len(env_ids)
        episode.segments.append(
            {"role": "env", "text": self.tokenizer.decode(env_ids, skip_special_tokens=False), "trained": False}
        )

    def _respond(self, episode: Episode, text: str, ids: list[int]) -> tuple[list[dict], bool]:
        """The environment's answer to a finished model turn: (messages to the model, episode done)."""
        instance = episode.instance
        if self.env.shape == "turns":
            result = self._timed(episode, lambda: instance.step(text), "step")
            if not (isinstance(result, tuple) and len(result) == 4 and _is_messages(result[0])):
                raise EpisodeEnds("error", "step must return (messages, done, reward or None, info)")
            replies, done, reward, _info = result
            if reward is not None:
                if not isinstance(reward, (int, float)) or not math.isfinite(reward):
                    raise EpisodeEnds("error", f"step returned the reward {reward!r}, not a finite number")
                episode.reward = (episode.reward or 0.0) + float(reward)
            return [dict(m) for m in replies], bool(done)
        start, calls = time.perf_counter(), None
        try:
            before = episode.prompt_ids + episode.ids[: len(episode.ids) - len(ids)]  # the turn's context
            calls = tool_calls.parse(text, self.tokenizer, ids, before, episode.tools)
            if not calls:
                episode.why = "the model answered without a tool call"
                return [], True
            return tool_calls.run_calls(instance, self.env.tools, calls, self.cfg.tool_timeout_s, episode.calls), False
        except EpisodeEnds:
            episode.failed_calls += 1
            raise
        finally:
            episode.attempted_calls += 1 if calls is None else len(calls)  # a malformed call is one attempt
            episode.env_s += time.perf_counter() - start

    def _score(self, episode: Episode) -> None:
        """The environment's reward of a finished episode: get_reward() (tools shape) or the sum of step()'s
        rewards, 0 when it gave none (turns shape)."""
        if episode.instance is None or not self.env.has_reward:
            return
        if self.env.shape == "turns":
            episode.reward = episode.reward or 0.0
            return
        try:
            value = self._timed(episode, episode.instance.get_reward, "get_reward")
            episode.reward = float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None
        except EpisodeEnds:
            episode.reward = None

    def _rollout(self, episodes: list[Episode], seconds: float) -> Rollout:
        width = max([1, *(len(e.ids) for e in episodes)])
        pad = self.tokenizer.pad_token_id

        def padded(values, fill):
            return [v + [fill] * (width - len(v)) for v in values]

        return Rollout(
            completion_ids=torch.tensor(padded([e.ids for e in episodes], pad), dtype=torch.long),
            mask=torch.tensor(padded([e.mask for e in episodes], 0.0)),
            logprobs=torch.tensor(padded([e.logprobs for e in episodes], 0.0), dtype=torch.float32),
            truncated=torch.tensor([e.stop == "length" for e in episodes]),
            seconds=seconds,
        )


def _is_messages(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
    )


def metrics(episodes: list[Episode], tools: list[str], model_s: float) -> dict:
    """env/* and the environment's and the model's seconds, over one rollout's episodes."""
    n = len(episodes)
    attempted = sum(e.attempted_calls for e in episodes)
    env_tokens = sum(len(e.mask) - sum(e.mask) for e in episodes)
    out = {
        "env/turns_mean": sum(e.turns for e in episodes) / n,
        "env/turns_max": float(max(e.turns for e in episodes)),
        "env/tool_calls_mean": attempted / n,
        "env/tool_failure_frac": sum(e.failed_calls for e in episodes) / attempted if attempted else 0.0,
        "env/env_token_frac": env_tokens / max(1, sum(len(e.mask) for e in episodes)),
        "perf/env_s": sum(e.env_s for e in episodes),
        "perf/model_s": model_s,
    }
    out.update({f"env/tool_calls/{t}": sum(e.calls.get(t, 0) for e in episodes) / n for t in tools})
    out.update({f"env/stop/{s}": sum(e.stop == s for e in episodes) / n for s in STOPS})
    return out


def make(cfg, tokenizer, rows: list[dict]) -> Episodes | None:
    """The run's episodes (None without env.environment): the environment class and the chat template
    checked, and every row's first prompt measured against rollout.max_prompt_len, before weights load."""
    if not cfg.env.environment:
        return None
    env = environments.load(cfg.env.environment)
    if not cfg.rewards.funcs and not env.has_reward:
        raise UserError(
            f"{env.name} has no get_reward(), so nothing scores its episodes; give a reward function",
            key="rewards.funcs",
            value=[],
        )
    template = tool_template.choose(tokenizer, cfg.data)
    episodes = Episodes(env, tokenizer, template, cfg.env, cfg.rollout.max_completion_len)
    longest = 0
    for row in rows:
        try:
            episode = episodes.start(row, cfg.data.prompt_column)
        except EpisodeEnds:  # that row's episodes will end at once, with their stop reason
            continue
        longest = max(longest, len(episodes.render(episode.messages, episode.tools, generation=True)))
    refuse_longer(longest, cfg.rollout.max_prompt_len, "the longest episode prompt (tools listed)")
    return episodes
