"""The prompts a run trains on: where rows come from and how a row becomes the model's input.

data           prompts: built-in tasks, local files, Hugging Face datasets; held-out rows; the seeded stream
prompt_render  a row's prompt for the model: chat templates, tokenizing, the prompt-length check
tasks          built-in tasks for chat models (builtin:NAME)
arith          the built-in two-number addition task

May import: contract, rewards.
"""
