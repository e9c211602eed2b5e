"""engine/out/checkpoint.py in-process, against the files themselves: what save writes (a manifest whose
sizes and sha256 are the files' own), what restore puts back (weights, AdamW state, LR schedule,
loss scaler, RNG, data cursor: equal to what was saved), which checkpoint it picks (the newest by
number), and the exact reason it gives for each kind of damage. (The SIGKILL/resume stories through
the real CLI are tests/test_crash_consistency.py.)"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch

from grpo_studio.contract import config, precision_plan
from grpo_studio.engine.model import policy_loader
from grpo_studio.engine.out import checkpoint
from grpo_studio.engine.precision.numerics import LossScaler


class Objects:
    """A policy with its optimizer, LR schedule and loss scaler, moved a few steps from the start."""

    def __init__(self, lora_rank: int = 16, seed: int = 0, steps: int = 2):
        cfg = config.load("tiny-arith", [f"model.lora_rank={lora_rank}"])
        torch.manual_seed(seed)
        self.policy = policy_loader.load_policy(
            cfg, policy_loader.resolve_model_path("tiny-arith"), precision_plan.resolve(cfg)
        )
        self.params = [p for p in self.policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=0.01)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda done: 1.0 / (done + 1))
        self.scaler = LossScaler(init_scale=1024.0, growth_interval=3)
        g = torch.Generator().manual_seed(seed + 100)
        for _ in range(steps):
            for p in self.params:
                p.grad = torch.randn(p.shape, generator=g)
            self.optimizer.step()
            self.schedule.step()
            self.scaler.update(False)
        self.scaler.update(True)  # one skipped step: scale halved, counter 1

    def trainable(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.policy.named_parameters() if p.requires_grad}

    def save(self, run, step: int, cursor=None):
        return checkpoint.save(
            run,
            step,
            self.policy,
            self.optimizer,
            self.schedule,
            self.scaler,
            cursor or {"epoch": 1, "index": step},
            {"counted": step * 3},
        )

    def restore(self, run):
        skipped = []
        state = checkpoint.restore(
            run,
            self.policy,
            self.optimizer,
            self.schedule,
            self.scaler,
            on_skip=lambda step, path, why: skipped.append((step, path.name, why)),
        )
        return state, skipped


def assert_same(a, b):
    """Nested dicts/lists/tensors equal exactly."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A run with checkpoints 9 and 10 (different weights), and what each held."""
    run = tmp_path_factory.mktemp("ckpt") / "run"
    held = {}
    for step, seed in ((9, 1), (10, 2)):
        objs = Objects(seed=seed, steps=seed + 1)
        torch.manual_seed(1000 + step)
        held[step] = {
            "weights": objs.trainable(),
            "optimizer": objs.optimizer.state_dict(),
            "schedule": objs.schedule.state_dict(),
            "scaler": objs.scaler.state_dict(),
            "rng": torch.get_rng_state(),
        }
        assert objs.save(run, step) == run / "checkpoints" / f"step-{step}"
    return run, held


def copy_run(saved, tmp_path):
    run, held = saved
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run", held


def test_save_writes_a_manifest_of_the_files_own_sizes_and_digests(saved):
    run, _ = saved
    folder = run / "checkpoints" / "step-10"
    manifest = json.loads((folder / "manifest.json").read_text())
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "manifest.json")
    assert {"adapter_model.safetensors", "adapter_config.json", "trainer_state.pt"} <= {p.name for p in files}
    assert manifest == {
        "step": 10,
        "files": {
            p.relative_to(folder).as_posix(): {
                "size": p.stat().st_size,
                "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
            }
            for p in files
        },
    }
    assert not list((run / "checkpoints").glob(".step-*"))  # no temporary folder left behind


def test_save_never_overwrites_a_step(saved, tmp_path):
    run, _ = copy_run(saved, tmp_path)
    before = (run / "checkpoints/step-10/manifest.json").read_bytes()
    assert Objects(seed=5).save(run, 10) is None
    assert (run / "checkpoints/step-10/manifest.json").read_bytes() == before


def test_restore_puts_back_exactly_what_the_newest_checkpoint_holds(saved, tmp_path):
    """10 is newer than 9 (by number, not by name: 'step-10' < 'step-9' as strings); folders that are
    not step-N (step-11.skipped, step-12-old) are not candidates."""
    run, held = copy_run(saved, tmp_path)
    (run / "checkpoints" / "step-11.skipped").mkdir()
    (run / "checkpoints" / "step-12-old").mkdir()
    target = Objects(seed=7, steps=1)
    assert any(not torch.equal(held[10]["weights"][n], w) for n, w in target.trainable().items())
    torch.manual_seed(4242)
    state, skipped = target.restore(run)
    assert skipped == []
    assert state["step"] == 10 and state["data_cursor"] == {"epoch": 1, "index": 10}
    assert state["counters"] == {"counted": 30}
    assert_same(target.trainable(), held[10]["weights"])
    assert_same(target.optimizer.state_dict(), held[10]["optimizer"])
    assert target.schedule.state_dict()["last_epoch"] == held[10]["schedule"]["last_epoch"] == 3
    assert target.schedule.get_last_lr() == [0.01 / 4]
    assert target.scaler.state_dict() == held[10]["scaler"]
    # 3 clean steps at growth_interval 3 doubled 1024 to 2048, then the overflow halved it
    assert (target.scaler.get_scale(), target.scaler.skipped_steps) == (1024.0, 1)
    assert torch.equal(torch.get_rng_state(), held[10]["rng"])


def test_restore_of_a_full_fine_tune(tmp_path):
    source = Objects(lora_rank=0, seed=3)
    assert source.save(tmp_path / "run", 2) is not None
    target = Objects(lora_rank=0, seed=4, steps=1)
    state, skipped = target.restore(tmp_path / "run")
    assert state["step"] == 2 and skipped == []
    assert_same(target.trainable(), source.trainable())
    assert_same(target.optimizer.state_dict(), source.optimizer.state_dict())


def test_nothing_to_restore(tmp_path):
    state, skipped = Objects().restore(tmp_path / "run")
    assert state is None and skipped == []


def _edit_manifest(folder, edit):
    manifest = json.loads((folder / "manifest.json").read_text())
    edit(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _flip_last_byte(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGE = {
    "no-manifest": (
        lambda f: (f / "manifest.json").unlink(),
        "no manifest.json (written before this version, or cut short)",
    ),
    "manifest-garbage": (lambda f: (f / "manifest.json").write_text("{not json"), "manifest.json is unreadable"),
    "manifest-no-files": (lambda f: _edit_manifest(f, lambda m: m.pop("files")), "manifest.json is unreadable"),
    "other-step": (lambda f: _edit_manifest(f, lambda m: m.update(step=4)), "manifest.json is for step 4"),
    "state-unlisted": (
        lambda f: _edit_manifest(f, lambda m: m["files"].pop("trainer_state.pt")),
        "manifest.json does not list trainer_state.pt",
    ),
    "file-missing": (lambda f: (f / "adapter_config.json").unlink(), "adapter_config.json is missing"),
    "file-grew": (lambda f: open(f / "adapter_model.safetensors", "ab").write(b"x"), None),
    "file-changed": (
        lambda f: _flip_last_byte(f / "adapter_model.safetensors"),
        "adapter_model.safetensors fails its sha256 check",
    ),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_newest_checkpoint_is_moved_aside_for_the_previous_one(saved, tmp_path, kind):
    run, held = copy_run(saved, tmp_path)
    newest = run / "checkpoints" / "step-10"
    size = (newest / "adapter_model.safetensors").stat().st_size
    damage, why = DAMAGE[kind]
    damage(newest)
    if why is None:
        why = f"adapter_model.safetensors is {size + 1} bytes, the manifest says {size}"
    target = Objects(seed=7, steps=1)
    state, skipped = target.restore(run)
    assert skipped == [(10, "step-10", f"{why} (moved to step-10.skipped)")]
    assert not newest.exists() and (run / "checkpoints" / "step-10.skipped").is_dir()
    assert state["step"] == 9
    assert_same(target.trainable(), held[9]["weights"])
    assert_same(target.optimizer.state_dict(), held[9]["optimizer"])


def test_an_unloadable_trainer_state_is_skipped_with_the_readers_error(saved, tmp_path):
    run, _ = copy_run(saved, tmp_path)
    newest = run / "checkpoints" / "step-10"
    (newest / "trainer_state.pt").write_bytes(b"not a torch file")
    _edit_manifest(
        newest,
        lambda m: m["files"].update(
            {"trainer_state.pt": {"size": 16, "sha256": hashlib.sha256(b"not a torch file").hexdigest()}}
        ),
    )
    state, skipped = Objects(seed=7, steps=1).restore(run)
    # the reader's own error, type and first line: torch.load's pickle reader on b"not a torch file"
    assert skipped == [
        (10, "step-10", "cannot be loaded (UnpicklingError: invalid load key, 'n'.) (moved to step-10.skipped)")
    ]
    assert state["step"] == 9


def test_restore_clears_writes_cut_short_and_a_second_skip_replaces_the_first(saved, tmp_path):
    run, _ = copy_run(saved, tmp_path)
    cut = run / "checkpoints" / ".step-11.tmp"
    cut.mkdir()
    (cut / "adapter_model.safetensors").write_bytes(b"half")
    (run / "checkpoints" / "step-10.skipped").mkdir()  # left by an earlier resume
    (run / "checkpoints" / "step-10.skipped" / "old").write_text("old")
    (run / "checkpoints" / "step-10" / "manifest.json").unlink()
    state, skipped = Objects(seed=7, steps=1).restore(run)
    assert not cut.exists() and state["step"] == 9 and [s for s, _, _ in skipped] == [10]
    assert not (run / "checkpoints" / "step-10.skipped" / "old").exists()
    assert (run / "checkpoints" / "step-10.skipped" / "adapter_model.safetensors").is_file()


def test_the_trainer_state_file_holds_exactly_the_trainer_state(tmp_path):
    objs = Objects(seed=2, steps=2)
    torch.manual_seed(77)
    rng = torch.get_rng_state()
    path = objs.save(tmp_path / "run", 4, {"epoch": 0, "index": 8})
    state = torch.load(path / "trainer_state.pt", weights_only=False)
    assert set(state) == {"step", "optimizer", "schedule", "scaler", "rng", "cuda_rng", "data_cursor", "counters"}
    assert (state["step"], state["data_cursor"], state["counters"]) == (4, {"epoch": 0, "index": 8}, {"counted": 12})
    assert_same(state["optimizer"], objs.optimizer.state_dict())
    assert state["schedule"] == objs.schedule.state_dict() and state["scaler"] == objs.scaler.state_dict()
    assert torch.equal(state["rng"], rng)
    if torch.cuda.is_available():
        assert len(state["cuda_rng"]) == torch.cuda.device_count()
    else:
        assert state["cuda_rng"] == []


def test_save_starts_from_an_empty_folder_when_an_earlier_write_was_cut_short(tmp_path):
    run = tmp_path / "run"
    cut = run / "checkpoints" / ".step-4.tmp"
    cut.mkdir(parents=True)
    (cut / "junk.bin").write_bytes(b"left by a killed write")
    path = Objects().save(run, 4)
    assert not (path / "junk.bin").exists() and not cut.exists()
    assert "junk.bin" not in json.loads((path / "manifest.json").read_text())["files"]


@pytest.mark.gpu
def test_cuda_rng_round_trip(tmp_path):
    objs = Objects()
    torch.cuda.manual_seed_all(5)
    saved_state = torch.cuda.get_rng_state_all()
    objs.save(tmp_path / "run", 1)
    torch.cuda.manual_seed_all(6)
    state, _ = Objects(seed=3).restore(tmp_path / "run")
    assert state["cuda_rng"] and all(torch.equal(a, b) for a, b in zip(torch.cuda.get_rng_state_all(), saved_state))
