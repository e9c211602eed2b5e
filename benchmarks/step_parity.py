"""`bench step`'s parity line: before anything is timed, both sides' gradients on one shared rollout.

Our Trainer samples one rollout (prompts, G completions, rewards, advantages) and takes its gradient as a
step does (GRPOStep._accumulate, micro-batches and shared prefix included). TRL's GRPOTrainer, built on the
same settings (step_sides.trl_trainer), gets our LoRA weights copied in by name and takes its gradient on the
same rows as its training pass does: its micro-batches (per_device_train_batch_size rows), each through its
own `compute_loss` (scaled for gradient accumulation) and backward. Where the rollout's rewards are all equal
(a zero gradient would match vacuously) both sides get the same seeded N(0, 1) advantages instead, and the
line says so. The line reports the relative L2 distance of the two gradients over every trainable weight;
the timed steps are comparable only where it is small (fp32 rounding: about 1e-6 to 1e-4).
"""

from __future__ import annotations

import gc
import tempfile

from .step_measure import Workload

TOLERANCE = 1e-4  # relative L2 distance of the two gradients that still counts as the same gradient


def gradient_parity(w: Workload, model_path: str) -> dict:
    from .step_sides import bench_config, trl_trainer

    cfg = bench_config(w, model_path, "hf", steps=1)
    return shared_rollout_parity(cfg, lambda tmp: trl_trainer(w, model_path, cfg, tmp, steps=1), w.seed)


def shared_rollout_parity(cfg, make_trl, seed: int, run_dir: str | None = None) -> dict:
    """Our Trainer on `cfg` (in `run_dir`, or a throwaway one) against the TRL GRPOTrainer `make_trl(tmp)` builds:
    both sides' loss and gradient on our one rollout (the module's docstring says how)."""
    import torch

    from ..engine.rollout.batching import spans
    from ..engine.run.trainer import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, run_dir or f"{tmp}/run")
        trainer.rundir.acquire()
        try:
            step = trainer.grpo
            batch = step.rollouts.next(0, 0)
            source = "the rollout's"
            if not batch.inputs.advantages.any():  # all rewards equal: a zero gradient would pass vacuously
                gen = torch.Generator().manual_seed(seed)
                batch.inputs.advantages = torch.randn(batch.inputs.advantages.shape, generator=gen).to(
                    batch.inputs.advantages
                )
                source = "seeded N(0, 1) (the rollout's rewards were all equal)"
            ours_loss = step._accumulate(
                batch.input_ids, batch.attention, batch.inputs, batch.num_items, spans(batch.rollout.mask)
            ).loss
            trained = {n: p for n, p in trainer.policy.named_parameters() if p.requires_grad}
            weights = {n: p.detach().clone() for n, p in trained.items()}
            ours = {n: p.grad.detach().clone() for n, p in trained.items()}
        finally:
            trainer.rundir.release()
            trainer.close()
        del trainer, step, trained  # one model at a time in memory
        gc.collect()
        theirs = make_trl(tmp)
        model = theirs.model
        named = {n: p for n, p in model.named_parameters() if p.requires_grad}
        if set(named) != set(weights):
            differ = sorted(set(named) ^ set(weights))
            return {"ok": False, "why": f"the trained weights' names differ, e.g. {differ[:2]}"}
        with torch.no_grad():
            for n, v in weights.items():
                named[n].copy_(v.to(named[n].device))
        T, mask = batch.inputs.mask.shape[1], batch.inputs.mask
        micro = theirs.args.per_device_train_batch_size
        # TRL's training pass: its micro-batches, each loss scaled for accumulation, one backward each
        model.train()
        theirs.current_gradient_accumulation_steps = theirs.args.gradient_accumulation_steps
        model.zero_grad(set_to_none=True)
        trl_loss = 0.0
        for rows in torch.arange(mask.shape[0]).split(micro):
            loss = theirs.compute_loss(
                model,
                {
                    "prompt_ids": batch.input_ids[rows, :-T],
                    "prompt_mask": batch.attention[rows, :-T],
                    "completion_ids": batch.input_ids[rows, -T:],
                    "completion_mask": mask[rows].to(batch.attention.dtype),
                    "advantages": batch.inputs.advantages[rows],
                    "num_items_in_batch": torch.as_tensor(float(batch.num_items)),
                },
            )
            loss.backward()
            trl_loss += loss.item()
        a = torch.cat([ours[n].flatten().double().cpu() for n in sorted(ours)])
        b = torch.cat([named[n].grad.flatten().double().cpu() for n in sorted(ours)])
    distance = ((a - b).norm() / b.norm().clamp(min=1e-30)).item()
    return {
        "ok": distance < TOLERANCE,
        "grad_rel_l2": float(f"{distance:.3g}"),
        "loss_ours": float(f"{ours_loss:.6g}"),
        "loss_trl": float(f"{trl_loss:.6g}"),
        "advantages": source,
        "rows": int(mask.shape[0]),
        "completion_tokens": int(mask.sum().item()),
        "weights": int(a.numel()),
        "tolerance": TOLERANCE,
    }
