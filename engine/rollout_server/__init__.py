"""The rollout server: a vLLM engine in its own process (`grpo-studio rollout-serve`), a thin HTTP API
(http_api.py) behind the guard and the weight transport the client shares (engine/sampler/auth.py: the shared
secret, the body limit; engine/sampler/transport.py: a torch.distributed group made for the weights). The
trainer's side is engine/sampler/remote.py. Design and protocol: docs/rollout_server.md.

  http_api       the HTTP API: generate, score, weights, health; serve() runs it
  __main__       the server as the trainer starts it (rollout.colocate = false, no rollout.server)

May import: contract, engine.prompts, engine.precision, engine.model, engine.sampler."""

import os

# torch's C++ side logs a stack dump for a weight store it cannot reach; the API answers that in one line.
# Set here, before http_api imports torch.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
