"""Data-parallel GRPO across the processes torchrun starts (train.parallel = ddp; docs/distributed.md).

Each rank samples its contiguous share of a step's prompts (all G completions of a prompt on one rank,
so group advantages stay exact), scores them and trains on them; the gradients are summed across ranks
with one all-reduce after the step's last backward, each rank's first multiplied by its share of the
global normaliser, so the update equals the one-process update on the whole batch (grpo and dr_grpo
divide by sequences, bnpo by active tokens, dapo by the rollout's token count `num_items`, which is made
global before the loss; each loss type says which: contract/loss_types.py rank_units). The sum also makes fp16's found_inf global: an inf on one rank is an inf on all,
so every rank skips the step and shrinks its loss scale alike. Metrics are combined as the schema says
(contract/metrics.py `combine`), histograms summed, samples gathered; only rank 0 writes the run
directory and holds its lock.

train.parallel = fsdp (`Sharded`) shards the policy with FSDP2 (engine/model/fsdp.py): each rank weights its loss
by its share before the backward, whose reduce-scatter then sums the shards of the gradient; the gradient
norm and the finiteness check sum their per-shard parts over the ranks.

`Single` is the one-process group (train.parallel = none): the same calls, doing nothing, so the trainer
calls them unconditionally.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import time

import psutil
import torch
import torch.distributed as dist

from ...contract import metrics as schema
from ...contract.config import Config, check_processes
from ...contract.loss_types import LossType
from ...contract.rundir import RunWriter
from ..sampler.base import NonFiniteSampling


class Single:
    """One process: every rank call is the identity."""

    rank, world, main = 0, 1, True

    def writer(self, run_dir) -> RunWriter:
        return RunWriter(run_dir)

    def shard(self, rows: list) -> list:
        return rows

    def total(self, value: torch.Tensor) -> torch.Tensor:
        return value

    def any(self, flag: bool) -> bool:
        return flag

    def sync_params(self, params) -> None:
        pass

    def wrap(self, policy, plan):
        """The policy as this group trains it (FSDP: sharded, computing as the precision plan says)."""
        return policy

    def backward_weight(self, mask: torch.Tensor, loss_type: LossType) -> float:
        """What this rank's loss is multiplied by before its backward (FSDP: its share; others: 1)."""
        return 1.0

    def shard_sum(self, value: float) -> float:
        """The sum over ranks of a quantity each holds a shard of (FSDP); elsewhere every rank holds it all."""
        return value

    def full_state(self, policy, optimizer):
        """(model, optimizer) state dicts for a checkpoint gathered from the shards (FSDP), or None: the
        checkpoint takes the model's and optimizer's own."""
        return None

    load_state = None  # FSDP: shards a checkpoint back (engine/model/fsdp.py load_full_state)

    def agreeing(self, sampler):
        """The sampler as the rollouts use it (data-parallel: one rank's non-finite rollout fails on all)."""
        return sampler

    def reduce_gradients(self, params, loss: float, mask: torch.Tensor, loss_type: LossType) -> float:
        return loss

    def reduce_metrics(self, row: dict) -> dict:
        return {**row, "perf/comm_s": 0.0}  # no collectives

    def merge_histogram(self, hist: dict) -> dict:
        return hist

    def gather(self, rows: list) -> list:
        return rows

    def close(self) -> None:
        pass


FORWARDED = ("reward_error",)  # events only the rank that met them knows of: rank 0 writes them for it


class ReadOnlyWriter(RunWriter):
    """The run directory as ranks other than 0 see it: they read checkpoints, and write nothing; the events
    only this rank knows of (FORWARDED) wait in `pending` for the next metrics row, which takes them to rank 0."""

    def __init__(self, run_dir):
        super().__init__(run_dir)
        self.pending: list[tuple[str, str, dict]] = []

    def event(self, kind: str, message: str = "", **extra) -> None:
        if kind in FORWARDED:
            self.pending.append((kind, message, extra))

    def acquire(self) -> None:
        pass

    def release(self) -> None:
        pass

    def _append(self, name: str, *rows: dict) -> None:
        pass

    def cut_streams(self, step: int) -> dict:
        return {}


class Agreeing:
    """A rank's sampler as its rollouts see it under data parallelism: a NonFiniteSampling on one rank is raised
    on every rank at the same point, right after sampling and before the rollout's first collective, so all
    ranks skip the step together instead of the others waiting in a collective until train.dist_timeout_s."""

    def __init__(self, inner, group: Group):
        self.inner, self.group = inner, group

    def generate(self, *args, **kwargs):
        return self._agreed(self.inner.generate, *args, **kwargs)

    def result(self, *args, **kwargs):  # rollout.async_mode: the rollout is taken here
        return self._agreed(self.inner.result, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _agreed(self, sample, *args, **kwargs):
        out, why = None, None
        try:
            out = sample(*args, **kwargs)
        except NonFiniteSampling as err:
            why = str(err)
        why = next((f"rank {r}: {w}" for r, w in enumerate(self.group._gather_objects(why)) if w), None)
        if why:
            raise NonFiniteSampling(why)
        return out


class RankLost(RuntimeError):
    """A collective failed because a peer rank died or hung past train.dist_timeout_s."""


class Group(Single):
    """This process's place in the torchrun job: rank, world size, and the collectives the trainer needs."""

    _writer: RunWriter | None = None

    def __init__(self, cfg: Config):
        check_processes(cfg, int(os.environ["WORLD_SIZE"]), "WORLD_SIZE")
        cuda = torch.cuda.is_available()
        if cuda:  # one GPU per rank: the rank's LOCAL_RANK among the visible devices
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        if not dist.is_initialized():  # a second Trainer in the same process joins the same group
            dist.init_process_group(
                "nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=cfg.train.dist_timeout_s)
            )
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.main = self.rank == 0
        self.device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        self.peers: list = [None] * self.world  # (host, pid) of every rank, to name one that is gone
        self.timeout_s = cfg.train.dist_timeout_s
        self.comm_s = 0.0  # seconds in collectives since the last metrics row (perf/comm_s)
        dist.all_gather_object(self.peers, (socket.gethostname(), os.getpid()))

    def writer(self, run_dir) -> RunWriter:
        self._writer = RunWriter(run_dir) if self.main else ReadOnlyWriter(run_dir)
        return self._writer

    def shard(self, rows: list) -> list:
        """This rank's contiguous share of `rows`: of a step's prompts (the world size divides their number), or
        of the eval rows (the first ranks then take one fewer where it does not)."""
        n = len(rows)
        return rows[self.rank * n // self.world : (self.rank + 1) * n // self.world]

    def total(self, value: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of a scalar tensor."""
        out = value.detach().to(self.device, torch.float64).reshape(1)
        self._collective(dist.all_reduce, out)
        return out[0].to(value.device, value.dtype)

    def any(self, flag: bool) -> bool:
        """True on every rank when it is True on one (a stop asked of one rank stops all at the same step)."""
        return bool(self.total(torch.tensor(float(flag))) > 0)

    def sync_params(self, params) -> None:
        """Every rank starts from rank 0's weights (as DDP does at construction)."""
        for p in params:
            self._collective(dist.broadcast, p.data, 0)

    def reduce_gradients(self, params, loss: float, mask: torch.Tensor, loss_type: LossType) -> float:
        """Sum Σ_r w_r·∇L_r into every rank's .grad, where L_r is this rank's loss normalised over its own rows
        (grpo, dr_grpo: its sequences; bnpo: its active tokens; dapo: already the global num_items) and w_r
        its share of the global normaliser. Returns the global loss Σ_r w_r·L_r."""
        weight = self.share(mask, loss_type)
        grads = [p.grad for p in params if p.grad is not None]
        flat = torch.cat(
            [torch.full((1,), loss * weight, device=self.device, dtype=torch.float32)]
            + [g.reshape(-1).float() * weight for g in grads]
        )
        self._collective(dist.all_reduce, flat)  # one bucket; fp16 grads are summed in fp32
        offset = 1
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
        return float(flat[0])

    def agreeing(self, sampler):
        return Agreeing(sampler, self)

    def share(self, mask: torch.Tensor, loss_type: LossType) -> float:
        """w_r, this rank's share of the global loss normaliser (a collective; 1 where the normaliser is global)."""
        mine = loss_type.rank_units(mask)
        if mine is None:
            return 1.0
        return float(mine) / max(float(self.total(mine)), 1e-30)

    def reduce_metrics(self, row: dict) -> dict:
        """One metrics row for the whole job, each metric combined as the schema says (mean by default). The
        other ranks' FORWARDED events travel with their rows; rank 0 writes them, naming their rank."""
        pending = getattr(self._writer, "pending", [])
        parts = self._gather_objects(({**row, "perf/comm_s": self.comm_s}, pending))
        pending.clear()
        self.comm_s = 0.0
        rows = [part for part, _ in parts]
        for rank, (_, events) in enumerate(parts):
            for kind, message, extra in events if self.main else ():
                self._writer.event(kind, message, **extra, rank=rank)
        out = {}
        for key in dict.fromkeys(k for r in rows for k in r):  # a metric only some ranks have (mismatch/lagged/*)
            values = [r[key] for r in rows if r.get(key) is not None]
            metric = schema.lookup(key)
            how = metric.combine if metric else "mean"
            if not values:
                out[key] = rows[self.rank].get(key)
            elif how == "max":
                out[key] = max(values)
            elif how == "min":
                out[key] = min(values)
            elif how == "sum":
                out[key] = sum(values)
            else:
                out[key] = sum(values) / len(values)
        for rank, part in enumerate(rows):  # each rank's own time and memory, next to the combined ones
            for name in schema.PER_RANK:
                value = part.get(name.replace(f"rank{schema.RANK}/", ""))
                if value is not None:
                    out[schema.rank_key(rank, name)] = value
        return out

    def merge_histogram(self, hist: dict) -> dict:
        """The Δlogp histogram of all ranks' tokens: counts summed bin by bin, on the same fixed edges."""
        parts = self._gather_objects(hist)
        return {
            k: v
            if k == "edges"
            else [sum(col) for col in zip(*(p[k] for p in parts))]
            if isinstance(v, list)
            else sum(p[k] for p in parts)
            for k, v in hist.items()
        }

    def gather(self, rows: list) -> list:
        """Every rank's rows, in rank order (samples.jsonl lists the whole step)."""
        return [row for part in self._gather_objects(rows) for row in part]

    def close(self) -> None:
        """Leave the group together: a rank that tears its gloo connections down while a peer still reads its
        last collective makes that peer abort ("terminate called without an active exception"). A peer that
        is gone does not hold this up for long."""
        if not dist.is_initialized():
            return
        with contextlib.suppress(RuntimeError, dist.DistError):
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=min(10.0, self.timeout_s)), wait_all_ranks=True)
        dist.destroy_process_group()

    def _gather_objects(self, obj) -> list:
        out: list = [None] * self.world
        self._collective(dist.all_gather_object, out, obj)
        return out

    def _collective(self, fn, *args):
        start = time.perf_counter()
        try:
            return fn(*args)
        except (RuntimeError, dist.DistError) as err:
            raise RankLost(
                f"{self._who_is_gone()}: {str(err).splitlines()[0] if str(err) else type(err).__name__}; "
                f"every rank stops (train.dist_timeout_s = {self.timeout_s:g})"
            ) from err
        finally:
            self.comm_s += time.perf_counter() - start

    def _who_is_gone(self) -> str:
        """Name the peers on this host whose process is gone. When none is, the collective timed out on live
        ones: they are hung, and are killed here so that none outlives the run (torchrun would wait for a hung
        rank before killing it). Peers on other hosts cannot be checked."""
        local = [
            (r, pid) for r, (host, pid) in enumerate(self.peers) if r != self.rank and host == socket.gethostname()
        ]
        gone = [f"rank {r} (pid {pid})" for r, pid in local if not _alive(pid)]
        if gone:
            return f"{', '.join(gone)} died"
        if not local:
            return f"a peer of rank {self.rank} failed or hung"
        for _, pid in local:
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
        return f"{', '.join(f'rank {r} (pid {pid})' for r, pid in local)} did not answer (hung): killed"


class Sharded(Group):
    """train.parallel = fsdp: the policy sharded by FSDP2 (engine/model/fsdp.py), the gradients reduce-scattered in
    its backward."""

    _weight = 1.0  # this step's share (backward_weight)

    def wrap(self, policy, plan):
        from ..model import fsdp

        self.sync_params(p for p in policy.parameters() if p.requires_grad)  # rank 0's LoRA init, as DDP's
        return fsdp.shard(policy, plan)

    def sync_params(self, params) -> None:
        super().sync_params([p for p in params if not hasattr(p, "device_mesh")])  # shards: nothing to sync

    def backward_weight(self, mask: torch.Tensor, loss_type: LossType) -> float:
        self._weight = self.share(mask, loss_type)
        return self._weight

    def reduce_gradients(self, params, loss: float, mask: torch.Tensor, loss_type: LossType) -> float:
        """The gradient is already the sum (reduce-scatter in the backward); the loss is summed alike."""
        return float(self.total(torch.tensor(loss * self._weight)))

    def shard_sum(self, value: float) -> float:
        return float(self.total(torch.tensor(value, dtype=torch.float64)))

    def full_state(self, policy, optimizer):
        from ..model import fsdp

        start = time.perf_counter()
        try:
            return fsdp.full_state(policy, optimizer)
        finally:
            self.comm_s += time.perf_counter() - start

    @property
    def load_state(self):
        from ..model import fsdp

        return fsdp.load_full_state


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def start(cfg: Config):
    """The group of this process: torchrun's (WORLD_SIZE set) or a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    check_processes(cfg, world, "WORLD_SIZE")
    if world == 1 or cfg.train.parallel == "none":
        return Single()
    return Sharded(cfg) if cfg.train.parallel == "fsdp" else Group(cfg)
