"""Short runs written by the real trainer, for the studio tests that check what the studio shows
against the files (tests/conftest.py trains them once per session: the `trained_runs` fixture)."""

from __future__ import annotations

from pathlib import Path

TRAINED_STEPS = 4
DTYPES = ("bf16", "fp16")


def train(root: Path) -> dict[str, Path]:
    """bf16 and fp16 runs of the bundled model, TRAINED_STEPS steps each, eval every 2 steps."""
    from grpo_studio.contract import config
    from grpo_studio.engine.run.trainer import Trainer

    runs = {}
    for dtype in DTYPES:
        cfg = config.load(
            "tiny-arith",
            [
                f"model.dtype={dtype}",
                f"train.steps={TRAINED_STEPS}",
                "train.prompts_per_step=2",
                "rollout.num_generations=2",
                "train.save_every=0",
                "train.eval_every=2",
                "train.eval_before=true",
                "data.eval_size=8",
            ],
        )
        trainer = Trainer(cfg, root / f"real-{dtype}")
        try:
            assert trainer.run() == "finished"
        finally:
            trainer.close()
        runs[dtype] = root / f"real-{dtype}"
    return runs
