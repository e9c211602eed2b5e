"""The GRPO loop. One call of `Trainer.step()` is one optimizer step, readable top to bottom:

    [every steps_per_generation × num_iterations steps]
      prompts → rollout (G completions each, with the sampler's log-probs μ)     [engine/rollouts.py]
              → rewards → group-relative advantages → π_old (when a rollout gets several updates)
    this step's share of the rollout
            → trainer log-probs π (and the reference's, when beta > 0)
            → policy loss → backward (fp16: scaled) → clip → AdamW → LR schedule
            → mismatch metrics from (μ, π_old) on a rollout's first step
            → weight sync to the rollout engine after a rollout's last step
            → one metrics row in the run directory
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import time

import torch

from grpo_studio.engine import checkpoint, data, distributed, flops, policy_loader, rewards as reward_lib
from grpo_studio.engine.batching import token_budget_batches, token_budget_groups, trim
from grpo_studio.contract.config import Config, save as save_config
from grpo_studio.contract.errors import UserError
from grpo_studio.engine.faults import disk_full, disk_full_error, out_of_memory
from grpo_studio.engine.logprobs import token_logprobs, use_shared_prefix
from grpo_studio.engine.losses import LossInputs, policy_loss
from grpo_studio.engine.mismatch import dlogp_histogram, lag_counts, lag_metrics, merge_lag_counts, mismatch_metrics
from grpo_studio.engine.outlets import Outlets
from grpo_studio.contract import metrics as schema, precision_plan
from grpo_studio.engine.precision import LossScaler, torch_dtype
from grpo_studio.engine.sampler import Sampling, make_sampler
from grpo_studio.engine.sampler.base import NonFiniteSampling
from grpo_studio.engine.sampler.remote import RolloutServerLost
from grpo_studio.contract.rundir import CONFIG, METRICS, as_number, read_rows
from grpo_studio.engine.rollouts import GenerationBatch, Rollouts
from grpo_studio.engine.weights import export_weights


class Trainer:
    def __init__(self, cfg: Config, run_dir, resume: bool = False):
        self.cfg, self.resume = cfg, resume
        self.dist = distributed.start(cfg)  # data-parallel ranks (torchrun), or one process
        self.rundir = self.dist.writer(run_dir)  # only rank 0 writes the run directory
        if self.dist.main:  # the lock before anything loads; a new run refuses a directory that holds one
            self.rundir.acquire(new_run=not resume)  # refused: RunLock or UserError, nothing written
        try:
            self._load(cfg)
        except BaseException:
            self.rundir.release()
            raise

    def _load(self, cfg: Config) -> None:
        """Everything the run needs, under the lock: user inputs first, then the model, optimizer and sampler."""
        self.stop_requested = False
        torch.manual_seed(cfg.train.seed)

        # user inputs first (rewards, data, model path), so mistakes surface before weights load
        reward_fns = reward_lib.build(cfg.rewards)
        self.outlets = Outlets(cfg, self.rundir, self.dist.main)  # trackers and alerts (a missing extra fails here)
        self.prompts = data.PromptStream(data.load_rows(cfg.data, "train"), cfg.train.seed)
        self.eval_rows = data.load_rows(cfg.data, "eval")
        self.rundir.event("info", data.split_summary(cfg.data, self.prompts.rows, self.eval_rows))
        if cfg.train.eval_every and not self.eval_rows:
            self.rundir.event("warning", f"train.eval_every = {cfg.train.eval_every}: no rows to evaluate on, so no "
                                         f"eval/accuracy; set data.eval_size (rows held out), or data.eval_split "
                                         f"for a Hugging Face dataset")
        self.model_path = policy_loader.resolve_model_path(cfg.model.name)
        self.tokenizer = policy_loader.load_tokenizer(self.model_path)
        # every prompt rendered and measured before weights load: a broken template or a too-short
        # rollout.max_prompt_len fails here, in one line
        data.check_prompt_lengths(self.prompts.rows + self.eval_rows, cfg.data, self.tokenizer,
                                  cfg.rollout.max_prompt_len)
        self.device = policy_loader.device()
        self.precision = precision_plan.resolve(cfg)  # the one precision decision, handed to every consumer
        self.policy = self.dist.wrap(policy_loader.load_policy(cfg, self.model_path, self.precision).to(self.device),
                                     cfg)  # fsdp: sharded
        self.policy.train()  # transformers only checkpoints activations in train mode
        self.params = [p for p in self.policy.parameters() if p.requires_grad]
        # perf/mfu: the model's matmul weights N and this device's matmul peak in the run dtype, measured once
        self.matmul_params = flops.matmul_params(self.policy)
        self.peak_flop_s = flops.matmul_peak(str(self.device), torch_dtype(self.precision.model_dtype))
        self.dist.sync_params(self.params)
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.scaler = LossScaler.from_config(cfg, self.precision)  # fp16; elsewhere it only skips NaN steps
        self.sampler = make_sampler(cfg, self.model_path, self.tokenizer, self.precision, emit_event=self.rundir.event,
                                    log_dir=self.rundir.dir)
        self.rollouts = Rollouts(cfg, self.dist, self.prompts, self.tokenizer, self.dist.agreeing(self.sampler),
                                 reward_fns, self.device, self.rundir)
        if not cfg.rollout.colocate:  # a rollout server may hold another run's weights: this policy is version 0
            self.sampler.load_weights(export_weights(self.policy), version=0)
        truncation = [f"rollout.{k} = {v:g}" for k, v, off in (("top_k", cfg.rollout.top_k, 0),
                                                                  ("top_p", cfg.rollout.top_p, 1)) if v != off]
        if truncation:  # config.validate refuses it with rollout correction
            self.rundir.event("warning", f"{', '.join(truncation)}: the sampler's μ is the truncated distribution and "
                                         f"π is not, so mismatch/* also measure the truncation (docs/mismatch.md)")
        self.batch: GenerationBatch | None = None  # the rollout being trained on
        self.updates: list[torch.Tensor] = []      # the rows of each optimizer step still to take on it
        self.step_no = 0
        self.bad_steps = self.bad_streak = 0  # steps skipped for non-finite numbers: in all, and in a row
        self.rank_weight = 1.0  # this rank's loss weight in the step's backward (fsdp: its share of the normaliser)
        self.reference = None
        self.policy_version = 0  # weight syncs to the sampler so far (a rollout server numbers them the same)
        self.lost: RolloutServerLost | None = None  # the rollout server stopped answering: the run stops

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

    # ---- one optimizer step ------------------------------------------------------------------
    def step(self) -> dict:
        """One optimizer step (TRL's global step). Each rollout is trained on for train.steps_per_generation
        × train.num_iterations steps: the first of them samples it, the last hands the new weights to the
        sampler (docs/algorithms.md, "Updates per rollout")."""
        t = self.cfg.train
        t0, t_rollout, sampled = time.perf_counter(), 0.0, not self.updates
        if sampled:
            # 1-2. Rollout (μ) → rewards → group-relative advantages; the steps that will train on it.
            try:
                self.batch = self.rollouts.next(self.step_no, self.policy_version)
            except NonFiniteSampling as err:  # nothing to train on: a skipped step (one rank's: on every rank)
                self._judge(str(err))
                self.step_no += 1
                return {**self._common_metrics(t0), "loss": math.nan, "grad_norm": math.nan}
            t_rollout = time.perf_counter() - t0
            self.updates = self._update_plan(len(self.batch.input_ids))
        batch, rows = self.batch, self.updates.pop(0)
        lag = self.step_no - batch.step  # optimizer steps since the weights that sampled the batch

        t_train = time.perf_counter()
        with out_of_memory("training", self.step_no + 1, self.rundir.dir):
            # 3. π_old, the log-probs under the weights that sampled, once per rollout and only where it can
            #    differ from π (more updates follow this one): TRL's _generate_and_score_completions skips
            #    old_per_token_logps otherwise, and _compute_loss then uses π.detach() (as _accumulate does).
            if sampled and self.updates:
                batch.inputs.old_logps = self._old_logps(batch)
            # 4. π on this step's rows at the sampler's temperature, loss and backward, one micro-batch at
            #    a time (gradient accumulation); then clip, one AdamW step and the LR schedule.
            self.rank_weight = self.dist.backward_weight(batch.inputs.mask[rows], self.cfg.algo.loss_type)
            logps, loss, loss_metrics = self._accumulate(batch.input_ids[rows], batch.attention[rows],
                                                         _take(batch.inputs, rows), batch.num_items,
                                                         batch.rollout.mask[rows].sum(1))
            loss = self.dist.reduce_gradients(self.params, loss, batch.inputs.mask[rows], self.cfg.algo.loss_type)
            grad_norm, skipped = self._optimize(loss)
        train_s = time.perf_counter() - t_train
        self._judge(skipped)

        # 5. Rollout/train mismatch: μ against π under the weights that sampled (π_old, or with one update
        #    per rollout this step's π, whose rows are then the whole batch), on the first pass only.
        #    Split by token lag (rollout.async_mode one_step / in_flight: μ of lagged tokens is older weights').
        if sampled:
            pi = (logps if batch.inputs.old_logps is None else batch.inputs.old_logps).cpu()
            out = batch.rollout
            batch.metrics.update(mismatch_metrics(out.logprobs, pi, out.mask))
            batch.metrics.update(lag_metrics(out.logprobs, pi, out.mask, batch.lags))
            self.rundir.histogram({"step": self.step_no + 1,
                                   **self.dist.merge_histogram(dlogp_histogram(out.logprobs, pi, out.mask)),
                                   "lag": merge_lag_counts(self.dist.gather([lag_counts(out.mask, batch.lags)]))})

        # 6. After the batch's last update the rollout engine takes the new weights for the next rollout.
        sync_s = 0.0
        if not self.updates:
            sync_start = time.perf_counter()
            try:
                self.sampler.load_weights(export_weights(self.policy))
                self.policy_version += 1
            except RolloutServerLost as err:  # the step stands (its row, its checkpoint); then _run stops
                self.lost = err
            sync_s = time.perf_counter() - sync_start
        self.step_no += 1

        metrics = {**batch.metrics, **loss_metrics, **self._common_metrics(t0)}  # loss's mismatch/is_*: as applied
        metrics.update({"loss": loss, "grad_norm": grad_norm, "policy/lag": float(lag),
                        "perf/rollout_s": batch.rollout.seconds if sampled else 0.0,
                        "perf/train_s": metrics["perf/step_s"] - t_rollout, "perf/sync_s": sync_s})
        if not sampled:  # the waiting happened on the rollout's first step
            metrics.update({"perf/trainer_wait_s": 0.0, "perf/overlap_frac": 0.0})
        metrics.update(self._perf(batch, rows, sampled, metrics, train_s, sync_s))
        if batch.samples and self.step_no % t.samples_every == 0:  # each rollout's samples once
            self.rundir.samples(self.dist.gather([{"step": self.step_no, **sample} for sample in batch.samples]))
            batch.samples = None
        return metrics

    def _perf(self, batch: GenerationBatch, rows, sampled: bool, row: dict, train_s: float, sync_s: float) -> dict:
        """perf/flop, perf/peak_flop_s, perf/mfu and perf/idle_s of a step: its model FLOPs (engine/flops.py)
        over its wall time and the peak measured at start; idle = the step less waiting for the rollout,
        training (π_old, log-probs, loss, backward, AdamW) and the weight sync."""
        flop = flops.grpo_step_flop(self.matmul_params, flops.real_tokens(batch.attention, batch.rollout.mask),
                                    rows, sampled_here=sampled and self.cfg.rollout.colocate,
                                    old_logps=sampled and batch.inputs.old_logps is not None,
                                    reference=self.cfg.algo.beta > 0, lora=self.cfg.model.lora_rank > 0)
        step_s = row["perf/step_s"]
        return {"perf/flop": flop, "perf/peak_flop_s": self.peak_flop_s, "perf/mfu": flop / step_s / self.peak_flop_s,
                "perf/idle_s": max(0.0, step_s - row["perf/trainer_wait_s"] - train_s - sync_s)}

    def _update_plan(self, n: int) -> list[torch.Tensor]:
        """The rows of each optimizer step on a rollout of n sequences, in order, as TRL's _prepare_inputs
        buffers them: the rollout shuffled (shuffle_sequence_dict) and split into steps_per_generation equal
        parts (split_tensor_dict), taken in turn num_iterations times (_buffered_inputs[_step % steps])."""
        t = self.cfg.train
        order = torch.arange(n)
        if t.shuffle_batch and t.steps_per_generation > 1:  # a single part's order cannot change its update
            order = torch.randperm(n, generator=torch.Generator().manual_seed(data.mix_seed(t.seed, self.step_no)))
        return list(order.view(t.steps_per_generation, -1)) * t.num_iterations

    def _logps(self, model, input_ids, attention, completion_len, with_entropy=False):
        """Per-token log-probs (and entropies) of the completion tokens at the sampler's temperature."""
        mode = "off" if self.cfg.train.parallel == "fsdp" else self.cfg.train.shared_prefix  # fsdp: config refuses on
        shared = use_shared_prefix(mode, model, input_ids, attention, completion_len)
        return token_logprobs(model, input_ids, attention, completion_len, self.cfg.rollout.temperature,
                              with_entropy=with_entropy, logits_chunk=self.cfg.model.logits_chunk,
                              shared_prefix=shared)

    @torch.no_grad()
    def _old_logps(self, batch: GenerationBatch) -> torch.Tensor:
        """π_old over a whole rollout [B, T] (no grad, no more memory than a step): under
        train.micro_batch_tokens in _accumulate's length-sorted, trimmed micro-batches (0 past a micro-batch's
        cut, where no completion token is), else in chunks of one step's micro-batch rows."""
        cfg, B, T = self.cfg, batch.input_ids.shape[0], batch.inputs.mask.shape[1]
        if cfg.train.micro_batch_tokens:
            parts = token_budget_batches(batch.input_ids, batch.attention, T, batch.rollout.mask.sum(1),
                                         cfg.train.micro_batch_tokens)
        else:
            size = cfg.train.micro_batch_size or B // cfg.train.steps_per_generation
            parts = [(torch.arange(i, min(i + size, B)), batch.input_ids[i:i + size], batch.attention[i:i + size], T)
                     for i in range(0, B, size)]
        old = torch.zeros(B, T, device=batch.input_ids.device)
        with policy_loader.autocast(cfg):
            for rows, ids, attention, width in parts:
                old[rows.to(old.device), :width] = self._logps(self.policy, ids, attention, width)[0]
        return old

    @torch.no_grad()
    def _reference_logps(self, input_ids, attention, completion_len):
        """π_ref for the k3 KL: with LoRA the base model with adapters disabled (no second copy)."""
        if self.cfg.algo.beta <= 0:
            return None
        if self.cfg.model.lora_rank > 0:
            with self.policy.disable_adapter():
                return self._logps(self.policy, input_ids, attention, completion_len)[0]
        if self.reference is None:  # full fine-tune: a frozen copy of the starting weights
            self.reference = policy_loader.load_policy(self.cfg, self.model_path,  # same numerics
                                                       self.precision).to(self.device)
            self.reference.requires_grad_(False)
        return self._logps(self.reference, input_ids, attention, completion_len)[0]

    def _accumulate(self, input_ids, attention, batch: LossInputs, num_items,
                    lengths: torch.Tensor) -> tuple[torch.Tensor, float, dict]:
        """Forward + backward over micro-batches: train.micro_batch_size rows at a time, or under
        train.micro_batch_tokens rows sorted by length and each micro-batch cut to its own longest row
        (engine/batching.py; `lengths` are the rows' completion tokens). Returns the detached π for the
        whole batch ([B, T], 0 past a micro-batch's cut, where no completion token is), the loss value
        and the loss metrics (row-weighted).

        Each micro-batch loss is weighted so the accumulated gradient equals the whole-batch
        loss's: by its share of rows for the per-row normalisations (grpo, dr_grpo; bnpo with
        micro_batch_size, each micro-batch its own token mean as in TRL), for bnpo under a token budget
        by its share of the active tokens (the whole batch's token mean, as verl's dynamic batch size),
        and not at all for dapo, which already divides by `num_items` (the step's share of the rollout's
        active tokens)."""
        cfg, B, T = self.cfg, input_ids.shape[0], batch.mask.shape[1]
        budget = cfg.train.micro_batch_tokens
        if budget:
            prompt_lens = attention[:, :-T].sum(1).cpu()
            groups = token_budget_groups(prompt_lens, lengths.cpu(), budget)
        else:
            size = cfg.train.micro_batch_size or B
            groups = [torch.arange(start, min(start + size, B)) for start in range(0, B, size)]
        self.optimizer.zero_grad(set_to_none=True)
        logps_all, total, metrics = None, 0.0, {}
        for rows in groups:
            ids, att, width = input_ids[rows], attention[rows], T
            if budget:
                ids, att, width = trim(ids, att, T, prompt_lens[rows], lengths[rows])
            part_inputs = _take(batch, rows, width)
            with policy_loader.autocast(cfg), policy_loader.offload_activations(cfg):
                logps, entropy = self._logps(self.policy, ids, att, width, with_entropy=True)
                ref_logps = self._reference_logps(ids, att, width)
            old_logps = logps.detach() if batch.old_logps is None else part_inputs.old_logps  # TRL _compute_loss
            loss, part = policy_loss(
                dataclasses.replace(part_inputs, logps=logps, old_logps=old_logps, ref_logps=ref_logps,
                                    entropy=entropy),
                cfg.algo, max_completion_len=cfg.rollout.max_completion_len, num_items_in_batch=num_items,
                rollout_backend=self.sampler.name)
            share = len(rows) / B
            weight = share
            if cfg.algo.loss_type == "dapo":
                weight = 1.0
            elif cfg.algo.loss_type == "bnpo" and budget:
                weight = (part_inputs.mask.sum() / batch.mask.sum().clamp(min=1.0)).item()
            self.scaler.scale(loss * weight * self.rank_weight).backward()  # fsdp: its share, before the reduce
            total += loss.item() * weight
            if logps_all is None:
                logps_all = logps.new_zeros(B, T)
            logps_all[rows.to(logps.device), :width] = logps.detach()
            _merge_metrics(metrics, part, share)
        return logps_all, total, metrics

    def _optimize(self, loss: float) -> tuple[float, str | None]:
        """(fp16) unscale, skip on inf/NaN → clip → AdamW step → LR schedule. Returns the grad norm and
        why the step was skipped (None: it was taken). A skipped step does not advance the LR schedule
        (as HF Trainer) and, in fp16, shrinks the loss scale."""
        if not math.isfinite(loss):  # even finite gradients of a NaN/inf loss are not to be trusted
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.update(found_inf=True)
            return math.inf, "non-finite loss"
        stepped, grad_norm = self.scaler.step(self.optimizer, self.params, self.cfg.train.grad_clip,
                                              self.dist.shard_sum)
        if not stepped:
            return grad_norm, "non-finite gradients"
        self.schedule.step()
        return grad_norm, None

    def _judge(self, skipped: str | None) -> None:
        """Count step step_no + 1: taken (skipped None), or skipped for the reason given, with a
        `skipped_step` event. train.max_bad_steps skipped in a row means the run diverged: a `diverged`
        event naming the cause and the last good checkpoint (the newest whose weights then trained a step:
        saved before the step before the streak), then a UserError."""
        step = self.step_no + 1
        if skipped is None:
            self.bad_streak = 0
            return
        self.bad_steps += 1
        self.bad_streak += 1
        self.rundir.event("skipped_step", f"{skipped} at step {step}: step skipped, loss scale now "
                                          f"{self.scaler.get_scale():g}", step=step, cause=skipped)
        limit = self.cfg.train.max_bad_steps
        if not limit or self.bad_streak < limit:
            return
        first = step - self.bad_streak + 1
        last_good = self._last_checkpoint(first - 2)  # its weights trained step first - 1 (or an earlier one)
        steps = f"step {step}" if first == step else f"steps {first}-{step}"
        why = (f"diverged: {steps} all skipped (train.max_bad_steps = {limit}), the last for {skipped}; "
               f"last good checkpoint: {last_good or 'none'}; try a lower train.lr (now {self.cfg.train.lr:g})")
        self.rundir.event("diverged", why, step=step, cause=skipped, bad_steps=self.bad_streak,
                          last_good_checkpoint=last_good)
        self.outlets.event("diverged", why, step)
        raise UserError(why, kind="run")

    def _last_checkpoint(self, at_most: int) -> str | None:
        """The path of the newest checkpoint on disk saved at a step <= at_most (train.keep_checkpoints may
        have deleted older ones)."""
        path = checkpoint.newest(self.rundir.dir, at_most)
        return None if path is None else str(path)

    def _common_metrics(self, t0: float) -> dict:
        """The part of a metrics row every step has, taken or skipped (call after step_no += 1)."""
        row = {
            "step": self.step_no, "time": time.time(),
            "epoch": self.prompts.epoch + self.prompts.index / max(1, len(self.prompts.rows)),
            "lr": self.schedule.get_last_lr()[0], "perf/step_s": time.perf_counter() - t0,
            "mem/peak_gib": _peak_gib(), "mem/rss_gib": _rss_gib(),
            "precision/bad_steps": float(self.bad_steps), "precision/bad_streak": float(self.bad_streak),
        }
        if self.precision.loss_scaling:
            row.update(self.scaler.metrics())
        return row

    # ---- evaluation -------------------------------------------------------------------------
    def evaluate(self, limit: int | None = None) -> float:
        """Held-out accuracy at the run's temperature: the share of eval prompts whose one
        sample gets a positive score from the first reward function (correctness by default)."""
        if self.updates:  # between the updates of a rollout the sampler still holds the weights that sampled it
            self.sampler.load_weights(export_weights(self.policy))
        every = self.eval_rows[:limit] if limit else self.eval_rows
        rows, correct = self.dist.shard(every), 0  # data-parallel: each rank its part, the count summed
        if rows:
            texts = [data.prompt_text(row, self.cfg.data, self.tokenizer) for row in rows]
            ids = data.encode_prompts(self.tokenizer, texts, self.cfg.rollout.max_prompt_len)
            out = self.sampler.generate(ids, Sampling(n=1, max_tokens=self.cfg.rollout.max_completion_len,
                                                      temperature=self.cfg.rollout.temperature, seed=10_007))
            completions = self.tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)
            table = self.rollouts.score(self.rollouts.reward_fns[:1], rows, 1, completions)
            correct = sum(1 for (score,) in table if score > 0)
        return float(self.dist.total(torch.tensor(float(correct)))) / len(every)

    # ---- the run ----------------------------------------------------------------------------
    def run(self, progress=None) -> str:
        """Train to train.steps or until asked to stop. Returns 'finished' or 'stopped'."""
        self.rundir.acquire()  # held since __init__ (again only if released since)
        try:
            with _stop_on_signals(self):  # from here to the last checkpoint a stop is graceful
                return self._run(progress)
        except BaseException as err:
            stop = err
            if disk_full(err, self.rundir.dir):
                stop = disk_full_error(self.rundir.dir, self.step_no, self._last_checkpoint(self.step_no))
            with contextlib.suppress(OSError):  # a full disk may refuse this line too: stderr still says it
                self.rundir.event("crashed", f"{type(stop).__name__}: {stop}", step=self.step_no)
                self.outlets.event("crashed", f"{type(stop).__name__}: {stop}", self.step_no)
            if stop is err:
                raise
            raise stop from None
        finally:
            self.rundir.release()

    def _run(self, progress) -> str:
        cfg = self.cfg
        if self.resume:
            self._restore()
        elif self.dist.main:
            save_config(cfg, self.rundir.dir / CONFIG)
        warning = self.precision.warning
        if warning:
            self.rundir.event("warning", warning)
            if progress:
                progress.warn(warning)
        self.rundir.event("started", f"{'resumed at' if self.resume else 'starting'} step {self.step_no}",
                       total_steps=cfg.train.steps, pid=os.getpid())
        # verl's val_before_train. Off by default: the extra sampling shifts later steps' μ at fp32 rounding, so
        # a run resumed past it no longer equals the uninterrupted one bit for bit (tests/test_crash_consistency.py)
        if cfg.train.eval_before and cfg.train.eval_every and self.eval_rows and not self.resume:
            accuracy = self.evaluate()
            self.rundir.event("eval", f"eval/accuracy before training: {accuracy:.3f}", step=0, accuracy=accuracy)
            if progress:
                progress.note(f"eval_acc before training {accuracy:.3f}")
        while self.step_no < cfg.train.steps and not self._stop_agreed() and not self.lost:
            try:
                row = self.step()
            except RolloutServerLost as err:  # lost while sampling: nothing of this step was taken
                self.lost = err
                break
            if cfg.train.eval_every and self.eval_rows and self.step_no % cfg.train.eval_every == 0 and not self.lost:
                row["eval/accuracy"] = self.evaluate()
            row = self.dist.reduce_metrics(row)  # one row for all ranks, written by rank 0
            self.rundir.metrics(row)
            self.outlets.row(row)
            if progress:
                progress.update(row)
            if cfg.train.save_every and self.step_no % cfg.train.save_every == 0:
                self._save()
        self._save()
        if self.lost:
            self.rundir.event("rollout_server_lost", f"{self.lost}; stopped at step {self.step_no} with a checkpoint",
                              step=self.step_no)
            raise UserError(f"{self.lost}; stopped at step {self.step_no} with a checkpoint (resume with "
                            f"--resume once the server is back)", kind="run")
        state = "stopped" if self.stop_requested and self.step_no < cfg.train.steps else "finished"
        self.rundir.event(state, f"{state} at step {self.step_no}", step=self.step_no)
        self.outlets.event(state, f"{state} at step {self.step_no}", self.step_no)
        return state

    def close(self) -> None:
        """Release the rollout engine (vLLM holds memory and threads) and the data-parallel group; finish the
        trackers' runs."""
        self.sampler.close()
        self.dist.close()
        self.outlets.close()
        self.rundir.release()  # a trainer that never ran holds the lock from __init__ until here

    def _stop_agreed(self) -> bool:
        """A stop asked of one rank (SIGTERM) stops every rank before the same step."""
        self.stop_requested = self.dist.any(self.stop_requested)
        return self.stop_requested

    def _save(self) -> None:
        full = self.dist.full_state(self.policy, self.optimizer)  # fsdp: gathered from the shards (all ranks)
        if not self.dist.main:  # rank 0 saves the weights for all
            return
        path = checkpoint.save(self.rundir.dir, self.step_no, self.policy, self.optimizer, self.schedule,
                               self.scaler, self.prompts.state(),
                               {"bad_steps": self.bad_steps, "bad_streak": self.bad_streak}, full)
        if path is None:
            return
        self.rundir.event("checkpoint", f"saved {path.name}", step=self.step_no, path=str(path))
        keep = self.cfg.train.keep_checkpoints
        if keep:
            removed = checkpoint.prune(self.rundir.dir, keep, self.step_no, self._best_metric_scores())
            if removed:
                self.rundir.event("checkpoints_deleted", f"deleted {', '.join(f'step-{s}' for s in removed)} "
                                                         f"(train.keep_checkpoints = {keep})", steps=removed)

    def _best_metric_scores(self) -> dict[int, float]:
        """step -> train.best_metric from the metrics rows that have a finite one (none without a best_metric)."""
        name, scores = self.cfg.train.best_metric, {}
        for row in read_rows(self.rundir.dir / METRICS) if name else []:
            value = as_number(row.get(name))
            if value is not None and math.isfinite(value):
                scores[row[schema.STEP]] = value
        return scores

    def _restore(self) -> None:
        """Continue from the newest trustworthy checkpoint, or from step 0 and the base weights when there
        is none, with the streams cut back to that step: each step stays in them once."""
        state = checkpoint.restore(self.rundir.dir, self.policy, self.optimizer, self.schedule, self.scaler,
                                   on_skip=self._checkpoint_skipped, into=self.dist.load_state)
        if state is None:
            self.rundir.event("no_checkpoint", "no complete checkpoint to resume from: restarting at step 0 "
                                               "from the base weights", step=0)
        else:
            self.step_no = state["step"]
            self.prompts.restore(state["data_cursor"])
            self.bad_steps, self.bad_streak = state["counters"]["bad_steps"], state["counters"]["bad_streak"]
            t = self.cfg.train
            self.policy_version = self.step_no // (t.steps_per_generation * t.num_iterations)  # syncs made so far
            version = {} if self.cfg.rollout.colocate else {"version": self.policy_version}  # the server numbers them
            self.sampler.load_weights(export_weights(self.policy), **version)
        dropped = self.rundir.cut_streams(self.step_no)
        if dropped:
            what = "; ".join(f"{name}: " + " and ".join(
                part for part, n in ((f"{n['past']} rows past step {self.step_no}", n["past"]),
                                     (f"{n['malformed']} malformed lines", n["malformed"])) if n)
                for name, n in dropped.items())
            self.rundir.event("rows_dropped", f"resuming at step {self.step_no}: dropped {what}", step=self.step_no,
                              files=dropped)

    def _checkpoint_skipped(self, step: int, path, why: str) -> None:
        self.rundir.event("checkpoint_skipped", f"skipped checkpoint {path.name}: {why}", step=step, path=str(path),
                          reason=why)


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


def _take(inputs: LossInputs, rows, width: int | None = None) -> LossInputs:
    """The rows `rows` of every tensor in `inputs`, per-token ones cut to their first `width` tokens."""
    return LossInputs(**{k: None if v is None else v[rows] if v.dim() == 1 else v[rows, :width]
                         for k, v in vars(inputs).items()})


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
