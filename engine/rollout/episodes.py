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

Every call into the environment (the constructor, reset, step, get_reward, a turn's tools) runs guarded within
env.tool_timeout_s, and what it returns becomes plain text, cut to env.max_result_chars, inside that bound
(tool_calls.bounded). An episode the environment could not start (its constructor or reset failed, its prompt
would not render or is longer than rollout.max_prompt_len) is a sample with no tokens at all, left out of its
group's reward statistics; a rollout whose every episode the environment failed raises EveryEpisodeFailed, which
the step counts as skipped (engine/train/skipped_steps.py). A get_reward that fails leaves its reward None and is a
`reward_error`, as a reward function's failure is.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import time

import torch

from ...contract import environments, user_code
from ...contract.environments import STOPS, Environment
from ...contract.errors import UserError, describe
from ...rewards.runner import as_float
from ..prompts import data
from ..prompts.prompt_render import is_conversational, refuse_longer, render_ids
from ..sampler.base import Rollout, Sampling
from . import tool_calls, tool_template
from .tool_calls import EpisodeEnds, awaited, bounded, plain_messages, plain_text

# the guard puts torch's default dtype back after every call into user code, with the rest of contract's KEPT
user_code.KEPT.append((torch.get_default_dtype, torch.set_default_dtype))


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
    failed: bool = False  # ended by the environment's own failure (not the model's text, not a tool it called)
    reward: float | None = None  # turns shape: the sum of step()'s rewards
    step_metrics: dict = dataclasses.field(default_factory=dict)  # turns shape: info["metrics"] key -> its values
    reward_error: tuple[str, str] | None = None  # get_reward's failure: (problem kind, message), as rewards report
    answer: str = ""  # the last model turn's text: what the reward functions score
    env_s: float = 0.0


class EveryEpisodeFailed(Exception):
    """The environment failed every episode of a rollout: nothing in it is worth training on."""


MAX_STILL_RUNNING = 8  # calls into the environment spinning past their bound before no new episode starts


class Episodes:
    """Episodes of one environment class through one sampler, rendered with one chat template."""

    def __init__(self, env: Environment, tokenizer, template: str, env_cfg, max_tokens: int, max_prompt: int = 0):
        self.env, self.tokenizer, self.template, self.cfg = env, tokenizer, template, env_cfg
        self.max_tokens = max_tokens  # rollout.max_completion_len: model and environment tokens together
        self.max_prompt = max_prompt  # rollout.max_prompt_len (0: unchecked), which the memory plan assumes
        self.eos = tokenizer.eos_token_id

    def still_running(self) -> str | None:
        """Why no new episode may start: MAX_STILL_RUNNING calls into the environment still run past their bound
        (each takes its share of the interpreter, so every step slows), or None."""
        stuck = user_code.still_running(environments.THREAD)
        if stuck < MAX_STILL_RUNNING:
            return None
        return (
            f"{stuck} calls into the environment are still running past env.tool_timeout_s = "
            f"{self.cfg.tool_timeout_s:g} s; it does not stop when asked"
        )

    # ---- rendering ------------------------------------------------------------------------------
    def render(self, messages: list[dict], tools, generation: bool) -> list[int]:
        """The ids of a conversation; a template or tokenizer that fails on it ends the episode."""
        try:
            return render_ids(self.tokenizer, messages, self.template, tools, generation)
        except Exception as err:  # noqa: BLE001 - the user's template on the environment's messages
            raise EpisodeEnds(
                "error", f"the chat template could not render the conversation ({describe(err)})"
            ) from None

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
        """A new episode of `row`: a fresh instance, reset with (a copy of) the row's columns (TRL's reset(**row)),
        and its prompt rendered. The instance is only ever held by the episode, so `release` drops it guarded."""
        episode = Episode(None, [], None)
        episode.instance = self._timed(episode, self.env.factory, "making an instance")
        try:
            self._reset(episode, row, prompt_column)
        except EpisodeEnds:
            self.release([episode])
            raise
        return episode

    def _reset(self, episode: Episode, row: dict, prompt_column: str) -> None:
        limit = self.cfg.max_result_chars
        if self.env.shape == "turns":

            def messages():
                return plain_messages(awaited(episode.instance.reset(**copy.deepcopy(row))), "reset", limit)

            episode.messages = self._timed(episode, messages, "reset")
        else:
            prompt = row[prompt_column] if prompt_column in row else row["prompt"]
            messages = [dict(m) for m in prompt] if is_conversational(prompt) else [{"role": "user", "content": prompt}]
            episode.messages, episode.tools = messages, self.env.schemas

            def reset():  # TRL: a string from reset is appended to the last user message
                observation = awaited(episode.instance.reset(**copy.deepcopy(row)))
                return None if observation is None else plain_text(observation, "reset", limit)

            observation = self._timed(episode, reset, "reset")
            if observation is not None:
                messages[-1] = {**messages[-1], "content": messages[-1]["content"] + observation}
        episode.prompt_ids = self._rendered(episode, episode.messages, generation=True)

    def _timed(self, episode: Episode, fn, what: str, fails: bool = True):
        """fn, a call into the environment, guarded and bounded; its failure is the environment's (unless
        `fails` is False: get_reward's failure costs the episode its reward, not its tokens)."""
        start = time.perf_counter()
        try:
            return bounded(fn, self.cfg.tool_timeout_s, what)
        except EpisodeEnds:
            episode.failed = episode.failed or fails
            raise
        finally:
            episode.env_s += time.perf_counter() - start

    def _rendered(self, episode: Episode, messages: list[dict], generation: bool) -> list[int]:
        try:
            return self.render(messages, episode.tools, generation)
        except EpisodeEnds:
            episode.failed = True
            raise

    def _begin(self, row: dict, prompt_column: str) -> Episode:
        """start(), or an episode that ended before the model's first turn: no tokens at all (nothing to train,
        nothing the memory plan did not count), its stop reason and why."""
        try:
            episode = self.start(row, prompt_column)
        except EpisodeEnds as end:
            return Episode(None, [], None, stop=end.stop, why=str(end), failed=True)
        if self.max_prompt and len(episode.prompt_ids) > self.max_prompt:
            why = f"its prompt renders to {len(episode.prompt_ids)} tokens, over rollout.max_prompt_len = "
            return Episode(None, [], None, stop="length", why=f"{why}{self.max_prompt}", failed=True)
        return episode

    # ---- the episodes of one rollout ---------------------------------------------------------------
    def run(self, sampler, rows: list[dict], n: int, sampling: Sampling, prompt_column: str = "prompt"):
        """n episodes per row, turn by turn, every live episode's next turn in one generate call.
        Returns (Rollout over the completion spans, the episodes)."""
        episodes = [self._begin(row, prompt_column) for row in rows for _ in range(n)]
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

    def release(self, episodes: list[Episode]) -> None:
        """Drop finished episodes' instances inside the guard: a __del__ that hangs costs one bound, not the run
        (the trainer calls it once a rollout is scored)."""
        instances = [e.instance for e in episodes]
        for episode in episodes:
            episode.instance = None
        try:
            bounded(instances.clear, self.cfg.tool_timeout_s, "deleting the instances")
        except EpisodeEnds:  # its episodes are over: nothing is left to lose
            pass

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
        except EpisodeEnds as end:  # the template or tokenizer could not carry the environment's messages
            episode.stop, episode.why, episode.failed = end.stop, str(end), True
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
        instance, limit = episode.instance, self.cfg.max_result_chars
        if self.env.shape == "turns":

            def step():
                result = awaited(instance.step(text))
                if not (isinstance(result, tuple) and len(result) == 4):
                    raise EpisodeEnds("error", "step must return (messages, done, reward or None, info)")
                replies, done, reward, info = result
                number, _, what = as_float(reward)
                if what:
                    raise EpisodeEnds("error", f"step returned a reward of type {type(reward).__name__} ({what})")
                step_metrics(episode, info)
                return plain_messages(replies, "step", limit), bool(done), number

            replies, done, reward = self._timed(episode, step, "step")
            if reward is not None:
                total = (episode.reward or 0.0) + reward
                if not math.isfinite(total):
                    episode.failed = True
                    raise EpisodeEnds("error", "the sum of step's rewards is too large for a float")
                episode.reward = total
            return replies, done
        start, calls = time.perf_counter(), None
        try:
            before = episode.prompt_ids + episode.ids[: len(episode.ids) - len(ids)]  # the turn's context
            calls = tool_calls.parse(text, self.tokenizer, ids, before, episode.tools)
            if not calls:
                episode.why = "the model answered without a tool call"
                return [], True
            timeout = self.cfg.tool_timeout_s
            return tool_calls.run_calls(instance, self.env.tools, calls, timeout, limit, episode.calls), False
        except EpisodeEnds:
            episode.failed_calls += 1
            raise
        finally:
            episode.attempted_calls += 1 if calls is None else len(calls)  # a malformed call is one attempt
            episode.env_s += time.perf_counter() - start

    def _score(self, episode: Episode) -> None:
        """The environment's reward of a finished episode: get_reward() (tools shape) or the sum of step()'s
        rewards, 0 when it gave none (turns shape). A get_reward that fails or returns anything but a finite number
        (None, a string, nan, inf, a list) leaves it None, with the problem recorded for its reward_error
        (reward_problems)."""
        if episode.instance is None or not self.env.has_reward:
            return
        if self.env.shape == "turns":
            episode.reward = episode.reward or 0.0
            return
        instance = episode.instance

        def get_reward():  # a number (True/False count as 1/0, as float() reads them); None is no score
            value = awaited(instance.get_reward())
            number, kind, what = as_float(value)
            if value is None:
                kind, what = "not_a_number", "None, not a number"
            return number, kind, f"get_reward returned {type(value).__name__} ({what})"

        try:
            episode.reward, kind, message = self._timed(episode, get_reward, "get_reward", fails=False)
        except EpisodeEnds as end:
            episode.reward_error = ("timeout" if end.stop == "timeout" else "exception", str(end))
            return
        if kind:
            episode.reward_error = (kind, message)

    def _rollout(self, episodes: list[Episode], seconds: float) -> Rollout:
        width = max([1, *(len(e.ids) for e in episodes)])
        pad = self.tokenizer.pad_token_id

        def padded(values, fill):
            return [v + [fill] * (width - len(v)) for v in values]

        return Rollout(
            completion_ids=torch.tensor(padded([e.ids for e in episodes], pad), dtype=torch.long),
            mask=torch.tensor(padded([e.mask for e in episodes], 0.0)),
            logprobs=torch.tensor(padded([e.logprobs for e in episodes], 0.0), dtype=torch.float32),
            truncated=torch.tensor([e.stop == "length" and e.turns > 0 for e in episodes]),
            seconds=seconds,
        )


def step_metrics(episode: Episode, info) -> None:
    """Keep the finite numbers of step()'s info["metrics"] ({name: number}, names of word characters); anything
    else there is ignored, as the rest of info is."""
    reported = info.get("metrics") if isinstance(info, dict) else None
    if not isinstance(reported, dict):
        return
    for name, value in reported.items():
        number, _, what = as_float(value)
        if isinstance(name, str) and re.fullmatch(r"\w{1,64}", name) and not what and number is not None:
            episode.step_metrics.setdefault(name, []).append(number)


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
    for name in sorted({k for e in episodes for k in e.step_metrics}):  # the mean over every step that reported it
        values = [v for e in episodes for v in e.step_metrics.get(name, [])]
        out[f"env/step/{name}"] = sum(values) / len(values)
    return out


def reward_problems(episodes: list[Episode]) -> dict[str, list]:
    """get_reward's failures in one rollout as reward functions' problems are reported (rewards/runner.py
    report): {kind: [(sample, message, None), ...]}, the first message saying how many samples it cost."""
    problems: dict[str, list] = {}
    for i, episode in enumerate(episodes):
        if episode.reward_error:
            problems.setdefault(episode.reward_error[0], []).append((i, episode.reward_error[1], None))
    for items in problems.values():
        i, message, _ = items[0]
        items[0] = (i, f"{message} (sample {i}; {len(items)} of {len(episodes)} samples set to None)", None)
    return problems


def every_episode_failed(episodes: list[Episode]) -> str | None:
    """Why, when the environment failed every episode of a rollout (the first one's why); else None."""
    if episodes and all(e.failed for e in episodes):
        return f"every episode ({len(episodes)}) failed in the environment, the first: {episodes[0].why}"
    return None


def make(cfg, tokenizer, rows: list[dict]) -> Episodes | None:
    """The run's episodes (None without env.environment): the environment class and the chat template
    checked, and the rows' first prompts measured against rollout.max_prompt_len, before weights load. The
    measuring takes env.tool_timeout_s in all (plus the call under way): the rows it leaves are measured as their
    episodes start."""
    if not cfg.env.environment:
        return None
    env = environments.load(cfg.env.environment, cfg.env.tool_timeout_s)
    if not cfg.rewards.funcs and not env.has_reward:
        raise UserError(
            f"{env.name} has no get_reward(), so nothing scores its episodes; give a reward function",
            key="rewards.funcs",
            value=[],
        )
    template = tool_template.choose(tokenizer, cfg.data)
    episodes = Episodes(env, tokenizer, template, cfg.env, cfg.rollout.max_completion_len, cfg.rollout.max_prompt_len)
    longest, deadline = 0, time.monotonic() + cfg.env.tool_timeout_s
    for row in rows:
        if time.monotonic() > deadline:
            break
        try:
            episode = episodes.start(row, cfg.data.prompt_column)
        except EpisodeEnds:  # that row's episodes will end at once, with their stop reason
            continue
        longest = max(longest, len(episode.prompt_ids))
        episodes.release([episode])
    refuse_longer(longest, cfg.rollout.max_prompt_len, "the longest episode prompt (tools listed)")
    return episodes
