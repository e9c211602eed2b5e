"""One optimizer step on a scored batch, read top to bottom in grpo_step.

grpo_step           one optimizer step: rollout, π_old, loss and backward, AdamW, mismatch, weight sync, metrics
step_metrics        a step's metrics row: loss, lr, perf/* (wall time, FLOPs, MFU), mem/*, micro-batches merged
losses              policy losses: normalisation, PPO clipping, rollout-correction IS, KL
logprobs            per-token log-probs under the training model (materialised or chunked)
chunked_logsoftmax  the chunked path's autograd Function: log-probs over vocabulary tiles, no [N, V] logits
completion_packing  a prompt's completions packed side by side into fewer rows for the shared-prefix pass
zero_advantage      micro-batches whose every advantage is 0: backward skipped, the update bitwise the same
skipped_steps       steps skipped for non-finite numbers; train.max_bad_steps in a row: diverged
flops               model FLOPs of a step and the matmul peak (MFU)
warmup              the supervised warm-up before RL (warmup.source): cross-entropy on conversations' assistant turns

May import: contract, rewards, engine.prompts, engine.precision, engine.model, engine.sampler, engine.out, engine.rollout.
"""
