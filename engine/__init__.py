"""grpo-studio's GRPO engine: everything that needs torch. Never imports textual (tests/test_import_hygiene.py).

Rooms by phase, lowest first. Each room's `__init__` says which rooms it may import; nothing imports a room
above it (tests/test_rooms.py reads every import, lazy ones too).

  prompts/         where prompts come from and how a row becomes the model's input
  precision/       the step's numerics (dtypes, loss scaling, FP8) and the sampler/trainer mismatch
  model/           the policy: loaded, LoRA, sharded, its weights for the rollout engine
  sampler/         rollout backends: hf, vllm, and the client of a rollout server (with its wire protocol)
  rollout_server/  a vLLM engine in its own process (grpo-studio rollout-serve)
  rollout/         prompts to a scored batch: completions or episodes, rewards, advantages
  train/           one optimizer step: log-probs, losses, backward, the step's metrics
  out/             checkpoints, exports, trackers, alerts
  run/             the run's life: the trainer, evaluation, rehearsal, ranks

Shared by every room:
  faults           out-of-memory and full-disk as one line

May import: contract, rewards.
"""

__version__ = "0.1.0"
