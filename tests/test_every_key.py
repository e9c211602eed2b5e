"""No silent keys: every config key changes what the engine does (or is refused where it cannot act).

Each key has exactly one proof, and the table must name every key `config.all_keys()` has, so a new key
without one fails here:

  RUN        a short real training run of the bundled model with the key changed differs from the same run
             without the change: metrics, samples, events, run-directory files or trained weights (timings
             and memory readings left out; the run itself is deterministic, see the first test)
  BUILT      the built Trainer differs (keys whose numbers are the same by design: they trade memory)
  REWARD     the reward functions score a fixed set of completions differently
  DATA       the training rows or the rendered prompts differ
  PLANNER    the VRAM planner's estimate differs (keys that size GPU memory, which the CPU has none of)
  ELSEWHERE  a named test proves it (a vLLM engine, an fp16 overflow, a NaN streak, sandbox limits)

docs/config-keys.md is the same table in words, for users.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from pathlib import Path

import pytest

from grpo_studio.contract import config, model_card
from grpo_studio.contract.planner import vram
from grpo_studio.contract.rundir import METRICS, read_rows

ROOT = Path(__file__).resolve().parents[1]
SHORT = [
    "train.steps=2",
    "train.prompts_per_step=4",
    "rollout.num_generations=4",
    "train.eval_every=0",
    "train.save_every=0",
    "rollout.backend=hf",
]
CLIP = ["train.num_iterations=2", "train.lr=0.05"]  # π_old ≠ π on the second pass: the clip can act
MISMATCH = ["rollout.dtype=bf16"]  # μ ≠ π: rollout correction has something to correct
FP16 = ["model.dtype=fp16"]
QLORA = ["model.load_in_4bit=true"]
CONVERSATION = ["data.system_prompt=Answer briefly."]
PASS_AT_K = ['rewards.funcs=["correctness"]', "rollout.num_generations=8"]  # one pass/fail reward, k < G

# key -> (changed value, the context it acts in)
RUN = {
    "model.name": ("{other_model}", []),
    "model.dtype": ("bf16", []),
    "model.lora_rank": ("4", []),
    "model.lora_alpha": ("8", []),
    "model.lora_dropout": ("0.1", []),
    "model.lora_target_modules": ('["q_proj", "v_proj"]', []),
    "model.load_in_4bit": ("true", []),
    "model.double_quant": ("false", QLORA),
    "rollout.dtype": ("bf16", []),
    "rollout.num_generations": ("2", []),
    "rollout.max_completion_len": ("4", []),
    "rollout.temperature": ("0.5", []),
    "rollout.top_p": ("0.5", []),
    "rollout.top_k": ("3", []),
    "algo.name": ("dr_grpo", []),
    "algo.loss_type": ("grpo", []),
    "algo.epsilon": ("0.001", CLIP),
    "algo.epsilon_high": ("0.001", CLIP),
    "algo.delta": ("1.201", CLIP),
    "algo.beta": ("0.1", []),
    "algo.scale_rewards": ("none", []),
    "algo.mask_truncated_completions": ("true", ["rollout.max_completion_len=2"]),
    "algo.importance_sampling_level": ("sequence", CLIP),
    "algo.is_level": ("token", MISMATCH),
    "algo.is_mode": ("truncate", [*MISMATCH, "algo.is_level=token", "algo.is_cap=1.001"]),
    "algo.is_cap": ("1.001", [*MISMATCH, "algo.is_level=token"]),
    "algo.is_floor": ("0.999", [*MISMATCH, "algo.is_level=token"]),
    "algo.advantage": ("pass_at_k", PASS_AT_K),
    "algo.pass_k": ("2", [*PASS_AT_K, "algo.advantage=pass_at_k"]),
    "algo.logprob_support": ("full", ["rollout.top_p=0.9"]),
    "algo.objective": ("pg", []),
    "algo.use_bias_correction_kl": ("false", ["algo.beta=0.1", *CLIP]),
    "train.steps": ("3", []),
    "train.lr": ("0.01", []),
    "train.warmup_steps": ("1", []),
    "train.lr_schedule": ("linear", []),
    "train.weight_decay": ("0.5", []),
    "train.prompts_per_step": ("2", []),
    "train.steps_per_generation": ("2", []),
    "train.num_iterations": ("2", []),
    "train.shuffle_batch": ("false", ["train.steps_per_generation=2"]),
    "train.seed": ("1", []),
    "train.grad_clip": ("0.001", []),
    "train.save_every": ("1", []),
    "train.keep_checkpoints": ("1", ["train.save_every=1", "train.steps=3"]),
    "train.samples_every": ("2", []),
    "train.eval_every": ("1", []),
    "train.eval_k": ("4", ["train.eval_every=1"]),
    "data.general_size": ("0", ["train.eval_every=1"]),  # no eval/general/* (auto: 200 rows of builtin:arith's)
    "data.eval_source": ("{jsonl}", ["train.eval_every=1"]),  # eval/* of its 81 rows; no pair of arith held out
    "rewards.weights": ("[1.0, 0.25]", []),
    "precision.loss_scale_init": ("1024", FP16),
    "precision.loss_scale_growth_interval": ("1", FP16),
    "precision.loss_scale_growth": ("4", [*FP16, "precision.loss_scale_growth_interval=1"]),
}

# key -> (changed value, context, what to read off the built Trainer)
BUILT = {
    "model.gradient_checkpointing": ("true", [], lambda t: t.policy.get_base_model().is_gradient_checkpointing),
}

# fixed completions for the reward probe: right, wrong, differently marked, long, code
COMPLETIONS = [
    "<reasoning>6+1</reasoning><answer>7</answer>",
    "<answer>7</answer>",
    "<answer>seven</answer>",
    "[think]6+1[/think][ans]7[/ans]",
    "The answer is 7.",
    "x" * 300,
    "```python\nimport sys\nx = bytearray(100 * 2**20)\nprint(7)\n```",
]
CODE_ROW = {"tests": ["assert True"]}

# key -> (changed value, context)
REWARD = {
    "rewards.funcs": ('["format"]', []),
    "rewards.reasoning_start": ("[think]", ["rewards.format_require_reasoning=true"]),
    "rewards.reasoning_end": ("[/think]", ["rewards.format_require_reasoning=true"]),
    "rewards.solution_start": ("[ans]", []),
    "rewards.solution_end": ("[/ans]", []),
    "rewards.answer_regex": (r"answer is (\d+)", []),
    "rewards.format_require_reasoning": ("true", []),
    "rewards.format_numeric": ("false", []),
    "rewards.length_min": ("100", ['rewards.funcs=["length_penalty"]']),
    "rewards.length_max": ("50", ['rewards.funcs=["length_penalty"]']),
    "rewards.keywords": ('["reasoning"]', ['rewards.funcs=["keyword"]']),
    "rewards.regex": ("answer", ['rewards.funcs=["regex_match"]', "rewards.regex=7"]),
    "rewards.code_tests_column": ("checks", ['rewards.funcs=["code_exec"]']),
    "rewards.code_memory_mb": ("64", ['rewards.funcs=["code_exec"]']),
}

# key -> (changed value, context)
DATA = {
    "data.source": ("{jsonl}", []),
    "data.prompt_column": ("question", ["data.source={jsonl}"]),
    "data.answer_column": ("solution", ["data.source={jsonl}"]),
    "data.eval_size": ("10", []),
    "data.system_prompt": ("Answer briefly.", []),
    "data.chat_template": ("{% for m in messages %}[{{ m.content }}]{% endfor %}", CONVERSATION),
}

# key -> (changed value, context); estimated for an 80 GiB GPU
VLLM_8B = ["model.name=qwen3-8b", "rollout.backend=vllm", "model.dtype=bf16"]
PLANNER = {
    "rollout.gpu_memory_utilization": ("0.9", VLLM_8B),
    "rollout.colocate": ("false", VLLM_8B),
    "rollout.sleep": ("true", VLLM_8B),
}

# key -> the test that proves it ("file::name"); each is checked to exist
ELSEWHERE = {
    "env.environment": "tests/test_episodes_train.py::test_an_environment_that_ends_on_its_first_step_trains_bitwise_as_plain_grpo",
    "env.max_turns": "tests/test_episodes.py::test_max_turns_gives_n_turns_and_n_actions",
    "env.tool_timeout_s": "tests/test_episodes.py::test_bad_input_ends_its_episode_with_a_stop_reason",
    "env.max_result_chars": "tests/test_environments_hostile.py::test_a_tool_result_is_cut_to_max_result_chars",
    "warmup.source": "tests/test_warmup.py::test_the_run_warms_up_then_samples_its_first_step_with_the_warmed_up_weights",
    "warmup.steps": "tests/test_warmup.py::test_the_run_warms_up_then_samples_its_first_step_with_the_warmed_up_weights",
    "warmup.lr": "tests/test_warmup.py::test_a_step_takes_batch_size_conversations_and_moves_each_weight_by_lr",
    "warmup.batch_size": "tests/test_warmup.py::test_a_step_takes_batch_size_conversations_and_moves_each_weight_by_lr",
    "train.eval_before": "tests/test_studio_units.py::test_rundata_reads_a_real_run_column_for_column",
    "rollout.max_prompt_len": "tests/test_real_model.py::test_a_too_short_max_prompt_len_is_one_line_before_weights_load",
    "model.offload_checkpoints": "tests/test_every_key.py::test_offload_checkpoints_moves_saved_activations_to_host",
    "model.logits_chunk": "tests/test_every_key.py::test_logits_chunk_runs_the_chunked_path_in_the_trainer",
    "rollout.backend": "tests/test_vllm_train.py::test_three_step_grpo_run_with_vllm",
    "rollout.vllm_enforce_eager": "tests/test_vllm_train.py::"
    "test_compiled_vllm_with_the_simulated_fp8_rollout_is_refused_in_one_line",
    "rollout.vllm_sync": "tests/test_vllm_adapter_sync.py::test_a_lora_run_syncs_the_adapter_with_the_merged_paths_mismatch",
    "rollout.server": "tests/test_rollout_server.py::test_twenty_step_runs_against_the_server_learn_and_carry_versions",
    "rollout.async_mode": "tests/test_rollout_server.py::test_one_step_overlaps_generation_with_training",
    "rollout.server_secret_file": "tests/test_rollout_server_auth.py::"
    "test_a_trainer_reaches_the_server_only_with_its_secret",
    "rollout.server_timeout": "tests/test_rollout_server.py::"
    "test_killed_server_stops_the_run_with_a_checkpoint_and_one_event",
    "precision.fp8_flow": "tests/test_precision.py::test_fp8_flow_resolution",
    "precision.loss_scale_backoff": "tests/test_fp16_run.py::test_fp16_run_loss_scale_grows_after_interval_and_no_nan",
    "algo.dynamic_sampling": "tests/test_dynamic_sampling.py::"
    "test_rounds_refill_the_rollout_with_groups_that_have_signal",
    "algo.dynamic_sampling_max_rounds": "tests/test_dynamic_sampling.py::"
    "test_the_round_limit_fills_with_the_first_dropped_groups_and_warns",
    "algo.router_replay": "tests/test_moe.py::test_router_replay_closes_the_bf16_routing_gap",
    "train.best_metric": "tests/test_knobs_small.py::test_keep_checkpoints_keeps_the_newest_and_the_best",
    "train.max_bad_steps": "tests/test_divergence.py::test_a_nan_streak_stops_the_run_naming_cause_and_last_good_checkpoint",
    "train.micro_batch_size": "tests/test_micro_batch_auto.py::test_auto_micro_batches_give_the_whole_batch_loss_and_gradient",
    "train.micro_batch_tokens": "tests/test_packed_batches.py::test_token_budget_gives_the_whole_batch_loss_and_gradients",
    "train.parallel": "tests/test_distributed.py::test_ddp_step_equals_one_process",
    "train.max_staleness": "tests/test_rollout_server.py::test_resumed_in_flight_run_takes_prompts_once_and_staleness_0_drops_lagged_tokens",
    "train.dist_timeout_s": "tests/test_distributed.py::test_a_lost_rank_ends_the_run",
    "train.shared_prefix": "tests/test_shared_prefix.py::test_shared_prefix_runs_in_the_trainer",
    "train.score_zero_advantage": "tests/test_skip_zero_advantage.py::test_skipping_zero_advantage_micro_batches_is_bitwise_exact",
    "data.split": "tests/test_data.py::test_data_errors_are_one_line",
    "data.subset": "tests/test_data.py::test_hf_dataset_offline_fails_with_one_line",
    "data.eval_split": "tests/test_data.py::test_data_errors_are_one_line",
    "rewards.timeout_s": "tests/test_rewards_user.py::test_hanging_function_is_bounded_and_its_thread_ends",
    "rewards.code_timeout_s": "tests/test_sandbox.py::test_infinite_loop_is_killed",
    "rewards.code_workers": "tests/test_sandbox.py::test_code_exec_reward_extracts_the_code_block_and_runs_in_parallel",
    "rewards.code_max_output": "tests/test_sandbox.py::test_printing_a_gigabyte_is_cut_at_the_cap",
    "rewards.sandbox": "tests/test_sandbox.py::test_auto_is_bwrap_where_it_works_else_namespaces",
    "rewards.sandbox_force_none": "tests/test_sandbox.py::test_forced_none_is_accepted",
    "rewards.reward_model_batch_size": "tests/test_reward_model.py::test_batch_size_sets_the_forward_passes",
    "report.to": "tests/test_trackers.py::test_wandb_offline_run_holds_every_step_and_the_samples",
    "report.project": "tests/test_trackers.py::test_wandb_offline_run_holds_every_step_and_the_samples",
    "alerts.rules": "tests/test_alerts.py::test_k3_rules_fire_once_per_crossing_in_a_real_run",
    "alerts.on": "tests/test_alerts.py::test_k3_rules_fire_once_per_crossing_in_a_real_run",
    "alerts.webhook": "tests/test_alerts.py::test_the_webhook_received_every_alert_of_the_run",
    "alerts.desktop": "tests/test_alerts.py::test_desktop_notification_runs_notify_send",
}

TABLES = {"RUN": RUN, "BUILT": BUILT, "REWARD": REWARD, "DATA": DATA, "PLANNER": PLANNER, "ELSEWHERE": ELSEWHERE}


def test_every_key_has_exactly_one_proof():
    named = [key for table in TABLES.values() for key in table]
    assert sorted(named) == sorted(config.all_keys()), (
        f"keys without a proof: {sorted(set(config.all_keys()) - set(named))}; "
        f"unknown or named twice: {sorted(k for k in set(named) if named.count(k) > 1 or k not in config.all_keys())}"
    )


def test_the_user_table_names_every_key_once():
    doc = (ROOT / "docs" / "config-keys.md").read_text()
    assert {key: doc.count(f"| `{key}` |") for key in config.all_keys() if doc.count(f"| `{key}` |") != 1} == {}


# ---- RUN and BUILT ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def places(tmp_path_factory, random_tiny_model):
    """Values that are paths: another model (same architecture, other weights) and a JSONL dataset."""
    root = tmp_path_factory.mktemp("keys")
    jsonl = root / "data.jsonl"
    jsonl.write_text(
        "".join(
            json.dumps(
                {"prompt": f"{a}+{b}=", "answer": str(a + b), "question": f"{b}+{a}=", "solution": str(a + b + 1)}
            )
            + "\n"
            for a in range(9)
            for b in range(9)
        )
    )
    return {"other_model": str(random_tiny_model), "jsonl": str(jsonl)}


def _fill(items, places) -> list[str]:
    """The overrides with {other_model} and {jsonl} replaced by their paths."""
    out = []
    for item in items:
        for name, path in places.items():
            item = item.replace("{" + name + "}", path)
        out.append(item)
    return out


@pytest.fixture(scope="module")
def run_of(tmp_path_factory, places):
    """What a short run with these overrides did, as comparable JSON text (cached per override list)."""
    from grpo_studio.engine.run.trainer import Trainer

    cache: dict[tuple, dict] = {}

    def run(overrides: list[str], fresh: bool = False) -> dict:
        overrides = tuple(_fill(overrides, places))
        if overrides in cache and not fresh:
            return cache[overrides]
        run_dir = tmp_path_factory.mktemp("run")
        trainer = Trainer(config.load("tiny-arith", [*SHORT, *overrides]), run_dir)
        try:
            trainer.run()
        finally:
            trainer.close()
        weights = hashlib.sha256(
            b"".join(p.detach().float().numpy().tobytes() for p in trainer.policy.parameters() if p.requires_grad)
        ).hexdigest()
        volatile = ("time", "perf/", "mem/")
        rows = [{k: v for k, v in row.items() if not k.startswith(volatile)} for row in read_rows(run_dir / METRICS)]
        events = [
            (e["event"], re.sub(r"\d+(\.\d+)?s\b", "", e["message"])) for e in read_rows(run_dir / "events.jsonl")
        ]
        samples = read_rows(run_dir / "samples.jsonl") if (run_dir / "samples.jsonl").exists() else []
        files = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if "checkpoints" in p.parts)
        cache[overrides] = {
            part: json.dumps(value, sort_keys=True)
            for part, value in (
                ("weights", weights),
                ("metrics", rows),
                ("events", events),
                ("samples", samples),
                ("checkpoint files", files),
            )
        }
        return cache[overrides]

    return run


def test_the_probe_run_is_deterministic(run_of):
    """Else every RUN proof below would pass by chance."""
    assert run_of([]) == run_of([], fresh=True)


@pytest.mark.parametrize("key", RUN)
def test_key_changes_the_run(run_of, key):
    value, context = RUN[key]
    before, after = run_of(context), run_of([*context, f"{key}={value}"])
    assert [part for part in before if before[part] != after[part]], f"{key} = {value} changed nothing in the run"


@pytest.mark.parametrize("key", BUILT)
def test_key_changes_the_built_trainer(tmp_path, key):
    from grpo_studio.engine.run.trainer import Trainer

    value, context, read = BUILT[key]
    seen = []
    for overrides in (context, [*context, f"{key}={value}"]):
        trainer = Trainer(config.load("tiny-arith", [*SHORT, *overrides]), tmp_path / str(len(seen)))
        seen.append(read(trainer))
        trainer.close()
    assert seen[0] != seen[1]


# ---- REWARD, DATA, PLANNER ----------------------------------------------------------------------


def _scores(overrides: list[str]) -> list[list[float]]:
    from grpo_studio import rewards

    cfg = config.load("tiny-arith", overrides)
    n = len(COMPLETIONS)
    return rewards.score(
        rewards.build(cfg.rewards),
        ["6+1="] * n,
        COMPLETIONS,
        {"answer": ["7"] * n, **{k: [v] * n for k, v in CODE_ROW.items()}},
    )


@pytest.mark.parametrize("key", REWARD)
def test_key_changes_the_rewards(key):
    value, context = REWARD[key]
    before, after = _scores(context), _scores([*context, f"{key}={value}"])
    assert json.dumps(before) != json.dumps(after)  # NaN (None) scores compare as text


def _rendered(overrides: list[str], places) -> list[str]:
    from grpo_studio.engine.model import policy_loader
    from grpo_studio.engine.prompts import data, prompt_render

    cfg = config.load("tiny-arith", _fill(overrides, places))
    tokenizer = policy_loader.load_tokenizer(policy_loader.resolve_model_path(cfg.model.name))
    rows = data.load_rows(cfg.data, "train")
    return [f"{prompt_render.prompt_text(row, cfg.data, tokenizer)} -> {row['answer']}" for row in rows[:5]] + [
        str(len(rows))
    ]


@pytest.mark.parametrize("key", DATA)
def test_key_changes_the_data(key, places):
    value, context = DATA[key]
    assert _rendered(context, places) != _rendered([*context, f"{key}={value}"], places)


@pytest.mark.parametrize("key", PLANNER)
def test_key_changes_the_plan(key):
    value, context = PLANNER[key]
    card = model_card.load("qwen3-8b")
    plans = [
        vram.estimate(card, config.load("tiny-arith", sets), "accurate", 80.0)
        for sets in (context, [*context, f"{key}={value}"])
    ]
    assert [(r.name, r.gib) for r in plans[0].rows] != [(r.name, r.gib) for r in plans[1].rows]


# ---- ELSEWHERE ----------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ELSEWHERE)
def test_the_named_proof_exists(key):
    path, name = ELSEWHERE[key].split("::")
    tree = ast.parse((ROOT / path).read_text())
    assert name in {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_logits_chunk_runs_the_chunked_path_in_the_trainer(tmp_path, monkeypatch):
    """Its numbers equal the materialised path's (tests/test_logprobs.py); here: the trainer takes that path."""
    from grpo_studio.engine.run.trainer import Trainer
    from grpo_studio.engine.train.chunked_logsoftmax import ChunkedLogSoftmax

    calls = []
    apply = ChunkedLogSoftmax.apply
    monkeypatch.setattr(ChunkedLogSoftmax, "apply", lambda *a: calls.append(1) or apply(*a))
    for chunk in (0, 4):
        trainer = Trainer(
            config.load("tiny-arith", [*SHORT, "train.steps=1", f"model.logits_chunk={chunk}"]), tmp_path / str(chunk)
        )
        trainer.run()
        trainer.close()
        if chunk == 0:
            assert calls == []
    assert calls


@pytest.mark.gpu
def test_offload_checkpoints_moves_saved_activations_to_host():
    """On CUDA the tensors saved for backward live in host RAM (on a CPU they are there already)."""
    import torch

    from grpo_studio.engine.model import policy_loader

    cfg = config.load("tiny-arith", ["model.offload_checkpoints=true"])
    x = torch.randn(4096, 4096, device="cuda", requires_grad=True)
    torch.cuda.synchronize()
    peaks = []
    for offload in (False, True):
        cfg.model.offload_checkpoints = offload
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with policy_loader.offload_activations(cfg):
            y = (x.sin() * x.cos()).sum()
        peaks.append(torch.cuda.memory_allocated() - base)
        y.backward()
    assert peaks[1] < peaks[0] / 2
