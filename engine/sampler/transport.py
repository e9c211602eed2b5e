"""Weights from the trainer (rank 0) to the rollout server (rank 1) over a standalone torch.distributed group.

The group is built from its own TCPStore, not torch.distributed's default group (which the data-parallel
helper owns for DDP): gloo on CPU, NCCL on CUDA, as TRL's VLLMClient / vLLM's StatelessProcessGroup do it.
Weights travel as broadcasts of one flat buffer per layer (the tensors of `model.layers.N`, or of one
top-level module, of one dtype), described beforehand by a JSON plan that the HTTP request carries;
nothing touches the disk. The receiver checks a plan against its model's parameters before it allocates.
"""

from __future__ import annotations

import datetime
import socket
import threading
from collections.abc import Iterable

import torch

from ...contract.errors import did_you_mean

DTYPE_NAMES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.bfloat16, torch.float16)}
STORE_CONNECT_S = 30.0  # the server's wait for the trainer's store, which opens as it asks the server to join


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def local_address(peer: str) -> str:
    """This machine's address on the route to `peer` (where a remote server can reach the trainer's store)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, 9))  # UDP connect sends nothing: it only picks the route
        return s.getsockname()[0]


class Group:
    """A two-rank process group and the store it rendezvoused through (kept alive with it)."""

    def __init__(self, group, store):
        self.group, self.store = group, store


def open_group(host: str, port: int, rank: int, backend: str, timeout_s: float) -> Group:
    """A two-rank process group (rank 0 = trainer, hosting the store; rank 1 = server, which waits at most
    min(timeout_s, STORE_CONNECT_S) to reach the store and hear it answer)."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    if rank == 0:
        store = dist.TCPStore(host, port, 2, True, timeout=timeout)
    else:
        connect = min(timeout_s, STORE_CONNECT_S)
        store = _within(
            connect, lambda: dist.TCPStore(host, port, 2, False, timeout=datetime.timedelta(seconds=connect))
        )
    store.set_timeout(timeout)
    if backend == "nccl":
        group = dist.ProcessGroupNCCL(store, rank, 2, dist.ProcessGroupNCCL.Options())
    else:
        group = dist.ProcessGroupGloo(store, rank, 2, timeout)
    return Group(group, store)


def _within(seconds: float, make):
    """make()'s result, or TimeoutError after `seconds`. A TCPStore client bounds its connect but not its wait
    for the store's first answer: a port that accepts and never answers would hold it forever. The thread left
    waiting ends when that peer closes."""
    box: dict = {}

    def run():
        try:
            box["made"] = make()
        except Exception as err:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True, name="weight-store-connect")
    thread.start()
    thread.join(seconds + 1.0)  # the store's own connect timeout answers first when nothing listens
    if "error" in box:
        raise box["error"]
    if "made" not in box:
        raise TimeoutError(f"no TCPStore answered within {seconds:g} s (the port accepts, but does not answer)")
    return box["made"]


def _layer(name: str) -> str:
    """'model.layers.3.mlp.up_proj.weight' → 'model.layers.3'; 'lm_head.weight' → 'lm_head'."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1]) or name


def chunks(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[list[tuple[str, torch.Tensor]]]:
    """Consecutive tensors of one layer and one dtype, in order: one broadcast each."""
    out: list[list[tuple[str, torch.Tensor]]] = []
    key = None
    for name, tensor in named_tensors:
        this = (_layer(name), tensor.dtype)
        if this != key:
            out.append([])
            key = this
        out[-1].append((name, tensor.detach()))
    return out


def plan(parts: list[list[tuple[str, torch.Tensor]]]) -> list[dict]:
    """The JSON description of each chunk the receiver needs to allocate and split it."""
    return [
        {"dtype": str(part[0][1].dtype).removeprefix("torch."), "tensors": [[name, list(t.shape)] for name, t in part]}
        for part in parts
    ]


def check_plan(chunk_plan: list[dict], shapes: dict[str, tuple[int, ...]]) -> None:
    """ValueError (one line) unless every chunk has a dtype the receiver takes and every tensor is, once, a
    parameter of the served model with its shape: nothing is allocated for a plan that fails."""
    seen = set()
    for i, chunk in enumerate(chunk_plan):
        if chunk["dtype"] not in DTYPE_NAMES:
            raise ValueError(f"plan[{i}].dtype = {chunk['dtype']!r}: allowed: {', '.join(DTYPE_NAMES)}")
        for name, shape in chunk["tensors"]:
            if name not in shapes:
                raise ValueError(
                    f"plan[{i}]: {name[:200]!r} is not a parameter of the served model{did_you_mean(name[:200], shapes)}"
                )
            if tuple(shape) != shapes[name]:
                raise ValueError(
                    f"plan[{i}]: {name} has shape {list(shape)[:8]}; the served model's is {list(shapes[name])}"
                )
            if name in seen:
                raise ValueError(f"plan[{i}]: {name} comes twice")
            seen.add(name)


def _broadcast(group, buffer: torch.Tensor) -> None:
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    group.group.broadcast([buffer], opts).wait()


def send(group, parts: list[list[tuple[str, torch.Tensor]]], device: torch.device) -> int:
    """Broadcast each chunk as one flat buffer; returns the bytes sent."""
    sent = 0
    for part in parts:
        buffer = torch.cat([t.reshape(-1).to(device) for _, t in part])
        _broadcast(group, buffer)
        sent += buffer.numel() * buffer.element_size()
    return sent


def receive(group, chunk_plan: list[dict], device: torch.device):
    """The (name, tensor) stream of send(), chunk by chunk, views of each received buffer."""
    for chunk in chunk_plan:
        shapes = [(name, torch.Size(shape)) for name, shape in chunk["tensors"]]
        buffer = torch.empty(sum(s.numel() for _, s in shapes), dtype=DTYPE_NAMES[chunk["dtype"]], device=device)
        _broadcast(group, buffer)
        offset = 0
        for name, shape in shapes:
            yield name, buffer[offset : offset + shape.numel()].view(shape)
            offset += shape.numel()
