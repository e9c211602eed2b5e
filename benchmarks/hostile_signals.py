"""The fault suite's hostile cases for signals (benchmarks/fault_probes.py says how they run)."""

from __future__ import annotations


def cases() -> list:
    return []
