"""`--json` prints only JSON on stdout, so it pipes into jq: while a command works, whatever libraries
print (vLLM's and transformers' warnings, progress bars, child processes) goes to stderr."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send stdout to stderr inside the block: Python's sys.stdout, and file descriptor 1 itself, which
    C code and child processes (vLLM's engine core) write to. The command prints its JSON after the block."""
    real = sys.stdout
    real.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no fd 1 (a closed stdout): Python's stdout is all there is to move
        saved = None
    if saved is not None:
        os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        real.flush()  # what was buffered inside belongs on stderr, where fd 1 still points
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)
