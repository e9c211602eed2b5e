"""A .gguf file as a Hugging Face folder, converted once and cached.

transformers reads GGUF (dequantising it) in 20-50 s; the folder it saves reloads in under a second. The
cache lives in $GRPO_STUDIO_CACHE (default ~/.cache/grpo-studio)/models/<stem>-<key>, the key taken from
the file's size and first MiB, so the same weights installed in two virtualenvs share one folder.

Safe under concurrency and crashes: one process converts at a time (a lock file), the folder is built
under a temporary name and renamed into place when complete, and `manifest.json` (written last) lists
every file's size. A folder whose files do not match it (a partial copy, a truncated or deleted file) is
rebuilt.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from grpo_studio.contract import bundled
from grpo_studio.contract.errors import UserError, describe

MANIFEST = "manifest.json"


def cache_root() -> Path:
    return bundled.user_cache() / "models"


def _key(gguf: Path) -> str:
    digest = hashlib.sha256(str(gguf.stat().st_size).encode())
    with gguf.open("rb") as fh:
        digest.update(fh.read(1 << 20))
    return f"{gguf.stem}-{digest.hexdigest()[:12]}"


def is_complete(folder: Path) -> bool:
    """The folder holds every file its manifest lists, each of the listed size."""
    try:
        sizes = json.loads((folder / MANIFEST).read_text())["files"]
        return bool(sizes) and all((folder / f).stat().st_size == n for f, n in sizes.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def hf_folder(gguf: Path, name: str) -> Path:
    """The cached Hugging Face folder of `gguf` (model.name = `name`), converting it on first use."""
    root = cache_root()
    key = _key(gguf)
    final = root / key
    if is_complete(final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    with (root / f".{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits here, then finds the folder complete
        if is_complete(final):
            return final
        for stale in [final, *root.glob(f".tmp-{key}-*")]:  # damaged, or left by a killed conversion
            shutil.rmtree(stale, ignore_errors=True)
        tmp = root / f".tmp-{key}-{os.getpid()}"
        print(
            f"model.name = {name!r}: converting {gguf.name} to a Hugging Face folder in {final} (first use only)",
            file=sys.stderr,
            flush=True,
        )
        try:
            _convert(gguf, tmp)
        except Exception as err:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(err, OSError) and not isinstance(err, FileNotFoundError):
                raise  # disk full, permissions: the run's own handling names them
            raise UserError(
                f"could not convert the GGUF file ({describe(err)})", key="model.name", value=name
            ) from None
        os.replace(tmp, final)
    return final


def _convert(gguf: Path, out: Path) -> None:
    """Dequantise with transformers (its progress bar shows), save weights, tokenizer and chat template,
    then the manifest."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.hf_quantizer = None  # dequantised: saved as plain weights, not as a GGUF-quantised model
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    sizes = {str(p.relative_to(out)): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}
    (out / MANIFEST).write_text(json.dumps({"source": str(gguf), "files": sizes}, indent=1))
