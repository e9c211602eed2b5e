"""The run's life: load, the loop, evaluate, checkpoint, resume, signals; and its ranks.

trainer        the run's life: load, the loop, evaluate, checkpoint, resume, signals
evaluation     held-out pass@1, pass@k and maj@k from train.eval_k samples per prompt
rehearsal      train --rehearse: one real step on the longest prompt at full completion length, its peak memory
host_memory    glibc's malloc keeping what a CPU micro-batch frees (no page faults on the next one)
distributed    data-parallel GRPO across torchrun's processes

May import: contract, rewards, engine.prompts, engine.precision, engine.model, engine.sampler, engine.rollout, engine.train, engine.out.
"""
