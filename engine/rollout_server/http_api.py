"""The rollout server's HTTP API around one VLLMBackend (the in-process backend, reused as it is), after
TRL's `trl vllm-serve` (trl/scripts/vllm_serve.py): FastAPI + uvicorn, which ship with vLLM.

  GET  /health          {"ok": true, "policy_version": v} (the one endpoint open without the secret)
  GET  /version         vLLM and grpo-studio versions, the policy version, the engine's dtype
  POST /generate        prompt_ids + Sampling (+ in_flight) → the Rollout's tensors as lists, with the policy
                        version it started with (and, in_flight, the version of every token)
  POST /score           sequences → prompt log-probs at T=1 (VLLMBackend.score; weight-sync checks)
  POST /init_weights    {host, port, backend, timeout_s}: join the trainer's weight group as rank 1
  POST /update_weights  {version, plan}: receive the broadcast chunks of `plan`, load them, set the version

In front of it, auth.Guard: the secret and the body limit. Every request is checked against the served model
(token ids in its vocabulary, prompts within its context, plans naming its parameters with their shapes) before
the engine or an allocation sees it; a bad one is a 4xx with one line, {"error": "..."}.

One lock serialises the engine (vLLM's engine is not thread-safe). /update_weights receives the weights
at once (the broadcast needs both ends) and leaves them pending; they are loaded by whoever holds the engine
next: after the generation in progress, or, when that generation asked for in_flight (PipelineRL's
in-flight weight updates), by the generating thread itself between two decode steps. Then one completion
spans two policy versions; the KV cache of its earlier tokens stays as the old weights computed it.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, model_validator

from ...contract.config_bounds import (
    MAX_GENERATIONS,
    MAX_SECONDS,
    MAX_SEQUENCES,
    MAX_TOKENS,
    VLLM_MAX_TEMPERATURE,
)
from ..sampler import auth, transport
from ..sampler.base import Sampling

MIN_BODY, MAX_BODY = 16 * 2**20, 2**30  # bytes: any update plan or score request fits 16 MiB; 1 GiB at most
STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


# request bodies (module level: FastAPI resolves the annotations of its endpoints by name)
class SamplingBody(BaseModel):
    """engine/sampler/base.Sampling, bounded as the config bounds the keys it comes from and as vLLM's
    SamplingParams takes them (a temperature of at most 2, min_tokens within max_tokens)."""

    model_config = STRICT
    n: int = Field(ge=1, le=MAX_GENERATIONS)
    max_tokens: int = Field(ge=1, le=MAX_TOKENS)
    temperature: float = Field(1.0, gt=0, le=VLLM_MAX_TEMPERATURE)
    top_p: float = Field(1.0, gt=0, le=1.0)
    top_k: int = Field(0, ge=0, le=MAX_TOKENS)
    seed: int = Field(0, ge=0, lt=2**128)  # the trainer's seeds are mixes of mixes: past 2**63
    min_tokens: int = Field(0, ge=0, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _min_within_max(self):
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens = {self.min_tokens} is over max_tokens = {self.max_tokens}")
        return self


class GenerateRequest(BaseModel):
    model_config = STRICT
    prompt_ids: list[list[int]] = Field(min_length=1)
    sampling: SamplingBody
    in_flight: bool = False


class ScoreRequest(BaseModel):
    model_config = STRICT
    sequences: list[list[int]] = Field(min_length=1)


class InitRequest(BaseModel):
    model_config = STRICT
    host: str = Field(min_length=1, max_length=253)
    port: int = Field(ge=1, le=65535)
    backend: Literal["gloo", "nccl"] = "gloo"
    timeout_s: float = Field(60.0, gt=0, le=MAX_SECONDS)


class Chunk(BaseModel):
    model_config = ConfigDict(extra="forbid")  # lax only for the [name, shape] pairs: JSON has no tuples
    dtype: StrictStr
    tensors: list[tuple[StrictStr, list[StrictInt]]] = Field(min_length=1)


class UpdateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: StrictInt = Field(ge=0, le=2**53)
    plan: list[Chunk] = Field(min_length=1)


class Refused(Exception):
    """A request the server will not carry out: its HTTP status and the one line that says why."""

    def __init__(self, status: int, why: str):
        super().__init__(why)
        self.status, self.why = status, why


@dataclasses.dataclass(frozen=True)
class Served:
    """What the served model admits: its parameters by name and shape (update plans), its vocabulary size (token
    ids) and its context length (prompts)."""

    shapes: dict[str, tuple[int, ...]]
    vocab_size: int
    max_model_len: int

    @classmethod
    def of(cls, backend) -> Served:
        """A VLLMBackend's: its checkpoint's tensors (the names a weight sync sends), its engine's limits."""
        model = backend.llm.llm_engine.model_config
        return cls(backend.sync.checkpoint.shapes(), model.get_vocab_size(), model.max_model_len)

    def check_ids(self, rows: list[list[int]], field: str) -> None:
        """Token ids in the vocabulary, and room in the context for one more token (vLLM generates at least one,
        /score too)."""
        longest = self.max_model_len - 1
        for i, ids in enumerate(rows):
            if not ids or len(ids) > longest:
                raise Refused(
                    400,
                    f"{field}[{i}] has {len(ids)} tokens; 1 to {longest} (the context of {self.max_model_len} "
                    "less the one token vLLM generates)",
                )
            if min(ids) < 0 or max(ids) >= self.vocab_size:
                bad = min(ids) if min(ids) < 0 else max(ids)
                raise Refused(400, f"{field}[{i}] holds token id {bad}; the vocabulary is 0 to {self.vocab_size - 1}")


def body_limit(cfg) -> int:
    """Bytes of the largest request a run of this config sends, twice over: its largest generate call (a
    rollout's prompts, or the eval's held-out rows; each one row per completion with an environment) of
    prompt + completion ids at 8 JSON bytes each; never under MIN_BODY (update plans, score requests) nor over
    MAX_BODY, which an eval split or source of unknown size (data.eval_split, data.eval_source) gets."""
    from ..prompts import data

    r, t = cfg.rollout, cfg.train
    if cfg.data.eval_split or cfg.data.eval_source:
        return MAX_BODY
    rows = max(t.prompts_per_step * t.steps_per_generation, data.eval_size(cfg.data))
    rows *= max(r.num_generations, t.eval_k)
    return min(MAX_BODY, max(MIN_BODY, 2 * 8 * rows * (r.max_prompt_len + r.max_completion_len)))


class Update:
    """Received weights waiting for the engine, and the event set once they are loaded."""

    def __init__(self, version: int, weights: list):
        self.version, self.weights, self.done = version, weights, threading.Event()


class Server:
    def __init__(self, backend, device: torch.device, served: Served):
        self.backend, self.device, self.served = backend, device, served
        self.lock = threading.Lock()  # the engine: one generation, score or weight load at a time
        self.pending: Update | None = None
        self.handoff = threading.Lock()  # guards `pending` between the HTTP thread and the engine's holder
        self.transfer = threading.Lock()  # the weight group: one join or receive at a time
        self.version = 0
        self.group = None
        self.sync_s = 0.0

    def generate(self, prompt_ids: list[list[int]], sampling: Sampling, in_flight: bool = False) -> dict:
        self.served.check_ids(prompt_ids, "prompt_ids")
        if len(prompt_ids) * sampling.n > MAX_SEQUENCES:
            raise Refused(400, f"{len(prompt_ids)} prompts x n = {sampling.n}: at most {MAX_SEQUENCES} completions")
        with self.lock:
            version = self._load_pending()
            out = self.backend.generate(prompt_ids, sampling, between_steps=self._load_pending if in_flight else None)
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
        self.served.check_ids(sequences, "sequences")
        with self.lock:
            self._load_pending()
            return self.backend.score(sequences)

    def init_weights(self, host: str, port: int, backend: str, timeout_s: float) -> None:
        if backend == "nccl" and self.device.type != "cuda":
            raise Refused(400, "backend 'nccl' needs a CUDA engine; this server's is on the CPU: use 'gloo'")
        with self.transfer:
            try:
                self.group = transport.open_group(host, port, 1, backend, timeout_s)
            except Exception as err:  # noqa: BLE001 - whatever the address holds, the answer is one line
                raise Refused(400, f"cannot join the weight group at {host}:{port}: {auth.one_line(err)}") from None

    def update_weights(self, version: int, chunk_plan: list[dict]) -> dict:
        """Receive now (the trainer's broadcast), load when the engine is free or, during an in_flight
        generation, at its next step boundary; answer once loaded."""
        try:
            transport.check_plan(chunk_plan, self.served.shapes)
        except ValueError as err:
            raise Refused(400, str(err)) from None
        with self.transfer:
            if self.group is None:
                raise Refused(409, "no weight group: POST /init_weights first")
            try:
                update = Update(version, list(transport.receive(self.group, chunk_plan, self.device)))
            except Exception as err:  # noqa: BLE001 - a peer that stops sending leaves the group unusable
                self.group = None
                raise Refused(
                    409, f"the weight transfer failed: {auth.one_line(err)}; POST /init_weights again"
                ) from None
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
        from .. import __version__

        return {
            "vllm": self.backend.version,
            "grpo_studio": __version__,
            "policy_version": self.version,
            "dtype": self.backend.vllm_dtype,
            "platform": self.backend.platform,
        }


def _invalid(err) -> str:
    """A validation error as one line: where in the body, and what was wrong."""
    first = err.errors()[0]
    if first.get("type") == "json_invalid":
        return f"the body is not JSON: {first.get('ctx', {}).get('error', first['msg'])}"
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"][1:]).lstrip(".") or "the body"
    more = f" (and {len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return f"{where}: {first['msg'].removeprefix('Value error, ')}{more}"


def _refused_by_vllm(err: Exception) -> bool:
    """vLLM's own verdict that a request is bad (VLLMClientError: a sampling parameter, a prompt's length),
    which the checks above missed: the client's fault, not the engine's."""
    exceptions = sys.modules.get("vllm.exceptions")  # not loaded: no error of vLLM's was raised
    return exceptions is not None and isinstance(err, exceptions.VLLMClientError)


def build_app(server: Server, secret: str | None, max_body: int):
    """The API behind its guard (auth.Guard): the secret, when there is one, and the body limit."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    app = FastAPI(title="grpo-studio rollout server", docs_url=None, redoc_url=None, openapi_url=None)
    # plain `def` endpoints run in FastAPI's thread pool: /health answers while a generation runs

    @app.exception_handler(Refused)
    def refused(_, err: Refused):
        return JSONResponse({"error": err.why}, err.status)

    @app.exception_handler(HTTPException)
    def http(request, err: HTTPException):  # no such endpoint or method, a body that does not parse
        return JSONResponse({"error": f"{request.method} {request.url.path}: {err.detail}"}, err.status_code)

    @app.exception_handler(RequestValidationError)
    def invalid(_, err: RequestValidationError):
        return JSONResponse({"error": _invalid(err)}, 400)

    @app.exception_handler(Exception)
    def failed(_, err: Exception):  # the guard logs the same line
        if _refused_by_vllm(err):
            return JSONResponse({"error": f"vLLM refused the request: {auth.one_line(err)}"}, 400)
        return JSONResponse({"error": f"the server failed: {auth.one_line(err)}"}, 500)

    @app.get("/health")
    def health():
        return {"ok": True, "policy_version": server.version}

    @app.get("/version")
    def version():
        return server.info()

    @app.post("/generate")
    def generate(req: GenerateRequest):
        return server.generate(req.prompt_ids, Sampling(**req.sampling.model_dump()), req.in_flight)

    @app.post("/score")
    def score(req: ScoreRequest):
        return {"logprobs": server.score(req.sequences)}

    @app.post("/init_weights")
    def init_weights(req: InitRequest):
        server.init_weights(req.host, req.port, req.backend, req.timeout_s)
        return {"ok": True}

    @app.post("/update_weights")
    def update_weights(req: UpdateRequest):
        return server.update_weights(req.version, [chunk.model_dump() for chunk in req.plan])

    return auth.Guard(app, secret, max_body)


def serve(cfg, host: str, port: int, secret: str | None) -> int:
    """Build the vLLM engine the config names and answer on http://host:port until stopped (checked arguments:
    cli/rollout_serve_cmd.py, or the trainer's own child, __main__.py)."""
    import uvicorn

    from ...contract.precision_plan import resolve
    from ..model import policy_loader
    from ..sampler import make_sampler

    model_path = policy_loader.resolve_model_path(cfg.model.name)
    tokenizer = policy_loader.load_tokenizer(model_path)

    def say(kind, message, **_):
        print(f"{kind}: {message}", flush=True)

    backend = make_sampler(cfg, model_path, tokenizer, resolve(cfg), emit_event=say, local=True)
    server = Server(backend, torch.device("cpu" if backend.on_cpu else "cuda"), Served.of(backend))
    print(f"rollout server: {cfg.model.name} on http://{host}:{port}", flush=True)
    if secret is None:
        print(
            f"warning: no secret ({auth.SECRET_ENV} or --secret-file): any user of this machine can drive this server",
            flush=True,
        )
    try:
        uvicorn.run(build_app(server, secret, body_limit(cfg)), host=host, port=port, log_level="warning")
    finally:
        backend.close()
    print("rollout server stopped", file=sys.stderr, flush=True)
    return 0
