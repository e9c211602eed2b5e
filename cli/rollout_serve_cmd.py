"""Serve rollouts from a vLLM engine in its own process: the trainer's `rollout.colocate = false` side.

Takes the run's recipe and --set overrides (model, dtypes, sampling limits: the engine is built exactly as
the in-process vLLM backend builds it) and answers on http://HOST:PORT (docs/rollout_server.md). It binds
127.0.0.1 unless --host names another address, which needs a secret: --secret-file FILE (mode 0600) or the
environment variable GRPO_STUDIO_ROLLOUT_SECRET; never a command-line value, which every user sees in `ps`.
Pick its devices with CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import argparse
import ipaddress

from ..contract import config
from ..contract.errors import UserError
from .parser import add_recipe

LOOPBACK = "127.0.0.1"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_recipe(parser)
    parser.add_argument(
        "--host",
        default=None,
        help=f"address to bind (default {LOOPBACK}); any other address needs a secret (--secret-file, or the "
        "environment variable GRPO_STUDIO_ROLLOUT_SECRET)",
    )
    parser.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    parser.add_argument(
        "--secret-file",
        metavar="FILE",
        default="",
        help="a file (mode 0600) holding the secret every request but /health must carry; or set "
        "GRPO_STUDIO_ROLLOUT_SECRET; the trainer reads the same (rollout.server_secret_file or the variable)",
    )
    parser.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="vLLM tensor parallelism; only 1 for now (see docs/rollout_server.md)",
    )


def is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def run(args: argparse.Namespace) -> int:
    cfg = config.load(args.recipe, args.sets)
    if args.tensor_parallel_size != 1:
        raise UserError(
            "only 1 for now: the weight reload drives vLLM's in-process executor, and tensor "
            "parallelism needs its multi-process one",
            key="--tensor-parallel-size",
            value=args.tensor_parallel_size,
        )
    if not 0 < args.port < 65536:
        raise UserError("a TCP port, 1-65535", key="--port", value=args.port)
    if cfg.rollout.backend == "hf":
        raise UserError("the rollout server runs vLLM; use 'vllm' or 'auto'", key="rollout.backend", value="hf")
    cfg.rollout.backend = "vllm"
    from ..engine.rollout_server.http_api import serve  # first: its package quiets torch's C++ log before torch loads
    from ..engine.sampler import auth

    secret = auth.read_secret(args.secret_file, "--secret-file")
    host = args.host or LOOPBACK
    if secret is None and not is_loopback(host):
        raise UserError(
            f"binding beyond loopback needs a secret: --secret-file FILE (mode 0600) or {auth.SECRET_ENV}; "
            "see docs/rollout_server.md",
            key="--host",
            value=host,
        )
    return serve(cfg, host, args.port, secret)
