"""`grpo-studio bench vram-accuracy`: the accurate-mode estimate against real training steps.

For each configuration a tiny model is built from a transformers config (Llama, Qwen3, Gemma3), or the
real packaged SmolLM2-135M-Instruct is taken (random token ids below 4,096 are its real tokens too),
loaded through the engine (engine/model/policy_loader.py), and one GRPO-shaped step runs through the engine's
own log-prob path (engine/train/logprobs.py), a policy-gradient loss, backward and AdamW. Measured:

  weights            bytes of every parameter storage (a 4-bit base: with the quantisation state each
                     bitsandbytes weight carries outside the parameters: absmax scales, code tables)
  train state        trainable params (LoRA) + .grad + AdamW state after the step, plus the
                     autocast low-precision weight copies seen among the saved tensors
  activations        bytes saved for backward (torch.autograd.graph.saved_tensors_hooks) from the
                     embedding to the final norm; with gradient checkpointing, the checkpointed
                     inputs plus the largest layer's saved bytes (the one layer recomputed in backward)
  logits             saved bytes from lm_head on + the materialised logits tensor
  peak               the largest live tensor memory during the step (a TorchDispatchMode that
                     follows every storage an op returns until it is freed) plus what lived before

On CUDA the peak is torch.cuda.max_memory_allocated (UNTESTED: no GPU was available when
this was written). The estimate is grpo_studio.contract.planner.vram in accurate mode with device="cpu" (no CUDA
context/margin rows) or "cuda".

A case with `world = 2` runs as two processes (gloo, engine/run/distributed.py): each rank measures its share of
the rows; ddp's step includes the engine's gradient all-reduce (reduce_gradients); fsdp's policy is sharded
by engine/model/fsdp.py, and only its local shards (weights, state) and the step's peak are measured. The estimate
is the planner's per-rank plan (world_size = 2). Rank 0's numbers are reported.
"""

from __future__ import annotations

import tempfile

from .tensor_bytes import (
    LiveBytes,
    persistent_tensors,
    sum_tags,
    unique_storages,
    with_quant_states,
)
from .vram_cases import ARCH, CASES, PROMPT, PROMPTS_PER_STEP, Case, model_folder

TOLERANCE = 0.15


def measure(case: Case, folder: str, group=None) -> dict:
    """One step's components and peak; with a data-parallel `group` (engine/run/distributed.py) this rank's share
    of the rows and the gradient all-reduce after the backward."""
    import torch

    from ..contract import precision_plan
    from ..engine.model import policy_loader
    from ..engine.train.logprobs import token_logprobs

    cfg = _config(case)
    cfg.model.name = folder
    policy = policy_loader.load_policy(cfg, folder, precision_plan.resolve(cfg))
    dev = policy_loader.device()
    policy.to(dev)
    policy.train()  # HF checkpoints layers only in train mode (the engine's trainer does not call .train())
    params = [p for p in policy.parameters()]
    trainable = [p for p in params if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4)
    param_ptrs = {p.untyped_storage().data_ptr() for p in params}
    param_shapes = {tuple(p.shape) for p in params if p.dim() == 2}
    frozen = params if case.lora_rank == 0 else [p for p in params if not p.requires_grad]
    weights = sum(t.untyped_storage().nbytes() for t in unique_storages(with_quant_states(frozen)))

    B, T = PROMPTS_PER_STEP // case.world * case.generations, PROMPT + case.completion
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, ARCH["vocab_size"], (B, T), generator=gen).to(dev)
    attention = torch.ones_like(ids)
    attention[::2, : PROMPT // 3] = 0  # left padding, as the trainer's batches have
    adv = torch.randn(B, 1, generator=gen).to(dev)

    def step(hooks=None):
        optimizer.zero_grad(set_to_none=True)
        with policy_loader.autocast(precision_plan.resolve(cfg)):
            if hooks is None:
                logps, _ = token_logprobs(policy, ids, attention, case.completion)
            else:
                with torch.autograd.graph.saved_tensors_hooks(*hooks):
                    logps, _ = token_logprobs(policy, ids, attention, case.completion)
        loss = -(logps * adv).mean()
        loss.backward()
        if group is not None:
            group.reduce_gradients(trainable, loss.item(), torch.ones(B, case.completion), "grpo")
        optimizer.step()

    step()  # AdamW state exists from here on

    # saved tensors, tagged by where they were saved
    tag, saved = ["outside"], {}
    layers = policy.get_decoder().layers
    for i, layer in enumerate(layers):
        layer.register_forward_pre_hook(lambda m, a, i=i: tag.__setitem__(0, f"L{i}"))
        layer.register_forward_hook(lambda m, a, o: tag.__setitem__(0, "outside"))
    policy.get_decoder().norm.register_forward_hook(lambda m, a, o: tag.__setitem__(0, "logits"))

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in param_ptrs and st.data_ptr() not in saved:
            cast = tuple(t.shape) in param_shapes and t.dtype != torch.float32
            saved[st.data_ptr()] = ("autocast" if cast else tag[0], st.nbytes())
        return t

    def _reset_tag(*_):
        tag[0] = "outside"

    policy.get_decoder().register_forward_pre_hook(_reset_tag)

    if dev.type == "cuda":  # UNTESTED: no GPU in the session that wrote this
        torch.cuda.reset_peak_memory_stats()
        step((pack, lambda t: t))
        peak = torch.cuda.max_memory_allocated()  # persistent weights/optimizer included, like the CPU path
    else:
        before = sum(t.untyped_storage().nbytes() for t in persistent_tensors(with_quant_states(params), optimizer))
        tracker = LiveBytes()
        with tracker.mode:
            step((pack, lambda t: t))
        peak = before + tracker.peak

    by_tag: dict[str, int] = {}
    for where, n in saved.values():
        by_tag[where] = by_tag.get(where, 0) + n
    layer_bytes = [v for k, v in by_tag.items() if k.startswith("L")]
    activations = sum(layer_bytes) + by_tag.get("outside", 0)
    if case.checkpointing:  # the layer recomputed in backward: its saved bytes from a plain forward
        policy.base_model.model.gradient_checkpointing_disable() if case.lora_rank else policy.gradient_checkpointing_disable()
        saved.clear()
        with (
            policy_loader.autocast(precision_plan.resolve(cfg)),
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
        ):
            token_logprobs(policy, ids, attention, case.completion)
        one = max(v for k, v in sum_tags(saved).items() if k.startswith("L"))
        activations += one
    logits = _logits_peak(policy, cfg, ids, attention, case.completion, adv)
    state = sum(t.untyped_storage().nbytes() for t in persistent_tensors(trainable, optimizer, grads=True))
    if case.lora_rank == 0:
        state -= sum(p.untyped_storage().nbytes() for p in trainable)  # the fp32 master is the weights row
    state += by_tag.get("autocast", 0)
    return {
        "base weights": weights,
        "train state": state,
        "activations": activations,
        "logits + log-softmax": logits,
        "peak": peak,
    }


def _logits_peak(policy, cfg, ids, attention, completion: int, adv) -> int:
    """Peak live bytes of lm_head -> engine log-probs -> loss -> backward, from fixed final hidden states."""
    import types

    import torch

    from ..contract import precision_plan
    from ..engine.model import policy_loader
    from ..engine.train.logprobs import token_logprobs

    with torch.no_grad(), policy_loader.autocast(precision_plan.resolve(cfg)):
        hidden = policy.get_decoder()(input_ids=ids, attention_mask=attention).last_hidden_state
    hidden = hidden.detach().requires_grad_(True)
    head = policy.get_output_embeddings()

    def fake_model(logits_to_keep: int, **_):
        return types.SimpleNamespace(logits=head(hidden[:, -logits_to_keep:]))

    tracker = LiveBytes()
    with tracker.mode, policy_loader.autocast(precision_plan.resolve(cfg)):
        logps, _ = token_logprobs(fake_model, ids, attention, completion)
        (-(logps * adv).mean()).backward()
    return tracker.peak - hidden.grad.untyped_storage().nbytes() if hidden.grad is not None else tracker.peak


def _config(case: Case):
    from ..contract.config import Config

    cfg = Config()
    cfg.model.dtype, cfg.model.lora_rank = case.dtype, case.lora_rank
    cfg.model.gradient_checkpointing = case.checkpointing
    cfg.model.load_in_4bit = case.load_in_4bit
    cfg.rollout.num_generations, cfg.rollout.max_completion_len = case.generations, case.completion
    cfg.rollout.max_prompt_len, cfg.train.prompts_per_step = PROMPT, PROMPTS_PER_STEP
    return cfg


def estimate(case: Case, folder: str, device: str) -> dict:
    from ..contract import model_card
    from ..contract.planner import vram

    card = model_card.load(folder)
    cfg = _config(case)
    cfg.train.parallel = case.parallel if case.world > 1 else "none"
    est = vram.estimate(card, cfg, "accurate", device=device, world_size=case.world)
    rows = {r.name: r.gib * vram.GIB for r in est.rows}
    state = rows.get("LoRA adapter + AdamW", rows.get("full FT grads + AdamW", 0.0))
    train = ("base weights", "activations", "logits + log-softmax")
    out = {k: rows[k] for k in train}
    out["train state"] = state
    # training phase (the rollout KV is freed before it, hf backend): forward/backward, or the all-reduce after
    forward = out["activations"] + out["logits + log-softmax"] + rows.get("FSDP gathered weights", 0.0)
    out["peak"] = out["base weights"] + state + max(forward, rows.get("ddp gradient all-reduce", 0.0))
    return out


def measure_ranks(case: Case, folder: str) -> dict:
    """Rank 0's measure() (ddp) or measure_sharded() (fsdp) in a `case.world`-process gloo job
    (torch.multiprocessing, engine/run/distributed.py)."""
    import json
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tempfile.mkdtemp(prefix="vram-ddp-")
    mp.spawn(_rank, (case, folder, port, out), nprocs=case.world)
    with open(f"{out}/rank0.json") as f:
        return json.load(f)


def measure_sharded(case: Case, folder: str, group) -> dict:
    """fsdp (engine/model/fsdp.py through the group's wrap): this rank's local shards of the weights and of the
    trainable state, and the live-tensor peak of one step on its share of the rows. The components are not
    split: saved-tensor hooks cannot tell gathered parameters from activations."""
    import torch

    from ..contract import precision_plan
    from ..engine.model import policy_loader
    from ..engine.train.logprobs import token_logprobs

    cfg = _config(case)
    cfg.model.name, cfg.train.parallel = folder, "fsdp"
    policy = group.wrap(policy_loader.load_policy(cfg, folder, precision_plan.resolve(cfg)), cfg)
    policy.train()
    params = list(policy.parameters())
    trainable = [p for p in params if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4)
    B, T = PROMPTS_PER_STEP // case.world * case.generations, PROMPT + case.completion
    gen = torch.Generator().manual_seed(group.rank)
    ids = torch.randint(0, ARCH["vocab_size"], (B, T), generator=gen)
    attention = torch.ones_like(ids)
    attention[::2, : PROMPT // 3] = 0
    adv = torch.randn(B, 1, generator=gen)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with policy_loader.autocast(precision_plan.resolve(cfg)):
            logps, _ = token_logprobs(policy, ids, attention, case.completion)
        (-(logps * adv).mean()).backward()
        optimizer.step()

    def local(tensors) -> int:
        return sum(
            t.untyped_storage().nbytes() for t in unique_storages([getattr(t, "_local_tensor", t) for t in tensors])
        )

    step()
    adam = [v for st in optimizer.state.values() for v in st.values() if v.dim() > 0]
    weights, state = local(params), local(adam + [p.grad for p in trainable if p.grad is not None])
    if case.lora_rank:  # the adapters' fp32 weights are part of the LoRA state row
        weights, state = weights - local(trainable), state + local(trainable)
    before = local(params) + local(adam)  # step() sets the grads to None first: they are counted live
    tracker = LiveBytes()
    with tracker.mode:
        step()
    return {"base weights": weights, "train state": state, "peak": before + tracker.peak}


def _rank(rank: int, case: Case, folder: str, port: int, out: str) -> None:
    import json
    import os

    import torch

    from ..engine.run import distributed

    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(case.world)
    )
    cfg = _config(case)
    cfg.train.parallel = case.parallel
    group = (distributed.Sharded if case.parallel == "fsdp" else distributed.Group)(cfg)
    try:
        result = (measure_sharded if case.parallel == "fsdp" else measure)(case, folder, group)
    finally:
        group.close()
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(result, f)


ROWS = ["base weights", "train state", "activations", "logits + log-softmax"]


def run(cases=CASES) -> list[dict]:
    import torch

    torch.set_num_threads(2)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results, folders = [], {}
    for case in cases:
        if case.family not in folders:
            folders[case.family] = model_folder(case.family)
        meas = (measure_ranks if case.world > 1 else measure)(case, folders[case.family])
        est = estimate(case, folders[case.family], device)
        rows = [k for k in ROWS if k in meas]  # fsdp measures weights and state, not activations or logits
        meas["sum"] = sum(meas[k] for k in rows)
        est["sum"] = sum(est[k] for k in rows)
        results.append(
            {
                "config": case.name,
                "device": device,
                "estimate": est,
                "measured": meas,
                "error": {k: None if k not in meas else (est[k] - meas[k]) / meas[k] if meas[k] else 0.0 for k in est},
            }
        )
    return results


def report(results: list[dict]) -> dict:
    """The JSON report: ok when the sum of measured components is within TOLERANCE of the estimate for every
    config (the issue's criterion; the peak is reported)."""
    return {"tolerance": TOLERANCE, "ok": all(abs(r["error"]["sum"]) <= TOLERANCE for r in results), "results": results}


def print_report(report: dict) -> None:
    results, ok = report["results"], report["ok"]
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"vram-accuracy ({results[0]['device']}): estimate / measured MiB, error")
    table.add_column("config")
    for k in ROWS + ["sum", "peak"]:
        table.add_column(k, justify="right")
    for r in results:
        cells = [
            f"{r['estimate'][k] / 2**20:.2f} / {r['measured'][k] / 2**20:.2f}  {r['error'][k]:+.1%}"
            if r["error"][k] is not None
            else f"{r['estimate'][k] / 2**20:.2f} / —"
            for k in ROWS + ["sum", "peak"]
        ]
        table.add_row(r["config"], *cells)
    Console().print(table)
    print(
        f"{'PASS' if ok else 'FAIL'}: sum of measured components within ±{TOLERANCE:.0%} of the estimate for "
        f"every config (peak: live-tensor peak, informational; AdamW step temporaries are not modelled)"
    )
