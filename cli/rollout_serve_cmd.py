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
import os
import sys

from grpo_studio.cli.parser import add_recipe
from grpo_studio.contract import config
from grpo_studio.contract.errors import UserError

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
    from grpo_studio.engine.rollout_server import auth

    secret = auth.read_secret(args.secret_file, "--secret-file")
    host = args.host or LOOPBACK
    if secret is None and not is_loopback(host):
        raise UserError(
            f"binding beyond loopback needs a secret: --secret-file FILE (mode 0600) or {auth.SECRET_ENV}; "
            "see docs/rollout_server.md",
            key="--host",
            value=host,
        )
    # torch's C++ side logs a stack dump for a weight store it cannot reach; the API answers that in one line
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")

    import torch
    import uvicorn

    from grpo_studio.contract.precision_plan import resolve
    from grpo_studio.engine import policy_loader
    from grpo_studio.engine.rollout_server.http_api import Served, Server, body_limit, build_app
    from grpo_studio.engine.sampler import make_sampler

    model_path = policy_loader.resolve_model_path(cfg.model.name)
    tokenizer = policy_loader.load_tokenizer(model_path)

    def say(kind, message, **_):
        print(f"{kind}: {message}", flush=True)

    backend = make_sampler(cfg, model_path, tokenizer, resolve(cfg), emit_event=say, local=True)
    server = Server(backend, torch.device("cpu" if backend.on_cpu else "cuda"), Served.of(backend))
    print(f"rollout server: {cfg.model.name} on http://{host}:{args.port}", flush=True)
    if secret is None:
        print(
            f"warning: no secret ({auth.SECRET_ENV} or --secret-file): any user of this machine can drive this server",
            flush=True,
        )
    try:
        uvicorn.run(build_app(server, secret, body_limit(cfg)), host=host, port=args.port, log_level="warning")
    finally:
        backend.close()
    print("rollout server stopped", file=sys.stderr, flush=True)
    return 0
