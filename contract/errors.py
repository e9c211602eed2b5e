"""The one user-error type of every `grpo-studio` command, and the one "did you mean".

A `UserError` is a mistake the user can fix (a config key, a flag, a file, a run name). Its str()
is the whole message, one line:

    <kind> error: <key> = <value>: <why>; allowed: <a, b> (did you mean '<a>'?)

each part only where known. The CLI's one error boundary (cli/main.py) prints it with exit code 2;
the studio shows the same line beside the field.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Iterable
from typing import Any


class _NoValue:
    def __repr__(self) -> str:
        return "NO_VALUE"


NO_VALUE: Any = _NoValue()  # no value given: the line names the key alone ("data.eval_size: no training rows ...")


def close_matches(word: str, candidates: Iterable[str], n: int = 1, cutoff: float = 0.6) -> list[str]:
    """The candidates nearest to `word`, best first (difflib's ratio >= cutoff)."""
    return difflib.get_close_matches(word, list(candidates), n=n, cutoff=cutoff)


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """The hint ` (did you mean 'x'?)` for the nearest candidate, or "" when none is near."""
    close = close_matches(word, candidates)
    return f" (did you mean '{close[0]}'?)" if close else ""


def show_choices(values: Iterable[str]) -> str:
    """Allowed values as the messages list them ('auto, hf, vllm'); an empty string shows as "" (two quotes)."""
    return ", ".join(v if v else '""' for v in values)


def show(value: Any) -> str:
    """A value as the messages print it: strings quoted, booleans as TOML spells them, the rest as str()."""
    if isinstance(value, str):
        return repr(value)
    return str(value).lower() if isinstance(value, bool) else str(value)


class UserError(ValueError):
    """A user mistake. `kind` is the message's prefix ("config", "vram", "bench", "attach", "runs", "run",
    "report"); `key` the flag or config key, `value` what was given, `why` what is wrong, `allowed` the
    values that would be accepted (shown, with a "did you mean" for `near`, by default the value)."""

    def __init__(
        self,
        why: str = "",
        *,
        kind: str = "config",
        key: str | None = None,
        value: Any = NO_VALUE,
        allowed: Iterable[str] | None = None,
        near: str | None = None,
    ):
        self.why, self.kind, self.key, self.value = why, kind, key, value
        self.allowed = None if allowed is None else tuple(allowed)
        self.near = near if near is not None or value is NO_VALUE else str(value)
        super().__init__(self.line())

    def line(self, kind: str | None = None) -> str:
        """The one-line message; `kind` relabels it (`grpo-studio vram` reports config mistakes as vram errors)."""
        subject = ""
        if self.key is not None:
            subject = self.key + ("" if self.value is NO_VALUE else f" = {show(self.value)}") + ": "
        text = self.why
        if self.allowed is not None:
            text += ("; " if text else "") + f"allowed: {show_choices(self.allowed)}"
            if self.near is not None:
                text += did_you_mean(self.near, [a for a in self.allowed if a])
        return f"{kind or self.kind} error: {subject}{text}"


def describe(err: BaseException) -> str:
    """An exception as one short line for a message: "<Type>: <first line>", or for bad bytes where text
    was expected "not UTF-8 text (byte 0xff at offset 3)"."""
    if isinstance(err, UnicodeDecodeError):
        return f"not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start})"
    first = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    return f"{type(err).__name__}: {first[:200]}" if first else type(err).__name__


@contextlib.contextmanager
def user_path(key: str, value: Any, doing: str = "cannot read it"):
    """Touch a file or folder the user named (`key` = `value`): a missing or unreadable file, a name too
    long, a NUL byte, a file where a folder belongs, bad bytes — any failure becomes one UserError line,
    "<key> = <value>: <doing>: <reason>"."""
    try:
        yield
    except UserError:
        raise
    except (OSError, ValueError, RuntimeError) as err:  # RuntimeError: expanduser of '~nosuchuser'
        reason = err.strerror.lower() if isinstance(err, OSError) and err.strerror else describe(err)
        raise UserError(f"{doing}: {reason}", key=key, value=value) from None
