"""Model cards: the architecture numbers the VRAM planner needs. Pure python (no torch).

A card comes from presets/cards/<name>.json (numbers copied from each model's public
config.json), from a local folder's config.json, or from a config.json already in the local
Hugging Face cache. Parameter counts are computed from the architecture; the card's published
`params` is kept to check the computation (tests/test_vram.py).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from . import bundled
from .errors import UserError, close_matches, describe

FAMILIES = ("llama", "qwen2", "qwen3", "gemma3", "phi3", "gpt_oss", "qwen3_moe", "olmoe")
# MoE families whose experts and router carry no biases; peft's all-linear adapts them too (target_parameters)
ROUTED = ("qwen3_moe", "olmoe")
# config.json model_type -> family (Mistral's dense blocks are Llama blocks)
MODEL_TYPES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
    "phi3": "phi3",
    "gpt_oss": "gpt_oss",
    "qwen3_moe": "qwen3_moe",
    "olmoe": "olmoe",
}


@dataclass
class Card:
    name: str
    family: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    params: int = 0  # published total (0 = unknown); computed value is total_params()
    nominal_b: float = 0.0  # the size in the model's name, in billions (Unsloth's rule of thumb)
    hf_id: str = ""
    num_experts: int = 0  # MoE: experts per layer, and how many are active per token (intermediate: one expert's)
    experts_per_token: int = 0
    extra_params: int = 0  # weights outside the text stack (e.g. Gemma-3-4B's vision tower)
    sliding_window: int = 0
    sliding_pattern: int = 0  # every Nth layer is global (full attention); 0 = all global
    active_params: int = 0
    source: str = ""
    extra_params_note: str = ""
    extras: dict = field(default_factory=dict)

    # ---- architecture-derived sizes -------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def qkv_bias(self) -> bool:
        return self.family in ("qwen2", "gpt_oss")

    @property
    def qk_norm(self) -> bool:
        return self.family in ("qwen3", "gemma3", "qwen3_moe", "olmoe")

    @property
    def norms_per_layer(self) -> int:
        return 4 if self.family == "gemma3" else 2

    def linears(self) -> list[tuple[str, int, int, int]]:
        """(peft module name, d_in, d_out, copies per layer) of the per-layer linear layers.

        Phi-3/Phi-4 fuse qkv and gate/up, so LoRA sees one wide module there. gpt-oss experts are
        3-D parameters, not nn.Linear: peft's all-linear reaches only the attention projections.
        """
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        attn = [("q_proj", h, q, 1), ("k_proj", h, kv, 1), ("v_proj", h, kv, 1), ("o_proj", q, h, 1)]
        if self.family == "phi3":
            return [
                ("qkv_proj", h, q + 2 * kv, 1),
                ("o_proj", q, h, 1),
                ("gate_up_proj", h, 2 * i, 1),
                ("down_proj", i, h, 1),
            ]
        if self.family == "gpt_oss" or self.family in ROUTED:
            return attn
        return attn + [("gate_proj", h, i, 1), ("up_proj", h, i, 1), ("down_proj", i, h, 1)]

    def layer_linear_params(self) -> int:
        return sum(din * dout * n for _, din, dout, n in self.linears())

    def expert_params(self) -> int:
        """Per layer: router + experts (gate_up fused 2i, down); gpt-oss's with biases, ROUTED's without."""
        if not self.num_experts:
            return 0
        h, i, e = self.hidden, self.intermediate, self.num_experts
        if self.family in ROUTED:
            return h * e + e * (h * 2 * i + i * h)
        return (h * e + e) + e * (h * 2 * i + 2 * i) + e * (i * h + h)

    def layer_small_params(self) -> int:
        """Norms, qk-norms, biases, attention sinks: tiny, counted for the total."""
        n = self.norms_per_layer * self.hidden
        if self.family == "olmoe":  # q_norm and k_norm over the whole projections
            n += self.q_dim + self.kv_dim
        elif self.qk_norm:
            n += 2 * self.head_dim
        if self.qkv_bias:
            n += self.q_dim + 2 * self.kv_dim
        if self.family == "gpt_oss":
            n += self.hidden + self.heads  # o_proj bias, sinks
        return n

    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def total_params(self) -> int:
        per_layer = self.layer_linear_params() + self.expert_params() + self.layer_small_params()
        return self.layers * per_layer + self.embedding_params() + self.hidden + self.extra_params

    def active_params_per_token(self) -> int:
        """MoE: params a token multiplies by (experts_per_token of num_experts, no input embedding
        table: OpenAI's 3.6B "active" for gpt-oss-20b counts it this way); dense: all."""
        if not self.num_experts:
            return self.total_params()
        inactive = self.expert_params() * (1 - self.experts_per_token / self.num_experts)
        lookup = 0 if self.tied_embeddings else self.vocab * self.hidden
        return int(self.total_params() - self.layers * inactive - lookup)

    def params_line(self) -> str:
        """The weights in words: total, and for an MoE what one token multiplies by."""
        total = f"{self.total_params() / 1e9:.3g}B params"
        if not self.num_experts:
            return total
        active = self.active_params_per_token() / 1e9
        return f"{total}, {active:.3g}B active per token ({self.experts_per_token} of {self.num_experts} experts)"

    def lora_params(self, rank: int, targets: list[str]) -> int:
        """Σ r·(d_in + d_out) over the targeted per-layer linears (peft LoRA A: r×d_in, B: d_out×r)."""
        wanted = None if targets in ([], ["all-linear"], "all-linear") else set(targets)
        per_layer = sum(
            rank * (din + dout) * n for name, din, dout, n in self.linears() if wanted is None or name in wanted
        )
        if wanted is None and self.family in ROUTED:
            # peft's all-linear on an MoE: the fused experts as 3-D parameters (r·E rows; gate_up at rank 2r)
            # and the router (transformers_weight_conversion; measured on the tiny MoE)
            h, i, e = self.hidden, self.intermediate, self.num_experts
            per_layer += 2 * rank * e * (h + 2 * i) + rank * e * (i + h) + rank * (h + e)
        return self.layers * per_layer


# ---- loading -----------------------------------------------------------------------------


def card_names() -> list[str]:
    return sorted(p.stem for p in bundled.CARDS.glob("*.json"))


def _normalise(name: str) -> str:
    base = name.strip().rstrip("/").split("/")[-1].lower()
    for suffix in ("-unsloth-bnb-4bit", "-bnb-4bit", "-instruct", "-it", "-base", "-chat", "-pt"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return base.replace("meta-llama-", "llama-")


def _from_card_file(path: Path) -> Card:
    data = json.loads(path.read_text())
    known = set(Card.__dataclass_fields__)
    return Card(**{k: v for k, v in data.items() if k in known})


def _read_config_json(path: Path, name: str) -> dict:
    """A model's config.json as a dict; unreadable, not UTF-8, not JSON, not a JSON object or holding a number
    that is not finite or a field outside its domain: one line."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UserError(f"cannot read {path}: {describe(err)}", kind="vram", key="model.name", value=name) from None
    if not isinstance(data, dict):
        raise UserError(f"{path} is not a JSON object of model settings", kind="vram", key="model.name", value=name)
    refuse_bad_numbers(data, path, name, "vram")
    return data


FLOAT_TAGS = ("NaN", "Infinity", "-Infinity")


def non_finite(data) -> tuple[str, float] | None:
    """The first number of a JSON value (in document order, at any depth) that is NaN or infinite, as (its
    dotted path, the number); None when every number is finite. Python's json reads NaN, Infinity, -Infinity
    and 1e999 (inf) without complaint, transformers 5 writes them as {"__float__": "NaN"} (FLOAT_TAGS) and reads
    that back as the float, and it trains on them."""
    stack: list[tuple[str, object]] = [("", data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict) and list(value) == ["__float__"] and value["__float__"] in FLOAT_TAGS:
            value = float(value["__float__"])
        if isinstance(value, float) and not math.isfinite(value):
            return where, value
        if isinstance(value, dict):
            stack += reversed([(f"{where}.{k}" if where else str(k), v) for k, v in value.items()])
        elif isinstance(value, list):
            stack += reversed([(f"{where}[{i}]", v) for i, v in enumerate(value)])
    return None


MAX_COUNT = 2**31 - 1  # a size or count past this is no model's (and past 2**63 torch cannot hold it)


def _positive(v) -> bool:
    return math.isfinite(float(v)) and v > 0  # float() overflows for an integer past a float's range


def _count(v) -> bool:
    return isinstance(v, int) and 1 <= v <= MAX_COUNT


# Fields whose domain is known, by name at any depth (text_config.hidden_size, rope_parameters.rope_theta):
# (whether a number is in it, whether null is allowed (transformers derives the value), the domain in words).
# A value outside it trains to NaN (rms_norm_eps = -1), or fails inside torch naming no field.
POSITIVE = (_positive, False, "a number > 0")
COUNT = (_count, False, f"an integer from 1 to {MAX_COUNT}")
DOMAINS = {
    **dict.fromkeys(("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps", "rope_theta"), POSITIVE),
    **dict.fromkeys(
        (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
        ),
        COUNT,
    ),
    **dict.fromkeys(("num_key_value_heads", "head_dim"), (_count, True, f"{COUNT[2]}, or null")),
    **dict.fromkeys(
        ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"),
        (lambda v: 0 <= v <= 1, False, "a number from 0 to 1"),
    ),
    "initializer_range": (lambda v: math.isfinite(float(v)) and v >= 0, False, "a number >= 0"),
}


def _shown(value) -> str:
    """A config value as a message shows it: JSON's spelling, an integer too long to read by its length."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**20:
        return f"an integer of {len(str(abs(value)))} digits"
    return json.dumps(value, ensure_ascii=False)[:80] if not isinstance(value, float) else repr(value)


def out_of_domain(data) -> tuple[str, object, str] | None:
    """The first field of DOMAINS (in document order, at any depth) whose value is outside its domain, as (its
    dotted path, the value, the domain in words); None when every one is in."""
    stack: list[tuple[str, object]] = [("", data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            stack += reversed([(f"{where}.{k}" if where else str(k), v) for k, v in value.items()])
        elif isinstance(value, list):
            stack += reversed([(f"{where}[{i}]", v) for i, v in enumerate(value)])
        domain = DOMAINS.get(where.rsplit(".", 1)[-1])
        if domain is None or value is None and domain[1]:
            continue
        inside, _, allowed = domain
        try:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and inside(value)
        except OverflowError:  # an integer too large for a float
            ok = False
        if not ok:
            return where, value, allowed
    return None


def refuse_bad_numbers(data, path: Path, name: str, kind: str = "config") -> None:
    """A model config holding a number that is not finite, or a known field outside its domain
    (rms_norm_eps = NaN or -1 trains to NaN every step), refused in one line naming the file, the field, the
    value and what is allowed."""
    found = non_finite(data)
    if found:
        field, value = found
        raise UserError(
            f"{path} sets {field} = {value}; allowed: finite numbers", kind=kind, key="model.name", value=name
        )
    found = out_of_domain(data)
    if found:
        field, value, allowed = found
        raise UserError(
            f"{path} sets {field} = {_shown(value)}; allowed: {allowed}", kind=kind, key="model.name", value=name
        )


def check_model_folder(folder: Path, name: str) -> None:
    """Before a model folder's weights load: its config.json's numbers are finite and its known fields in their
    domains. A config.json that cannot be read or parsed is left to the loader, which names the reason."""
    path = folder / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return
    refuse_bad_numbers(data, path, name)


def from_config_json(data: dict, name: str) -> Card:
    """A card from a Hugging Face config.json (text_config for multimodal models)."""
    if "text_config" in data and "num_hidden_layers" not in data:
        data = {**data["text_config"], "tie_word_embeddings": data.get("tie_word_embeddings", True)}
    model_type = data.get("model_type", "")
    family = MODEL_TYPES.get(model_type)
    if family is None:
        raise UserError(
            f"model_type {model_type!r} has no VRAM formulas (supported: {', '.join(sorted(MODEL_TYPES))})",
            kind="vram",
            key="model.name",
            value=name,
        )
    try:
        heads = data["num_attention_heads"]
        hidden = data["hidden_size"]
        sliding = data.get("sliding_window") or 0
        return Card(
            name=name,
            family=family,
            layers=data["num_hidden_layers"],
            hidden=hidden,
            intermediate=data["moe_intermediate_size"] if family == "qwen3_moe" else data["intermediate_size"],
            heads=heads,
            kv_heads=data.get("num_key_value_heads") or heads,
            head_dim=data.get("head_dim") or hidden // heads,
            vocab=data["vocab_size"],
            tied_embeddings=bool(data.get("tie_word_embeddings", family == "gemma3")),
            num_experts=data.get("num_local_experts") or data.get("num_experts") or 0,
            experts_per_token=data.get("num_experts_per_tok", data.get("experts_per_token", 0)) or 0,
            sliding_window=sliding if data.get("use_sliding_window", True) else 0,
        )
    except KeyError as err:
        raise UserError(f"config.json lacks {err.args[0]!r}", kind="vram", key="model.name", value=name) from None


def _hf_cache_config(hub_id: str) -> Path | None:
    home = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
    snaps = home.expanduser() / f"models--{hub_id.replace('/', '--')}" / "snapshots"
    found = sorted(snaps.glob("*/config.json")) if snaps.is_dir() else []
    return found[-1] if found else None


def load(name: str) -> Card:
    """A card by card name, hub id of a carded model, bundled model, local folder or cached hub id; a name
    the file system refuses (too long, a NUL byte) or cannot read is one line."""
    try:
        return _load(name)
    except OSError as err:
        why = err.strerror.lower() if err.strerror else describe(err)
        raise UserError(f"cannot look it up: {why}", kind="vram", key="model.name", value=name) from None


def _load(name: str) -> Card:
    if not name or not name.strip():
        raise UserError(
            "give a card name, a local folder or a hub id", kind="vram", key="model.name", value=(name or "").strip()
        )
    card_file = bundled.CARDS / f"{name}.json"
    if card_file.is_file():
        return _from_card_file(card_file)
    folder = bundled.bundled_model(name) or Path(name).expanduser()
    if folder.is_dir():
        cfg = folder / "config.json"
        if not cfg.is_file():
            raise UserError("folder has no config.json", kind="vram", key="model.name", value=name)
        return from_config_json(_read_config_json(cfg, name), name)
    wanted = _normalise(name)
    for card in card_names():
        if card == wanted or _normalise(_from_card_file(bundled.CARDS / f"{card}.json").hf_id) == wanted:
            return _from_card_file(bundled.CARDS / f"{card}.json")
    cached = _hf_cache_config(name) if "/" in name else None
    if cached is not None:
        return from_config_json(_read_config_json(cached, name), name)
    close = close_matches(wanted, card_names(), n=3, cutoff=0.4)
    hint = f"closest cards: {', '.join(close)}" if close else f"cards: {', '.join(card_names())}"
    raise UserError(
        f"no model card, local folder or cached config.json (offline); {hint}",
        kind="vram",
        key="model.name",
        value=name,
    )
