"""The built-in reward functions and their one-line descriptions, for the setup form."""

from __future__ import annotations

FALLBACK = [("correctness", "+2 when the answer equals the reference"), ("format", "+0.5 for the answer format")]


def builtin_rewards() -> list[tuple[str, str]]:
    try:
        from .. import rewards

        if hasattr(rewards, "describe"):
            return [(name, about) for name, about, *_ in rewards.describe()]
        from ..rewards import builtin

        out = []
        for name, entry in builtin.REGISTRY.items():
            fn, about = (entry[0], entry[1]) if isinstance(entry, tuple) else (entry, "")
            out.append((name, about or (fn.__doc__ or "").strip().splitlines()[0]))
        return out
    except Exception:  # a half-installed reward package must not keep the studio from opening
        return FALLBACK
