"""Weight sync into a live vLLM engine, and the simulated FP8 rollout on platforms without FP8.

vLLM fuses some HF linears into one kernel tensor (q/k/v → qkv_proj, gate/up → gate_up_proj),
and on CPU (bf16) it repacks every linear weight into an oneDNN / SGL kernel layout and drops
the plain `weight`. So tensors cannot simply be copied in. The supported path is the worker's
`reload_weights(weights_iterator=..., is_checkpoint_format=True)` (vLLM ≥ 0.11's layerwise
reload): each fused layer is rebuilt once all of its checkpoint tensors arrived, then re-packed
(and, with quantization="fp8", re-quantised). A layer that receives only *some* of its parts
(LoRA on q_proj alone) would be rebuilt with garbage in the rest, so `complete_groups` adds the
missing siblings: the last value we sent, or the checkpoint's (unchanged) value from disk.

Names are the checkpoint's, as the reload is told (is_checkpoint_format) and as the sibling completion reads
from disk. transformers 5 loads some families with tensors fused across modules (an MoE's experts:
`mlp.experts.gate_up_proj` [E, 2I, H] from the checkpoint's `mlp.experts.{e}.gate_proj.weight`, ...), so
the trainer's stream is turned back into the checkpoint's names first, by transformers' own reverse
conversion (what save_pretrained writes; vLLM 0.32 would also take the fused names, older loaders need
not). The trainer adapts an MoE's experts whole (all-linear), so no group of experts needs completing.
vLLM on CPU has to pack reloaded experts again (repack_cpu_experts).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

import torch

# HF names fused by vLLM's Llama/Qwen/Mistral/Gemma models (their `packed_modules_mapping`).
DEFAULT_PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


class Checkpoint:
    """Lazy reader of an HF safetensors checkpoint (one file or an index of shards)."""

    def __init__(self, path: str):
        self.path = Path(path)
        self._where: dict[str, Path] = {}
        index = self.path / "model.safetensors.index.json"
        if index.is_file():
            for name, shard in json.loads(index.read_text())["weight_map"].items():
                self._where[name] = self.path / shard
        else:
            from safetensors import safe_open

            for file in sorted(self.path.glob("*.safetensors")):
                with safe_open(str(file), framework="pt") as f:
                    self._where.update({name: file for name in f.keys()})

    def names(self) -> set[str]:
        return set(self._where)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor's shape, from the files' headers (nothing is loaded)."""
        from safetensors import safe_open

        out = {}
        for file in set(self._where.values()):
            with safe_open(str(file), framework="pt") as f:
                out.update({name: tuple(f.get_slice(name).get_shape()) for name in f.keys()})
        return out

    def get(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(str(self._where[name]), framework="pt") as f:
            return f.get_tensor(name)


def split_name(name: str, packed: dict[str, list[str]]) -> tuple[str, str, str] | None:
    """'model.layers.0.self_attn.k_proj.weight' → ('model.layers.0.self_attn', 'qkv_proj', 'weight')."""
    parts = name.split(".")
    if len(parts) < 2:
        return None
    for fused, members in packed.items():
        if parts[-2] in members:
            return ".".join(parts[:-2]), fused, parts[-1]
    return None


def group_names(prefix: str, fused: str, param: str, packed: dict[str, list[str]]) -> list[str]:
    return [f"{prefix}.{m}.{param}" if prefix else f"{m}.{param}" for m in packed[fused]]


class CheckpointNames:
    """The trainer's tensors under the checkpoint's names: transformers' reverse weight conversion on a
    meta-device copy of the architecture (nothing allocated); names already the checkpoint's pass through."""

    def __init__(self, model_path: str, on_disk: set[str]):
        self.path, self.on_disk, self._meta = model_path, on_disk, None

    def __call__(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if tensors.keys() <= self.on_disk:
            return tensors
        from transformers.core_model_loading import revert_weight_conversion

        return revert_weight_conversion(self._model(), tensors)

    def _model(self):
        if self._meta is None:
            from transformers import AutoConfig, AutoModelForCausalLM

            with torch.device("meta"):
                self._meta = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(self.path))
        return self._meta


class WeightSync:
    """Turns the trainer's (hf_name, tensor) stream into a complete, engine-dtype batch for vLLM."""

    def __init__(self, model_path: str, dtype: torch.dtype, packed: dict[str, list[str]] | None = None):
        self.checkpoint = Checkpoint(model_path)
        self.dtype = dtype
        self.packed = packed or DEFAULT_PACKED
        self.names = CheckpointNames(model_path, self.checkpoint.names())
        self._last: dict[str, torch.Tensor] = {}  # last value sent for names in partly-sent groups

    def current(self, name: str) -> torch.Tensor:
        """The engine's current value of an HF tensor: last sent, else the checkpoint's."""
        if name in self._last:
            return self._last[name]
        return self.checkpoint.get(name).to(self.dtype)

    def prepare(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        sent = self.names({name: t.detach().to("cpu", self.dtype) for name, t in named_tensors})
        sent = {name: t.contiguous() for name, t in sent.items()}
        out = dict(sent)
        on_disk = self.checkpoint.names()
        for name in sent:
            where = split_name(name, self.packed)
            if where is None:
                continue
            for sibling in group_names(*where, self.packed):
                if sibling not in out and sibling in on_disk | set(self._last):
                    out[sibling] = self.current(sibling)
            # remember partly-sent groups so their siblings stay in step next time
            self._last.update({n: out[n] for n in group_names(*where, self.packed) if n in out})
        # order by parent layer, so vLLM rebuilds one layer at a time (no extra buffers)
        return sorted(out.items(), key=lambda kv: _layer_key(kv[0]))


def _layer_key(name: str):
    parts = name.split(".")
    return [int(p) if p.isdigit() else p for p in parts[:-2]], parts[-2:]


def quiet_reload_logs() -> None:
    # layerwise reload warns about every layer it did not receive (by design with LoRA); those
    # lines would flood stdout.log after every optimizer step.
    for name in (
        "vllm.model_executor.model_loader.reload.layerwise",
        "vllm.model_executor.model_loader.reload.inplace",
        "vllm.model_executor.model_loader.weight_utils",
        "vllm.model_executor.model_loader.utils",
    ):
        logging.getLogger(name).setLevel(logging.ERROR)


def refresh_tied_head(model) -> bool:
    """A tied lm_head shares the embedding's weight, but the reload only rebuilds embed_tokens; on
    CPU the head keeps its own packed GEMM copy, so re-run its post-load processing."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None or getattr(head, "weight", None) is None:
        return False
    if head.weight.data_ptr() != embed.weight.data_ptr():
        return False
    head.quant_method.process_weights_after_loading(head)
    return True


def repack_cpu_experts(model, names: Iterable[str]) -> int:
    """Pack the reloaded MoE experts of `names` again for vLLM's CPU kernel; the layers packed.

    vLLM on CPU packs a fused-MoE layer's expert weights into its grouped-GEMM layout once, at load. A reload
    copies the new weights in but skips that packing (vLLM 0.32: UnquantizedFusedMoEMethod._setup_kernel
    runs the experts' process_weights_after_loading on the first load only), so the kernel read plain new
    weights as packed ones: measured on the tiny MoE, max |Δ log p| 0.30 against the trainer after a sync
    that moved the experts, 5e-7 once packed again. Only layers that received weights are packed: a layer
    the reload did not touch keeps its packed tensors, which packing twice would scramble."""
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    reloaded = {name.partition(".experts.")[0] + ".experts" for name in names if ".experts." in name}
    n = 0
    for module_name, module in model.named_modules():
        experts = getattr(getattr(getattr(module, "quant_method", None), "moe_kernel", None), "fused_experts", None)
        if isinstance(experts, CPUUnquantizedExperts) and module_name.startswith(tuple(reloaded)):
            experts.process_weights_after_loading(module)
            n += 1
    return n


# --------------------------------------------------------------------------------------------
# Simulated FP8 rollout inside vLLM (platforms where vLLM has no FP8 kernels, e.g. CPU)


class Fp8Sim:
    """Routes every vLLM linear (not the embedding / lm_head) through grpo_studio.engine.precision.fp8.fp8_linear_forward.

    That is the same quantise → dequantise → fp32 GEMM the trainer runs in the unified FP8 flow
    (1×128 activation groups, 128×128 weight blocks), applied per HF part of a fused layer, so a
    fused qkv_proj quantises q, k and v exactly as three separate nn.Linear would. vLLM on CPU
    keeps only a packed kernel weight, so the BF16 weights are kept here (one extra copy of the
    linear weights) and re-installed after every reload (the reload re-runs vLLM's kernel
    dispatch, which would otherwise put the plain BF16 GEMM back).
    """

    def __init__(self, sync: WeightSync):
        self.sync = sync
        self.weights: dict[str, torch.Tensor] = {}

    def update(self, batch: list[tuple[str, torch.Tensor]]) -> None:
        self.weights.update(batch)

    def install(self, model: torch.nn.Module) -> int:
        from ..precision.fp8 import fp8_linear_forward

        packed = getattr(model, "packed_modules_mapping", None) or self.sync.packed
        on_disk = self.sync.checkpoint.names()
        n = 0
        for module_name, module in model.named_modules():
            if not hasattr(module, "cpu_linear") or not hasattr(module, "quant_method"):
                continue
            prefix, _, last = module_name.rpartition(".")
            members = packed.get(last, [last])
            parts = [f"{prefix}.{m}" if prefix else m for m in members]
            if not all(f"{p}.weight" in on_disk or f"{p}.weight" in self.weights for p in parts):
                continue  # not a checkpoint linear we can mirror
            ws = [self._get(f"{p}.weight") for p in parts]
            bs = [
                self._get(f"{p}.bias") if f"{p}.bias" in on_disk or f"{p}.bias" in self.weights else None for p in parts
            ]

            def linear(x, weight, bias, _ws=ws, _bs=bs):
                # vLLM passes bias=None when the caller adds it (skip_bias_add): do not add it twice
                ys = [
                    fp8_linear_forward(x, w, b if bias is not None else None, backend="sim") for w, b in zip(_ws, _bs)
                ]
                return ys[0] if len(ys) == 1 else torch.cat(ys, dim=-1)

            module.cpu_linear = linear
            n += 1
        return n

    def _get(self, name: str) -> torch.Tensor:
        if name not in self.weights:
            self.weights[name] = self.sync.current(name)
        return self.weights[name]
