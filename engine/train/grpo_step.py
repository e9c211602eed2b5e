"""The GRPO step. One call of `GRPOStep.step()` is one optimizer step, readable top to bottom:

    [every steps_per_generation × num_iterations steps]
      prompts → rollout (G completions each, with the sampler's log-probs μ)     [engine/rollout/rollouts.py]
              → rewards → group-relative advantages → π_old (when a rollout gets several updates)
    this step's share of the rollout
            → trainer log-probs π (and the reference's, when beta > 0)            [engine/train/logprobs.py]
            → policy loss → backward (fp16: scaled) → clip → AdamW → LR schedule  [engine/train/losses.py]
            → mismatch metrics from (μ, π_old) on a rollout's first step
            → weight sync to the rollout engine after a rollout's last step
            → one metrics row, for the run (engine/run/trainer.py) to write

The step is built from three typed parts: the model it trains (TrainedModel), where it reports (RunLinks) and
what rollouts are made from (RolloutSources). Between the phases it hands on typed bundles: the rollout
(GenerationBatch), the forward and backward (LossPass), the optimizer step (Update) and the phases' wall time
(StepTimes); with where the run is (RunState) they make the typed record (TakenStep) that
engine/train/step_metrics.py turns into the metrics row, keyed by contract/metrics.py's names.
"""

from __future__ import annotations

import dataclasses
import math
import time

import torch

from ...contract import loss_types
from ...contract import metrics as schema
from ...contract.config import Config
from ...contract.precision_plan import PrecisionPlan
from ..faults import out_of_memory
from ..model import moe, policy_loader
from ..model.weights import export_weights
from ..precision.mismatch import (
    dlogp_histogram,
    lag_counts,
    lag_metrics,
    merge_lag_counts,
    mismatch_metrics,
)
from ..precision.numerics import LossScaler, torch_dtype
from ..prompts import data
from ..rollout.batching import micro_batches, spans, token_budget_batches, trim
from ..rollout.episodes import EveryEpisodeFailed
from ..rollout.rollouts import GenerationBatch, Rollouts
from ..sampler import make_sampler
from ..sampler.base import NonFiniteSampling
from ..sampler.remote import RolloutServerLost
from . import flops, step_metrics, zero_advantage
from .logprobs import token_logprobs, use_shared_prefix
from .losses import LossInputs, policy_loss
from .skipped_steps import SkippedSteps
from .step_metrics import LossPass, StepTimes, Update, merge_metrics


@dataclasses.dataclass
class TrainedModel:
    """The policy the step trains, and how: its precision plan, where it was loaded from, its tokenizer, its device."""

    policy: torch.nn.Module  # fsdp: sharded; LoRA: a peft model
    plan: PrecisionPlan  # contract/precision_plan.py: the one precision decision
    path: str  # the resolved model folder (the sampler loads the same)
    tokenizer: object
    device: torch.device


@dataclasses.dataclass
class RunLinks:
    """Where the step reports: the ranks (engine/run/distributed.py), the run directory's writer, trackers and alerts."""

    dist: object
    rundir: object
    outlets: object


@dataclasses.dataclass
class RolloutSources:
    """What rollouts are made from: the seeded prompt stream, the reward functions, the environment (or None)."""

    prompts: data.PromptStream
    reward_fns: object
    episodes: object = None


class GRPOStep:
    """The step's machinery: the optimizer, LR schedule and loss scaler over the policy's trainable weights,
    the rollout engine and its rollouts; and where the run is: the rollout being trained on, the updates still
    to take on it, the steps and weight syncs so far."""

    exact_parts = False  # micro-batches weighted to the whole batch's loss for every loss type (micro_batch_size auto)

    def __init__(self, cfg: Config, model: TrainedModel, run: RunLinks, sources: RolloutSources):
        self.cfg, self.model, self.run, self.prompts = cfg, model, run, sources.prompts
        dist, rundir = run.dist, run.rundir
        self.params = [p for p in model.policy.parameters() if p.requires_grad]
        # perf/mfu: the model's matmul weights N and this device's matmul peak in the run dtype (cached per machine)
        self.matmul_params = flops.matmul_params(model.policy)
        self.peak = flops.Peak(str(model.device), torch_dtype(model.plan.model_dtype), rundir.event)
        dist.sync_params(self.params)
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.scaler = LossScaler.from_config(cfg, model.plan)  # fp16; elsewhere it only skips NaN steps
        self.sampler = make_sampler(
            cfg, model.path, model.tokenizer, model.plan, emit_event=rundir.event, log_dir=rundir.dir
        )
        self.rollouts = Rollouts(
            cfg,
            dist,
            sources.prompts,
            model.tokenizer,
            dist.agreeing(self.sampler),
            sources.reward_fns,
            model.device,
            rundir,
            sources.episodes,
        )
        if not cfg.rollout.colocate:  # a rollout server may hold another run's weights: this policy is version 0
            self.sampler.load_weights(export_weights(model.policy), version=0)
        truncation = [
            f"rollout.{k} = {v:g}"
            for k, v, off in (("top_k", cfg.rollout.top_k, 0), ("top_p", cfg.rollout.top_p, 1))
            if v != off
        ]
        if truncation and cfg.algo.logprob_support == "full":  # config.validate refuses it with rollout correction
            rundir.event(
                "warning",
                f"{', '.join(truncation)}: the sampler's μ is the truncated distribution and "
                f"π is not, so mismatch/* also measure the truncation (docs/mismatch.md)",
            )
        self.batch: GenerationBatch | None = None  # the rollout being trained on
        self.updates: list[torch.Tensor] = []  # the rows of each optimizer step still to take on it
        self.step_no = 0
        self.skips = SkippedSteps(rundir, run.outlets, self.scaler)  # steps skipped for non-finite numbers
        self.rank_weight = 1.0  # this rank's loss weight in the step's backward (fsdp: its share of the normaliser)
        self.reference = None
        self.policy_version = 0  # weight syncs to the sampler so far (a rollout server numbers them the same)
        self.routes = moe.RouterReplay.for_policy(model.policy, cfg.algo.router_replay)  # MoE routers (R3)
        self.step_rows = torch.arange(0)  # the rollout rows of the step being taken
        self.lost: RolloutServerLost | None = None  # the rollout server stopped answering: the run stops
        self.synced = SyncedAdapters(cfg.model.lora_rank > 0 and cfg.rollout.colocate and dist.world == 1)

    @property
    def loss_type(self) -> loss_types.LossType:
        """algo.loss_type's object: its normaliser, micro-batch weight and rank share (contract/loss_types.py)."""
        return loss_types.of(self.cfg.algo.loss_type)

    # ---- schedule -------------------------------------------------------------------------
    def _lr_factor(self, done: int) -> float:
        """LambdaLR's multiplier after `done` optimizer steps: linear warm-up, then linear decay, a cosine
        half-period (SGDR, arXiv 1608.03983, without restarts) or constant."""
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
        times, sampled = StepTimes(start=time.perf_counter()), not self.updates
        if sampled:
            # 1-2. Rollout (μ) → rewards → group-relative advantages; the steps that will train on it.
            try:
                self.batch = self.rollouts.next(self.step_no, self.policy_version)
            except (NonFiniteSampling, EveryEpisodeFailed) as err:  # nothing to train on: a skipped step (every rank)
                environment = self.cfg.env.environment if isinstance(err, EveryEpisodeFailed) else ""
                self.skips.judge(self.step_no + 1, str(err), self.cfg.train, environment)
                self.step_no += 1
                return step_metrics.skipped_row(self._state(), times)
            times.rollout_s = time.perf_counter() - times.start
            self.updates = self._update_plan(len(self.batch.input_ids))
        batch, rows = self.batch, self.updates.pop(0)
        lag = self.step_no - batch.step  # optimizer steps since the weights that sampled the batch

        t_train = time.perf_counter()
        with out_of_memory("training", self.step_no + 1, self.run.rundir.dir):
            # 3. π_old, the log-probs under the weights that sampled, once per rollout and only where it can
            #    differ from π (more updates follow this one): TRL's _generate_and_score_completions skips
            #    old_per_token_logps otherwise, and _compute_loss then uses π.detach() (as _accumulate does).
            if sampled and self.routes is not None:
                self.routes.reset()
            if sampled and self.updates:
                batch.inputs.old_logps = self._old_logps(batch)
            # 4. π on this step's rows at the sampler's temperature, loss and backward, one micro-batch at
            #    a time (gradient accumulation); then clip, one AdamW step and the LR schedule.
            self.rank_weight = self.run.dist.backward_weight(batch.inputs.mask[rows], self.loss_type)
            self.step_rows = rows
            passed = self._accumulate(
                batch.input_ids[rows],
                batch.attention[rows],
                _take(batch.inputs, rows),
                batch.num_items,
                spans(batch.rollout.mask[rows]),
                None if batch.rollout.support is None else batch.rollout.support[rows],
            )
            update = self._optimize(
                self.run.dist.reduce_gradients(self.params, passed.loss, batch.inputs.mask[rows], self.loss_type)
            )
        times.train_s = time.perf_counter() - t_train
        self.skips.judge(self.step_no + 1, update.skipped, self.cfg.train)
        if update.skipped is None:
            self.skips.judge_collapse(
                self.step_no + 1, batch.metrics.get(schema.REWARD), update.grad_norm, self.cfg.train
            )

        # 5. Rollout/train mismatch: μ against π under the weights that sampled (π_old, or with one update
        #    per rollout this step's π, whose rows are then the whole batch), on the first pass only.
        #    Split by token lag (rollout.async_mode one_step / in_flight: μ of lagged tokens is older weights').
        #    Over the rows π was computed on (zero-advantage rows not run: engine/train/zero_advantage.py).
        if sampled:
            pi, out, mask = batch.inputs.old_logps, batch.rollout, batch.rollout.mask
            if pi is None:
                pi, mask = passed.logps, mask.clone()
                mask[rows[passed.unscored]] = 0
            pi = pi.cpu()
            batch.metrics.update(mismatch_metrics(out.logprobs, pi, mask))
            if self.routes is not None:  # the sampler's experts against those of the forwards π came from
                batch.metrics.update(self.routes.metrics())
            batch.metrics.update(lag_metrics(out.logprobs, pi, mask, batch.lags))
            self.run.rundir.histogram(
                {
                    "step": self.step_no + 1,
                    **self.run.dist.merge_histogram(dlogp_histogram(out.logprobs, pi, mask)),
                    "lag": merge_lag_counts(self.run.dist.gather([lag_counts(mask, batch.lags)])),
                }
            )

        # 6. After the batch's last update the rollout engine takes the new weights for the next rollout.
        #    Unless the sampler holds them already (SyncedAdapters: the step left the adapters as they were).
        if not self.updates:
            sync_start = time.perf_counter()
            try:
                if not self.synced.unchanged(self.params):
                    self.sampler.load_weights(export_weights(self.model.policy))
                    self.synced.took(self.params)
                self.policy_version += 1
            except RolloutServerLost as err:  # the step stands (its row, its checkpoint); then the run stops
                self.lost = err
            times.sync_s = time.perf_counter() - sync_start
        self.step_no += 1

        # 7. The metrics row; each rollout's samples once.
        taken = step_metrics.TakenStep(
            batch, rows, sampled, lag, passed, update, self._flop(batch, rows, sampled, passed)
        )
        metrics = step_metrics.taken_row(self._state(), taken, times, self.peak)
        if batch.samples and self.step_no % self.cfg.train.samples_every == 0:
            self.run.rundir.samples(
                self.run.dist.gather([{"step": self.step_no, **sample} for sample in batch.samples])
            )
            batch.samples = None
        return metrics

    def _state(self) -> step_metrics.RunState:
        """Where the run is after this step (call after step_no += 1)."""
        return step_metrics.RunState(
            step=self.step_no,
            epoch=self.prompts.epoch + self.prompts.index / max(1, len(self.prompts.rows)),
            lr=self.schedule.get_last_lr()[0],
            bad_steps=self.skips.bad_steps,
            bad_streak=self.skips.bad_streak,
            loss_scale=self.scaler.metrics() if self.model.plan.loss_scaling else {},
        )

    @property
    def _prefix_mode(self) -> str:
        """train.shared_prefix as the forwards use it: fsdp (config refuses on) and an MoE's sampled experts, laid
        out like input_ids, which the prompt pass is not, turn it off."""
        off = self.cfg.train.parallel == "fsdp" or self.routes is not None
        return "off" if off else self.cfg.train.shared_prefix

    def _flop(self, batch: GenerationBatch, rows, sampled: bool, passed: LossPass) -> float:
        """The step's model FLOPs (engine/train/flops.py): the rollout where sampled here, π_old, π (and π_ref)
        forward, and backward on the rows trained."""
        once = flops.shared_prompt_tokens(batch.input_ids, batch.attention, batch.rollout.mask)  # prompt once a group
        T = batch.rollout.mask.shape[1]
        shared = use_shared_prefix(self._prefix_mode, self.model.policy, batch.input_ids, batch.attention, T)
        return flops.grpo_step_flop(
            self.matmul_params,
            once if shared else flops.real_tokens(batch.attention, batch.rollout.mask),
            rows,
            generated=once,
            sampled_here=sampled and self.cfg.rollout.colocate,
            old_logps=sampled and batch.inputs.old_logps is not None,
            reference=self.cfg.algo.beta > 0,
            lora=self.cfg.model.lora_rank > 0,
            untrained=rows[passed.skipped],
            unrun=rows[passed.unscored],
        )

    def _update_plan(self, n: int) -> list[torch.Tensor]:
        """The rows of each optimizer step on a rollout of n sequences, in order, as TRL's _prepare_inputs
        buffers them: the rollout shuffled (shuffle_sequence_dict) and split into steps_per_generation equal
        parts (split_tensor_dict), taken in turn num_iterations times (_buffered_inputs[_step % steps])."""
        t = self.cfg.train
        order = torch.arange(n)
        if t.shuffle_batch and t.steps_per_generation > 1:  # a single part's order cannot change its update
            order = torch.randperm(n, generator=torch.Generator().manual_seed(data.mix_seed(t.seed, self.step_no)))
        return list(order.view(t.steps_per_generation, -1)) * t.num_iterations

    def _logps(self, model, input_ids, attention, completion_len, lengths=None, with_entropy=False, support=None):
        """Per-token log-probs (and entropies) of the completion tokens at the sampler's temperature, on its kept
        sets `support` where given (Rollout.support); given the rows' completion spans `lengths`, 0 after them on
        the paths that leave those positions out (token_logprobs)."""
        shared = use_shared_prefix(self._prefix_mode, model, input_ids, attention, completion_len)
        return token_logprobs(
            model,
            input_ids,
            attention,
            completion_len,
            self.cfg.rollout.temperature,
            with_entropy=with_entropy,
            logits_chunk=self.cfg.model.logits_chunk,
            shared_prefix=shared,
            spans=lengths,
            support=support,
        )

    def _route(self, rows: torch.Tensor, ids: torch.Tensor, width: int) -> None:
        """The next forwards of `ids` (the rollout's rows `rows`, `width` completion columns) see the sampler's
        experts for their tokens, replayed or compared by the router hooks (engine/model/moe.py)."""
        routes = None if self.routes is None else self.batch.rollout.routes
        if routes is not None:
            prompt_width = ids.shape[1] - width
            lags = moe.position_lags(self.batch.lags.cpu()[rows.cpu()], prompt_width, width)
            self.routes.use(routes.layout(rows, prompt_width, width), lags)

    @torch.no_grad()
    def _old_logps(self, batch: GenerationBatch) -> torch.Tensor:
        """π_old over a whole rollout [B, T] (no grad, no more memory than a step): under
        train.micro_batch_tokens in _accumulate's length-sorted, trimmed micro-batches (0 past a micro-batch's
        cut, where no completion token is), else in chunks of one step's micro-batch rows."""
        cfg, B, T = self.cfg, batch.input_ids.shape[0], batch.inputs.mask.shape[1]
        lengths = spans(batch.rollout.mask)
        if cfg.train.micro_batch_tokens:
            parts = token_budget_batches(batch.input_ids, batch.attention, T, lengths, cfg.train.micro_batch_tokens)
        else:
            size = cfg.train.micro_batch_size or B // cfg.train.steps_per_generation
            parts = [
                (torch.arange(i, min(i + size, B)), batch.input_ids[i : i + size], batch.attention[i : i + size], T)
                for i in range(0, B, size)
            ]
        old, support = torch.zeros(B, T, device=batch.input_ids.device), batch.rollout.support
        with policy_loader.autocast(self.model.plan):
            for rows, ids, attention, width in parts:
                self._route(rows, ids, width)
                kept = None if support is None else support[rows]
                old[rows.to(old.device), :width] = self._logps(
                    self.model.policy, ids, attention, width, lengths[rows], support=kept
                )[0]
        return old

    @torch.no_grad()
    def _reference_logps(self, input_ids, attention, completion_len, lengths, support=None):
        """π_ref for the k3 KL (GRPO, arXiv 2402.03300): with LoRA the base model with adapters disabled (no second copy);
        on the sampler's kept sets `support` as π is."""
        if self.cfg.algo.beta <= 0:
            return None
        if self.cfg.model.lora_rank > 0:
            with self.model.policy.disable_adapter(), moe.uncounted(self.routes):
                return self._logps(self.model.policy, input_ids, attention, completion_len, lengths, support=support)[0]
        if self.reference is None:  # full fine-tune: a frozen copy of the starting weights
            self.reference = policy_loader.load_policy(
                self.cfg,
                self.model.path,  # same numerics
                self.model.plan,
            ).to(self.model.device)
            self.reference.requires_grad_(False)
        return self._logps(self.reference, input_ids, attention, completion_len, lengths, support=support)[0]

    def _accumulate(
        self, input_ids, attention, batch: LossInputs, num_items, lengths: torch.Tensor, support=None
    ) -> LossPass:
        """Forward + backward over micro-batches: train.micro_batch_size rows at a time, or under
        train.micro_batch_tokens rows sorted by length and each micro-batch cut to its own longest row
        (engine/rollout/batching.py; `lengths` are the rows' completion spans, batching.spans; `support` their
        sampler's kept sets, Rollout.support, or None).

        Each micro-batch loss is weighted so the accumulated gradient equals the whole-batch loss's, as the loss
        type says (contract/loss_types.py micro_batch_weight).

        A micro-batch whose rows all have advantage 0 (with algo.beta = 0) has a gradient of exactly 0: its backward
        is skipped, and unless train.score_zero_advantage its forward too; such rows are batched apart from the
        others, after them, where that leaves the update the same (engine/train/zero_advantage.py)."""
        cfg, B, T = self.cfg, input_ids.shape[0], batch.mask.shape[1]
        budget, size = cfg.train.micro_batch_tokens, cfg.train.micro_batch_size or B
        prompt_lens = attention[:, :-T].sum(1).cpu() if budget else None
        zero = torch.zeros(B, dtype=torch.bool)
        if zero_advantage.packable(cfg, self.run.dist, self.model.plan):
            zero = batch.advantages.cpu() == 0
        groups = micro_batches(zero, size, prompt_lens, lengths.cpu(), budget)
        self.optimizer.zero_grad(set_to_none=True)
        skip, skipped = zero_advantage.skippable(cfg, self.run.dist, self.model.plan), zero_advantage.Skipped()
        unrun = zero_advantage.unscored(groups, batch.advantages, skip, cfg.train.score_zero_advantage)
        run = [rows for rows, out in zip(groups, unrun) if not out]
        unscored = [rows for rows, out in zip(groups, unrun) if out]
        scored = sum(map(len, run))
        logps_all, total, metrics = torch.zeros(B, T, device=batch.mask.device), 0.0, {}
        for rows in run:
            ids, att, width = input_ids[rows], attention[rows], T
            if budget:
                ids, att, width = trim(ids, att, T, prompt_lens[rows], lengths[rows])
            part_inputs = _take(batch, rows, width)
            if self.routes is not None:  # an MoE: the sampler's experts of these rows (the step's rows in the rollout)
                self._route(self.step_rows[rows], ids, width)
            with policy_loader.autocast(self.model.plan), policy_loader.offload_activations(cfg):
                kept = None if support is None else support[rows]
                logps, entropy = self._logps(
                    self.model.policy, ids, att, width, lengths[rows], with_entropy=True, support=kept
                )
                ref_logps = self._reference_logps(ids, att, width, lengths[rows], kept)
            old_logps = logps.detach() if batch.old_logps is None else part_inputs.old_logps  # TRL _compute_loss
            loss, part = policy_loss(
                dataclasses.replace(
                    part_inputs, logps=logps, old_logps=old_logps, ref_logps=ref_logps, entropy=entropy
                ),
                cfg.algo,
                max_completion_len=cfg.rollout.max_completion_len,
                num_items_in_batch=num_items,
                rollout_backend=self.sampler.name,
            )
            weight = self.loss_type.micro_batch_weight(part_inputs.mask, batch.mask, bool(budget) or self.exact_parts)
            part_loss = loss.item()
            if skip and zero_advantage.zero_gradient(part_inputs.advantages, part_loss):  # its gradient: all 0
                skipped.add(loss, rows)
            else:
                self.scaler.scale(loss * weight * self.rank_weight).backward()  # fsdp: its share, before the reduce
            total += part_loss * weight
            logps_all[rows.to(logps.device), :width] = logps.detach()
            merge_metrics(metrics, part, len(rows) / scored)  # over the rows run
            del loss, logps  # a skipped backward's graph goes before the next forward
        skipped.fill()
        none = torch.zeros(0, dtype=torch.long)
        return LossPass(logps_all, total, metrics, skipped.rows(), torch.cat(unscored) if unscored else none)

    def _optimize(self, loss: float) -> Update:
        """(fp16) unscale, skip on inf/NaN → clip → AdamW step → LR schedule. A skipped step does not
        advance the LR schedule (as HF Trainer) and, in fp16, shrinks the loss scale."""
        if not math.isfinite(loss):  # even finite gradients of a NaN/inf loss are not to be trusted
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.update(found_inf=True)
            return Update(loss, math.inf, "non-finite loss")
        stepped, grad_norm = self.scaler.step(
            self.optimizer, self.params, self.cfg.train.grad_clip, self.run.dist.shard_sum
        )
        if not stepped:
            return Update(loss, grad_norm, "non-finite gradients")
        self.schedule.step()
        return Update(loss, grad_norm, None)

    def resume_at(self, step: int, counters: dict[str, int]) -> None:
        """Continue after `step` optimizer steps restored from a checkpoint (with its skip counters): the
        sampler takes the restored weights, numbered as the uninterrupted run's syncs."""
        self.step_no = step
        self.skips.restore(counters)
        t = self.cfg.train
        # The config's lr and weight decay, not the checkpoint's: a fork (or --resume --set train.lr) changes them.
        self.schedule.base_lrs = [t.lr] * len(self.optimizer.param_groups)
        for group in self.optimizer.param_groups:
            group.update(initial_lr=t.lr, lr=t.lr * self._lr_factor(self.schedule.last_epoch))
            group["weight_decay"] = t.weight_decay
        self.policy_version = step // (t.steps_per_generation * t.num_iterations)  # syncs made so far
        version = {} if self.cfg.rollout.colocate else {"version": self.policy_version}  # the server numbers them
        self.sampler.load_weights(export_weights(self.model.policy), **version)
        self.synced.took(self.params)


class SyncedAdapters:
    """The trained weights the colocated sampler took at its last sync, kept where they are small (LoRA's
    adapters, one process): a sync of the same weights again is skipped. A step whose every micro-batch has
    zero advantage (engine/train/zero_advantage.py) leaves AdamW's zero moments, so no weight, as they were; the
    sampler's merged copy (0.3-0.9 s of a short-prompt step to rebuild) is then already the policy's.
    A rollout server numbers the syncs it takes, so it gets every one (`enabled` off)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.taken: list[torch.Tensor] | None = None

    def unchanged(self, params: list[torch.Tensor]) -> bool:
        """Whether every trained weight is bitwise the one the sampler took last."""
        return self.taken is not None and all(torch.equal(p, q) for p, q in zip(params, self.taken))

    def took(self, params: list[torch.Tensor]) -> None:
        if self.enabled:
            self.taken = [p.detach().clone() for p in params]


def _take(inputs: LossInputs, rows, width: int | None = None) -> LossInputs:
    """The rows `rows` of every tensor in `inputs`, per-token ones cut to their first `width` tokens."""
    return LossInputs(
        **{k: None if v is None else v[rows] if v.dim() == 1 else v[rows, :width] for k, v in vars(inputs).items()}
    )
