"""`python -m grpo_studio.engine.rollout_server CONFIG PORT`: the rollout server the trainer starts for itself
(engine/sampler/remote.py) on 127.0.0.1:PORT, from the run's saved config, with the secret it put in the
environment. A user starts one with `grpo-studio rollout-serve`, which checks its flags first."""

from __future__ import annotations

import sys

from ...contract import config
from ...contract.errors import UserError
from ..sampler import auth
from .http_api import serve


def main(argv: list[str]) -> int:
    path, port = argv
    try:
        cfg = config.load(path, [])
        cfg.rollout.backend = "vllm"
        return serve(cfg, "127.0.0.1", int(port), auth.read_secret("", "--secret-file"))
    except UserError as err:
        print(err.line(), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
