"""The rollout server's HTTP API around one VLLMBackend (the in-process backend, reused as it is), after
TRL's `trl vllm-serve` (trl/scripts/vllm_serve.py): FastAPI + uvicorn, which ship with vLLM.

  GET  /health          {"ok": true, "policy_version": v}
  GET  /version         vLLM and grpo-studio versions, the policy version, the engine's dtype
  POST /generate        prompt_ids + Sampling (+ in_flight) → the Rollout's tensors as lists, with the policy
                        version it started with (and, in_flight, the version of every token)
  POST /score           sequences → prompt log-probs at T=1 (VLLMBackend.score; weight-sync checks)
  POST /init_weights    {host, port, backend, timeout_s}: join the trainer's weight group as rank 1
  POST /update_weights  {version, plan}: receive the broadcast chunks of `plan`, load them, set the version

One lock serialises the engine (vLLM's engine is not thread-safe). /update_weights receives the weights
at once (the broadcast needs both ends) and leaves them pending; they are loaded by whoever holds the engine
next: after the generation in progress, or, when that generation asked for in_flight (PipelineRL's
in-flight weight updates), by the generating thread itself between two decode steps. Then one completion
spans two policy versions; the KV cache of its earlier tokens stays as the old weights computed it.
"""

from __future__ import annotations

import threading
import time

import torch
from pydantic import BaseModel

from grpo_studio.engine.rollout_server import transport
from grpo_studio.engine.sampler.base import Sampling


# request bodies (module level: FastAPI resolves the annotations of its endpoints by name)
class GenerateRequest(BaseModel):
    prompt_ids: list[list[int]]
    sampling: dict
    in_flight: bool = False


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


class Update:
    """Received weights waiting for the engine, and the event set once they are loaded."""

    def __init__(self, version: int, weights: list):
        self.version, self.weights, self.done = version, weights, threading.Event()


class Server:
    def __init__(self, backend, device: torch.device):
        self.backend, self.device = backend, device
        self.lock = threading.Lock()  # the engine: one generation, score or weight load at a time
        self.pending: Update | None = None
        self.handoff = threading.Lock()  # guards `pending` between the HTTP thread and the engine's holder
        self.version = 0
        self.group = None
        self.sync_s = 0.0

    def generate(self, prompt_ids: list[list[int]], sampling: dict, in_flight: bool = False) -> dict:
        with self.lock:
            version = self._load_pending()
            out = self.backend.generate(
                prompt_ids, Sampling(**sampling), between_steps=self._load_pending if in_flight else None
            )
            self._load_pending()  # an update that came after the last step must not wait for the next call
        answer = {
            "completion_ids": out.completion_ids.tolist(),
            "mask": out.mask.tolist(),
            "logprobs": out.logprobs.tolist(),
            "truncated": out.truncated.tolist(),
            "seconds": out.seconds,
            "policy_version": version,
        }
        if out.versions is not None:
            answer["versions"] = out.versions.tolist()
        return answer

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        with self.lock:
            self._load_pending()
            return self.backend.score(sequences)

    def init_weights(self, host: str, port: int, backend: str, timeout_s: float) -> None:
        self.group = transport.open_group(host, port, 1, backend, timeout_s)

    def update_weights(self, version: int, chunk_plan: list[dict]) -> dict:
        """Receive now (the trainer's broadcast), load when the engine is free or, during an in_flight
        generation, at its next step boundary; answer once loaded."""
        if self.group is None:
            raise RuntimeError("POST /init_weights first")
        update = Update(version, list(transport.receive(self.group, chunk_plan, self.device)))
        with self.handoff:
            self.pending = update  # the trainer sends one update at a time: nothing else is pending
        while not update.done.is_set():
            if self.lock.acquire(timeout=0.05):
                try:
                    self._load_pending()
                finally:
                    self.lock.release()
        return {"policy_version": version, "load_s": self.sync_s}

    def _load_pending(self) -> int:
        """Load the pending weights, if any (the caller holds the engine); the version the engine now has."""
        with self.handoff:
            update, self.pending = self.pending, None
        if update is not None:
            start = time.perf_counter()
            self.backend.load_weights(update.weights)
            self.version = update.version
            self.sync_s = time.perf_counter() - start
            update.done.set()
        return self.version

    def info(self) -> dict:
        from grpo_studio.engine import __version__

        return {
            "vllm": self.backend.version,
            "grpo_studio": __version__,
            "policy_version": self.version,
            "dtype": self.backend.vllm_dtype,
            "platform": self.backend.platform,
        }


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
        return server.generate(req.prompt_ids, req.sampling, req.in_flight)

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
