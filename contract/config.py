"""Typed run config: TOML load/save, dotted `--set` overrides, one-line validation errors. The keys
themselves (sections, types, defaults, allowed values, help) are declared in config_schema.py and
re-exported here.

Pure python (no torch), so the studio and the VRAM planner can import it.

Every user mistake raises `UserError` (contract/errors.py) whose message is one line naming
the key, the value and what is allowed. The CLI prints it and exits with code 2.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from grpo_studio.contract import alert_rules, algorithms, backend, bundled, metrics
from grpo_studio.contract.errors import UserError, did_you_mean, show_choices, user_path
from grpo_studio.contract.config_schema import (  # noqa: F401 - the keys, re-exported
    opt, DTYPES, ALGOS, LOSS_TYPES, MAX_STEPS, MAX_TOKENS, MAX_GENERATIONS, MAX_PROMPTS, MAX_SEQUENCES,
    MAX_SECONDS, MAX_UPDATES, AUTO, ModelConfig, RolloutConfig, AlgoConfig, TrainConfig, DataConfig,
    RewardsConfig, PrecisionConfig, TRACKERS, ReportConfig, AlertsConfig, Config,
)


SECTIONS = {f.name: f.type for f in dataclasses.fields(Config)}


def _section_fields(section: str) -> dict[str, dataclasses.Field]:
    cls = {f.name: f for f in dataclasses.fields(Config)}[section].default_factory
    return {f.name: f for f in dataclasses.fields(cls)}


def all_keys() -> list[str]:
    return [f"{s}.{k}" for s in SECTIONS for k in _section_fields(s)]


@dataclass(frozen=True)
class KeyInfo:
    """What a user may know about one key: `grpo-studio config --keys` and the setup form's tooltips."""
    key: str
    type: str           # bool | int | float | str | list
    default: Any
    choices: tuple | None
    lo: float | None
    hi: float | None
    lo_open: bool
    help: str
    auto: bool = False  # also takes the word "auto"

    def allowed(self) -> str:
        """The allowed values as the error messages word them: 'fp32, bf16, fp16, fp8', '>= 0', '> 0, <= 1'."""
        if self.choices is not None:
            return show_choices(self.choices)
        bounds = ["auto"] if self.auto else []
        if self.lo is not None:
            bounds.append(_lower(self.lo, self.lo_open))
        if self.hi is not None:
            bounds.append(_upper(self.hi))
        return ", ".join(bounds)


def key_info() -> list[KeyInfo]:
    """Every key in file order, with its type, default, allowed values and help."""
    defaults = Config()
    out = []
    for section in SECTIONS:
        for name, f in _section_fields(section).items():
            default = getattr(getattr(defaults, section), name)
            m = f.metadata
            kind = m["auto"] if m.get("auto") else type(default)
            out.append(KeyInfo(f"{section}.{name}", kind.__name__, default,
                               tuple(m["choices"]) if m.get("choices") is not None else None,
                               m.get("lo"), m.get("hi"), bool(m.get("lo_open")), m.get("help", ""),
                               bool(m.get("auto"))))
    return out


def _coerce(key: str, value: Any, default: Any, from_text: bool) -> Any:
    """Convert `value` to the type of `default`; `from_text` is True for --set strings."""
    kind = type(default)
    if kind is bool:
        if isinstance(value, bool):
            return value
        if from_text and str(value).lower() in ("true", "false", "1", "0", "yes", "no"):
            return str(value).lower() in ("true", "1", "yes")
        raise UserError("expected true or false", key=key, value=value)
    if kind is int:
        if isinstance(value, bool):
            raise UserError("expected an integer", key=key, value=value)
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if from_text:
            try:
                return int(str(value).replace("_", ""))
            except ValueError:
                pass
        raise UserError("expected an integer", key=key, value=value)
    if kind is float:
        if isinstance(value, bool):
            raise UserError("expected a number", key=key, value=value)
        if isinstance(value, (int, float)):
            try:
                return float(value)
            except OverflowError:  # an int beyond the float range
                raise UserError("must be a finite number", key=key, value=value) from None
        if from_text:
            try:
                return float(value)
            except ValueError:
                pass
        raise UserError("expected a number", key=key, value=value)
    if not isinstance(value, str):
        raise UserError("expected a string", key=key, value=value)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: bytes from the command line that are not UTF-8
        raise UserError("not valid UTF-8 text", key=key, value=value) from None
    return value


def _coerce_list(key: str, value: Any, item: type, from_text: bool) -> list:
    """A list whose items are each coerced and checked like a key of type `item` (str or float), named
    `key[i]` in a message; `from_text` accepts --set's '["a", "b"]' and 'a, b' forms."""
    items_from_text = False
    if from_text and not isinstance(value, list):
        text = str(value).strip()
        if text.startswith("["):
            try:
                value = tomllib.loads(f"v = {text}")["v"]
            except (tomllib.TOMLDecodeError, ValueError):
                raise UserError('expected a list like ["a", "b"]', key=key, value=text) from None
        else:
            value, items_from_text = [part.strip() for part in text.split(",") if part.strip()], True
    if not isinstance(value, list):
        raise UserError("expected a list", key=key, value=value)
    out = []
    for i, element in enumerate(value):
        converted = _coerce(f"{key}[{i}]", element, item(), items_from_text)
        _check(f"{key}[{i}]", converted, {})
        out.append(converted)
    return out


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _lower(lo: float, lo_open: bool) -> str:
    return f"{'>' if lo_open else '>='} {_num(lo)}"


def _upper(hi: float) -> str:
    return f"<= {_num(hi)}"


def _check(key: str, value: Any, meta: dict) -> None:
    if isinstance(value, float) and not math.isfinite(value):  # NaN slips past every comparison below
        raise UserError("must be a finite number", key=key, value=value)
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise UserError(key=key, value=value, allowed=choices)
    lo, hi = meta.get("lo"), meta.get("hi")
    if lo is not None and (value <= lo if meta.get("lo_open") else value < lo):
        raise UserError(f"must be {_lower(lo, meta.get('lo_open'))}", key=key, value=value)
    if hi is not None and value > hi:
        raise UserError(f"must be {_upper(hi)}", key=key, value=value)


def set_key(cfg: Config, key: str, value: Any, from_text: bool = False) -> None:
    """Set a dotted key (e.g. 'train.steps') with conversion and validation."""
    section, _, name = key.partition(".")
    fields = _section_fields(section) if section in SECTIONS else {}
    if name not in fields:
        raise UserError(f"unknown key {key!r}{did_you_mean(key, all_keys())}")
    current, meta = getattr(getattr(cfg, section), name), fields[name].metadata
    if meta.get("auto") and isinstance(value, str) and value.strip().lower() == AUTO:
        setattr(getattr(cfg, section), name, AUTO)
        return
    if isinstance(current, list):
        converted = _coerce_list(key, value, meta["item"], from_text)
    else:
        try:
            converted = _coerce(key, value, meta["auto"]() if meta.get("auto") else current, from_text)
        except UserError as err:
            if not meta.get("auto"):
                raise
            raise UserError(f"expected {AUTO} or {err.why.removeprefix('expected ')}", key=key, value=value) from None
    _check(key, converted, meta)
    setattr(getattr(cfg, section), name, converted)


def check_tables(data: dict, source: str = "") -> None:
    """A recipe's top level holds only known [section] tables."""
    where = f" in {source}" if source else ""
    for section, body in data.items():
        if section not in SECTIONS:
            raise UserError(f"unknown section {section!r}{did_you_mean(section, SECTIONS)}{where}")
        if not isinstance(body, dict):
            raise UserError(f"must be a [{section}] table of keys{where}", key=section, value=body)


def apply_dict(cfg: Config, data: dict, source: str = "") -> None:
    check_tables(data, source)
    for section, body in data.items():
        for name, value in body.items():
            set_key(cfg, f"{section}.{name}", value)


def parse_override(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise UserError(f"--set {text!r}: expected section.key=value")
    return key.strip(), value.strip()


def load(source: str | None = None, overrides: list[str] = ()) -> Config:
    """Resolve a recipe (preset name or TOML path) plus `--set` overrides into a validated Config.
    The algorithm preset fills its defaults before the explicit keys."""
    data = read_recipe(source) if source else {}
    check_tables(data, source or "")
    cfg = Config()
    algo_name = data.get("algo", {}).get("name", "grpo")
    parsed = [parse_override(o) for o in overrides]
    for key, value in parsed:
        if key == "algo.name":
            algo_name = value
    set_key(cfg, "algo.name", algo_name)
    for key, value in algorithms.defaults(algo_name).items():
        set_key(cfg, key, value)
    apply_dict(cfg, data, source or "")
    for key, value in parsed:
        set_key(cfg, key, value, from_text=True)
    validate(cfg)
    return cfg


def read_recipe(source: str) -> dict:
    """The TOML table of a preset name or a .toml path; unreadable, not UTF-8 or not TOML: one line."""
    with user_path("recipe", source):
        path = Path(source)
        if path.suffix != ".toml":
            preset = bundled.recipe(source)
            if preset is None:
                names = bundled.recipe_names()
                raise UserError(f"recipe {source!r} not found: not a .toml file or a preset "
                                f"(presets: {', '.join(names)}){did_you_mean(source, names)}")
            path = preset
        if not path.is_file():
            raise UserError(f"recipe file {str(path)!r} does not exist")
        text = path.read_bytes().decode("utf-8")
    try:
        return tomllib.loads(text)
    except ValueError as err:  # TOMLDecodeError, or an integer of more than 4300 digits
        raise UserError(f"{path}: invalid TOML: {err}") from None


def validate(cfg: Config) -> None:
    """Cross-field rules that single-key checks cannot express."""
    r, a = cfg.rollout, cfg.algo
    best = cfg.train.best_metric
    if best and metrics.lookup(best) is None:
        raise UserError(f"not a metric the trainer writes{did_you_mean(best, metrics.names(cfg.rewards.funcs))}",
                        key="train.best_metric", value=best)
    if a.is_mode == "mask" and a.is_level != "none" and a.is_cap <= 0:
        raise UserError(f"algo.is_cap = {a.is_cap:g}: algo.is_mode = 'mask' needs a cap > 0 (e.g. 10.0)")
    if 0 < a.delta <= 1 + a.epsilon_high:
        raise UserError(f"algo.delta = {a.delta:g}: must be > 1 + algo.epsilon_high ({1 + a.epsilon_high:g}), "
                        f"or 0 = off")
    if a.objective == "pg" and a.importance_sampling_level == "sequence":
        raise UserError("algo.importance_sampling_level = 'sequence' with algo.objective = 'pg': the pg objective "
                        "has no pi/pi_old ratio; use 'token' (its IS weight is algo.is_level)")
    if cfg.rewards.weights and len(cfg.rewards.weights) != len(cfg.rewards.funcs):
        raise UserError(f"needs {len(cfg.rewards.funcs)} values, one per rewards.funcs entry", key="rewards.weights",
                        value=cfg.rewards.weights)
    if not cfg.rewards.funcs:
        raise UserError("give at least one reward function", key="rewards.funcs", value=cfg.rewards.funcs)
    if cfg.rewards.sandbox == "none" and not cfg.rewards.sandbox_force_none:
        raise UserError("runs model-written code unconfined, as your user (rlimits and the wall clock only); "
                        "use auto, bwrap or namespaces, or set rewards.sandbox_force_none = true to accept it",
                        key="rewards.sandbox", value="none")
    if cfg.model.lora_rank > 0 and not cfg.model.lora_target_modules:
        raise UserError("give at least one module name, or 'all-linear'", key="model.lora_target_modules",
                        value=cfg.model.lora_target_modules)
    if cfg.model.load_in_4bit:
        _refuse_4bit(cfg)
    if cfg.rollout_dtype == "fp8" and cfg.model.dtype not in ("bf16", "fp8"):
        raise UserError(f"rollout.dtype = 'fp8' with model.dtype = {cfg.model.dtype!r}: "
                        f"fp8 rollout pairs with model.dtype 'bf16' (rollout_only) or 'fp8' (unified)")
    if r.max_prompt_len + r.max_completion_len > MAX_TOKENS:
        raise UserError(f"prompt + completion must be <= {MAX_TOKENS} tokens", key="rollout.max_completion_len",
                        value=r.max_completion_len)
    if cfg.train.shared_prefix == "on" and cfg.model.gradient_checkpointing:
        raise UserError("with model.gradient_checkpointing = true transformers turns the prompt pass's KV cache "
                        "off; set auto or off", key="train.shared_prefix", value="on")
    if cfg.train.micro_batch_tokens and cfg.train.micro_batch_size:
        raise UserError(f"train.micro_batch_tokens = {cfg.train.micro_batch_tokens} with train.micro_batch_size = "
                        f"{cfg.train.micro_batch_size}: micro-batches are cut by one of them; set the other to 0")
    sequences = cfg.train.prompts_per_step * r.num_generations
    if sequences > MAX_SEQUENCES:
        raise UserError(f"{sequences} sequences per step with rollout.num_generations = {r.num_generations}; "
                        f"must be <= {MAX_SEQUENCES}", key="train.prompts_per_step", value=cfg.train.prompts_per_step)
    _check_updates_per_rollout(cfg, sequences)
    _refuse_truncated_is(cfg)
    _check_rollout_server(cfg.rollout)
    if cfg.train.max_staleness >= 0 and cfg.rollout.async_mode == "off":
        raise UserError("needs rollout.async_mode = 'one_step' or 'in_flight' (with 'off' every token is sampled "
                        "by the weights it trains: lag 0); -1 = off", key="train.max_staleness",
                        value=cfg.train.max_staleness)
    _check_parallel(cfg)
    _check_outlets(cfg)


def _check_outlets(cfg: Config) -> None:
    """report.* and alerts.*: tracker and event names, the rules' grammar and metrics, the webhook's scheme."""
    for key, values, allowed in (("report.to", cfg.report.to, TRACKERS),
                                 ("alerts.on", cfg.alerts.on, alert_rules.EVENTS)):
        for i, value in enumerate(values):
            if value not in allowed:
                raise UserError(key=f"{key}[{i}]", value=value, allowed=allowed)
    alert_rules.parse_all(cfg.alerts.rules, cfg.rewards.funcs)
    hook = cfg.alerts.webhook
    if hook and not (hook.startswith(("http://", "https://")) and len(hook.split("://", 1)[1]) > 0):
        raise UserError("an http:// or https:// URL, or empty for none", key="alerts.webhook", value=hook)


def _check_parallel(cfg: Config) -> None:
    """train.parallel: what data-parallel training cannot honour yet (docs/distributed.md)."""
    if cfg.train.parallel == "fsdp":
        _check_fsdp(cfg)
    if cfg.train.parallel != "none" and cfg.algo.scale_rewards == "batch":
        raise UserError(f"algo.scale_rewards = 'batch' with train.parallel = {cfg.train.parallel!r}: the batch std "
                        f"would be each rank's; use 'group' or 'none'")


def _check_fsdp(cfg: Config) -> None:
    """What FSDP2 sharding (engine/fsdp.py) cannot run: weights read outside the model's own forward (where a
    rank holds only its shard), ranks with different numbers of forwards, layers it cannot shard."""
    t, m = cfg.train, cfg.model
    why = {("model.logits_chunk", m.logits_chunk): (m.logits_chunk > 0, "the chunked lm_head reads its weight outside "
                                                    "the model's forward, where a rank holds only its shard; use 0"),
           ("train.shared_prefix", t.shared_prefix): (t.shared_prefix == "on", "the shared-prefix pass calls the "
                                                      "decoder outside the model's forward, where a rank holds only "
                                                      "its shard; use 'auto' (off under fsdp) or 'off'"),
           ("train.micro_batch_tokens", t.micro_batch_tokens): (t.micro_batch_tokens > 0, "ranks would run different "
                                                                "numbers of micro-batches and every sharded forward "
                                                                "is a collective; use train.micro_batch_size"),
           ("model.load_in_4bit", m.load_in_4bit): (m.load_in_4bit, "bitsandbytes 4-bit weights cannot be sharded; "
                                                    "use train.parallel = 'ddp'"),
           ("model.dtype", m.dtype): (m.dtype == "fp8", "the fp8 linears are not sharded; use bf16 or "
                                                        "train.parallel = 'ddp'")}
    for (key, value), (refused, reason) in why.items():
        if refused:
            raise UserError(f"not with train.parallel = 'fsdp': {reason}", key=key, value=value)


def _check_rollout_server(r: RolloutConfig) -> None:
    """rollout.server / async_mode only mean something for a rollout server (docs/rollout_server.md)."""
    if r.colocate:
        for key, value, off in (("server", r.server, ""), ("async_mode", r.async_mode, "off")):
            if value != off:
                raise UserError("needs rollout.colocate = false (a rollout server); the colocated engine "
                                "shares the trainer's process", key=f"rollout.{key}", value=value)
        return
    if r.backend == "hf":
        raise UserError("rollout.colocate = false runs vLLM in a rollout server; use rollout.backend = 'vllm' "
                        "or 'auto'", key="rollout.backend", value="hf")
    host, _, port = r.server.rpartition(":")
    if r.server and not (host and port.isdigit() and 0 < int(port) < 65536):
        raise UserError("host:port, e.g. 127.0.0.1:8000; or empty to start a server for the run",
                        key="rollout.server", value=r.server)


def _check_updates_per_rollout(cfg: Config, sequences: int) -> None:
    """A rollout is trained on for steps_per_generation × num_iterations optimizer steps (docs/algorithms.md)."""
    t = cfg.train
    if sequences * t.steps_per_generation > MAX_SEQUENCES:
        raise UserError(f"{sequences * t.steps_per_generation} sequences per rollout "
                        f"(train.prompts_per_step × rollout.num_generations × this); must be <= {MAX_SEQUENCES}",
                        key="train.steps_per_generation", value=t.steps_per_generation)
    cycle = t.steps_per_generation * t.num_iterations
    if t.save_every % cycle:
        raise UserError(f"must be a multiple of train.steps_per_generation × train.num_iterations ({cycle}), so a "
                        f"checkpoint never falls between the updates of one rollout; or 0 = only at the end",
                        key="train.save_every", value=t.save_every)


def _refuse_truncated_is(cfg: Config) -> None:
    """top-p / top-k sampling makes μ the truncated distribution while π is the full one: π_old/μ is then no
    importance weight (docs/mismatch.md), so rollout correction is refused with it."""
    r = cfg.rollout
    if r.top_k == 0 and r.top_p == 1:
        return
    name = backend.resolve(r.backend, load_in_4bit=cfg.model.load_in_4bit)[0]
    level = algorithms.rollout_is_level(cfg.algo.is_level, name)
    if level != "none":
        key, value = ("rollout.top_k", r.top_k) if r.top_k else ("rollout.top_p", r.top_p)
        shown = "" if level == cfg.algo.is_level else f" ({level} for the {name} rollout)"
        raise UserError(f"algo.is_level = {cfg.algo.is_level!r}{shown} corrects towards the sampler's mu, "
                        f"which this truncates while pi does not; set algo.is_level = 'none', or sample the full "
                        f"distribution (rollout.top_k = 0, rollout.top_p = 1)", key=key, value=value)


def _refuse_4bit(cfg: Config) -> None:
    """The model.load_in_4bit combinations that cannot run, refused before anything loads."""
    m = cfg.model
    if m.lora_rank == 0:
        raise UserError("a 4-bit base cannot be fine-tuned in full (model.lora_rank = 0); set a LoRA rank > 0 (QLoRA)",
                        key="model.load_in_4bit", value=True)
    for key, dtype in (("model.dtype", m.dtype), ("rollout.dtype", cfg.rollout_dtype)):
        if dtype == "fp8":
            raise UserError(f"{key} = 'fp8': bitsandbytes 4-bit layers compute in fp32, bf16 or fp16; use one of "
                            f"those", key="model.load_in_4bit", value=True)
    if cfg.rollout.backend == "vllm":
        raise UserError("rollout.backend = 'vllm': a 4-bit base is sampled with its live LoRA adapters by the hf "
                        "backend only (docs/mismatch.md); use rollout.backend = 'hf' or 'auto' (hf for a 4-bit base)",
                        key="model.load_in_4bit", value=True)


def to_toml(cfg: Config) -> str:
    return tomli_w.dumps(cfg.to_dict())


def save(cfg: Config, path: Path) -> None:
    from grpo_studio.contract.rundir import atomic_write_text

    atomic_write_text(path, to_toml(cfg))
