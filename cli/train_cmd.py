"""`grpo-studio train`: train headless, writing a run directory; a rich progress bar on a terminal, one plain line
per step when piped.

What it owns: the command's own checks (the recipe, --resume's rules, --nproc/--devices, the rehearsal's flags), the
supervisor (the trainer as a child process it outlives: its crash recorded, its signals passed on, a hang-up
detached) and, in that child, the trainer with its progress. The checks every front end runs before a trainer
starts (the run directory, the pre-flight), the plain progress lines and the command lines it starts come from
contract/launch.py, which the studio's launcher and the Python API use too."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..contract import config, launch, metrics, resume_rules, rundir
from ..contract.errors import UserError, user_path
from ..contract.rundir import CONFIG, RUNS, RunLock
from .parser import add_recipe

IN_PROCESS = launch.NO_SUPERVISOR  # the supervisor's child: train in this process


class RichProgress(launch.PlainProgress):
    """A rich progress bar with step, reward and ETA, for terminals."""

    def __init__(self, total: int):
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        super().__init__(total)
        self.bar = Progress(
            TextColumn("step {task.completed}/{task.total}"),
            BarColumn(),
            TextColumn("reward {task.fields[reward]}  k3 {task.fields[k3]}"),
            TimeRemainingColumn(),
        )
        self.task = self.bar.add_task("train", total=total, reward="-", k3="-")
        self.bar.start()

    def attached(self) -> bool:
        """Whether the bar still has its terminal: after a SIGHUP (rundir.detach_output) it stops, and the steps go
        on as PlainProgress's lines into stdout.log."""
        if self.bar.live.is_started and not os.isatty(1):
            self.bar.stop()
        return self.bar.live.is_started

    def warn(self, message: str) -> None:
        if self.attached():
            self.bar.console.print(f"[yellow]warning:[/] {message}")
        else:
            super().warn(message)

    def note(self, message: str) -> None:
        if self.attached():
            self.bar.console.print(message, markup=False)
        else:
            super().note(message)

    def update(self, row: dict) -> None:
        if not self.attached():
            super().update(row)
            return
        self.bar.update(
            self.task,
            completed=row[metrics.STEP],
            reward=f"{row.get(metrics.REWARD, float('nan')):.3f}",
            k3=f"{row.get(metrics.K3, float('nan')):.1e}",
        )

    def close(self) -> None:
        self.bar.stop()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_recipe(parser)
    parser.add_argument(
        "--run-dir", metavar="DIR", help=f"a new or empty directory for the run (default: a new one under {RUNS}/)"
    )
    parser.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its last checkpoint")
    parser.add_argument(
        "--force",
        action="store_true",
        help="launch even when the pre-flight check says the run will not fit the free memory",
    )
    parser.add_argument(
        "--rehearse",
        action="store_true",
        help="before the run starts, one real step on the longest prompt at the longest completion in a "
        "throwaway directory: its peak memory next to the planner's estimate; refused when over the free memory",
    )
    parser.add_argument(
        "--nproc",
        type=int,
        default=1,
        metavar="N",
        help="data-parallel processes on this machine, launched by torchrun (needs train.parallel "
        "= ddp or fsdp); docs/distributed.md",
    )
    parser.add_argument("--devices", metavar="0,1", help="the GPUs the processes use (CUDA_VISIBLE_DEVICES)")
    parser.add_argument(IN_PROCESS, dest="in_process", action="store_true", help=argparse.SUPPRESS)


def default_run_dir(recipe: str) -> Path:
    return RUNS / f"{Path(recipe).stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def run(args: argparse.Namespace) -> int:
    if args.resume is not None:
        resume = launch.given_dir(args.resume, "--resume", "a run directory")
        with user_path("--resume", str(resume)):
            is_run = (resume / CONFIG).is_file()
            empty = is_run and not (resume / CONFIG).read_bytes().strip()
        if not is_run:
            raise UserError(f"--resume {str(resume)!r}: no {CONFIG} there (not a run directory)")
        if empty:  # defaults would not be the run's settings: its checkpoints would not even load
            raise UserError(
                f"--resume {str(resume)!r}: its {CONFIG} is empty, so the run's settings are lost; "
                f"write them back (the recipe and --set values it was started with), then resume"
            )
        cfg = config.load(str(resume / CONFIG), args.sets)
        resume_rules.check(resume, cfg, {config.parse_override(s)[0] for s in args.sets})  # before anything loads
        run_dir = resume
    else:
        run_dir = (
            None
            if args.run_dir is None
            else launch.given_dir(
                args.run_dir, "--run-dir", f"a new or empty directory, or no --run-dir for a new one under {RUNS}/"
            )
        )
        cfg = config.load(args.recipe, args.sets)
        run_dir = run_dir or default_run_dir(args.recipe)
    if not args.in_process:  # the trainer process (each rank under torchrun) checks as it takes the lock
        check_launch(cfg, args.nproc, args.devices)
        check_rehearse(cfg, args)
        launch.check_free(run_dir, args.resume is not None)
        launch.preflight_check(
            cfg, args.force, args.nproc
        )  # before the run directory exists: a refused run leaves nothing behind
    launch.usable_run_dir(run_dir, "--resume" if args.resume is not None else "--run-dir")
    run_dir = run_dir.absolute()  # every event (a checkpoint's path) and a fork's fork.json name it from anywhere
    with rundir.terminal_loss_detaches(run_dir):  # a terminal gone without a SIGHUP: as a hang-up
        if not args.in_process:
            return supervise(args, run_dir)
        supervised = os.environ.pop(SUPERVISED, None) is not None  # never a test's in-process call
        code = 1
        try:
            code = train(cfg, run_dir, args)
            return code
        except (UserError, RunLock):
            code = 2
            raise
        finally:
            if supervised:
                bound_exit(code)


def train(cfg: config.Config, run_dir: Path, args: argparse.Namespace) -> int:
    """The trainer process: the run in this process, with its progress on stdout."""
    rehearsed = rehearse(cfg, run_dir, args) if args.rehearse else None
    from ..engine.run.trainer import StoppedLoading, Trainer  # torch loads once the config is known good

    try:
        trainer = Trainer(cfg, run_dir, resume=args.resume is not None)
    except StoppedLoading as stopped:  # exit 0, as a stop mid-run
        if stopped.main:
            print(f"{stopped}: {run_dir}", flush=True)
        return 0
    if rehearsed:
        trainer.rundir.event("rehearsal", rehearsed.line(), phase="done", **rehearsed.fields())
    main = trainer.dist.main  # under torchrun, rank 0 reports for all
    progress = None
    if main:
        progress = RichProgress(cfg.train.steps) if sys.stdout.isatty() else launch.PlainProgress(cfg.train.steps)
        print(f"run directory: {run_dir}", flush=True)
    try:
        state = trainer.run(progress)
    finally:
        if progress:
            progress.close()  # before an error line (the error boundary in cli/main.py prints it)
        trainer.close()
    if main:
        print(f"{state} at step {trainer.step_no}: {run_dir}", flush=True)
    return 0


def check_launch(cfg: config.Config, nproc: int, devices: str | None) -> None:
    """--nproc and --devices against train.parallel, before anything starts."""
    config.check_processes(cfg, nproc, "--nproc")
    if devices is not None:
        ids = devices.split(",")
        if not all(i.strip().isdigit() for i in ids):
            raise UserError("a comma-separated list of GPU indices, e.g. 0,1", key="--devices", value=devices)
        if len(ids) < nproc:
            raise UserError(
                f"--nproc {nproc} needs one device per process, {len(ids)} given", key="--devices", value=devices
            )


def check_rehearse(cfg: config.Config, args: argparse.Namespace) -> None:
    """--rehearse rehearses one process's step on single-turn prompts."""
    if not args.rehearse:
        return
    if args.nproc > 1:
        raise UserError("--rehearse rehearses one process; allowed with it: 1", key="--nproc", value=args.nproc)
    if cfg.env.environment:
        raise UserError(
            "--rehearse rehearses single-turn prompts; allowed with it: '' (no environment)",
            key="env.environment",
            value=cfg.env.environment,
        )


def rehearse(cfg: config.Config, run_dir: Path, args: argparse.Namespace):
    """One real step on the longest prompt at the longest completion, in a throwaway directory, before the run
    loads (engine/run/rehearsal.py); its line printed. A peak over the free memory the pre-flight check sees stops the
    run in one line (unless --force), leaving a new run's directory as it was."""
    from ..contract.planner import preflight

    devs = preflight.devices()
    verdict = preflight.check(cfg, devs)  # the pre-flight's planned total and free memory, before torch loads
    running = (
        f"rehearsal: one step on the longest prompt at {cfg.rollout.max_completion_len} completion tokens, "
        f"{verdict.need_gib:.2f} GiB planned ({devs[0].where()}) …"
    )
    writer = rundir.RunWriter(run_dir)  # no lock: not a state event, so the run still reads as created
    writer.event("rehearsal", running, phase="running", planned_gib=verdict.need_gib, where=devs[0].where())
    writer.close()  # the studio shows the phase while the step runs (studio/rundata.py: RunData.rehearsal)
    from ..engine.run import rehearsal

    result = rehearsal.rehearse(cfg, verdict.need_gib, verdict.free_gib, devs[0].where())
    print(result.line(), flush=True)
    if result.fits or args.force:
        return result
    if args.resume is None:  # a new run's directory as it was: the running event goes with the refusal
        (run_dir / rundir.EVENTS).unlink(missing_ok=True)
        if not any(run_dir.iterdir()):
            run_dir.rmdir()
    raise UserError(
        f"the rehearsal step peaked at {result.measured_gib:.2f} GiB and {result.where} has "
        f"{result.free_gib:.2f} GiB free (planned {result.planned_gib:.2f} GiB); or launch anyway with --force",
        kind="rehearsal",
    )


def supervise(args: argparse.Namespace, run_dir: Path) -> int:
    """Train in a child process (this command with --no-supervisor) and outlive it: a trainer that dies
    without saying goodbye (os._exit in a reward function, SIGKILL from the OOM killer) gets its `crashed`
    event and loses its lock here. SIGTERM and SIGINT are passed on, so a stop stays graceful. SIGHUP (the
    terminal closed) detaches the run: this process keeps watching, it and the trainer write on into
    RUN/stdout.log. The trainer never outlives this process: when it dies the trainer is sent SIGTERM and stops
    gracefully, writing its own `stopped` (_child_setup). Returns the child's exit code (128 + N when signal N
    killed it)."""
    resuming = args.resume is not None
    flags = launch.train_args(
        args.recipe, run_dir, args.sets, resume=resuming, force=args.force, rehearse=args.rehearse
    )
    cmd = launch.train_command(flags, trainer=True, ranks=args.nproc)
    env = dict(os.environ, **{SUPERVISED: "1"})
    if args.devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = args.devices
    child, pending = None, []

    def forward(signum, _frame):
        if signum == signal.SIGHUP:
            rundir.detach_output(run_dir)  # and the trainer too (a `kill -HUP` may have reached only this process)
        elif signum == signal.SIGINT and args.nproc == 1 and _terminal_sent_it():
            return  # Ctrl-C reached the trainer from the terminal already
        if child is None:
            pending.append(signum)
        else:
            _send(child, signum, args.nproc)

    old = {sig: signal.signal(sig, forward) for sig in PASSED_ON}
    try:
        # torchrun in its own process group: Ctrl-C reaches it only through _send, never as torchrun's own signal
        child = subprocess.Popen(
            cmd,
            env=env,
            process_group=0 if args.nproc > 1 else None,
            preexec_fn=_child_setup(os.getpid(), hold=args.nproc == 1),
        )
        for signum in pending:
            _send(child, signum, args.nproc)
        code = child.wait()
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    # any exit without its end is a crash, exit 0 included (os._exit(0) in an environment); under torchrun the
    # trainer is rank 0, named by the lock it left
    crash = rundir.record_exit(run_dir, child.pid if args.nproc == 1 else rundir.read_pid(run_dir) or 0, code)
    if crash:
        print(f"run error: {crash}; the run is marked crashed: {run_dir}", file=sys.stderr, flush=True)
        code = code or 1
    return code if code >= 0 else 128 - code


SUPERVISED = "GRPO_STUDIO_SUPERVISED"  # set for the trainer process: bound_exit holds there only
EXIT_GRACE_S = 30.0


def bound_exit(code: int, grace_s: float = EXIT_GRACE_S) -> None:
    """In the supervised trainer process, once its run has ended: a daemon watchdog ends the process with `code`
    after `grace_s` if the interpreter is still alive then, so that a thread user code left running (which
    threading's shutdown waits for) or an atexit handler that never returns cannot keep it, and its supervisor,
    from exiting."""

    def watchdog() -> None:
        time.sleep(grace_s)
        with contextlib.suppress(Exception):
            print(
                f"warning: still alive {grace_s:.0f} s after the run ended (a thread or atexit handler of the "
                f"run's own code); ended",
                flush=True,
            )
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)

    threading.Thread(target=watchdog, name="exit-watchdog", daemon=True).start()


PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # what the trainer handles (engine/run/trainer.py _Signals)
PR_SET_PDEATHSIG = 1  # prctl(2)


def _child_setup(supervisor: int, hold: bool):
    """What the trainer's process does before it runs python (subprocess's preexec_fn): on Linux it asks for SIGTERM
    when this process dies (PR_SET_PDEATHSIG), so it stops gracefully instead of training on unwatched; `hold` (the
    trainer itself, not torchrun) blocks PASSED_ON until the trainer's handlers are in place, so a stop or hangup
    sent while python starts waits for them instead of killing it. A supervisor already gone gets the same SIGTERM."""
    prctl = getattr(ctypes.CDLL(None), "prctl", None) if sys.platform == "linux" else None

    def setup() -> None:
        if hold:
            signal.pthread_sigmask(signal.SIG_BLOCK, PASSED_ON)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != supervisor:  # died before prctl
            if not hold:  # torchrun: not started, so nothing to stop
                os._exit(128 + signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # blocked: the trainer's handler takes it as a stop

    return setup


def _send(child: subprocess.Popen, signum: int, nproc: int) -> None:
    """Pass a stop on to the trainer: under torchrun to each rank, which all stop after the same step; torchrun
    itself, signalled, would tear the ranks down and exit non-zero (before it has started them: torchrun)."""
    if nproc > 1:
        import psutil

        try:
            ranks = psutil.Process(child.pid).children()
        except psutil.NoSuchProcess:  # torchrun has exited
            return
        if ranks:
            for rank in ranks:
                rank.send_signal(signum)
            return
    child.send_signal(signum)


def _terminal_sent_it() -> bool:
    """Whether a SIGINT came from Ctrl-C: the terminal sends it to its whole foreground process group,
    which holds this process and the trainer."""
    try:
        return os.tcgetpgrp(0) == os.getpgrp()
    except OSError:  # no terminal
        return False
