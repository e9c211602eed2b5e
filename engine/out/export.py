"""Export a run's checkpoint: a merged safetensors folder, a GGUF file, or a push to the Hugging Face Hub.

Every kind starts from the same merged model: the checkpoint's LoRA adapters merged into the base by
peft (`merge_and_unload`), in the dtype the trainer held the base in (model.dtype; fp8 runs: their bf16
master weights), or a full fine-tune's weights cast to it. peft adds the fp32 delta (α/r)·B·A to the base in
place, which rounds once to the base's dtype: the weights the trainer's sampler receives (engine/model/weights.py).

GGUF goes through the `gguf` package (llama.cpp's gguf-py): its GGUFWriter, its TensorNameMap (llama.cpp's
own HF-name → GGUF-name table), its quantizers and its vocab readers. What llama.cpp's convert_hf_to_gguf.py
does per architecture beyond that is small for the Qwen2/Qwen3 family this writes (no Q/K permutation, tied
embeddings share token_embd), and the rest of that script refuses the bundled model's tokenizer; docs/export.md.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from ...contract import config, precision_plan
from ...contract.errors import UserError, describe
from ...contract.rundir import CHECKPOINTS, CONFIG
from . import checkpoint

KIND = "export"
# The GGUF file types llama.cpp's convert_hf_to_gguf.py writes itself (its --outtype, less the ternary ones);
# smaller ones are llama.cpp's llama-quantize's job, from an f16 file.
QUANTS = ("f32", "f16", "bf16", "q8_0")
# HF architectures whose GGUF layout is the plain TensorNameMap one: llama.cpp reads their q/k weights as HF
# writes them (NEOX RoPE; convert_hf_to_gguf's Qwen2Model and Qwen3Model change no tensor).
GGUF_ARCHS = {"Qwen2ForCausalLM": "QWEN2", "Qwen3ForCausalLM": "QWEN3"}


# ---- which checkpoint -------------------------------------------------------------------------


def find_checkpoint(run: Path, step: int | None) -> Path:
    """checkpoints/step-N of `run` (the newest complete one when `step` is None); every miss one line."""
    if not (run / CONFIG).is_file():
        why = "no such folder" if not run.exists() else f"not a run directory (no {CONFIG})"
        raise UserError(why, kind=KIND, key="RUN", value=str(run))
    complete = [path for step, path in checkpoint.folders(run) if _complete(path, step)]  # oldest first
    if not complete:
        raise UserError(
            f"no complete checkpoint under {CHECKPOINTS}/ (a run writes one at its end and every "
            f"train.save_every steps)",
            kind=KIND,
            key="RUN",
            value=str(run),
        )
    if step is None:
        return complete[-1]
    found = next((path for path in complete if path.name == f"step-{step}"), None)
    if found is None:
        raise UserError(
            f"no complete checkpoint at that step in {run}",
            kind=KIND,
            key="--step",
            value=step,
            allowed=[path.name.removeprefix("step-") for path in complete],
            near="",
        )
    return found


def _complete(path: Path, step: int) -> bool:
    """Its manifest (written last) is there and every file it lists has the listed size (the sha256 check
    is the load's)."""
    try:
        checkpoint.check(path, step, digests=False)
        return True
    except checkpoint.BadCheckpoint:
        return False


# ---- the merged model -------------------------------------------------------------------------


def merged_model(run: Path, ckpt: Path):
    """(model, base folder, note): the checkpoint merged into its base, in the base's training dtype."""
    from ..model import policy_loader

    cfg = config.load(str(run / CONFIG))
    base_path = policy_loader.resolve_model_path(cfg.model.name)
    dtype = getattr(torch, precision_plan.resolve(cfg).base)
    policy_loader.quiet_transformers()
    # A 4-bit (QLoRA) run trained its adapters on NF4 codes; merged, they go onto the 16-bit base (Unsloth's
    # merged_16bit does the same), so its outputs differ slightly from the trainer's.
    note = " (4-bit run: adapters merged into the 16-bit base)" if cfg.model.load_in_4bit else ""
    if (ckpt / "adapter_config.json").is_file():
        from peft import PeftModel

        base = policy_loader.load_base(base_path, dtype)
        return PeftModel.from_pretrained(base, ckpt).merge_and_unload(), base_path, note
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype), base_path, note


def _fresh(dest: Path, key: str) -> None:
    """`dest` may be written: it does not exist, or is an empty folder."""
    if dest.is_dir() and not any(dest.iterdir()) or not dest.exists():
        return
    raise UserError("exists and is not empty; choose a new path or empty it", kind=KIND, key=key, value=str(dest))


def _write_folder(model, base_path: str, dest: Path) -> None:
    """safetensors + config + generation config + tokenizer into `dest`, renamed into place whole."""
    from transformers import AutoTokenizer

    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    AutoTokenizer.from_pretrained(base_path).save_pretrained(tmp)
    if dest.is_dir():
        dest.rmdir()  # empty (checked): rename onto it
    os.replace(tmp, dest)


def export_merged(run: Path, step: int | None, dest: Path) -> str:
    _fresh(dest, "--merged")
    ckpt = find_checkpoint(run, step)
    model, base_path, note = merged_model(run, ckpt)
    dest.parent.mkdir(parents=True, exist_ok=True)
    _write_folder(model, base_path, dest)
    return f"exported {run.name}/{ckpt.name} merged ({_dtype_name(model)}) to {dest}{note}"


def _dtype_name(model) -> str:
    return str(next(model.parameters()).dtype).removeprefix("torch.")


# ---- GGUF -------------------------------------------------------------------------------------


def export_gguf(run: Path, step: int | None, dest: Path, quant: str) -> str:
    if quant not in QUANTS:
        raise UserError("not a GGUF type this converter writes", kind=KIND, key="--quant", value=quant, allowed=QUANTS)
    if dest.exists():
        raise UserError("exists; choose a new file name", kind=KIND, key="--gguf", value=str(dest))
    ckpt = find_checkpoint(run, step)
    model, base_path, note = merged_model(run, ckpt)
    hf_arch = (model.config.architectures or ["?"])[0]
    if hf_arch not in GGUF_ARCHS:
        raise UserError(
            f"GGUF export writes {', '.join(GGUF_ARCHS)} models, not {hf_arch}; export --merged "
            f"and convert it with llama.cpp's convert_hf_to_gguf.py",
            kind=KIND,
            key="--gguf",
            value=str(dest),
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    try:
        write_gguf(model, Path(base_path), tmp, quant, f"{run.name}-{ckpt.name}")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, dest)
    return f"exported {run.name}/{ckpt.name} as GGUF {quant} to {dest}{note}"


def write_gguf(model, tokenizer_dir: Path, path: Path, quant: str, name: str) -> None:
    import gguf

    cfg = model.config
    arch = getattr(gguf.MODEL_ARCH, GGUF_ARCHS[cfg.architectures[0]])
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    _write_hparams(writer, cfg, quant, name)
    _write_vocab(writer, tokenizer_dir, cfg.vocab_size)
    names = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # llama.cpp reads a tied output matrix from token_embd (convert_hf_to_gguf skips it too)
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise UserError(
                f"llama.cpp's tensor map has no name for {hf_name}", kind=KIND, key="--gguf", value=str(path)
            )
        data, qtype = _quantize(gguf_name, tensor.float().numpy(), quant)
        writer.add_tensor(gguf_name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _quantize(gguf_name: str, data, quant: str):
    """convert_hf_to_gguf's rule: 1-D tensors and norms stay f32; the rest in `quant`, f16 where q8_0's
    32-wide blocks do not divide a row."""
    import gguf

    qtype = gguf.GGMLQuantizationType[quant.upper()]
    if data.ndim <= 1 or gguf_name.endswith("_norm.weight"):
        qtype = gguf.GGMLQuantizationType.F32
    try:
        return gguf.quants.quantize(data, qtype), qtype
    except gguf.QuantError:
        return gguf.quants.quantize(data, gguf.GGMLQuantizationType.F16), gguf.GGMLQuantizationType.F16


def _write_hparams(writer, cfg, quant: str, name: str) -> None:
    """The hyperparameters convert_hf_to_gguf's TextModel.set_gguf_parameters writes for these models."""
    import gguf

    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    rope = getattr(cfg, "rope_parameters", None) or {"rope_theta": getattr(cfg, "rope_theta", 10000.0)}
    if rope.get("rope_type", "default") != "default":
        raise UserError(
            f"RoPE scaling {rope['rope_type']!r} is not written by this converter; export --merged "
            f"and use llama.cpp's convert_hf_to_gguf.py",
            kind=KIND,
            key="--gguf",
            value=name,
        )
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_file_type(
        {
            "f32": gguf.LlamaFileType.ALL_F32,
            "f16": gguf.LlamaFileType.MOSTLY_F16,
            "bf16": gguf.LlamaFileType.MOSTLY_BF16,
            "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
        }[quant]
    )
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _write_vocab(writer, folder: Path, n_vocab: int) -> None:
    """The tokenizer as llama.cpp reads it. A byte-level BPE tokenizer (Qwen's) goes through gguf's BpeVocab
    ("gpt2", with its merges); a character-level WordLevel one (the bundled model's) is llama.cpp's "llama"
    (SentencePiece) type, whose text splitting gives the same tokens: every token is one character, and SPM
    spells the space as ▁ (U+2581)."""
    import gguf

    spec = json.loads((folder / "tokenizer.json").read_text())
    kind = spec["model"]["type"]
    if kind == "BPE":
        vocab = gguf.BpeVocab(folder)
        tokens, types = [], []
        for text, _score, toktype in vocab.all_tokens():
            tokens.append(text)
            types.append(toktype)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("qwen2")  # the pre-tokenizer convert_hf_to_gguf identifies for Qwen's tokenizer
        scores = None
    elif kind == "WordLevel" and (spec.get("pre_tokenizer") or {}).get("pattern") == {"Regex": ""}:
        added = {t["content"]: t["special"] for t in spec["added_tokens"]}
        by_id = [t for t, _ in sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])]
        tokens = [("\u2581" if t == " " else t).encode() for t in by_id]
        # added tokens match whole (control ones only as special text); other multi-character tokens cannot
        # come out of a character split, so llama.cpp never produces them either
        types = [
            (gguf.TokenType.CONTROL if added[t] else gguf.TokenType.USER_DEFINED)
            if t in added
            else gguf.TokenType.NORMAL
            if len(t) == 1
            else gguf.TokenType.UNUSED
            for t in by_id
        ]
        scores = [0.0] * len(tokens)
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_add_space_prefix(False)
    else:
        raise UserError(
            f"its {kind} tokenizer has no llama.cpp tokenizer type here; export --merged instead",
            kind=KIND,
            key="--gguf",
            value=str(folder),
        )
    for i in range(len(tokens), n_vocab):  # rows of the embedding no token uses (convert_hf_to_gguf's [PAD{i}])
        tokens.append(f"[PAD{i}]".encode())
        types.append(gguf.TokenType.UNUSED)
        if scores is not None:
            scores.append(0.0)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if scores is not None:
        writer.add_token_scores(scores)
    special = gguf.SpecialVocab(folder, load_merges=kind == "BPE", n_vocab=n_vocab)
    special.add_to_gguf(writer)
    if "bos" not in special.add_special_token:  # a tokenizer that does not say so adds no BOS in transformers
        writer.add_add_bos_token(False)


# ---- the Hub ----------------------------------------------------------------------------------


def push(run: Path, step: int | None, repo: str) -> str:
    """The merged folder uploaded to the Hub model repo `repo` (created private if it does not exist)."""
    from huggingface_hub import HfApi, is_offline_mode

    if is_offline_mode():
        raise UserError(
            "cannot push: the Hugging Face Hub is offline here (HF_HUB_OFFLINE=1)", kind=KIND, key="--push", value=repo
        )
    ckpt = find_checkpoint(run, step)
    model, base_path, note = merged_model(run, ckpt)
    api = HfApi()
    with tempfile.TemporaryDirectory(prefix="grpo-studio-push-") as tmp:
        folder = Path(tmp) / "merged"
        _write_folder(model, base_path, folder)
        try:
            api.create_repo(repo, private=True, exist_ok=True)
            commit = api.upload_folder(
                repo_id=repo, folder_path=folder, commit_message=f"grpo-studio export of {run.name}/{ckpt.name}"
            )
        except Exception as err:  # no network, no token, no right to the repo: all one line naming it
            raise UserError(
                f"cannot push to the Hugging Face Hub ({describe(err)})", kind=KIND, key="--push", value=repo
            ) from None
    return f"pushed {run.name}/{ckpt.name} merged to {commit.repo_url}{note}"
