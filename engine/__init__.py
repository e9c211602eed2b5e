"""grpo-studio's GRPO engine: everything that needs torch. Never imports textual (tests/test_import_hygiene.py).

The loop
  trainer         the run's life: load, the loop, evaluate, checkpoint, resume, signals
  evaluation      held-out pass@1, pass@k and maj@k from train.eval_k samples per prompt
  grpo_step       one optimizer step: rollout, π_old, loss and backward, AdamW, mismatch, weight sync, metrics
  step_metrics    a step's metrics row: loss, lr, perf/* (wall time, FLOPs, MFU), mem/*, micro-batches merged
  skipped_steps   steps skipped for non-finite numbers; train.max_bad_steps in a row: diverged
  rollouts        where batches come from: prompts -> G completions each, rewards, advantages
  dynamic_sampling  DAPO's dynamic sampling: rounds until a rollout's groups have reward signal
  sample_rows     samples.jsonl rows: prompt, completion, rewards, advantage, group, trained tokens
  advantages      group-relative advantages (GRPO, arXiv 2402.03300)
  losses          policy losses: normalisation, PPO clipping, rollout-correction IS, KL
  zero_advantage  micro-batches whose every advantage is 0: backward skipped, the update bitwise the same
  logprobs        per-token log-probs under the training model (materialised or chunked)
  completion_packing  a prompt's completions packed side by side into fewer rows for the shared-prefix pass
  chunked_logsoftmax  the chunked path's autograd Function: log-probs over vocabulary tiles, no [N, V] logits
  batching        batch layout for the trainer's forward (token budgets, trimming)
  mismatch        rollout/train mismatch telemetry from (mu, pi, mask)
  checkpoint      checkpoints/step-N/: adapters or weights, optimizer, RNG, atomically
Models and precision
  policy_loader   tokenizer and model from a preset, a folder, a .gguf or the HF cache; LoRA via peft
  gguf_cache      a .gguf file as a Hugging Face folder, converted once and cached
  grouped_sdpa    transformers' sdpa attention reading grouped KV heads in place on CPU (no repeated KV cache)
  precision       torch dtypes, the FP16 dynamic loss scaler, gradient clipping
  fp8             FP8 (e4m3) linear layers, shared by the rollout and the trainer
  weights         the trainer's weights for the rollout engine (HF names, LoRA merged)
  flops           model FLOPs of a step and the matmul peak (MFU)
Data and rewards
  data            prompts: built-in tasks, local files, Hugging Face datasets; held-out rows; the seeded stream
  prompt_render   a row's prompt for the model: chat templates, tokenizing, the prompt-length check
  tasks           built-in tasks for chat models (builtin:NAME)
  arith           the built-in two-number addition task
  rewards/        reward functions in TRL's signature, contained
Multi-turn episodes (env.environment)
  episodes        G episodes per prompt: model turns and environment tokens in one completion span, masks exact
  tool_calls      tool calls read from a turn and run with a time bound; every failure a stop reason
  tool_template   the chat template episodes render with, checked (tools rendered, prefix-preserving, eos)
  warmup          the supervised warm-up before RL (warmup.source): cross-entropy on whole conversations' assistant turns
Rollouts and scale
  sampler/        rollout backends: hf, vllm, and the client of a rollout server
  rollout_server/ a vLLM engine in its own process (grpo-studio rollout-serve)
  distributed     data-parallel GRPO across torchrun's processes
  fsdp            FSDP2 sharding of the policy
Around the run
  outlets         trackers and alerts, fed every metrics row
  trackers        tracker fan-out (report.to)
  alerts          alert rules and events, delivered
  faults          out-of-memory and full-disk as one line
  host_memory     glibc's malloc keeping what a CPU micro-batch frees (no page faults on the next one)
  rehearsal       train --rehearse: one real step on the longest prompt at full completion length, its peak memory
  export          a checkpoint as merged safetensors, GGUF, or a Hub push
"""

__version__ = "0.1.0"
