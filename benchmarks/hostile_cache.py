"""The fault suite's hostile cases for the model cache (benchmarks/fault_probes.py says how they run): .gguf files
that collide, change, lie about being GGUF or are cut short; a damaged cache folder or hash memo; two loads at
once; a model config with numbers that are not finite. The probes convert a GGUF of the bundled tiny model (5 MB,
a fraction of a second) in a cache of their own ($GRPO_STUDIO_CACHE under the probe's folder).

What the content key catches and what it cannot: a different file at any path, and a file rewritten in place even
with its mtime put back (the memo is keyed by ctime and inode too), are hashed again. A memo entry forged with the
file's exact stamp is believed (the cache folder is the user's own), and so is a file rewritten within the same
clock tick as its previous change."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

from .fault_cases import Case, train
from .fault_probes import Probe

CATEGORY = "cache"


@functools.lru_cache(maxsize=2)
def tiny_gguf(rms_norm_eps: float = 1e-6) -> bytes:
    """The bundled tiny model written as an f32 GGUF (engine/out/export.py), its bytes."""
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM

    from ..contract import bundled
    from ..engine.out.export import write_gguf

    src = bundled.bundled_model("tiny-arith")
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    model.config.rms_norm_eps = rms_norm_eps
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiny.gguf"
        write_gguf(model, Path(src), path, "f32", "tiny")
        return path.read_bytes()


def twin() -> bytes:
    """tiny_gguf with one byte changed near its end: the same name, size and first MiB, other weights."""
    data = bytearray(tiny_gguf())
    data[-7] ^= 0x01
    return bytes(data)


@contextlib.contextmanager
def cache_in(tmp: Path):
    """The cache in tmp/cache for the probe's duration."""
    old = os.environ.get("GRPO_STUDIO_CACHE")
    os.environ["GRPO_STUDIO_CACHE"] = str(tmp / "cache")
    try:
        yield tmp / "cache"
    finally:
        if old is None:
            os.environ.pop("GRPO_STUDIO_CACHE", None)
        else:
            os.environ["GRPO_STUDIO_CACHE"] = old


def _put(path: Path, content: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def _sha(content: bytes) -> str:
    import hashlib

    return hashlib.sha256(content).hexdigest()


def _load(path: Path) -> Path:
    from ..engine.model import gguf_cache

    return gguf_cache.hf_folder(path, str(path))


def _weights(folder: Path) -> dict:
    from safetensors.numpy import load_file

    return load_file(folder / "model.safetensors")


def _same_weights(a: Path, b: Path) -> bool:
    wa, wb = _weights(a), _weights(b)
    return wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)


def _holds_content(folder: Path, content: bytes) -> str | None:
    """None when `folder` is the complete conversion of `content`, by name and manifest."""
    from ..engine.model import gguf_cache

    if not folder.name.endswith(_sha(content)[: gguf_cache.KEY_HEX]):
        return f"{folder.name} is not keyed by the file's sha256 {_sha(content)[:16]}..."
    return None if gguf_cache.is_complete(folder) else f"{folder} is not complete"


# ---- the content key ---------------------------------------------------------------------------------------


def colliding_files(tmp: Path) -> str | None:
    with cache_in(tmp):
        a = _load(_put(tmp / "a" / "model.gguf", tiny_gguf()))
        b = _load(_put(tmp / "b" / "model.gguf", twin()))
        if a == b:
            return f"two files of one name, size and first MiB share {a}"
        if _same_weights(a, b):
            return "the second file's folder holds the first file's weights"
        return _holds_content(b, twin())


def same_file_two_paths(tmp: Path) -> str | None:
    with cache_in(tmp) as cache:
        a = _load(_put(tmp / "venv1" / "m.gguf", tiny_gguf()))
        b = _load(_put(tmp / "venv2" / "m.gguf", tiny_gguf()))
        folders = [p.name for p in (cache / "models").iterdir() if not p.name.startswith(".")]
        return None if a == b and folders == [a.name] else f"folders {folders} for one content"


def other_names_one_content(tmp: Path) -> str | None:
    """A copy and a hard link under other names: the folder the first name converted, no second conversion."""
    with cache_in(tmp) as cache:
        a = _load(_put(tmp / "SmolLM2.Q4_1.gguf", tiny_gguf()))
        b = _load(_put(tmp / "copy.gguf", tiny_gguf()))
        os.link(tmp / "SmolLM2.Q4_1.gguf", tmp / "hard_other_name.gguf")
        c = _load(tmp / "hard_other_name.gguf")
        folders = [p.name for p in (cache / "models").iterdir() if not p.name.startswith(".")]
        return None if a == b == c and folders == [a.name] else f"folders {folders} for one content"


def rewritten_while_converting(tmp: Path) -> str | None:
    """The file rewritten between its hash and the end of its conversion: refused, no folder of the old hash."""
    from ..contract.errors import UserError
    from ..engine.model import gguf_cache

    with cache_in(tmp) as cache:
        path = _put(tmp / "m.gguf", tiny_gguf())
        convert = gguf_cache._convert

        def convert_then_rewrite(gguf: Path, out: Path, sha: str) -> None:
            convert(gguf, out, sha)
            gguf.write_bytes(twin())

        gguf_cache._convert = convert_then_rewrite
        try:
            folder = _load(path)
        except UserError as err:
            left = [p.name for p in (cache / "models").iterdir() if not p.name.endswith(".lock")]
            return None if "changed while it was hashed or converted" in str(err) and not left else f"{err}; {left}"
        finally:
            gguf_cache._convert = convert
        return f"loaded {folder.name}, holding weights of another hash"


def rewritten_in_place_same_mtime(tmp: Path) -> str | None:
    with cache_in(tmp):
        path = _put(tmp / "m.gguf", tiny_gguf())
        before = path.stat()
        _load(path)
        with path.open("r+b") as fh:  # the same inode, the same size
            fh.write(twin())
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        if path.stat().st_mtime_ns != before.st_mtime_ns:
            return "could not put the mtime back"
        return _holds_content(_load(path), twin())


def replaced_by_rename(tmp: Path) -> str | None:
    with cache_in(tmp):
        path = _put(tmp / "m.gguf", tiny_gguf())
        before = path.stat()
        _load(path)
        other = _put(tmp / "new.gguf", twin())
        os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))
        os.replace(other, path)
        return _holds_content(_load(path), twin())


def symlinked_file(tmp: Path) -> str | None:
    with cache_in(tmp):
        real = _put(tmp / "real.gguf", tiny_gguf())
        link = tmp / "link.gguf"
        link.symlink_to(real)
        return None if _load(link) == _load(real) else "a link to a file got a folder of its own"


# ---- the hash memo -----------------------------------------------------------------------------------------


def memo_case(damage: Callable[[Path, Path], None]) -> Callable[[Path], str | None]:
    """A check: the memo damaged by damage(memo file, gguf) before a load, which still finds the right folder."""

    def check(tmp: Path) -> str | None:
        from ..engine.model import gguf_cache

        with cache_in(tmp) as cache:
            path = _put(tmp / "m.gguf", tiny_gguf())
            cache.mkdir(parents=True, exist_ok=True)
            damage(cache / gguf_cache.HASHES, path)
            return _holds_content(_load(path), tiny_gguf())

    return check


def _entry(path: Path, stamp_shift: int, sha: str) -> dict:
    from ..engine.model import gguf_cache

    stamp = gguf_cache._stamp(path)
    stamp[1] += stamp_shift
    return {str(path.resolve()): {"stamp": stamp, "sha256": sha}}


def _stale(memo: Path, gguf: Path) -> None:
    memo.write_text(json.dumps(_entry(gguf, -1, _sha(twin()))))  # another mtime: another file's hash


def _malformed(memo: Path, gguf: Path) -> None:
    memo.write_text(json.dumps(_entry(gguf, 0, "not a hash")))


def _fifo(memo: Path, gguf: Path) -> None:
    os.mkfifo(memo)


MEMOS: dict[str, Callable[[Path, Path], None]] = {
    "a stale memo entry (another mtime)": _stale,
    "a memo entry whose hash is not hex": _malformed,
    "a memo that is not JSON": lambda memo, gguf: memo.write_text("{ not json"),
    "a memo that is a list": lambda memo, gguf: memo.write_text("[1, 2]"),
    "a memo of 2 MiB": lambda memo, gguf: memo.write_text(" " * (2 << 20) + "{}"),
    "a memo that is a FIFO": _fifo,
    "a memo that is a folder": lambda memo, gguf: memo.mkdir(),
    "a memo lock that is a folder": lambda memo, gguf: (memo.parent / f".{memo.name}.lock").mkdir(),
}


def memo_remembers(tmp: Path) -> str | None:
    from ..engine.model import gguf_cache

    with cache_in(tmp) as cache:
        path = _put(tmp / "m.gguf", tiny_gguf())
        (cache / gguf_cache.HASHES).parent.mkdir(parents=True, exist_ok=True)
        (cache / gguf_cache.HASHES).write_text("{ damaged")
        _load(path)
        memo = json.loads((cache / gguf_cache.HASHES).read_text())
        want = {str(path.resolve()): {"stamp": gguf_cache._stamp(path), "sha256": _sha(tiny_gguf())}}
        return None if memo == want else f"memo after a load: {memo}"


# ---- files that are not (whole) GGUF -----------------------------------------------------------------------


def refused(
    prepare: Callable[[Path], Path], why: Callable[[Path], str], exact: bool = True
) -> Callable[[Path], str | None]:
    """A check: model.name = the prepared path is refused by resolve_model_path with `why(path)`, exactly or
    (exact=False) followed by the reason in parentheses."""

    def check(tmp: Path) -> str | None:
        from ..contract.errors import UserError
        from ..engine.model.policy_loader import resolve_model_path

        with cache_in(tmp):
            path = prepare(tmp)
            try:
                folder = resolve_model_path(str(path))
            except UserError as err:
                want, line = f"config error: model.name = '{path}': {why(path)}", str(err)
                ok = line == want if exact else line.startswith(f"{want} (") and "\n" not in line
                return None if ok else f"said {line!r}, expected {want!r}"
            return f"loaded as {folder}"

    return check


def _truncated(tmp: Path) -> Path:
    return _put(tmp / "cut.gguf", tiny_gguf()[: len(tiny_gguf()) // 2])


def _directory(tmp: Path) -> Path:
    (tmp / "x.gguf").mkdir()
    return tmp / "x.gguf"


def _unreadable(tmp: Path) -> Path:
    path = _put(tmp / "locked.gguf", tiny_gguf())
    path.chmod(0)
    return path


def _nan_gguf(tmp: Path) -> Path:
    return _put(tmp / "nan.gguf", tiny_gguf(float("nan")))


NOT_GGUF = "not a GGUF file (it starts with {!r}, a GGUF file with b'GGUF')"


def not_gguf_cases() -> dict[str, Callable[[Path], str | None]]:
    out = {
        "a truncated gguf": refused(_truncated, lambda p: CONVERT_FAILED, exact=False),
        "a gguf cut to 3 bytes": refused(lambda t: _put(t / "c.gguf", b"GGU"), lambda p: NOT_GGUF.format(b"GGU")),
        "an empty .gguf": refused(lambda t: _put(t / "e.gguf", b""), lambda p: NOT_GGUF.format(b"")),
        "a text file named .gguf": refused(
            lambda t: _put(t / "notes.gguf", b"hello world\n"), lambda p: NOT_GGUF.format(b"hell")
        ),
        "a safetensors file named .gguf": refused(
            lambda t: _put(t / "w.gguf", (8).to_bytes(8, "little") + b'{"a":1} '),
            lambda p: NOT_GGUF.format(b"\x08\x00\x00\x00"),
        ),
        "a directory named x.gguf": refused(_directory, lambda p: "a folder, not a .gguf file"),
        "a gguf whose rms_norm_eps is NaN": refused(
            _nan_gguf,
            lambda p: f"{_folder_of(p)}/config.json sets rms_norm_eps = nan; allowed: finite numbers",
        ),
    }
    if os.geteuid() != 0:  # root reads a chmod 000 file anyway
        out["an unreadable gguf"] = refused(_unreadable, lambda p: "cannot read it: permission denied")
    return out


CONVERT_FAILED = "could not convert the GGUF file"


def _folder_of(path: Path) -> Path:
    from ..engine.model import gguf_cache

    return gguf_cache.cache_root() / gguf_cache.folder_name(path, _sha(path.read_bytes()))


# ---- a damaged cache folder --------------------------------------------------------------------------------


def folder_case(damage: Callable[[Path], None]) -> Callable[[Path], str | None]:
    """A check: the converted folder damaged by damage(folder), then loaded again: rebuilt whole, the same weights."""

    def check(tmp: Path) -> str | None:
        import shutil

        with cache_in(tmp):
            path = _put(tmp / "m.gguf", tiny_gguf())
            folder = _load(path)
            good = tmp / "good"
            shutil.copytree(folder, good)
            damage(folder)
            again = _load(path)
            wrong = _holds_content(again, tiny_gguf())
            if wrong or again != folder:
                return wrong or f"loaded {again}, not {folder}"
            leftovers = [p.name for p in folder.parent.iterdir() if p.name.startswith(".tmp-")]
            return None if _same_weights(again, good) and not leftovers else f"weights differ or left {leftovers}"

    return check


def _manifest(folder: Path, change: Callable[[dict], None]) -> None:
    from ..engine.model import gguf_cache

    manifest = json.loads((folder / gguf_cache.MANIFEST).read_text())
    change(manifest)
    (folder / gguf_cache.MANIFEST).write_text(json.dumps(manifest))


def _replace_with_file(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder)
    folder.write_text("not a folder")


def _manifest_fifo(folder: Path) -> None:
    (folder / "manifest.json").unlink()
    os.mkfifo(folder / "manifest.json")


def _killed_midway(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder)
    partial = folder.parent / f".tmp-{folder.name.rsplit('-', 1)[1]}-99999"  # .tmp-<key>-<pid>
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"\0" * 100)


FOLDERS: dict[str, Callable[[Path], None]] = {
    "a manifest with a wrong size": lambda f: _manifest(f, lambda m: m["files"].update({"config.json": 1})),
    "a manifest naming another file's hash": lambda f: _manifest(f, lambda m: m.update(sha256=_sha(twin()))),
    "a manifest without a hash (the old format)": lambda f: _manifest(f, lambda m: m.pop("sha256")),
    "a manifest that is a FIFO": _manifest_fifo,
    "a converted file missing": lambda f: (f / "model.safetensors").unlink(),
    "a converted file truncated": lambda f: os.truncate(f / "model.safetensors", 1000),
    "a file where the cached folder belongs": _replace_with_file,
    "a conversion killed midway": _killed_midway,
}


def old_key_not_reused(tmp: Path) -> str | None:
    """A folder keyed the old way (size + first MiB, 12 hex digits) with the other file's weights is left alone."""
    import hashlib
    import shutil

    with cache_in(tmp) as cache:
        path = _put(tmp / "m.gguf", tiny_gguf())
        first = _load(_put(tmp / "other" / "m.gguf", twin()))
        old = hashlib.sha256(str(len(tiny_gguf())).encode())
        old.update(tiny_gguf()[: 1 << 20])
        stale = cache / "models" / f"m-{old.hexdigest()[:12]}"
        shutil.copytree(first, stale)
        folder = _load(path)
        if folder == stale or _same_weights(folder, stale):
            return f"the old-key folder {stale.name} was reused"
        return _holds_content(folder, tiny_gguf()) or (None if stale.is_dir() else "the old folder was removed")


def two_loads_at_once(tmp: Path) -> str | None:
    with cache_in(tmp) as cache:
        path = _put(tmp / "m.gguf", tiny_gguf())
        got: list = []
        threads = [threading.Thread(target=lambda: got.append(_load(path))) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        names = sorted(p.name for p in (cache / "models").iterdir())
        if len(got) != 2 or got[0] != got[1]:
            return f"loads gave {got}"
        if names != sorted([got[0].name, f".{got[0].name.rsplit('-', 1)[1]}.lock"]):
            return f"the cache holds {names}"
        return _holds_content(got[0], tiny_gguf())


def probes() -> list[Probe]:
    checks: dict[str, Callable[[Path], str | None]] = {
        "same name, size and first MiB, other content": colliding_files,
        "the same content at two paths shares a folder": same_file_two_paths,
        "a copy and a hard link of other names share its folder": other_names_one_content,
        "rewritten while it converts": rewritten_while_converting,
        "rewritten in place with the mtime put back": rewritten_in_place_same_mtime,
        "replaced by a rename, same size and mtime": replaced_by_rename,
        "a symlink to a converted file": symlinked_file,
        "the hash remembered after a load": memo_remembers,
        "a folder of the old key is not reused": old_key_not_reused,
        "two loads at once": two_loads_at_once,
        **{name: memo_case(damage) for name, damage in MEMOS.items()},
        **not_gguf_cases(),
        **{name: folder_case(damage) for name, damage in FOLDERS.items()},
    }
    return [Probe(CATEGORY, name, check, timeout_s=60) for name, check in checks.items()]


def _config_with(**changes) -> str:
    from ..contract import bundled

    config = json.loads((bundled.bundled_model("tiny-arith") / "config.json").read_text())
    return json.dumps({**config, **changes}).replace('"NAN"', "NaN").replace('"INF"', "Infinity")


def commands() -> list[Case]:
    """`train` with a hostile model.name: refused in one line before any weights load, no run directory."""
    nan, inf = "NAN", "INF"
    folders = {
        "rms_norm_eps NaN": _config_with(rms_norm_eps=nan),
        "rope_theta Infinity": _config_with(rope_parameters={"rope_theta": inf, "rope_type": "default"}),
        "initializer_range -Infinity": _config_with(initializer_range=-1).replace(
            '"initializer_range": -1', '"initializer_range": -Infinity'
        ),
        "a 1e999 number": _config_with(rms_norm_eps=1).replace('"rms_norm_eps": 1', '"rms_norm_eps": 1e999'),
        "NaN in a list": _config_with(extra_scales=[1.0, nan]),
        "rms_norm_eps -1 (trained to NaN, exit 0)": _config_with(rms_norm_eps=-1.0),
        "rms_norm_eps 0": _config_with(rms_norm_eps=0),
        "rms_norm_eps true": _config_with(rms_norm_eps=True),
        'rms_norm_eps "NaN" (a string)': _config_with(rms_norm_eps="NaN"),
        "rope_theta a 400-digit integer": _config_with(rope_parameters={"rope_theta": 10**399, "rope_type": "default"}),
        "max_position_embeddings 10**30": _config_with(max_position_embeddings=10**30),
        "num_attention_heads 0": _config_with(num_attention_heads=0),
        "hidden_size 256.5": _config_with(hidden_size=256.5),
        "attention_dropout 2": _config_with(attention_dropout=2),
    }
    out = [
        Case(
            CATEGORY,
            f"config.json with {what}",
            train("--set", "model.name={tmp}/model"),
            files={"model/config.json": text},
        )
        for what, text in folders.items()
    ]
    out += [
        Case(
            CATEGORY, "model.name a text file .gguf", train("--set", "model.name={tmp}/m.gguf"), files={"m.gguf": "hi"}
        ),
        Case(CATEGORY, "model.name an empty .gguf", train("--set", "model.name={tmp}/m.gguf"), files={"m.gguf": b""}),
        Case(
            CATEGORY,
            "model.name a folder x.gguf",
            train("--set", "model.name={tmp}/x.gguf"),
            prepare=lambda t: (t / "x.gguf").mkdir(),
        ),
        Case(
            CATEGORY,
            "model.name a FIFO x.gguf",
            train("--set", "model.name={tmp}/x.gguf"),
            prepare=lambda t: os.mkfifo(t / "x.gguf"),
        ),
        Case(
            CATEGORY,
            "model.name a link to /dev/zero",
            train("--set", "model.name={tmp}/z.gguf"),
            prepare=lambda t: (t / "z.gguf").symlink_to("/dev/zero"),
        ),
    ]
    return out


def cases() -> list:
    return [*probes(), *commands()]
