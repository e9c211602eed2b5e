"""The run's life around the GRPO step (engine/train/grpo_step.py): one `Trainer` per run directory.

Trainer(cfg, run_dir)   signals heard (_Signals) → lock the directory → rewards, data, tokenizer, prompt lengths
                        → policy → GRPOStep; a stop meanwhile: `stopped`, StoppedLoading
run()                   [resume: the newest trustworthy checkpoint, the streams cut back to its step]
                        `started` → (eval before training) → step → (eval) → metrics row → (checkpoint) …
                        → last checkpoint → `finished` | `stopped` (SIGTERM / SIGINT) | UserError
                        (diverged, rollout server lost, full disk: a `crashed` event first)
close()                 the rollout engine, the data-parallel group, the trackers, the lock
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
from pathlib import Path

import torch

from ... import rewards as reward_lib
from ...contract import config, precision_plan, resume_rules
from ...contract import metrics as schema
from ...contract.config import Config
from ...contract.config import save as save_config
from ...contract.errors import UserError
from ...contract.planner import micro_batch
from ...contract.rundir import (
    CONFIG,
    METRICS,
    as_number,
    detach_output,
    last_metrics_row,
    read_events,
    read_rows,
)
from ..faults import disk_full, disk_full_error
from ..model import policy_loader
from ..model.weights import export_weights
from ..out import checkpoint
from ..out.outlets import Outlets
from ..prompts import data, prompt_render
from ..rollout import episodes
from ..sampler.remote import RolloutServerLost
from ..train import warmup
from ..train.grpo_step import GRPOStep, RolloutSources, RunLinks, TrainedModel
from ..train.skipped_steps import last_checkpoint
from . import distributed, evaluation, host_memory


class Trainer:
    """One run: its directory (locked), data, policy and GRPO step (`grpo`); checkpoints, eval, events."""

    def __init__(self, cfg: Config, run_dir, resume: bool = False):
        self.cfg, self.resume, self.stop_requested = cfg, resume, False
        self.signals = _Signals(self, Path(run_dir))  # a stop is heard from here on (while loading: at once)
        self.rundir, held = None, False
        try:
            self.signals.unblock()
            self.dist = distributed.start(cfg)  # data-parallel ranks (torchrun), or one process
            self.rundir = self.dist.writer(run_dir)  # only rank 0 writes the run directory
            if self.dist.main:  # the lock before anything loads; a new run refuses a directory that holds one
                self.rundir.acquire(new_run=not resume)  # refused: RunLock or UserError, nothing written
                held = True
                if not resume:  # first, so a trainer killed while loading leaves a run that --resume restarts
                    save_config(cfg, self.rundir.dir / CONFIG)
                else:  # --resume --set: config.toml says what the steps from here are trained with
                    self._record_changes(cfg)
            self._load(cfg)
        except BaseException:
            self.signals.restore()
            stop = self.signals.stop
            if stop and held:  # a stop is no mistake: the run stays, and --resume starts it again
                row = last_metrics_row(self.rundir.dir)
                self.rundir.event("stopped", f"stopped while loading ({stop})", step=row[schema.STEP] if row else 0)
            if held and not resume and not stop:  # a new run refused while loading leaves nothing behind
                self.rundir.abandon()
            elif self.rundir is not None:
                self.rundir.release()
            if stop and not held and not resume:  # stopped before the lock: the new run's folder, still empty
                with contextlib.suppress(OSError):
                    Path(run_dir).rmdir()
            if stop:
                line = f"stopped while loading ({stop})" + ("" if held else ", before anything was written")
                raise StoppedLoading(line, self.rundir is None or self.dist.main) from None
            raise
        self.signals.loading = False

    def _record_changes(self, cfg: Config) -> None:
        """--resume with another config (--set, or an edited config.toml; cli/train_cmd.py has refused what the
        checkpoint cannot carry): a `config_changed` event against what the newest checkpoint was trained with."""
        changed = config.changes(resume_rules.reference(self.rundir.dir)[1], cfg)
        if changed:
            line = "; ".join(f"{key} {a} -> {b}" for key, (a, b) in changed.items())
            self.rundir.event("config_changed", f"resumed with {line}", keys=sorted(changed))
            save_config(cfg, self.rundir.dir / CONFIG)

    def _load(self, cfg: Config) -> None:
        """Everything the run needs, under the lock: user inputs first, then the model, optimizer and sampler."""
        self.from_checkpoint = False  # resumed from a checkpoint (_restore)
        torch.manual_seed(cfg.train.seed)

        # user inputs first (rewards, data, model path), so mistakes surface before weights load
        reward_fns = reward_lib.build(cfg.rewards)
        self.outlets = Outlets(cfg, self.rundir, self.dist.main)  # trackers and alerts (a missing extra fails here)
        has_env = bool(cfg.env.environment)  # its reset completes each prompt
        self.prompts = data.PromptStream(data.load_rows(cfg.data, "train", has_env), cfg.train.seed)
        self.eval_rows = data.load_rows(cfg.data, "eval", has_env)
        self.general_rows = data.load_rows(cfg.data, "general")  # the generalisation split, evaluated beside them
        self.rundir.event("info", data.split_summary(cfg.data, self.prompts.rows, self.eval_rows, self.general_rows))
        if cfg.train.eval_every and not self.eval_rows:
            self.rundir.event(
                "warning",
                f"train.eval_every = {cfg.train.eval_every}: no rows to evaluate on, so no "
                f"eval/accuracy; set data.eval_size (rows held out), data.eval_source (a file of eval rows), "
                f"or data.eval_split for a Hugging Face dataset",
            )
        self.model_path = policy_loader.resolve_model_path(cfg.model.name)
        self.tokenizer = policy_loader.load_tokenizer(self.model_path)
        # every prompt rendered and measured before weights load: a broken template or a too-short
        # rollout.max_prompt_len fails here, in one line
        # (env.environment: the environment class, the chat template and every episode's first prompt)
        every_row = self.prompts.rows + self.eval_rows + self.general_rows
        self.episodes = episodes.make(cfg, self.tokenizer, every_row)
        if not self.episodes:
            prompt_render.check_prompt_lengths(every_row, cfg.data, self.tokenizer, cfg.rollout.max_prompt_len)
        self.warmup = warmup.prepare(cfg, self.tokenizer, self.episodes)  # warmup.source's conversations, tokenised
        self.device = policy_loader.device()
        step_cfg = self._choose_micro_batch(cfg)  # before the weights load: the free memory is the budget
        host_memory.keep_freed_memory(self.device)  # CPU: what a micro-batch frees is kept for the next one
        self.precision = precision_plan.resolve(cfg)  # the one precision decision, handed to every consumer
        self.policy = self.dist.wrap(
            policy_loader.load_policy(cfg, self.model_path, self.precision).to(self.device), self.precision
        )  # fsdp: sharded
        self.policy.train()  # transformers only checkpoints activations in train mode
        self.grpo = GRPOStep(
            step_cfg,
            TrainedModel(self.policy, self.precision, self.model_path, self.tokenizer, self.device),
            RunLinks(self.dist, self.rundir, self.outlets),
            RolloutSources(self.prompts, reward_fns, self.episodes),
        )
        self.grpo.exact_parts = self.micro_batch is not None  # auto: every loss type equals its whole batch

    def _choose_micro_batch(self, cfg: Config) -> Config:
        """train.micro_batch_size = auto: the rows contract/planner/micro_batch.py chooses for this machine (the
        smallest choice of any rank, so every rank cuts alike), recorded as an `info` event; the step's config
        holds the number, config.toml keeps auto. Any other value: `cfg` as it is."""
        self.micro_batch = None
        if not micro_batch.is_auto(cfg):
            return micro_batch.fixed(cfg)
        choice = micro_batch.here(cfg, self.dist.world)
        rows = min(self.dist.gather([choice.rows]))
        if rows != choice.rows:
            choice = micro_batch.Choice(rows, "the smallest rank's choice", choice.budget)
        self.micro_batch = choice
        self.rundir.event("info", choice.line(), micro_batch_rows=rows, plan=choice.budget)
        return micro_batch.with_rows(cfg, rows)

    @property
    def step_no(self) -> int:
        """Optimizer steps done (taken or skipped)."""
        return self.grpo.step_no

    def step(self) -> dict:
        """One optimizer step (engine/train/grpo_step.py); its metrics row."""
        return self.grpo.step()

    # ---- evaluation -------------------------------------------------------------------------
    def evaluate(self, limit: int | None = None) -> float:
        """Held-out accuracy (pass@1) at the run's temperature (eval_metrics)."""
        return self.eval_metrics(limit)[schema.EVAL_ACCURACY]

    def eval_metrics(self, limit: int | None = None) -> dict[str, float]:
        """The eval/* values of train.eval_k samples per eval prompt (engine/run/evaluation.py): the held-out
        rows', then the generalisation split's (eval/general/*)."""
        sampler, rollouts = self.grpo.sampler, self.grpo.rollouts
        if self.grpo.updates:  # between the updates of a rollout the sampler still holds the weights that sampled it
            sampler.load_weights(export_weights(self.policy))
            self.grpo.synced.took(self.grpo.params)
        out = {}
        for split, split_rows in ((schema.EVAL, self.eval_rows), (schema.GENERAL, self.general_rows)):
            every = split_rows[:limit] if limit else split_rows
            if not every:
                continue
            rows = self.dist.shard(every)  # data-parallel: each rank its part, the sums summed
            sums = evaluation.sample(rollouts, rows, self.cfg)[0] if rows else evaluation.no_sums(rollouts.reward_names)
            sums = [float(self.dist.total(torch.tensor(s, dtype=torch.float64))) for s in sums]  # summed over ranks
            out.update(evaluation.eval_metrics(sums, len(every), self.cfg.train.eval_k, split, rollouts.reward_names))
        return out

    # ---- the run ----------------------------------------------------------------------------
    def run(self, progress=None) -> str:
        """Train to train.steps or until asked to stop. Returns 'finished' or 'stopped'."""
        self.rundir.acquire()  # held since __init__ (again only if released since)
        try:
            return self._run(progress)  # a stop is graceful from here to the last checkpoint (_Signals)
        except BaseException as err:
            stop = err
            if isinstance(err, checkpoint.NoUsableCheckpoint):  # a refusal before `started`: the run stays as it was
                raise
            if disk_full(err, self.rundir.dir):
                stop = disk_full_error(self.rundir.dir, self.step_no, last_checkpoint(self.rundir.dir, self.step_no))
            with contextlib.suppress(OSError):  # a full disk may refuse this line too: stderr still says it
                self.rundir.event("crashed", f"{type(stop).__name__}: {stop}", step=self.step_no)
                self.outlets.event("crashed", f"{type(stop).__name__}: {stop}", self.step_no)
            if stop is err:
                raise
            raise stop from None
        finally:
            self.signals.restore()
            self.rundir.release()

    def _run(self, progress) -> str:
        cfg = self.cfg
        if self.resume:
            self._restore(progress)
        warning = self.precision.warning
        if warning:
            self.rundir.event("warning", warning)
            if progress:
                progress.warn(warning)
        self.rundir.event(
            "started",
            f"{'resumed at' if self.resume else 'starting'} step {self.step_no}",
            total_steps=cfg.train.steps,
            pid=os.getpid(),
        )
        if self.warmup and not self.from_checkpoint:  # a checkpoint's adapter holds the warm-up already
            if not self._warm_up(progress):  # stopped: no checkpoint, so --resume warms up again from the start
                self.rundir.event("stopped", "stopped during the warm-up", step=0)
                return "stopped"
        # verl's val_before_train. Off by default: the extra sampling shifts later steps' μ at fp32 rounding, so
        # a run resumed past it no longer equals the uninterrupted one bit for bit (tests/test_crash_consistency.py)
        if cfg.train.eval_before and cfg.train.eval_every and self.eval_rows and not self.resume:
            before = self.eval_metrics()
            line = evaluation.summary(before)
            fields = {key.removeprefix("eval/"): value for key, value in before.items()}  # metrics.EVAL_KEYS
            self.rundir.event("eval", f"before training: {line}", step=0, **fields)
            if progress:
                progress.note(f"before training: {line}")
        grpo = self.grpo  # grpo.lost: the rollout server stopped answering (in a step's weight sync, or here)
        while self.step_no < cfg.train.steps and not self._stop_agreed() and not grpo.lost:
            try:
                row = self.step()
            except RolloutServerLost as err:  # lost while sampling: nothing of this step was taken
                grpo.lost = err
                break
            stop = grpo.skips.stop  # diverged or collapsed: this step's row is written, its weights are not saved
            if (
                cfg.train.eval_every
                and self.eval_rows
                and self.step_no % cfg.train.eval_every == 0
                and not (grpo.lost or stop)
            ):
                row.update(self.eval_metrics())
            row = self.dist.reduce_metrics(row)  # one row for all ranks, written by rank 0
            self.rundir.metrics(row)
            self.outlets.row(row)
            if progress:
                progress.update(row)
            if stop:
                raise stop
            if cfg.train.save_every and self.step_no % cfg.train.save_every == 0:
                self._save()
        self._save()
        if grpo.lost:
            self.rundir.event(
                "rollout_server_lost",
                f"{grpo.lost}; stopped at step {self.step_no} with a checkpoint",
                step=self.step_no,
            )
            raise UserError(
                f"{grpo.lost}; stopped at step {self.step_no} with a checkpoint (resume with "
                f"--resume once the server is back)",
                kind="run",
            )
        state = "stopped" if self.stop_requested and self.step_no < cfg.train.steps else "finished"
        self.rundir.event(state, f"{state} at step {self.step_no}", step=self.step_no)
        self.outlets.event(state, f"{state} at step {self.step_no}", self.step_no)
        return state

    def _warm_up(self, progress) -> bool:
        """warmup.source: supervised steps on its conversations' assistant turns (engine/train/warmup.py), one
        `warmup` event each, then the sampler takes the warmed-up weights. False when stopped (SIGTERM/SIGINT)."""
        total = self.cfg.warmup.steps

        def note(k: int, loss: float) -> bool:
            line = f"warm-up step {k}/{total}: loss {loss:.4f}"
            self.rundir.event("warmup", line, step=0, warmup_step=k, loss=loss)
            if progress and (k == 1 or k == total or k % 10 == 0):
                progress.note(line)
            return self.stop_requested

        pad = self.tokenizer.pad_token_id  # load_tokenizer sets it (eos when the tokenizer has none)
        warmup.run(self.warmup, self.policy, self.cfg, self.precision, pad, self.device, note)
        if self.stop_requested:
            return False
        self.grpo.sampler.load_weights(export_weights(self.policy))
        self.grpo.synced.took(self.grpo.params)
        return True

    def close(self) -> None:
        """Release the rollout engine (vLLM holds memory and threads) and the data-parallel group; finish the
        trackers' runs."""
        self.grpo.sampler.close()
        self.dist.close()
        self.outlets.close()
        self.signals.restore()
        self.rundir.release()  # a trainer that never ran holds the lock from __init__ until here

    def _stop_agreed(self) -> bool:
        """A stop asked of one rank (SIGTERM) stops every rank before the same step."""
        self.stop_requested = self.dist.any(self.stop_requested)
        return self.stop_requested

    def _save(self) -> None:
        grpo = self.grpo
        full = self.dist.full_state(self.policy, grpo.optimizer)  # fsdp: gathered from the shards (all ranks)
        if not self.dist.main:  # rank 0 saves the weights for all
            return
        path = checkpoint.save(
            self.rundir.dir,
            self.step_no,
            self.policy,
            grpo.optimizer,
            grpo.schedule,
            grpo.scaler,
            self.prompts.state(),
            grpo.skips.counters(),
            full,
            config.to_toml(self.cfg),
        )
        if path is None:
            return
        self.rundir.event("checkpoint", f"saved {path.name}", step=self.step_no, path=str(path))
        keep = self.cfg.train.keep_checkpoints
        if keep:
            removed = checkpoint.prune(self.rundir.dir, keep, self.step_no, self._best_metric_scores())
            if removed:
                self.rundir.event(
                    "checkpoints_deleted",
                    f"deleted {', '.join(f'step-{s}' for s in removed)} (train.keep_checkpoints = {keep})",
                    steps=removed,
                )

    def _best_metric_scores(self) -> dict[int, float]:
        """step -> train.best_metric from the metrics rows that have a finite one (none without a best_metric)."""
        name, scores = self.cfg.train.best_metric, {}
        for row in read_rows(self.rundir.dir / METRICS) if name else []:
            value = as_number(row.get(name))
            if value is not None and math.isfinite(value):
                scores[row[schema.STEP]] = value
        return scores

    def _restore(self, progress=None) -> None:
        """Continue from the newest trustworthy checkpoint the run's files allow, or from step 0 and the base
        weights when there is none, with the streams cut back to that step: each step stays in them once.
        Checkpoints after it are moved aside, since the steps after it are trained again."""
        grpo = self.grpo
        at_most, why = self._resume_limit()
        state = checkpoint.restore(
            self.rundir.dir,
            self.policy,
            grpo.optimizer,
            grpo.schedule,
            grpo.scaler,
            on_skip=lambda step, path, why: self._warn(
                progress,
                "checkpoint_skipped",
                f"skipped checkpoint {path.name}: {why}",
                step=step,
                path=str(path),
                reason=why,
            ),
            into=self.dist.load_state,
            at_most=at_most,
        )
        self.from_checkpoint = state is not None
        if state is not None:
            self.prompts.restore(state["data_cursor"])
            grpo.resume_at(state["step"], state["counters"])
        superseded = checkpoint.supersede(self.rundir.dir, self.step_no) if self.dist.main else []  # rank 0 moves
        if state is None:
            limit = f" at or before step {at_most} ({why})" if superseded else ""
            self._warn(
                progress,
                "no_checkpoint",
                f"no complete checkpoint to resume from{limit}: restarting at step 0 from the base weights",
                step=0,
            )
        if superseded:
            self.rundir.event(
                "checkpoints_superseded",
                f"resuming at step {self.step_no} ({why}): moved aside " + ", ".join(f"step-{s}" for s in superseded),
                step=self.step_no,
                steps=superseded,
            )
        dropped = self.rundir.cut_streams(self.step_no)
        if dropped:
            what = "; ".join(
                f"{name}: "
                + " and ".join(
                    part
                    for part, n in (
                        (f"{n['past']} rows past step {self.step_no}", n["past"]),
                        (f"{n['malformed']} malformed lines", n["malformed"]),
                        (f"{n['repeated']} repeated steps", n["repeated"]),
                    )
                    if n
                )
                for name, n in dropped.items()
            )
            self.rundir.event(
                "rows_dropped", f"resuming at step {self.step_no}: dropped {what}", step=self.step_no, files=dropped
            )

    def _resume_limit(self) -> tuple[int, str]:
        """The newest step a resume may start from, and why: no later than the last good checkpoint
        of a `diverged` or `collapsed` event the run has not resumed past, nor than the metrics cover (steps
        1..k each in metrics.jsonl), so that no step is missing from the run's rows."""
        limits = []
        states = [e for e in read_events(self.rundir.dir) if e["event"] in ("started", "diverged", "collapsed")]
        if states and states[-1]["event"] != "started":
            good = as_number(states[-1].get("last_good_step"))
            limits.append((int(good or 0), f"the last good checkpoint before it {states[-1]['event']}"))
        covered = 0
        steps = {as_number(row.get(schema.STEP)) for row in read_rows(self.rundir.dir / METRICS)}
        while covered + 1 in steps:
            covered += 1
        limits.append((covered, f"metrics.jsonl has no row for step {covered + 1}"))
        return min(limits)

    def _warn(self, progress, kind: str, message: str, **extra) -> None:
        """An event the user must see as it happens: also a warning line on the terminal."""
        self.rundir.event(kind, message, **extra)
        if progress:
            progress.warn(message)


class StoppedLoading(Exception):
    """A stop (SIGTERM, SIGINT) while the trainer loaded: str() is the line `grpo-studio train` prints before it
    exits 0, as after a stop mid-run; `main`: this process reports (rank 0)."""

    def __init__(self, line: str, main: bool):
        super().__init__(line)
        self.main = main


class _Interrupted(BaseException):
    """Raised where the main thread is by a stop that arrives while the trainer loads (not an Exception, so no
    `except Exception` on the way swallows it)."""


class _Signals:
    """The trainer's signals, from its first line until its run ends (or close): SIGTERM / SIGINT stop it, at once
    while it loads (_Interrupted, then StoppedLoading), after that at the end of the step (a checkpoint, `stopped`);
    a second one only asks again. SIGHUP (its terminal closed) detaches it: the run goes on, its output into
    RUN/stdout.log (rundir.detach_output). `grpo-studio train` starts the trainer with these signals blocked
    (cli/train_cmd.py), so one sent before the handlers are in place waits for them, here."""

    HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def __init__(self, trainer: Trainer, run_dir: Path):
        self.trainer, self.run_dir = trainer, run_dir
        self.loading, self.stop = True, ""  # stop: the name of the first stop signal
        self.old = {}
        if threading.current_thread() is threading.main_thread():  # Python runs handlers in the main thread only
            self.old = {sig: signal.signal(sig, self._on) for sig in self.HANDLED}

    def unblock(self) -> None:
        """Take the signals held since the process started (a stop delivered here raises _Interrupted)."""
        if self.old:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, self.HANDLED)

    def _on(self, signum, _frame) -> None:
        if signum == signal.SIGHUP:
            detach_output(self.run_dir)
            return
        self.stop = self.stop or signal.Signals(signum).name
        self.trainer.stop_requested = True
        if self.loading:
            self.loading = False  # one interruption: a second signal while the stop is written only asks again
            raise _Interrupted

    def restore(self) -> None:
        """The handlers before; but once stopped, further stops are ignored until the process ends (the default
        action would kill it as it exits 0, and python's own shutdown restores that default for a handler)."""
        for sig, handler in self.old.items():
            signal.signal(sig, signal.SIG_IGN if self.stop and sig != signal.SIGHUP else handler)
        self.old = {}
