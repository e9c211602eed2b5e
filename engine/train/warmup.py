"""The supervised warm-up before RL (warmup.*): a few optimizer steps of next-token cross-entropy on whole
conversations, on their assistant turns only, into the adapter that GRPO then trains (TRL's
`SFTTrainer(assistant_only_loss=True)` followed by `GRPOTrainer` on its adapter, in one run).

For a policy that never tries what RL should reward, every group has the same reward and GRPO has nothing to
learn from: SmolLM2-135M-Instruct writes no <tool_call> in 64 samples of builtin:tool-arith (docs/environments.md).

Each conversation renders through the run's chat template (with the environment's tools listed), and its
assistant turns are found as the episodes find them (engine/rollout/episodes.py): each turn is the render ending with
it, cut after its end-of-turn token, less the render of what came before with the generation prompt. So the
trained tokens are exactly those the model samples in an episode, header excluded and end-of-turn included.

prepare(cfg, tokenizer, episodes)    rows read and tokenised before weights load (errors in one line)
run(examples, policy, …)             the steps, with its own AdamW; loss per step, as `warmup` events
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from ...contract.config import Config
from ...contract.errors import UserError
from ..model import policy_loader
from ..precision.numerics import LossScaler
from ..prompts import data, prompt_render

IGNORE = -100  # transformers' label for a position without loss


@dataclass
class Example:
    ids: list[int]
    trained: list[int]  # 1 on an assistant turn's tokens (its end-of-turn included), else 0


def _err(value, why: str) -> UserError:
    return UserError(why, key="warmup.source", value=value)


def transcript(render, messages: list[dict], eos: int, source: str) -> Example:
    """One conversation's ids and the mask of its assistant turns (the prefix-difference of two renders)."""
    ids: list[int] = []
    trained: list[int] = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        before = render(messages[:i], generation=True)
        upto = render(messages[: i + 1], generation=False)
        ends = [k for k, t in enumerate(upto) if t == eos and k >= len(before)]
        upto = upto[: ends[0] + 1] if ends else upto
        if before[: len(ids)] != ids or upto[: len(before)] != before:
            raise _err(
                source,
                "the chat template renders earlier turns differently as the conversation grows "
                "(not prefix-preserving), so its assistant turns cannot be found; use another data.chat_template",
            )
        trained += [0] * (len(before) - len(ids)) + [1] * (len(upto) - len(before))
        ids = upto
    if not any(trained):
        raise _err(source, "a conversation has no assistant turn to learn from; each `messages` needs one")
    return Example(ids, trained)


def prepare(cfg: Config, tokenizer, episodes) -> list[Example]:
    """The warm-up's conversations, tokenised (empty without warmup.source)."""
    source = cfg.warmup.source
    if not source:
        return []
    rows = data.source_rows(source, "warmup.source")
    if not rows or "messages" not in rows[0]:
        columns = ", ".join(rows[0]) if rows else "no rows"
        raise _err(source, f"needs a `messages` column of whole conversations; found: {columns}")
    if episodes:  # the episodes' template, with the environment's tools listed as in every episode
        template, tools = episodes.template, episodes.env.schemas or None
    else:
        template, tools = prompt_render.custom_template(cfg.data), None

    def render(messages, generation):
        return prompt_render.render_ids(tokenizer, messages, template, tools, generation)

    examples = []
    for row in rows:
        if not prompt_render.is_conversational(row["messages"]):
            raise _err(source, f"`messages` must be a list of {{role, content}} messages, got {row['messages']!r:.60}")
        examples.append(transcript(render, row["messages"], tokenizer.eos_token_id, source))
    longest, room = max(len(e.ids) for e in examples), cfg.rollout.max_prompt_len + cfg.rollout.max_completion_len
    if longest > room:  # the VRAM planner sizes every sequence of the run at most this long
        raise _err(
            source,
            f"the longest conversation renders to {longest} tokens; allowed: at most rollout.max_prompt_len + "
            f"rollout.max_completion_len = {room}",
        )
    return examples


def batches(examples: list[Example], size: int, steps: int, seed: int):
    """`steps` batches of `size` examples: shuffled passes over the conversations, as many as it takes."""
    rng, order = random.Random(seed), []
    for _ in range(steps):
        while len(order) < size:
            more = list(range(len(examples)))
            rng.shuffle(more)
            order += more
        yield [examples[i] for i in order[:size]]
        order = order[size:]


def tensors(batch: list[Example], pad: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input ids, attention mask and labels (IGNORE off the assistant turns), right-padded."""
    width = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)
    for row, e in enumerate(batch):
        n = len(e.ids)
        ids[row, :n] = torch.tensor(e.ids)
        attention[row, :n] = 1
        labels[row, :n] = torch.where(torch.tensor(e.trained) == 1, torch.tensor(e.ids), IGNORE)
    return ids.to(device), attention.to(device), labels.to(device)


def run(examples: list[Example], policy, cfg: Config, precision, pad: int, device, note) -> list[float]:
    """cfg.warmup.steps steps on the policy's trainable weights; note(step, loss) after each, which returns
    True to stop early. The losses."""
    w = cfg.warmup
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=w.lr, weight_decay=0.0)
    scaler = LossScaler.from_config(cfg, precision)
    losses = []
    for step, batch in enumerate(batches(examples, w.batch_size, w.steps, cfg.train.seed), start=1):
        ids, attention, labels = tensors(batch, pad, device)
        # the mean cross-entropy over the batch's assistant tokens (transformers shifts the labels by one)
        with policy_loader.autocast(precision):
            loss = policy(input_ids=ids, attention_mask=attention, labels=labels).loss
        scaler.scale(loss).backward()
        scaler.step(optimizer, params, cfg.train.grad_clip or None)
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if note(step, losses[-1]):
            break
    return losses
