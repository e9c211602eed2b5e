"""`grpo-studio bench mismatch`: the rollout/train mismatch of each precision, measured end to end.

For every precision name the same prompts are sampled with the same seed by the rollout
backend (grpo_studio.engine.sampler.make_sampler: hf or vllm) in that precision's rollout dtype, and the
sampled tokens are scored by the trainer's own path in its dtype: grpo_studio.engine.model.policy_loader.load_policy
(LoRA/full FT, fp8 patching), grpo_studio.engine.rollout.batching.join_prompt_completion (the trainer's batch
layout), grpo_studio.engine.model.policy_loader.autocast and grpo_studio.engine.train.logprobs.token_logprobs at the sampler's temperature.
The mismatch metrics are grpo_studio.engine.precision.mismatch.mismatch_metrics(μ, π, mask), exactly what a
training step logs for its first step (before any update).

    name          trainer (model.dtype)        rollout (rollout.dtype)
    fp32          fp32                         fp32
    bf16          bf16                         bf16
    fp16          fp16                         fp16
    fp8-unified   fp8 (bf16 weights, FP8 GEMMs) fp8   Jet-RL: one FP8 flow on both sides
    fp8-rollout   bf16                         fp8   BF16-train + FP8-rollout

Ratios are against fp16 measured in the same run (arXiv 2510.26788: fp16 on both sides removes
most of bf16's mismatch). The recipe (default tiny-arith) supplies everything else: temperature,
data; `--set section.key=value` overrides it like `grpo-studio train`.

The trainer is a full fine-tune by default (--lora-rank 0): fp32 master weights with the
forward under autocast(bf16|fp16), against the rollout's own copy stored in bf16|fp16 — the
usual mixed-precision trainer + low-precision inference engine pair. With LoRA (--lora-rank N)
the bench measures the untrained adapter (B = 0): the trainer's base weights are stored in the
rollout dtype too, and with the hf backend both sides then run the same kernels on the same
weights, so bf16 shows little or no mismatch before the first update (in training the merged
bf16 weights the rollout receives are what drifts).
"""

from __future__ import annotations

import math
import sys
import time

PRECISIONS: dict[str, tuple[str, str]] = {  # name -> (model.dtype, rollout.dtype)
    "fp32": ("fp32", "fp32"),
    "bf16": ("bf16", "bf16"),
    "fp16": ("fp16", "fp16"),
    "fp8-unified": ("fp8", "fp8"),
    "fp8-rollout": ("bf16", "fp8"),
}
BASELINE = "fp16"
SHOWN = {  # metric -> column header
    "mismatch/k3": "k3",
    "mismatch/k1": "k1",
    "mismatch/abs_dlogp_mean": "|Δlogp| mean",
    "mismatch/abs_dlogp_max": "|Δlogp| max",
    "mismatch/abs_dp_mean": "|Δp| mean",
    "mismatch/is_min": "IS min",
    "mismatch/is_max": "IS max",
    "mismatch/ess": "ESS",
    "mismatch/router_disagree": "router ≠",  # MoE models (--moe)
}


def parse_dtypes(text: str) -> list[str]:
    """--dtypes: a comma list of PRECISIONS names, in order, without repeats."""
    from ..contract.errors import UserError

    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UserError("empty", kind="bench", key="--dtypes", value=text, allowed=PRECISIONS)
    for n in names:
        if n not in PRECISIONS:
            raise UserError(f"{n!r} is not a precision", kind="bench", key="--dtypes", allowed=PRECISIONS, near=n)
    return list(dict.fromkeys(names))


def precision_config(
    name: str,
    *,
    backend: str = "hf",
    model: str | None = None,
    recipe: str = "tiny-arith",
    lora_rank: int = 0,
    max_tokens: int = 8,
    generations: int = 4,
    seed: int = 0,
    overrides=(),
):
    """The Config a training run in precision `name` would use (the recipe + the precision's dtypes)."""
    from ..contract import config

    model_dtype, rollout_dtype = PRECISIONS[name]
    sets = [
        f"model.lora_rank={lora_rank}",
        *overrides,
        f"model.dtype={model_dtype}",
        f"rollout.dtype={rollout_dtype}",
        "precision.fp8_flow=auto",
        f"rollout.backend={backend}",
        f"rollout.max_completion_len={max_tokens}",
        f"rollout.num_generations={generations}",
        f"train.seed={seed}",
    ]
    if model:
        sets.insert(0, f"model.name={model}")
    return config.load(recipe, sets)


def measure_one(cfg, prompt_ids: list[list[int]], seed: int, replay: str | None = None) -> dict:
    """Sample `prompt_ids` with cfg's rollout backend, score the samples with cfg's trainer, return metrics.
    `replay` (an MoE model, --moe): the trainer's forward replays the sampler's experts ("replay") or only
    compares them ("off"), as algo.router_replay; mismatch/router_disagree is then measured too."""
    import torch

    from ..contract import precision_plan
    from ..engine.model import policy_loader
    from ..engine.precision.mismatch import mismatch_metrics
    from ..engine.rollout.batching import join_prompt_completion
    from ..engine.sampler import Sampling, make_sampler
    from ..engine.train.logprobs import token_logprobs

    r, plan = cfg.rollout, precision_plan.resolve(cfg)
    path = policy_loader.resolve_model_path(cfg.model.name)
    tokenizer = policy_loader.load_tokenizer(path)
    dev = policy_loader.device()
    sampling = Sampling.of(r, seed)  # as the trainer's rollouts sample
    t0 = time.perf_counter()
    backend = make_sampler(cfg, path, tokenizer, plan)
    try:
        out = backend.generate(prompt_ids, sampling)
    finally:
        backend.close()
        del backend
    t_rollout = time.perf_counter() - t0

    # The trainer side, as Trainer.step scores a rollout (before the first update).
    t1 = time.perf_counter()
    torch.manual_seed(cfg.train.seed)
    policy = policy_loader.load_policy(cfg, path, plan).to(dev)
    input_ids, attention = join_prompt_completion(
        prompt_ids, out.completion_ids, r.num_generations, tokenizer.pad_token_id, dev
    )
    if replay is not None:
        from ..engine.model.moe import RouterReplay

        routers = RouterReplay.for_policy(policy, replay)
        routers.use(
            out.routes.layout(None, input_ids.shape[1] - out.completion_ids.shape[1], out.completion_ids.shape[1])
        )
    with torch.no_grad(), policy_loader.autocast(precision_plan.resolve(cfg)):
        width = out.completion_ids.shape[1]
        logps, _ = token_logprobs(policy, input_ids, attention, width, r.temperature, support=out.support)
    del policy
    t_train = time.perf_counter() - t1

    metrics = mismatch_metrics(out.logprobs, logps.detach().float().cpu(), out.mask)
    if replay is not None:
        metrics.update(routers.metrics())
    return {
        "trainer": plan.train_compute,
        "rollout": plan.rollout_compute,
        "model_dtype": cfg.model.dtype,
        "rollout_dtype": plan.rollout_dtype,
        "backend": cfg.rollout.backend,
        **metrics,
        "completion/len_mean": float(out.mask.sum(1).float().mean()),
        "perf/rollout_s": t_rollout,
        "perf/train_s": t_train,
    }


def prompts_for(cfg, n: int, seed: int) -> list[list[int]]:
    """The first n prompts of the recipe's seeded training stream, tokenized as Trainer.step does."""
    from ..engine.model import policy_loader
    from ..engine.prompts import data, prompt_render

    tokenizer = policy_loader.load_tokenizer(policy_loader.resolve_model_path(cfg.model.name))
    rows = data.PromptStream(data.load_rows(cfg.data, "train"), seed).take(n)
    texts = [prompt_render.prompt_text(row, cfg.data, tokenizer) for row in rows]
    return prompt_render.encode_prompts(tokenizer, texts, cfg.rollout.max_prompt_len)


def run(
    names: list[str],
    *,
    backend: str = "hf",
    model: str | None = None,
    recipe: str = "tiny-arith",
    lora_rank: int = 0,
    prompts: int = 64,
    generations: int = 4,
    max_tokens: int = 8,
    seed: int = 0,
    overrides=(),
    progress=None,
    moe: bool = False,
) -> dict:
    """Measure every precision in `names` on the same prompts and seed. Returns the JSON report. `moe`: each
    precision twice, the trainer replaying the sampler's experts or not (rows "NAME replay" and "NAME"), on
    `model` or the tiny MoE (benchmarks/tiny_moe.py)."""
    from ..contract.errors import UserError

    if moe and backend != "hf":
        raise UserError(
            "the sampler's experts come from the hf rollout (vLLM's need its Model Runner V2)",
            kind="bench",
            key="--moe",
            value=f"--backend {backend}",
        )
    if moe and model is None:
        import tempfile

        from .tiny_moe import build_tiny_moe

        model = str(build_tiny_moe(tempfile.mkdtemp(prefix="tiny-moe-")))

    cfgs = {
        n: precision_config(
            n,
            backend=backend,
            model=model,
            recipe=recipe,
            lora_rank=lora_rank,
            max_tokens=max_tokens,
            generations=generations,
            seed=seed,
            overrides=overrides,
        )
        for n in names
    }
    first = cfgs[names[0]]
    prompt_ids = prompts_for(first, prompts, seed)
    results: dict[str, dict] = {}
    runs = [(n, f"{n} replay" if mode == "replay" else n, mode) for n in names for mode in ("off", "replay")]
    for n, row, mode in runs if moe else [(n, n, None) for n in names]:
        if progress:
            progress(row)
        try:
            results[row] = measure_one(cfgs[n], prompt_ids, seed, mode)
        except UserError as err:  # e.g. a backend that cannot run this precision
            results[row] = {"error": str(err)}
    base = results.get(BASELINE, {})
    for res in results.values():
        if "error" in res:
            continue
        for key, col in (("mismatch/k3", "k3_vs_fp16"), ("mismatch/abs_dlogp_mean", "abs_dlogp_vs_fp16")):
            b = base.get(key)
            res[col] = res[key] / b if b else None
    return {
        "benchmark": "mismatch",
        "backend": backend,
        "model": first.model.name,
        "recipe": recipe,
        "lora_rank": first.model.lora_rank,
        "temperature": first.rollout.temperature,
        "workload": {"prompts": prompts, "generations": generations, "max_tokens": max_tokens, "seed": seed},
        "results": results,
        "checks": checks(results),
    }


def checks(results: dict) -> dict:
    """The orderings 2510.26788 and Jet-RL predict, where both sides were measured."""
    k3 = {n: r["mismatch/k3"] for n, r in results.items() if "mismatch/k3" in r}
    out = {}
    if "bf16" in k3 and "fp16" in k3:
        out["bf16 >= 10x fp16"] = k3["bf16"] >= 10 * k3["fp16"]
    if "fp16" in k3 and "fp32" in k3:
        out["fp16 >= 10x fp32"] = k3["fp16"] >= 10 * k3["fp32"]
    if "fp8-unified" in k3 and "fp8-rollout" in k3:
        out["fp8-unified < fp8-rollout"] = k3["fp8-unified"] < k3["fp8-rollout"]
    return out


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v == 0.0:
            return "0"
        if not math.isfinite(v):
            return str(v)
        return f"{v:.3g}" if 1e-3 <= abs(v) < 1e4 else f"{v:.2e}"
    return str(v)


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    w = report["workload"]
    table = Table(
        title=f"mismatch: {report['model']} (lora_rank {report['lora_rank']}), backend {report['backend']}, "
        f"{w['prompts']} prompts x {w['generations']} x <= {w['max_tokens']} tokens, "
        f"T={report['temperature']:g}, seed {w['seed']}"
    )
    table.add_column("precision")
    table.add_column("trainer/rollout")
    table.add_column("tokens", justify="right")
    for header in SHOWN.values():
        table.add_column(header, justify="right")
    table.add_column("k3 ÷ fp16", justify="right")
    table.add_column("|Δlogp| ÷ fp16", justify="right")
    for name, res in report["results"].items():
        if "error" in res:
            table.add_row(name, "-", "-", *["-"] * len(SHOWN), "-", "-")
            continue
        table.add_row(
            name,
            f"{res['trainer']}/{res['rollout']}",
            f"{int(res['mismatch/tokens'])}",
            *[_fmt(res.get(k)) for k in SHOWN],
            _fmt(res["k3_vs_fp16"]),
            _fmt(res["abs_dlogp_vs_fp16"]),
        )
    console = Console(width=None if sys.stdout.isatty() else 170)  # piped: do not squeeze to 80
    console.print(table)
    for name, res in report["results"].items():
        if "error" in res:
            console.print(f"{name}: {res['error']}", markup=False)
    for check, ok in report["checks"].items():
        console.print(f"{'ok  ' if ok else 'FAIL'} {check}", markup=False)
