"""The rules across keys (validate): what single-key bounds cannot say, each refused in one line naming the
keys, the values and what would be accepted; and the process-count rule of a data-parallel launch
(check_processes), the one home of that rule for `train --nproc`, `vram --nproc`, torchrun and the studio.

Pure python (no torch).
"""

from __future__ import annotations

import urllib.parse

from . import alert_rules, algorithms, backend, dtypes, metrics
from .config_bounds import AUTO, MAX_SEQUENCES, MAX_TOKENS, TRACKERS, VLLM_MAX_TEMPERATURE
from .config_schema import Config, WarmupConfig
from .config_training import AlgoConfig, RolloutConfig
from .errors import UserError, did_you_mean


def validate(cfg: Config) -> None:
    """Cross-field rules that single-key checks cannot express."""
    r, a = cfg.rollout, cfg.algo
    best = cfg.train.best_metric
    if best and metrics.lookup(best) is None:
        raise UserError(
            f"not a metric the trainer writes{did_you_mean(best, metrics.names(cfg.rewards.funcs))}",
            key="train.best_metric",
            value=best,
        )
    if a.is_mode == "mask" and a.is_level != "none" and a.is_cap <= 0:
        raise UserError(f"algo.is_cap = {a.is_cap:g}: algo.is_mode = 'mask' needs a cap > 0 (e.g. 10.0)")
    if 0 < a.delta <= 1 + a.epsilon_high:
        raise UserError(
            f"algo.delta = {a.delta:g}: must be > 1 + algo.epsilon_high ({1 + a.epsilon_high:g}), or 0 = off"
        )
    if a.objective == "pg" and a.importance_sampling_level == "sequence":
        raise UserError(
            "algo.importance_sampling_level = 'sequence' with algo.objective = 'pg': the pg objective "
            "has no pi/pi_old ratio; use 'token' (its IS weight is algo.is_level)"
        )
    if cfg.rewards.weights and len(cfg.rewards.weights) != len(cfg.rewards.funcs):
        raise UserError(
            f"needs {len(cfg.rewards.funcs)} values, one per rewards.funcs entry",
            key="rewards.weights",
            value=cfg.rewards.weights,
        )
    if not cfg.rewards.funcs and not cfg.env.environment:
        raise UserError(
            "give at least one reward function (or an env.environment that scores its episodes)",
            key="rewards.funcs",
            value=cfg.rewards.funcs,
        )
    if cfg.env.environment and cfg.rollout.async_mode != "off":
        raise UserError(
            f"episodes of env.environment = {cfg.env.environment!r} are sampled turn by turn with the current "
            f"weights; allowed with an environment: off",
            key="rollout.async_mode",
            value=cfg.rollout.async_mode,
        )
    if cfg.train.eval_k > 1 and not cfg.train.eval_every:
        raise UserError(
            "has no effect with train.eval_every = 0 (no evaluation); set train.eval_every or leave train.eval_k at 1",
            key="train.eval_k",
            value=cfg.train.eval_k,
        )
    if cfg.data.eval_source and cfg.data.eval_size > 0:
        raise UserError(
            f"holds rows of data.source out for evaluation, and data.eval_source = {cfg.data.eval_source!r} gives "
            f"the evaluation rows; allowed with data.eval_source: -1 (auto) or 0",
            key="data.eval_size",
            value=cfg.data.eval_size,
        )
    _warmup_rules(cfg)
    if cfg.rewards.sandbox == "none" and not cfg.rewards.sandbox_force_none:
        raise UserError(
            "runs model-written code unconfined, as your user (rlimits and the wall clock only); "
            "use auto, bwrap or namespaces, or set rewards.sandbox_force_none = true to accept it",
            key="rewards.sandbox",
            value="none",
        )
    if cfg.model.lora_rank > 0 and not cfg.model.lora_target_modules:
        raise UserError(
            "give at least one module name, or 'all-linear'",
            key="model.lora_target_modules",
            value=cfg.model.lora_target_modules,
        )
    if cfg.model.load_in_4bit:
        _refuse_4bit(cfg)
    if dtypes.quantised(cfg.rollout_dtype) and not dtypes.holds_fp8_masters(cfg.model.dtype):
        raise UserError(
            f"rollout.dtype = 'fp8' with model.dtype = {cfg.model.dtype!r}: "
            f"fp8 rollout pairs with model.dtype 'bf16' (rollout_only) or 'fp8' (unified)"
        )
    if r.max_prompt_len + r.max_completion_len > MAX_TOKENS:
        raise UserError(
            f"prompt + completion must be <= {MAX_TOKENS} tokens",
            key="rollout.max_completion_len",
            value=r.max_completion_len,
        )
    if cfg.train.shared_prefix == "on" and cfg.model.gradient_checkpointing:
        raise UserError(
            "with model.gradient_checkpointing = true transformers turns the prompt pass's KV cache "
            "off; set auto or off",
            key="train.shared_prefix",
            value="on",
        )
    if cfg.train.micro_batch_tokens and cfg.train.micro_batch_size not in (0, AUTO):
        raise UserError(
            f"train.micro_batch_tokens = {cfg.train.micro_batch_tokens} with train.micro_batch_size = "
            f"{cfg.train.micro_batch_size}: micro-batches are cut by one of them; set the other to 0"
        )
    sequences = cfg.train.prompts_per_step * r.num_generations
    if sequences > MAX_SEQUENCES:
        raise UserError(
            f"{sequences} sequences per step with rollout.num_generations = {r.num_generations}; "
            f"must be <= {MAX_SEQUENCES}",
            key="train.prompts_per_step",
            value=cfg.train.prompts_per_step,
        )
    _check_updates_per_rollout(cfg, sequences)
    _check_dynamic_sampling(cfg)
    _check_rollout_band(cfg)
    _check_pass_at_k(cfg)
    _check_truncated_support(cfg)
    _check_router_replay(cfg)
    backend.refuse_vllm_sync(cfg)  # rollout.vllm_sync; a 4-bit base's merged sync to vLLM
    backend.refuse_vllm_keys_with_hf(cfg)  # rollout.* keys only vLLM reads, with the hf sampler asked for
    _check_rollout_server(cfg.rollout)
    if cfg.rollout.temperature > VLLM_MAX_TEMPERATURE and (cfg.rollout.backend == "vllm" or not cfg.rollout.colocate):
        raise UserError(
            f"vLLM (rollout.backend = 'vllm', or a rollout server) samples at temperatures of at most "
            f"{VLLM_MAX_TEMPERATURE:g}; the hf rollout takes up to 100",
            key="rollout.temperature",
            value=cfg.rollout.temperature,
        )
    if cfg.train.max_staleness >= 0 and cfg.rollout.async_mode == "off":
        raise UserError(
            "needs rollout.async_mode = 'one_step' or 'in_flight' (with 'off' every token is sampled "
            "by the weights it trains: lag 0); -1 = off",
            key="train.max_staleness",
            value=cfg.train.max_staleness,
        )
    _check_parallel(cfg)
    _check_outlets(cfg)
    _check_model_name(cfg.model.name)


MAX_PATH_PART, MAX_PATH = 255, 4096  # a file name's and a path's limits (NAME_MAX, PATH_MAX); hub ids are shorter


def _check_model_name(name: str) -> None:
    """model.name as a name or path can be: within the file system's limits, no control characters; whether
    it names a model is the loader's question (engine/model/policy_loader.py resolve_model_path)."""
    parts = name.replace("\\", "/").split("/")
    if (
        len(name.encode("utf-8", "surrogateescape")) > MAX_PATH
        or not name.isprintable()
        or any(len(part.encode("utf-8", "surrogateescape")) > MAX_PATH_PART for part in parts)
    ):
        raise UserError(
            f"a preset id, hub id or local folder: at most {MAX_PATH_PART} bytes between slashes and "
            f"{MAX_PATH} in all, no control characters",
            key="model.name",
            value=name,
        )


def _check_outlets(cfg: Config) -> None:
    """report.* and alerts.*: tracker and event names, the rules' grammar and metrics, the webhook's scheme."""
    for key, values, allowed in (
        ("report.to", cfg.report.to, TRACKERS),
        ("alerts.on", cfg.alerts.on, alert_rules.EVENTS),
    ):
        for i, value in enumerate(values):
            if value not in allowed:
                raise UserError(key=f"{key}[{i}]", value=value, allowed=allowed)
    alert_rules.parse_all(cfg.alerts.rules, cfg.rewards.funcs)
    hook = cfg.alerts.webhook
    if hook and not _http_url(hook):
        raise UserError(
            "an http:// or https:// URL with a host, e.g. https://hooks.example.com/alerts, or empty for none",
            key="alerts.webhook",
            value=hook,
        )


def _http_url(text: str) -> bool:
    """An http(s) URL that urllib can send to: a scheme, a host, a port that is a number if given."""
    try:
        url = urllib.parse.urlsplit(text)
        port_ok = url.port is None or 0 < url.port < 65536  # .port raises ValueError for a bad one
    except ValueError:  # 'http://[::1': an unclosed IPv6 bracket
        return False
    return url.scheme in ("http", "https") and bool(url.hostname) and port_ok and text.isprintable() and " " not in text


def _check_parallel(cfg: Config) -> None:
    """train.parallel: what data-parallel training cannot honour yet (docs/distributed.md)."""
    if cfg.train.parallel == "fsdp":
        _check_fsdp(cfg)
    if cfg.train.parallel != "none" and cfg.algo.scale_rewards == "batch":
        raise UserError(
            f"algo.scale_rewards = 'batch' with train.parallel = {cfg.train.parallel!r}: the batch std "
            f"would be each rank's; use 'group' or 'none'"
        )


def _check_fsdp(cfg: Config) -> None:
    """What FSDP2 sharding (engine/model/fsdp.py) cannot run: weights read outside the model's own forward (where a
    rank holds only its shard), ranks with different numbers of forwards, layers it cannot shard."""
    t, m = cfg.train, cfg.model
    why = {
        ("model.logits_chunk", m.logits_chunk): (
            m.logits_chunk > 0,
            "the chunked lm_head reads its weight outside "
            "the model's forward, where a rank holds only its shard; use 0",
        ),
        ("train.shared_prefix", t.shared_prefix): (
            t.shared_prefix == "on",
            "the shared-prefix pass calls the "
            "decoder outside the model's forward, where a rank holds only "
            "its shard; use 'auto' (off under fsdp) or 'off'",
        ),
        ("train.micro_batch_tokens", t.micro_batch_tokens): (
            t.micro_batch_tokens > 0,
            "ranks would run different "
            "numbers of micro-batches and every sharded forward "
            "is a collective; use train.micro_batch_size",
        ),
        ("model.load_in_4bit", m.load_in_4bit): (
            m.load_in_4bit,
            "bitsandbytes 4-bit weights cannot be sharded; use train.parallel = 'ddp'",
        ),
        ("model.dtype", m.dtype): (
            dtypes.quantised(m.dtype),
            "the fp8 linears are not sharded; use bf16 or train.parallel = 'ddp'",
        ),
    }
    for (key, value), (refused, reason) in why.items():
        if refused:
            raise UserError(f"not with train.parallel = 'fsdp': {reason}", key=key, value=value)


def _check_rollout_server(r: RolloutConfig) -> None:
    """rollout.server / server_secret_file / async_mode only mean something for a rollout server
    (docs/rollout_server.md)."""
    if r.colocate:
        for key, value, off in (
            ("server", r.server, ""),
            ("server_secret_file", r.server_secret_file, ""),
            ("async_mode", r.async_mode, "off"),
        ):
            if value != off:
                raise UserError(
                    "needs rollout.colocate = false (a rollout server); the colocated engine "
                    "shares the trainer's process",
                    key=f"rollout.{key}",
                    value=value,
                )
        return
    if r.backend == "hf":
        raise UserError(
            "rollout.colocate = false runs vLLM in a rollout server; use rollout.backend = 'vllm' or 'auto'",
            key="rollout.backend",
            value="hf",
        )
    if r.server_secret_file and not r.server:
        raise UserError(
            "needs rollout.server: a server started for the run gets a secret made for it",
            key="rollout.server_secret_file",
            value=r.server_secret_file,
        )
    host, _, port = r.server.rpartition(":")
    if r.server and not (host and port.isdigit() and 0 < int(port) < 65536):
        raise UserError(
            "host:port, e.g. 127.0.0.1:8000; or empty to start a server for the run",
            key="rollout.server",
            value=r.server,
        )


def _check_updates_per_rollout(cfg: Config, sequences: int) -> None:
    """A rollout is trained on for steps_per_generation × num_iterations optimizer steps (docs/algorithms.md)."""
    t = cfg.train
    if sequences * t.steps_per_generation > MAX_SEQUENCES:
        raise UserError(
            f"{sequences * t.steps_per_generation} sequences per rollout "
            f"(train.prompts_per_step × rollout.num_generations × this); must be <= {MAX_SEQUENCES}",
            key="train.steps_per_generation",
            value=t.steps_per_generation,
        )
    cycle = t.steps_per_generation * t.num_iterations
    if t.save_every % cycle:
        raise UserError(
            f"must be a multiple of train.steps_per_generation × train.num_iterations ({cycle}), so a "
            f"checkpoint never falls between the updates of one rollout; or 0 = only at the end",
            key="train.save_every",
            value=t.save_every,
        )


def _check_rollout_band(cfg: Config) -> None:
    """algo.is_floor, the lower edge of the rollout-correction band [is_floor, is_cap] (IcePop's [α, β] in mask
    mode): it acts only where a correction runs, and below the cap."""
    a = cfg.algo
    if not a.is_floor:
        return
    name = backend.resolve(cfg.rollout.backend, load_in_4bit=cfg.model.load_in_4bit)[0]
    level = algorithms.rollout_is_level(a.is_level, name)
    if level == "none":
        shown = "" if level == a.is_level else f" ({level} for the {name} rollout)"
        raise UserError(
            f"has no effect with algo.is_level = {a.is_level!r}{shown}: no rollout correction runs; set "
            f"algo.is_level = 'token' (IcePop) or 'sequence', or leave this at 0",
            key="algo.is_floor",
            value=a.is_floor,
        )
    if 0 < a.is_cap <= a.is_floor:
        raise UserError(
            f"must be below algo.is_cap = {a.is_cap:g}: the band [algo.is_floor, algo.is_cap] a ratio is kept in "
            f"would be empty",
            key="algo.is_floor",
            value=a.is_floor,
        )


def _check_pass_at_k(cfg: Config) -> None:
    """algo.advantage = pass_at_k (engine/rollout/advantages.py): k below the group size, a pass/fail reward from
    one function, and the group's own std; algo.pass_k acts only there."""
    a, default = cfg.algo, AlgoConfig().pass_k
    if a.advantage != "pass_at_k":
        if a.pass_k != default:
            raise UserError(
                f"has no effect with algo.advantage = {a.advantage!r}; set algo.advantage = 'pass_at_k' or leave "
                f"this at {default}",
                key="algo.pass_k",
                value=a.pass_k,
            )
        return
    groups = cfg.rollout.num_generations
    if a.pass_k >= groups:
        raise UserError(
            f"must be below rollout.num_generations = {groups}: pass@k advantages average over the k-subsets of a "
            f"group, and at k >= {groups} there is at most one, so every advantage would be 0",
            key="algo.pass_k",
            value=a.pass_k,
        )
    if len(cfg.rewards.funcs) > 1:
        raise UserError(
            "algo.advantage = 'pass_at_k' takes pass (reward > 0) or fail from one reward function, as "
            "eval/pass@k does; give one, e.g. ['correctness']",
            key="rewards.funcs",
            value=cfg.rewards.funcs,
        )
    if a.scale_rewards == "batch":
        raise UserError(
            "pass@k advantages are divided by the std of their group's k-subset rewards, or not at all; "
            "allowed with algo.advantage = 'pass_at_k': group, none",
            key="algo.scale_rewards",
            value="batch",
        )


def _check_dynamic_sampling(cfg: Config) -> None:
    """DAPO dynamic sampling scores a round before it samples the next (engine/rollout/dynamic_sampling.py)."""
    a, default = cfg.algo, AlgoConfig().dynamic_sampling_max_rounds
    if not a.dynamic_sampling:
        if a.dynamic_sampling_max_rounds != default:
            raise UserError(
                f"has no effect with algo.dynamic_sampling = false; set it true or leave this at {default}",
                key="algo.dynamic_sampling_max_rounds",
                value=a.dynamic_sampling_max_rounds,
            )
        return
    if cfg.rollout.async_mode != "off":
        raise UserError(
            f"with rollout.async_mode = {cfg.rollout.async_mode!r} the next rollout is requested before this "
            f"one is scored, so no round can refill it; allowed with dynamic sampling: async_mode off",
            key="algo.dynamic_sampling",
            value=True,
        )
    if cfg.env.environment:
        raise UserError(
            f"not with env.environment = {cfg.env.environment!r}: multi-turn episodes are not resampled; "
            f"allowed: false with an environment",
            key="algo.dynamic_sampling",
            value=True,
        )


def _check_router_replay(cfg: Config) -> None:
    """algo.router_replay = replay needs each token's experts from the sampler: the colocated hf rollout records
    them from its own forward (engine/model/moe.py); the model's routers are checked when it loads."""
    if cfg.algo.router_replay == "off":
        return
    r, why = cfg.rollout, None
    if backend.resolve(r.backend, load_in_4bit=cfg.model.load_in_4bit)[0] == "vllm":
        why = (
            f"vLLM {backend.installed_version() or '(not installed)'} returns them only from its Model Runner V2 "
            "(enable_return_routed_experts), which the vllm rollout does not run (vLLM on cpu cannot: it needs "
            "Triton)"
        )
    elif not r.colocate:
        why = "a rollout server (rollout.colocate = false) does not return them"
    elif cfg.env.environment:
        why = f"the episodes of env.environment = {cfg.env.environment!r} do not carry them"
    elif cfg.algo.dynamic_sampling:
        why = "algo.dynamic_sampling's joined rounds do not carry them"
    elif cfg.train.shared_prefix == "on":
        why = "train.shared_prefix = 'on' reorders the tokens of the training forward (set auto or off)"
    if why:
        raise UserError(
            f"replay needs the experts the sampler routed each token to, and {why}; allowed: off, or "
            "rollout.backend = 'hf' colocated",
            key="algo.router_replay",
            value="replay",
        )


def _truncation(r: RolloutConfig) -> str | None:
    """The rollout key that truncates the sampler's distribution, as `key = value` (None: it draws from all)."""
    if r.top_k:
        return f"rollout.top_k = {r.top_k}"
    return f"rollout.top_p = {r.top_p:g}" if r.top_p < 1 else None


def _check_truncated_support(cfg: Config) -> None:
    """top-p / top-k sampling makes μ the truncated distribution. With algo.logprob_support = sampler π is
    renormalised on the tokens the sampler kept (docs/mismatch.md, "Truncated sampling"), so a sampler that
    cannot return them is refused; with full, π is the whole distribution and π_old/μ is no importance weight,
    so rollout correction is refused."""
    r, a = cfg.rollout, cfg.algo
    truncation = _truncation(r)
    if truncation is None:
        return
    name = backend.resolve(r.backend, load_in_4bit=cfg.model.load_in_4bit)[0]
    if a.logprob_support == "sampler":
        cannot = None
        if not r.colocate:
            cannot = "a rollout server (rollout.colocate = false) does not return them"
        elif cfg.env.environment:
            cannot = f"the episodes of env.environment = {cfg.env.environment!r} do not carry them"
        elif name == "vllm":
            cannot = (
                f"vLLM {backend.installed_version() or '(not installed)'} returns them only from its Model Runner "
                f"V2 (SamplingParams.return_sampling_mask), which the vllm rollout does not run"
            )
        if cannot:
            raise UserError(
                f"with {truncation} pi is taken on the tokens the sampler kept at each position, and {cannot}; "
                f"allowed: full (pi on the whole vocabulary), or rollout.backend = 'hf' colocated",
                key="algo.logprob_support",
                value="sampler",
            )
        return
    level = algorithms.rollout_is_level(a.is_level, name)
    if level != "none":
        key = truncation.split(" = ")[0]
        shown = "" if level == a.is_level else f" ({level} for the {name} rollout)"
        raise UserError(
            f"algo.is_level = {a.is_level!r}{shown} corrects towards the sampler's mu, which this truncates "
            f"while pi does not with algo.logprob_support = 'full'; set algo.logprob_support = 'sampler' or "
            f"algo.is_level = 'none', or sample the full distribution (rollout.top_k = 0, rollout.top_p = 1)",
            key=key,
            value=r.top_k if key == "rollout.top_k" else r.top_p,
        )


def _refuse_4bit(cfg: Config) -> None:
    """The model.load_in_4bit combinations that cannot run, refused before anything loads."""
    m = cfg.model
    if m.lora_rank == 0:
        raise UserError(
            "a 4-bit base cannot be fine-tuned in full (model.lora_rank = 0); set a LoRA rank > 0 (QLoRA)",
            key="model.load_in_4bit",
            value=True,
        )
    for key, dtype in (("model.dtype", m.dtype), ("rollout.dtype", cfg.rollout_dtype)):
        if dtypes.quantised(dtype):
            raise UserError(
                f"{key} = 'fp8': bitsandbytes 4-bit layers compute in fp32, bf16 or fp16; use one of those",
                key="model.load_in_4bit",
                value=True,
            )


def check_processes(
    cfg: Config, nproc: int, key: str = "--nproc", kind: str = "config", prompts_key: str = "train.prompts_per_step"
) -> None:
    """The process-count rule, its one home: `nproc` (named `key`) is a whole number >= 1; more than one
    process needs train.parallel ddp or fsdp; the step's prompts (named `prompts_key`) divide evenly among
    them (each rank samples its contiguous share, engine/run/distributed.py shard). `kind` labels the message."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise UserError("must be a whole number >= 1", kind=kind, key=key, value=nproc)
    if nproc > 1 and cfg.train.parallel == "none":
        raise UserError(
            f"{nproc} processes need train.parallel = 'ddp' or 'fsdp' (each trains on its share of the "
            f"prompts); add --set train.parallel=ddp",
            kind=kind,
            key="train.parallel",
            value="none",
        )
    if cfg.train.prompts_per_step % nproc:
        raise UserError(
            f"must divide evenly among the {nproc} processes (each samples its share of the prompts)",
            kind=kind,
            key=prompts_key,
            value=cfg.train.prompts_per_step,
        )


def _warmup_rules(cfg: Config) -> None:
    """warmup.* acts only with a warmup.source, and trains one process's adapter through a chat template."""
    w, unset = cfg.warmup, WarmupConfig()
    if not w.source:
        for name in ("steps", "lr", "batch_size"):
            if getattr(w, name) != getattr(unset, name):
                raise UserError(
                    "has no effect without warmup.source (the conversations to imitate); set warmup.source "
                    f"or leave warmup.{name} at {getattr(unset, name)!r} (no warm-up: warmup.steps, warmup.lr "
                    "and warmup.batch_size at their defaults)",
                    key=f"warmup.{name}",
                    value=getattr(w, name),
                )
        return
    if cfg.train.parallel != "none":
        raise UserError(
            f"warmup.source = {w.source!r}: the supervised warm-up runs in one process; allowed with a warm-up: none",
            key="train.parallel",
            value=cfg.train.parallel,
        )
    if cfg.data.chat_template in ("plain", "none") and not cfg.env.environment:
        raise UserError(
            f"warmup.source = {w.source!r} trains on the assistant turns of a chat template; allowed with a "
            "warm-up: auto, a Jinja template string or a .jinja file",
            key="data.chat_template",
            value=cfg.data.chat_template,
        )
