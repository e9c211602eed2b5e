"""The policy as a module: loaded, adapted, sharded, and its weights handed to a rollout engine.

policy_loader  tokenizer and model from a preset, a folder, a .gguf or the HF cache; LoRA via peft
gguf_cache     a .gguf file as a Hugging Face folder, converted once and cached
grouped_sdpa   transformers' sdpa attention reading grouped KV heads in place on CPU (no repeated KV cache)
fsdp           FSDP2 sharding of the policy
weights        the trainer's weights for the rollout engine (HF names, LoRA merged)
moe            mixture-of-experts routers: each token's experts recorded, replayed (R3) and compared

May import: contract, engine.precision, engine.prompts.
"""
