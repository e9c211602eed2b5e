"""glibc's malloc told to keep the memory a CPU training step frees, so the next micro-batch reuses it.

A CPU micro-batch allocates activations of megabytes per operation (SmolLM2-135M, 16 rows × 128 tokens:
12.6 MB for each MLP projection's output). glibc serves a block above its mmap threshold with a fresh mapping
and gives freed memory at the heap's top above its trim threshold back to the kernel (both adapt, up to
32 MiB and 64 MiB); either way the next allocation faults the pages in again, each zeroed by the kernel. On the
GSM8K-shaped workload (issue 27) that was 530,000 minor page faults per 16-row micro-batch and 6–9% of the
training time. `keep_freed_memory` fixes the mmap threshold at glibc's largest (32 MiB on 64-bit) and the
trim threshold at 1 GiB: the blocks come from the heap, and what a micro-batch frees stays mapped for the next
one. It does not raise the peak (docs/performance.md, "Where the peak goes"): on `bench step`'s short-prompt
workload (a random 50M Qwen3, 8 prompts × 8, 32 tokens, one core) peak RSS was 1.849 and 1.858 GiB with it and
1.861 and 1.824 GiB without, over a live high-water mark of 1.40 GiB in all four runs. The 0.42–0.46 GiB above
that mark is freed memory the training pass's own allocations leave in the heap, with or without the policy
(TRL's process, on glibc's defaults: 0.65 GiB); a malloc_trim(0) as each training pass began left the peak at
1.838 GiB, so the trainer does not call it.
"""

from __future__ import annotations

import ctypes
import sys

import torch

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
MMAP_THRESHOLD = 32 << 20  # glibc's largest on 64-bit (HEAP_MAX_SIZE / 2); larger blocks are still mappings
TRIM_THRESHOLD = 1 << 30


def keep_freed_memory(device: torch.device) -> bool:
    """Set both thresholds for this process when it trains on `device` = CPU; False where it does not, or where
    there is no glibc malloc (macOS, musl) to set."""
    if device.type != "cpu" or not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "gnu_get_libc_version"):  # musl has a mallopt that does nothing
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
