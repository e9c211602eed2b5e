"""Load the policy: tokenizer and model from a preset, a local folder, or the HF cache; LoRA via peft.

Precision (see docs/mismatch.md):
  * LoRA: base weights stored in the trainer dtype; peft keeps adapter weights in fp32.
  * Full fine-tune: fp32 master weights, forward under torch.autocast(dtype) for bf16/fp16.
  * fp8: bf16 master weights (LoRA base and full fine-tune alike) with every linear GEMM
    quantised (engine/precision/fp8.py).
  * model.load_in_4bit (QLoRA): the decoder's linears in 4-bit NF4 (bitsandbytes) computing in
    model.dtype, everything else stored in model.dtype, fp32 LoRA adapters on top.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
import warnings
from pathlib import Path

import torch

from ...contract import bundled, model_card, packaged
from ...contract.config import Config
from ...contract.errors import UserError, describe, did_you_mean, user_path
from ..prompts import data
from . import gguf_cache

# bitsandbytes (which peft imports) warns at import on CPUs with AVX512-BF16 that an optional kernel
# package is missing; its built-in CPU kernels are what run, so the line is noise in a run's console.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


def resolve_model_path(name: str) -> str:
    """A preset id, a packaged model or .gguf file (as its cached HF folder), a local folder with config.json,
    or a hub id already in the local HF cache; a local folder whose config.json holds a number that is not
    finite, or a known field outside its domain, is refused before anything loads (model_card.check_model_folder)."""
    path = _model_path(name)
    if Path(path).is_dir():
        model_card.check_model_folder(Path(path), name)
    return path


def _model_path(name: str) -> str:
    with user_path("model.name", name):  # a name too long, a NUL byte, an unreadable folder
        preset = bundled.bundled_model(name)
        if preset is not None:
            return str(preset)
        local = Path(name).expanduser()
        if name in packaged.PACKAGED or packaged.is_gguf(name):  # converted once, then a cached HF folder
            if not packaged.is_gguf(name):
                local = packaged.gguf_file(name)
            elif not local.is_file():
                why = "a folder, not a .gguf file" if local.is_dir() else data.not_regular(local) or "file not found"
                raise UserError(why, key="model.name", value=name)
            return str(gguf_cache.hf_folder(local, name))
        if local.is_dir():
            if (local / "config.json").is_file():
                return str(local)
            raise UserError("folder has no config.json", key="model.name", value=name)
    if "/" in name and not name.startswith((".", "/")):
        from huggingface_hub import snapshot_download

        try:
            return snapshot_download(name, local_files_only=True)
        except Exception:
            if os.environ.get("HF_HUB_OFFLINE") == "1" or not _online():
                raise UserError(
                    "not in the local Hugging Face cache and this machine is offline; download it "
                    "first or give a local folder",
                    key="model.name",
                    value=name,
                ) from None
            return name
    named = [p.name for p in bundled.MODELS.iterdir() if (p / "config.json").is_file()] + list(packaged.PACKAGED)
    raise UserError(
        f"not a bundled or packaged model ({', '.join(named)}), a local folder with config.json, a "
        f".gguf file, or a hub id like 'Qwen/Qwen3-0.6B'{did_you_mean(name, named)}",
        key="model.name",
        value=name,
    )


def _online() -> bool:
    import socket

    try:
        socket.create_connection(("huggingface.co", 443), timeout=2).close()
        return True
    except OSError:
        return False


def quiet_transformers() -> None:
    """No per-load progress bars in the run's console output (they garble piped logs)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


@contextlib.contextmanager
def _loading(path: str):
    """A model folder transformers cannot read (a bad config.json, no tokenizer, corrupt weights) is one
    line naming it; out of memory is not the folder's fault and stays what it is."""
    try:
        yield
    except (MemoryError, torch.OutOfMemoryError, UserError):
        raise
    except Exception as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        reason = describe(err)
        if len(lines) > 1 and lines[0].endswith(":"):  # "Validation error for field 'x':" names the fault next
            reason = f"{reason} {lines[1][:200]}"
        raise UserError(f"could not load ({reason})", key="model.name", value=path) from None


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    with _loading(path):
        tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_base(path: str, dtype: torch.dtype, quant=None):
    """The base model with its weights in `dtype`; `quant` a transformers quantization config (4-bit) or None."""
    from transformers import AutoModelForCausalLM

    from .grouped_sdpa import use_grouped_sdpa

    quiet_transformers()
    use_grouped_sdpa()
    with _loading(path):
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, quantization_config=quant)


def quantization(m, compute: torch.dtype):
    """model.load_in_4bit: bitsandbytes NF4 for the base's linears, computing in `compute` (QLoRA's
    recipe; config.validate has refused the combinations that cannot work); else None."""
    if not m.load_in_4bit:
        return None
    if importlib.util.find_spec("bitsandbytes") is None:
        raise UserError(
            "bitsandbytes is not installed: pip install 'grpo-studio[qlora]'", key="model.load_in_4bit", value=True
        )
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=compute,
        bnb_4bit_use_double_quant=m.double_quant,
    )


@contextlib.contextmanager
def _bitsandbytes_only_for_4bit(m):
    """peft imports bitsandbytes (about 1 s of start-up: torch's inductor comes with it) whether or not the base
    is 4-bit. Unless model.load_in_4bit, it is hidden while peft loads and wraps the model (a None in
    sys.modules: peft's find_spec checks then say it is not installed), and shown again after, with peft's
    cached answers cleared, so a later 4-bit load in the same process finds it."""
    if m.load_in_4bit or "bitsandbytes" in sys.modules:
        yield
        return
    sys.modules["bitsandbytes"] = None
    try:
        yield
    finally:
        if sys.modules.get("bitsandbytes", 0) is None:
            del sys.modules["bitsandbytes"]
        from peft import import_utils

        import_utils.is_bnb_available.cache_clear()
        import_utils.is_bnb_4bit_available.cache_clear()


def add_lora(model, m):
    """The model wrapped by peft with model.lora_* adapters (the base frozen)."""
    with _bitsandbytes_only_for_4bit(m):
        return _add_lora(model, m)


def _add_lora(model, m):
    from peft import LoraConfig, get_peft_model

    targets = m.lora_target_modules
    lora = LoraConfig(
        r=m.lora_rank,
        lora_alpha=m.lora_alpha,
        lora_dropout=m.lora_dropout,
        target_modules=targets[0] if targets == ["all-linear"] else targets,
        task_type="CAUSAL_LM",
    )
    try:
        with warnings.catch_warnings():
            # all-linear on an MoE: peft's conversion doubles gate_up_proj's rank by a pattern its own experts
            # wrapper is not named by, and warns on every load (the experts get rank r, as every other target)
            warnings.filterwarnings("ignore", r"The following (rank|alpha)_pattern keys did not match", RuntimeWarning)
            return get_peft_model(model, lora)
    except ValueError:  # peft's NoMatchingPeftModuleError: a name the model does not have
        linear = sorted({n.rpartition(".")[2] for n, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)})
        raise UserError(
            f"matches no module of the model; allowed: all-linear, or its linear layers {', '.join(linear)}",
            key="model.lora_target_modules",
            value=targets,
        ) from None


def load_policy(cfg: Config, path: str, plan):
    """The trainable policy: a peft LoRA model (lora_rank > 0) or the full model; FP8 GEMMs where
    the PrecisionPlan quantises the trainer."""
    m = cfg.model
    full_ft = m.lora_rank == 0
    store = getattr(torch, plan.weights)  # a full fine-tune's fp32 masters, else model.dtype (the plan says which)
    # 4-bit: not peft's prepare_model_for_kbit_training, whose fp32 upcast of the embeddings, norms and
    # lm_head would spend 4 B where the 16-bit LoRA path (and the planner) keep model.dtype, and compute them
    # differently from the 16-bit run; the freezing is get_peft_model's, gradient checkpointing is
    # model.gradient_checkpointing's, below.
    model = load_base(path, store, quantization(m, store))
    if m.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if not full_ft:
        model = add_lora(model, m)
        if m.gradient_checkpointing:
            model.enable_input_require_grads()
    if plan.train_fp8:
        from ..precision.fp8 import apply_fp8

        apply_fp8(model)
    return model


def autocast(plan):
    """Full fine-tune in bf16/fp16 runs the forward under autocast over fp32 master weights (plan.autocast)."""
    if plan.autocast:
        return torch.autocast("cuda" if torch.cuda.is_available() else "cpu", dtype=getattr(torch, plan.autocast))
    return contextlib.nullcontext()


def offload_activations(cfg: Config):
    """model.offload_checkpoints on CUDA: tensors saved for backward live in pinned host RAM."""
    if cfg.model.offload_checkpoints and torch.cuda.is_available():
        return torch.autograd.graph.save_on_cpu(pin_memory=True)
    return contextlib.nullcontext()


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
