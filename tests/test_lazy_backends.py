"""Optional backends load only when the config uses them: the default run (tiny-arith, LoRA on a 16-bit base)
never imports bitsandbytes, which peft would import on every run (about 1 s of start-up); a 4-bit base still
finds it afterwards in the same process (engine/model/policy_loader.py)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import importlib.util, json, sys, tempfile
from grpo_studio.contract import config
from grpo_studio.engine.run.trainer import Trainer
trainer = Trainer(config.load("tiny-arith", ["train.steps=1"]), tempfile.mkdtemp() + "/run")
trainer.rundir.acquire()
trainer.step()
trainer.rundir.release()
trainer.close()
loaded = sorted(m.split(".")[0] for m in sys.modules)
from peft import import_utils
print(json.dumps({"loaded": loaded, "found": importlib.util.find_spec("bitsandbytes") is not None,
                  "peft_sees": import_utils.is_bnb_available()}))
"""


def test_the_default_lora_run_never_imports_bitsandbytes():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=600, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert "peft" in seen["loaded"] and "torch" in seen["loaded"]  # the probe really built and stepped a LoRA run
    assert "bitsandbytes" not in seen["loaded"]
    # hidden only while peft wrapped the model: installed, it is found again, by peft too
    assert seen["found"] == seen["peft_sees"]
    assert seen["found"] == (subprocess.run([sys.executable, "-c", "import bitsandbytes"]).returncode == 0)
