"""A .gguf file as a Hugging Face folder, converted once and cached.

transformers reads GGUF (dequantising it) in 20-50 s; the folder it saves reloads in under a second. The
cache lives in $GRPO_STUDIO_CACHE (default ~/.cache/grpo-studio)/models/<stem>-<key>, the key the first 32 hex
digits of the sha256 of the whole file, so two different files never share a folder and the same weights
installed in two virtualenvs do. A folder is found by its key alone: a copy or a hard link of another name uses
the folder its first name converted (the stem only says what the folder is). The hash is computed once per file and remembered in gguf-hashes.json beside
models/, by the file's resolved path, size, mtime, ctime and inode: a file rewritten in place is hashed again even
with its mtime put back (the kernel moves ctime on every write). Folders of the older key (size and first MiB,
12 hex digits) are not reused: they stay on disk until deleted.

Safe under concurrency and crashes: one process converts at a time (a lock file), the folder is built
under a temporary name and renamed into place when complete, and `manifest.json` (written last) lists
every file's size and the source's sha256. A folder whose files do not match it (a partial copy, a truncated or
deleted file, a manifest of another file) is rebuilt. A file whose size, mtime, ctime or inode moved between the
hash and the end of its conversion is refused and its folder discarded: it would hold weights of another hash.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import stat
import sys
from pathlib import Path

from ...contract import bundled
from ...contract.errors import UserError, describe
from ...contract.run_files import atomic_write_text

MANIFEST = "manifest.json"
HASHES = "gguf-hashes.json"  # the remembered hashes: {resolved path: {"stamp": [...], "sha256": hex}}
REMEMBERED = 64  # files whose hash is remembered, the most recently hashed
KEY_HEX = 32  # hex digits of the sha256 in a folder's name (128 bits)
CHUNK = 8 << 20
NOTE_BYTES = 1 << 30  # files at least this large say they are being hashed
MAGIC = b"GGUF"
JSON_BYTES = 1 << 20  # the manifest and the memo are a few KiB


def cache_root() -> Path:
    return bundled.user_cache() / "models"


def _stamp(gguf: Path) -> list[int]:
    st = gguf.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _read_json(path: Path):
    """A small JSON file of the cache, or None: missing, damaged, over JSON_BYTES, or not a regular file (a FIFO
    would block the read, a device never end it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            return json.loads(fh.read(JSON_BYTES + 1))
    except (OSError, ValueError, RecursionError):
        return None


def _read_memo(path: Path) -> dict:
    """The remembered hashes; a missing, unreadable or damaged file remembers nothing."""
    memo = _read_json(path)
    return memo if isinstance(memo, dict) else {}


def _recall(path: str, stamp: list[int]) -> str | None:
    entry = _read_memo(bundled.user_cache() / HASHES).get(path)
    if not isinstance(entry, dict) or entry.get("stamp") != stamp:
        return None
    digest = entry.get("sha256")
    ok = isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
    return digest if ok else None


def _remember(path: str, stamp: list[int], sha: str) -> None:
    """Add one hash to the memo (the REMEMBERED newest kept), under a lock so two loads lose neither entry; a
    cache folder that cannot be written only means hashing again next time."""
    root = bundled.user_cache()
    with contextlib.suppress(OSError):
        root.mkdir(parents=True, exist_ok=True)
        with (root / f".{HASHES}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            memo = _read_memo(root / HASHES)
            memo.pop(path, None)
            memo[path] = {"stamp": stamp, "sha256": sha}
            atomic_write_text(root / HASHES, json.dumps(dict(list(memo.items())[-REMEMBERED:]), indent=1))


def content_hash(gguf: Path, name: str) -> str:
    """The sha256 of the whole file (hex), read in chunks the first time, then remembered while its path,
    size, mtime, ctime and inode stay the same. A file that changes while it is read is not remembered."""
    path, stamp = str(gguf.resolve()), _stamp(gguf)
    known = _recall(path, stamp)
    if known:
        return known
    if stamp[0] >= NOTE_BYTES:
        print(
            f"model.name = {name!r}: hashing {gguf.name} ({stamp[0] / 2**30:.1f} GiB) to find its cached folder "
            f"(once per file)",
            file=sys.stderr,
            flush=True,
        )
    digest = hashlib.sha256()
    with gguf.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    sha = digest.hexdigest()
    if _stamp(gguf) == stamp:
        _remember(path, stamp, sha)
    return sha


def _refuse_non_gguf(gguf: Path, name: str) -> None:
    """A file that does not start with GGUF's magic bytes is refused before it is hashed or converted."""
    with gguf.open("rb") as fh:
        head = fh.read(len(MAGIC))
    if head != MAGIC:
        raise UserError(
            f"not a GGUF file (it starts with {head!r}, a GGUF file with {MAGIC!r})", key="model.name", value=name
        )


def folder_name(gguf: Path, sha: str) -> str:
    """<stem>-<key>: the stem (of the file a link points to) only says what it is; the key is the content."""
    return f"{gguf.resolve().stem[:80]}-{sha[:KEY_HEX]}"


def is_complete(folder: Path) -> bool:
    """The folder holds every file its manifest lists, each of the listed size, and the manifest's source
    hash is the one in the folder's name."""
    try:
        manifest = _read_json(folder / MANIFEST)
        sizes, sha = manifest["files"], manifest["sha256"]
        return (
            bool(sizes)
            and folder.name.endswith(f"-{sha[:KEY_HEX]}")
            and all((folder / f).stat().st_size == n for f, n in sizes.items())
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _found(root: Path, sha: str) -> Path | None:
    """The complete folder of this content, whatever stem it carries (a copy or a link of another name
    converted it first)."""
    return next((f for f in sorted(root.glob(f"*-{sha[:KEY_HEX]}")) if is_complete(f)), None)


def hf_folder(gguf: Path, name: str) -> Path:
    """The cached Hugging Face folder of `gguf` (model.name = `name`), converting it on first use. A file
    rewritten while it is hashed or converted (its stamp moved) leaves no folder behind and is refused."""
    _refuse_non_gguf(gguf, name)
    stamp = _stamp(gguf)
    sha = content_hash(gguf, name)
    root = cache_root()
    found = _found(root, sha) if root.is_dir() else None
    if found:
        return found
    root.mkdir(parents=True, exist_ok=True)
    key = sha[:KEY_HEX]
    with (root / f".{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits here, then finds the folder complete
        found = _found(root, sha)
        if found:
            return found
        for stale in [*root.glob(f"*-{key}"), *root.glob(f".tmp-{key}-*")]:  # damaged, or left by a killed conversion
            if stale.is_symlink() or stale.is_file():
                stale.unlink()
            shutil.rmtree(stale, ignore_errors=True)
        final, tmp = root / folder_name(gguf, sha), root / f".tmp-{key}-{os.getpid()}"
        print(
            f"model.name = {name!r}: converting {gguf.name} to a Hugging Face folder in {final} (first use only)",
            file=sys.stderr,
            flush=True,
        )
        try:
            _convert(gguf, tmp, sha)
        except Exception as err:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(err, OSError) and not isinstance(err, FileNotFoundError):
                raise  # disk full, permissions: the run's own handling names them
            raise UserError(
                f"could not convert the GGUF file ({describe(err)})", key="model.name", value=name
            ) from None
        if _stamp(gguf) != stamp:  # the folder would hold other weights than the hash names
            shutil.rmtree(tmp, ignore_errors=True)
            raise UserError(
                "the file changed while it was hashed or converted (its size, mtime, ctime or inode moved); its "
                "folder was discarded; run again once nothing writes it",
                key="model.name",
                value=name,
            )
        os.replace(tmp, final)
    return final


def _convert(gguf: Path, out: Path, sha: str) -> None:
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
    (out / MANIFEST).write_text(json.dumps({"source": str(gguf), "sha256": sha, "files": sizes}, indent=1))
