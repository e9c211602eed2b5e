"""The VRAM planner: will a config fit, before anything loads. Pure python, like the rest of the contract.

  vram           the accurate mode: rows with a phase (weights, optimizer, activations, logits, KV cache...)
                 and the typed solve results (largest batch, fits or not)
  documented     Unsloth's documented formulas, the planner's other mode
  devices        per-device rows under DDP / FSDP2 / a rollout server, and the peak rule
  reward_models  the rows for reward models (rewards.funcs = ["rm:PATH"])
  preflight      the launch check `grpo-studio train` and the studio run before loading: fits, or says why
"""
