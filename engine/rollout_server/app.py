"""The rollout server's HTTP API around one VLLMBackend (the in-process backend, reused as it is), after
TRL's `trl vllm-serve` (trl/scripts/vllm_serve.py): FastAPI + uvicorn, which ship with vLLM.

  GET  /health          {"ok": true, "policy_version": v}
  GET  /version         vLLM and grpo-studio versions, the policy version, the engine's dtype
  POST /generate        prompt_ids + Sampling → the Rollout's tensors as lists, with the policy version
  POST /score           sequences → prompt log-probs at T=1 (VLLMBackend.score; weight-sync checks)
  POST /init_weights    {host, port, backend, timeout_s}: join the trainer's weight group as rank 1
  POST /update_weights  {version, plan}: receive the broadcast chunks of `plan`, load them, set the version

One lock serialises the engine: a weight update waits for the generation in progress and the next
generation waits for the update, so every completion comes from exactly one policy version.
"""

from __future__ import annotations

import threading
import time

import torch
from grpo_studio.engine.rollout_server import transport
from grpo_studio.engine.sampler.base import Sampling
from pydantic import BaseModel


# request bodies (module level: FastAPI resolves the annotations of its endpoints by name)
class GenerateRequest(BaseModel):
    prompt_ids: list[list[int]]
    sampling: dict


class ScoreRequest(BaseModel):
    sequences: list[list[int]]


class InitRequest(BaseModel):
    host: str
    port: int
    backend: str = "gloo"
    timeout_s: float = 60.0


class UpdateRequest(BaseModel):
    version: int
    plan: list[dict]


class Server:
    def __init__(self, backend, device: torch.device):
        self.backend, self.device = backend, device
        self.lock = threading.Lock()
        self.version = 0
        self.group = None
        self.sync_s = 0.0

    def generate(self, prompt_ids: list[list[int]], sampling: dict) -> dict:
        with self.lock:
            out = self.backend.generate(prompt_ids, Sampling(**sampling))
            version = self.version
        return {"completion_ids": out.completion_ids.tolist(), "mask": out.mask.tolist(),
                "logprobs": out.logprobs.tolist(), "truncated": out.truncated.tolist(),
                "seconds": out.seconds, "policy_version": version}

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        with self.lock:
            return self.backend.score(sequences)

    def init_weights(self, host: str, port: int, backend: str, timeout_s: float) -> None:
        self.group = transport.open_group(host, port, 1, backend, timeout_s)

    def update_weights(self, version: int, chunk_plan: list[dict]) -> dict:
        if self.group is None:
            raise RuntimeError("POST /init_weights first")
        with self.lock:
            start = time.perf_counter()
            self.backend.load_weights(transport.receive(self.group, chunk_plan, self.device))
            self.version = version
            self.sync_s = time.perf_counter() - start
        return {"policy_version": version, "load_s": self.sync_s}

    def info(self) -> dict:
        from grpo_studio.engine import __version__

        return {"vllm": self.backend.version, "grpo_studio": __version__, "policy_version": self.version,
                "dtype": self.backend.vllm_dtype, "platform": self.backend.platform}


def build_app(server: Server):
    from fastapi import FastAPI

    app = FastAPI(title="grpo-studio rollout server")
    # plain `def` endpoints run in FastAPI's thread pool: /health answers while a generation runs

    @app.get("/health")
    def health():
        return {"ok": True, "policy_version": server.version}

    @app.get("/version")
    def version():
        return server.info()

    @app.post("/generate")
    def generate(req: GenerateRequest):
        return server.generate(req.prompt_ids, req.sampling)

    @app.post("/score")
    def score(req: ScoreRequest):
        return {"logprobs": server.score(req.sequences)}

    @app.post("/init_weights")
    def init_weights(req: InitRequest):
        server.init_weights(req.host, req.port, req.backend, req.timeout_s)
        return {"ok": True}

    @app.post("/update_weights")
    def update_weights(req: UpdateRequest):
        return server.update_weights(req.version, req.plan)

    return app
