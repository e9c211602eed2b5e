"""The VRAM planner: will a config fit, before anything loads. Pure python, like the rest of the contract.

vram           the entry points: estimate (either mode, every device), the rollout's rows (KV cache, vLLM)
               and solve, with its typed results (largest batch, fits or not)
breakdown      what a plan is made of: Row, Device, Breakdown, the byte sizes and constants, phase_peak
train_memory   the accurate mode for one training rank: weights, trainable state, activations, logits
documented     Unsloth's documented formulas, the planner's other mode
devices        per-device rows under DDP / FSDP2 / a rollout server, and the peak rule
reward_models  the rows for reward models (rewards.funcs = ["rm:PATH"])
preflight      the launch check `grpo-studio train` and the studio run before loading: fits, or says why
micro_batch    train.micro_batch_size = auto: the most whole groups whose planned peak fits free memory
"""
