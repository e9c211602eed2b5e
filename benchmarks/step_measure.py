"""What `grpo-studio bench step` (step_bench.py) measures with: the Workload (its flags), the workload's model (a
random one gets an EOS bias for realistic lengths), a side's memory, and a side's summary from its timed steps."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


@dataclass
class Workload:
    """What one `grpo-studio bench step` measures (its flags)."""

    model: str  # preset id, local folder, or random:LxH[xI]
    prompts: int  # prompts per optimizer step
    generations: int  # completions per prompt (G)
    max_tokens: int  # completion length cap
    mean_len: int  # random models: target mean completion length via the EOS bias (0: no bias)
    steps: int  # timed steps per side
    warmup: int  # untimed steps per side first
    lora_rank: int  # 0 = full fine-tune
    lr: float
    seed: int
    backends: tuple  # our rollout backends, from hf, vllm
    vs: str  # trl | none
    micro_batch_tokens: int = 0  # ours: train.micro_batch_tokens (TRL pads every row to the longest)
    profile: int = 0  # > 0: torch.profiler over one more step of ours per backend, its top ops by self time
    recipe: str = "tiny-arith"  # the recipe both sides are set up from (data, rewards, loss, system prompt)
    name: str = "random"  # the --workload it came from
    sets: tuple = ()  # the workload's own `--set`s over the recipe (system prompt, prompt length cap)


def model_path_of(w: Workload) -> str:
    from ..engine.model.policy_loader import resolve_model_path
    from .rollout_bench import _random_model

    if not w.model.startswith("random:"):
        return resolve_model_path(w.model)
    import torch

    torch.manual_seed(w.seed)  # the same random weights, and so the same lengths, on every run
    path = _random_model(w.model)
    if w.mean_len:
        add_eos_bias(path, w.mean_len)
    return path


def add_eos_bias(path: str, mean_len: int) -> float:
    """Raise the EOS logit of the model at `path` by b = ln((V−1)/(L−1)) nats (see step_bench.py's module doc); returns b."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..engine.prompts import arith

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    emb = model.get_input_embeddings().weight
    eos, vocab = tok.eos_token_id, emb.shape[0]
    bias = math.log((vocab - 1) / max(mean_len - 1, 1))
    prompts = [torch.tensor([tok.encode(r["prompt"], add_special_tokens=False)]) for r in arith.rows("train")[:16]]
    with torch.no_grad():
        emb[:, 0] = 1.0
        h0 = torch.cat([model.get_decoder()(input_ids=ids).last_hidden_state[0, :, 0] for ids in prompts]).mean()
        emb[eos, 0] += bias / h0.item()
    model.save_pretrained(path)
    return bias


def rss_gib() -> float:
    """This process's resident memory now, GiB."""
    import psutil

    return round(psutil.Process().memory_info().rss / 2**30, 3)


class CudaPeak:
    """CUDA's peak allocated bytes over a `with` block (`peak`: None without a GPU)."""

    def __enter__(self):
        import torch

        self.cuda, self.peak = torch.cuda.is_available(), None
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        return self

    def __exit__(self, *exc):
        import torch

        self.peak = torch.cuda.max_memory_allocated() if self.cuda else None


def summary(steps: list[dict], w: Workload, n_params: int, prompt_len: float, peak: float, side: dict) -> dict:
    """One side's report from its timed steps (each {step_s, rollout_s, completion_tokens, reward}) and the
    memory its process measured (step_sides.py: RSS after imports, once built, at its peak; CUDA's peak)."""
    from ..engine.train import flops

    B = w.prompts * w.generations
    step_s = statistics.median(s["step_s"] for s in steps)
    rollout_s = statistics.median(s["rollout_s"] for s in steps)
    completion = statistics.mean(s["completion_tokens"] for s in steps)
    tokens = B * prompt_len + completion
    flop = flops.step_flop(n_params, generated=tokens, trained=tokens, lora=bool(w.lora_rank))
    return {
        "step_s": round(step_s, 4),
        "rollout_s": round(rollout_s, 4),
        "train_s": round(step_s - rollout_s, 4),
        "completion_len_mean": round(completion / B, 2),
        "gen_tok_s": float(f"{completion / rollout_s:.4g}"),
        "train_tok_s": float(f"{tokens / (step_s - rollout_s):.4g}"),
        "flop_per_step": flop,
        "achieved_gflop_s": float(f"{flop / step_s / 1e9:.4g}"),
        # ours counts only the work it ran (zero-advantage rows skipped: engine/train/zero_advantage.py)
        "mfu": statistics.median(s["run_mfu"] for s in steps)
        if "run_mfu" in steps[0]
        else float(f"{flop / step_s / peak:.4g}"),
        "peak_rss_gib": side["memory"]["peak_rss_gib"],
        "memory": side["memory"],
        **({"cuda_peak_gib": round(side["cuda_peak"] / 2**30, 3)} if side["cuda_peak"] is not None else {}),
        "reward_last": round(steps[-1]["reward"], 4),
        "reward_mean": round(statistics.mean(s["reward"] for s in steps), 4),
        "steps_s": [round(s["step_s"], 4) for s in steps],
        # ours: the trainer's own split and MFU (its rows' perf/sync_s, perf/idle_s, perf/mfu)
        **{
            k: round(statistics.median(s[k] for s in steps), 4)
            for k in ("sync_s", "idle_s", "run_mfu")
            if k in steps[0]
        },
        **{k: [s[k] for s in steps] for k in ("rows_trained", "rows_run") if k in steps[0]},
    }


class MemoryTrace:
    """Where a side's peak goes: a thread samples the process every `every_s` seconds (VmRSS, and glibc's
    mallinfo2: the bytes malloc has handed out and still holds free) under the phase label the side enters
    at its rollout and at its training pass (`enter`, `wrap`; a phase lasts until the next). Per phase it keeps the largest growth of live malloc
    bytes over their value when the phase began (the sampler's KV cache and logits; the activations and logits
    of forward and backward); over the whole run, the live high-water mark (RSS less the free bytes malloc
    keeps), so that peak RSS − that mark is the allocator's slack. Without glibc (macOS, musl) only RSS."""

    FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")

    def __init__(self, every_s: float = 0.01):
        import ctypes
        import os
        import threading

        class MallInfo2(ctypes.Structure):
            _fields_ = [(name, ctypes.c_size_t) for name in self.FIELDS]

        libc = ctypes.CDLL(None)
        self._mallinfo = getattr(libc, "mallinfo2", None)
        if self._mallinfo is not None:
            self._mallinfo.restype = MallInfo2
        self._page, self._every = os.sysconf("SC_PAGE_SIZE"), every_s
        self._stop, self._lock = threading.Event(), threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True, name="memory-trace")
        self.label, self.grown, self._start = "", {}, 0
        self.rss_peak, self.live_peak, self.live_peak_phase = 0, 0, ""

    def sample(self) -> tuple[int, int, int]:
        """(RSS, malloc live, malloc held free) bytes now; the last two 0 without mallinfo2."""
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * self._page
        if self._mallinfo is None:
            return rss, 0, 0
        mi = self._mallinfo()
        return rss, mi.uordblks + mi.hblkhd, mi.fordblks

    def _record(self) -> None:
        rss, live, free = self.sample()
        with self._lock:
            self.rss_peak = max(self.rss_peak, rss)
            if rss - free > self.live_peak:
                self.live_peak, self.live_peak_phase = rss - free, self.label or "other"
            if self.label:
                self.grown[self.label] = max(self.grown.get(self.label, 0), live - self._start)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self._record()

    def enter(self, label: str) -> None:
        """From now until the next `enter`, samples count toward `label`, their growth from the live bytes now."""
        self._record()
        with self._lock:
            self.label, self._start = label, self.sample()[1]

    def wrap(self, fn, label: str):
        """`fn`, entering phase `label` at every call."""

        def traced(*a, **k):
            self.enter(label)
            return fn(*a, **k)

        return traced

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._record()

    def breakdown(self, peak_rss: int) -> dict:
        """GiB: each phase's largest live growth, the live high-water mark, and the slack above it."""
        return {
            **{f"{label}_gib": round(b / 2**30, 3) for label, b in sorted(self.grown.items())},
            "rss_sampled_peak_gib": round(self.rss_peak / 2**30, 3),  # below peak RSS: a peak between samples
            "live_peak_gib": round(self.live_peak / 2**30, 3),
            "live_peak_phase": self.live_peak_phase,
            "slack_gib": round((peak_rss - self.live_peak) / 2**30, 3),
            "mallinfo": self._mallinfo is not None,
        }
