"""From prompts to a scored batch: G completions (or multi-turn episodes) per prompt, rewards, advantages.

rollouts          where batches come from: prompts -> G completions each, rewards, advantages
dynamic_sampling  DAPO's dynamic sampling: rounds until a rollout's groups have reward signal
advantages        group-relative advantages (GRPO, arXiv 2402.03300)
batching          the batch layout for the trainer's forward (token budgets, trimming) and the loss's inputs
sample_rows       samples.jsonl rows: prompt, completion, rewards, advantage, group, trained tokens
episodes          G episodes per prompt: model turns and environment tokens in one completion span, masks exact
tool_calls        tool calls read from a turn and run with a time bound; every failure a stop reason
tool_template     the chat template episodes render with, checked (tools rendered, prefix-preserving, eos)

May import: contract, rewards, engine.prompts, engine.precision, engine.model, engine.sampler.
"""
