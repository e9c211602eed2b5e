"""grpo-studio's terminal studio and CLI. Never imports torch, transformers or vllm."""
