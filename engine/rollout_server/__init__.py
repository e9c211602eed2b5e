"""The rollout server: a vLLM engine in its own process (`grpo-studio rollout-serve`), a thin HTTP API
(http_api.py) behind its guard (auth.py: the shared secret, the body limit) and the weight transport over a
torch.distributed group made for it (transport.py). The trainer's side is engine/sampler/remote.py. Design and
protocol: docs/rollout_server.md."""
