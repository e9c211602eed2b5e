"""The GRPO loop. One call of `Trainer.step()` is one GRPO step, readable top to bottom:

    prompts → rollout (G completions each, with the sampler's log-probs μ)
            → rewards → group-relative advantages
            → trainer log-probs π (and the reference's, when beta > 0)
            → policy loss → backward (fp16: scaled) → clip → AdamW → LR schedule
            → mismatch metrics from (μ, π) → weight sync to the rollout engine
            → one metrics row in the run directory
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time

import torch

from grpo_studio.engine import checkpoint, data, policy_loader, rewards as reward_lib
from grpo_studio.engine.advantages import compute_advantages
from grpo_studio.engine.batching import join_prompt_completion
from grpo_studio.engine.contract.config import Config, save as save_config
from grpo_studio.engine.logprobs import token_logprobs
from grpo_studio.engine.losses import LossInputs, policy_loss
from grpo_studio.engine.mismatch import dlogp_histogram, mismatch_metrics
from grpo_studio.engine.contract import precision
from grpo_studio.engine.precision import LossScaler
from grpo_studio.engine.sampler import Sampling, make_sampler
from grpo_studio.engine.contract.rundir import CONFIG, RunWriter
from grpo_studio.engine.weights import export_weights


class Trainer:
    def __init__(self, cfg: Config, run_dir, resume: bool = False):
        self.cfg, self.resume = cfg, resume
        self.rundir = RunWriter(run_dir)
        self.stop_requested = False
        torch.manual_seed(cfg.train.seed)

        # user inputs first (rewards, data, model path), so mistakes surface before weights load
        self.reward_fns = reward_lib.build(cfg.rewards)
        self.reward_weights = torch.tensor(cfg.rewards.weights or [1.0] * len(self.reward_fns))
        self.prompts = data.PromptStream(data.load_rows(cfg.data, "train"), cfg.train.seed)
        self.eval_rows = data.load_rows(cfg.data, "eval")
        self.model_path = policy_loader.resolve_model_path(cfg.model.name)
        self.tokenizer = policy_loader.load_tokenizer(self.model_path)
        self.device = policy_loader.device()
        self.precision = precision.resolve(cfg)  # the one precision decision, handed to every consumer
        self.policy = policy_loader.load_policy(cfg, self.model_path, self.precision).to(self.device)
        self.policy.train()  # transformers only checkpoints activations in train mode
        self.params = [p for p in self.policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.scaler = LossScaler.from_config(cfg, self.precision)  # fp16; elsewhere it only skips NaN steps
        self.sampler = make_sampler(cfg, self.model_path, self.tokenizer, self.precision, emit_event=self.rundir.event)
        self.step_no = 0
        self.reference = None

    # ---- schedule -------------------------------------------------------------------------
    def _lr_factor(self, done: int) -> float:
        t = self.cfg.train
        if done < t.warmup_steps:
            return (done + 1) / (t.warmup_steps + 1)
        progress = (done - t.warmup_steps) / max(1, t.steps - t.warmup_steps)
        if t.lr_schedule == "linear":
            return max(0.0, 1.0 - progress)
        if t.lr_schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    # ---- one GRPO step ----------------------------------------------------------------------
    def step(self) -> dict:
        cfg, r = self.cfg, self.cfg.rollout
        t0 = time.perf_counter()
        rows = self.prompts.take(cfg.train.prompts_per_step)
        prompts = [data.prompt_text(row, cfg.data, self.tokenizer) for row in rows]
        prompt_ids = data.encode_prompts(self.tokenizer, prompts, r.max_prompt_len)

        # 1. Rollout: G completions per prompt, with μ = the sampler's per-token log-probs.
        sampling = Sampling(n=r.num_generations, max_tokens=r.max_completion_len, temperature=r.temperature,
                            top_p=r.top_p, top_k=r.top_k, seed=data.mix_seed(cfg.train.seed, self.step_no))
        out = self.sampler.generate(prompt_ids, sampling)
        self.sampler.sleep()  # colocated vLLM frees its memory for training; it wakes on the next generate
        mask = out.mask.to(self.device)
        texts = self.tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)

        # 2. Rewards (TRL signature, every dataset column as a keyword) → group-relative advantages.
        G = r.num_generations
        rep_prompts = [p for p in prompts for _ in range(G)]
        table = self._score(self.reward_fns, rows, G, texts)
        rewards = torch.tensor(table, dtype=torch.float32)
        advantages, metrics = compute_advantages(rewards, self.reward_weights, G, cfg.algo.scale_rewards)
        if cfg.algo.mask_truncated_completions:
            mask = mask * (~out.truncated).float().unsqueeze(1).to(self.device)
        t_rollout = time.perf_counter() - t0

        # 3-4. Trainer log-probs π at the sampler's temperature, loss and backward, one
        #      micro-batch at a time (gradient accumulation); then clip and one AdamW step.
        input_ids, attention = join_prompt_completion(prompt_ids, out.completion_ids, G,
                                                      self.tokenizer.pad_token_id, self.device)
        batch = LossInputs(logps=None, old_logps=None, advantages=advantages.to(self.device), mask=mask,
                           rollout_logps=out.logprobs.to(self.device))
        logps, loss, loss_metrics = self._accumulate(input_ids, attention, batch)
        grad_norm = self._optimize()

        # 5. Rollout/train mismatch over completion tokens (before the update changes π).
        mismatch = mismatch_metrics(out.logprobs, logps.cpu(), out.mask)
        self.rundir.histogram({"step": self.step_no + 1, **dlogp_histogram(out.logprobs, logps.cpu(), out.mask)})

        # 6. The rollout engine samples the new policy from the next step on.
        self.sampler.load_weights(export_weights(self.policy))
        self.step_no += 1
        t_total = time.perf_counter() - t0

        lengths = out.mask.sum(1)
        metrics.update(mismatch)
        metrics.update(loss_metrics)  # its mismatch/is_* describe the correction actually applied
        metrics.update(self._reward_metrics(rewards))
        metrics.update({
            "step": self.step_no, "time": time.time(),
            "epoch": self.prompts.epoch + self.prompts.index / max(1, len(self.prompts.rows)),
            "loss": loss, "grad_norm": grad_norm, "lr": self.schedule.get_last_lr()[0],
            "completion/len_mean": lengths.mean().item(), "completion/len_max": lengths.max().item(),
            "completion/truncated_frac": out.truncated.float().mean().item(),
            "perf/step_s": t_total, "perf/rollout_s": out.seconds, "perf/train_s": t_total - t_rollout,
            "perf/rollout_tok_s": lengths.sum().item() / max(out.seconds, 1e-9),
            "mem/peak_gib": _peak_gib(), "mem/rss_gib": _rss_gib(),
        })
        if self.precision.loss_scaling:
            metrics.update(self.scaler.metrics())
        if self.step_no % cfg.train.samples_every == 0:
            self._write_samples(rep_prompts, texts, table, advantages)
        return metrics

    @torch.no_grad()
    def _reference_logps(self, input_ids, attention, completion_len):
        """π_ref for the k3 KL: with LoRA the base model with adapters disabled (no second copy)."""
        if self.cfg.algo.beta <= 0:
            return None
        if self.cfg.model.lora_rank > 0:
            with self.policy.disable_adapter():
                return token_logprobs(self.policy, input_ids, attention, completion_len,
                                      self.cfg.rollout.temperature, logits_chunk=self.cfg.model.logits_chunk)[0]
        if self.reference is None:  # full fine-tune: a frozen copy of the starting weights
            self.reference = policy_loader.load_policy(self.cfg, self.model_path,  # same numerics
                                                       self.precision).to(self.device)
            self.reference.requires_grad_(False)
        return token_logprobs(self.reference, input_ids, attention, completion_len, self.cfg.rollout.temperature,
                              logits_chunk=self.cfg.model.logits_chunk)[0]

    def _accumulate(self, input_ids, attention, batch: LossInputs) -> tuple[torch.Tensor, float, dict]:
        """Forward + backward over micro-batches of train.micro_batch_size rows. Returns the
        detached π for the whole batch, the loss value and the loss metrics (row-weighted).

        Each micro-batch loss is weighted so the accumulated gradient equals the whole-batch
        loss's: by its share of rows for the per-row normalisations (grpo, bnpo, dr_grpo), and
        not at all for dapo, which already divides by the whole batch's active tokens."""
        cfg, B, T = self.cfg, input_ids.shape[0], batch.mask.shape[1]
        size = cfg.train.micro_batch_size or B
        active_tokens = batch.mask.sum()
        self.optimizer.zero_grad(set_to_none=True)
        logps_all, total, metrics = [], 0.0, {}
        for start in range(0, B, size):
            rows = slice(start, min(start + size, B))
            with policy_loader.autocast(cfg), policy_loader.offload_activations(cfg):
                logps, entropy = token_logprobs(self.policy, input_ids[rows], attention[rows], T,
                                                cfg.rollout.temperature, with_entropy=True,
                                                logits_chunk=cfg.model.logits_chunk)
                ref_logps = self._reference_logps(input_ids[rows], attention[rows], T)
            loss, part = policy_loss(
                LossInputs(logps=logps, old_logps=logps.detach(), advantages=batch.advantages[rows],
                           mask=batch.mask[rows], rollout_logps=batch.rollout_logps[rows], ref_logps=ref_logps,
                           entropy=entropy),
                cfg.algo, max_completion_len=cfg.rollout.max_completion_len, num_items_in_batch=active_tokens)
            share = (rows.stop - rows.start) / B
            weight = 1.0 if cfg.algo.loss_type == "dapo" else share
            self.scaler.scale(loss * weight).backward()
            total += loss.item() * weight
            logps_all.append(logps.detach())
            _merge_metrics(metrics, part, share)
        return torch.cat(logps_all), total, metrics

    def _optimize(self) -> float:
        """(fp16) unscale, skip on inf/NaN → clip → AdamW step → LR schedule."""
        stepped, grad_norm = self.scaler.step(self.optimizer, self.params, self.cfg.train.grad_clip)
        if stepped:
            self.schedule.step()  # a skipped step does not advance the LR schedule (as HF Trainer)
        else:
            self.rundir.event("skipped_step", f"non-finite gradients at step {self.step_no + 1}: step skipped, "
                           f"loss scale now {self.scaler.get_scale():g}", step=self.step_no + 1)
        return grad_norm

    def _score(self, funcs, rows: list[dict], n: int, completions: list[str]) -> list[list[float]]:
        """Rewards for n completions per row, called as TRL does: the raw prompts, and every other
        dataset column as a keyword argument."""
        repeat = lambda values: [v for v in values for _ in range(n)]  # noqa: E731
        columns = {k: repeat(row[k] for row in rows) for k in rows[0] if k != "prompt"}
        return reward_lib.score(funcs, repeat(row["prompt"] for row in rows), completions, columns,
                                on_error=self._reward_error)

    def _reward_metrics(self, rewards: torch.Tensor) -> dict:
        out = {}
        for j, (name, _) in enumerate(self.reward_fns):
            col = rewards[:, j]
            col = col[~torch.isnan(col)]
            out[f"rewards/{name}/mean"] = col.mean().item() if col.numel() else float("nan")
            out[f"rewards/{name}/std"] = col.std().item() if col.numel() > 1 else 0.0
        return out

    def _reward_error(self, name: str, message: str, index, **fields) -> None:
        self.rundir.event("reward_error", f"reward {name!r} failed: {message}", function=name, sample=index,
                       step=self.step_no + 1, **fields)

    def _write_samples(self, prompts, texts, table, advantages) -> None:
        names = [n for n, _ in self.reward_fns]
        self.rundir.samples([
            {"step": self.step_no, "prompt": p, "completion": c, "advantage": a,
             "rewards": {n: (None if math.isnan(v) else v) for n, v in zip(names, row)}}
            for p, c, row, a in zip(prompts, texts, table, advantages.tolist())
        ])

    # ---- evaluation -------------------------------------------------------------------------
    def evaluate(self, limit: int | None = None) -> float:
        """Held-out accuracy at the run's temperature: the share of eval prompts whose one
        sample gets a positive score from the first reward function (correctness by default)."""
        rows = self.eval_rows[:limit] if limit else self.eval_rows
        texts = [data.prompt_text(row, self.cfg.data, self.tokenizer) for row in rows]
        ids = data.encode_prompts(self.tokenizer, texts, self.cfg.rollout.max_prompt_len)
        out = self.sampler.generate(ids, Sampling(n=1, max_tokens=self.cfg.rollout.max_completion_len,
                                                  temperature=self.cfg.rollout.temperature, seed=10_007))
        completions = self.tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)
        table = self._score(self.reward_fns[:1], rows, 1, completions)
        return sum(1 for (score,) in table if score > 0) / len(rows)

    # ---- the run ----------------------------------------------------------------------------
    def run(self, progress=None) -> str:
        """Train to train.steps or until asked to stop. Returns 'finished' or 'stopped'."""
        self.rundir.acquire()
        try:
            with _stop_on_signals(self):  # from here to the last checkpoint a stop is graceful
                return self._run(progress)
        except BaseException as err:
            self.rundir.event("crashed", f"{type(err).__name__}: {err}", step=self.step_no)
            raise
        finally:
            self.rundir.release()

    def _run(self, progress) -> str:
        cfg = self.cfg
        if self.resume:
            self._restore()
        else:
            save_config(cfg, self.rundir.dir / CONFIG)
        warning = self.precision.warning
        if warning:
            self.rundir.event("warning", warning)
            if progress:
                progress.warn(warning)
        self.rundir.event("started", f"{'resumed at' if self.resume else 'starting'} step {self.step_no}",
                       total_steps=cfg.train.steps, pid=os.getpid())
        while self.step_no < cfg.train.steps and not self.stop_requested:
            row = self.step()
            if cfg.train.eval_every and self.step_no % cfg.train.eval_every == 0:
                row["eval/accuracy"] = self.evaluate()
            self.rundir.metrics(row)
            if progress:
                progress.update(row)
            if cfg.train.save_every and self.step_no % cfg.train.save_every == 0:
                self._save()
        self._save()
        state = "stopped" if self.stop_requested and self.step_no < cfg.train.steps else "finished"
        self.rundir.event(state, f"{state} at step {self.step_no}", step=self.step_no)
        return state

    def close(self) -> None:
        """Release the rollout engine (vLLM holds memory and threads)."""
        self.sampler.close()

    def _save(self) -> None:
        path = checkpoint.save(self.rundir.dir, self.step_no, self.policy, self.optimizer, self.schedule,
                               self.scaler, self.prompts.state())
        if path is not None:
            self.rundir.event("checkpoint", f"saved {path.name}", step=self.step_no, path=str(path))

    def _restore(self) -> None:
        state = checkpoint.load_latest(self.rundir.dir, self.policy, self.optimizer, self.schedule, self.scaler)
        if state is None:
            return
        self.step_no = state["step"]
        self.prompts.restore(state["data_cursor"])
        self.rundir.truncate_metrics_after(self.step_no)
        self.sampler.load_weights(export_weights(self.policy))


@contextlib.contextmanager
def _stop_on_signals(trainer: Trainer):
    """SIGTERM / SIGINT: finish the current step, checkpoint, log `stopped`, exit 0."""
    def ask(signum, frame):
        trainer.stop_requested = True

    old = {sig: signal.signal(sig, ask) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _merge_metrics(into: dict, part: dict, share: float) -> None:
    """Combine one micro-batch's metrics: min/max for extremes, row-weighted mean otherwise."""
    for key, value in part.items():
        if key.endswith("_min"):
            into[key] = min(into.get(key, value), value)
        elif key.endswith("_max"):
            into[key] = max(into.get(key, value), value)
        else:
            into[key] = into.get(key, 0.0) + value * share


def _peak_gib() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def _rss_gib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**30
