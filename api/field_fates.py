"""The fate of every field of TRL 1.16's GRPOConfig, in one table (FATES, in TRL's field order):

    mapped     the value becomes a studio config key (`key` when it is one key as is; otherwise
               grpo_config.studio_keys converts it, as `text` says)
    no effect  accepted at any value; `text` says why the studio needs nothing from it
    refused    accepted at TRL's default; any other value is one UserError line naming the field, the value
               and `text` (what to do instead)

docs/python-api.md's field table is `markdown_table()` (tests/test_python_api_fields.py checks the page holds
it), and the same test fails when TRL has a field this table does not decide on.
"""

from __future__ import annotations

from dataclasses import dataclass

from .contract.errors import UserError

MAPPED, NO_EFFECT, REFUSED = "mapped", "no effect", "refused"
EVAL_LOOP = "transformers' prediction-loop bookkeeping; the eval sums its own numbers over the eval completions"
TRL_VERSION = "1.16.0"


@dataclass(frozen=True)
class Fate:
    field: str
    default: object  # TRL's default (GRPOConfig's too)
    kind: str  # MAPPED, NO_EFFECT or REFUSED
    text: str  # mapped: the key and its conversion; no effect: why; refused: what to do instead
    key: str = ""  # mapped one to one: the studio key the value is set to as it is


FATES: tuple[Fate, ...] = (
    Fate("output_dir", None, MAPPED, "the run directory: config.toml, the streams, checkpoints (None: trainer_output)"),
    Fate(
        "per_device_train_batch_size",
        8,
        MAPPED,
        "completions per micro-step: train.micro_batch_size; with gradient_accumulation_steps and num_generations it sets train.prompts_per_step (the batch arithmetic)",
    ),
    Fate(
        "num_train_epochs",
        3.0,
        MAPPED,
        "with max_steps <= 0: train.steps = ceil(epochs x optimizer steps per pass over train_dataset), as TRL counts them",
    ),
    Fate("max_steps", -1, MAPPED, "train.steps when > 0"),
    Fate("learning_rate", 1e-06, MAPPED, "train.lr", key="train.lr"),
    Fate(
        "lr_scheduler_type",
        "linear",
        MAPPED,
        "train.lr_schedule: linear, cosine, constant (constant_with_warmup = constant after train.warmup_steps)",
    ),
    Fate("lr_scheduler_kwargs", None, REFUSED, "grpo-studio's schedules take no arguments; remove it"),
    Fate("warmup_steps", 0, MAPPED, "train.warmup_steps (a value below 1 is a fraction of the steps, as transformers)"),
    Fate(
        "optim",
        "adamw_torch_fused",
        MAPPED,
        "adamw_torch and adamw_torch_fused: the studio's torch AdamW; others refused",
    ),
    Fate("optim_args", None, REFUSED, "grpo-studio's AdamW takes no extra arguments; remove it"),
    Fate("weight_decay", 0.0, MAPPED, "train.weight_decay", key="train.weight_decay"),
    Fate(
        "adam_beta1",
        0.9,
        REFUSED,
        "grpo-studio's AdamW uses torch's defaults (0.9, 0.999, 1e-8), TRL's defaults too; remove it",
    ),
    Fate(
        "adam_beta2",
        0.999,
        REFUSED,
        "grpo-studio's AdamW uses torch's defaults (0.9, 0.999, 1e-8), TRL's defaults too; remove it",
    ),
    Fate(
        "adam_epsilon",
        1e-08,
        REFUSED,
        "grpo-studio's AdamW uses torch's defaults (0.9, 0.999, 1e-8), TRL's defaults too; remove it",
    ),
    Fate("optim_target_modules", None, REFUSED, "grpo-studio's AdamW takes no extra arguments; remove it"),
    Fate(
        "gradient_accumulation_steps",
        1,
        MAPPED,
        "micro-steps per optimizer step: train.prompts_per_step = per_device_train_batch_size x gradient_accumulation_steps / num_generations",
    ),
    Fate(
        "average_tokens_across_devices",
        True,
        NO_EFFECT,
        "one process; under train.parallel the studio reduces token counts itself",
    ),
    Fate("max_grad_norm", 1.0, MAPPED, "train.grad_clip", key="train.grad_clip"),
    Fate("label_smoothing_factor", 0.0, REFUSED, "GRPO has no cross-entropy labels; remove it"),
    Fate("bf16", None, MAPPED, "model.dtype: bf16, fp16, or fp32 when neither (TRL turns bf16 on unless fp16 is set)"),
    Fate("fp16", False, MAPPED, "model.dtype: bf16, fp16, or fp32 when neither (TRL turns bf16 on unless fp16 is set)"),
    Fate("bf16_full_eval", False, NO_EFFECT, "evaluation computes in model.dtype"),
    Fate("fp16_full_eval", False, NO_EFFECT, "evaluation computes in model.dtype"),
    Fate("tf32", None, REFUSED, "grpo-studio leaves TF32 matmuls at torch's default; remove it"),
    Fate(
        "gradient_checkpointing",
        True,
        MAPPED,
        "model.gradient_checkpointing (TRL's default True)",
        key="model.gradient_checkpointing",
    ),
    Fate(
        "gradient_checkpointing_kwargs",
        None,
        MAPPED,
        "None or {'use_reentrant': False}: the studio checkpoints non-reentrant; others refused",
    ),
    Fate("torch_compile", False, REFUSED, "grpo-studio does not torch.compile the policy; remove it"),
    Fate("torch_compile_backend", None, REFUSED, "grpo-studio does not torch.compile the policy; remove it"),
    Fate("torch_compile_mode", None, REFUSED, "grpo-studio does not torch.compile the policy; remove it"),
    Fate("use_liger_kernel", False, REFUSED, "use model.logits_chunk, the studio's fused chunked log-softmax"),
    Fate("liger_kernel_config", None, NO_EFFECT, "read only with use_liger_kernel (refused)"),
    Fate("use_cache", False, NO_EFFECT, "the sampler keeps its own KV cache; the training forward needs none"),
    Fate("neftune_noise_alpha", None, REFUSED, "NEFTune noise is an SFT technique; grpo-studio does not apply it"),
    Fate("torch_empty_cache_steps", None, NO_EFFECT, "the engine frees device memory by phase itself"),
    Fate("auto_find_batch_size", False, REFUSED, "TRL refuses it too; set per_device_train_batch_size"),
    Fate(
        "logging_strategy",
        "steps",
        MAPPED,
        "when callbacks get on_log: every logging_steps steps, with the window's means as TRL logs them (metrics.jsonl has every step)",
    ),
    Fate(
        "logging_steps",
        10,
        MAPPED,
        "when callbacks get on_log: every logging_steps steps, with the window's means as TRL logs them (metrics.jsonl has every step)",
    ),
    Fate(
        "logging_first_step",
        False,
        MAPPED,
        "when callbacks get on_log: every logging_steps steps, with the window's means as TRL logs them (metrics.jsonl has every step)",
    ),
    Fate(
        "log_on_each_node",
        True,
        NO_EFFECT,
        "transformers.Trainer's console bookkeeping; the run's streams (metrics.jsonl, events.jsonl) are fixed",
    ),
    Fate(
        "logging_nan_inf_filter",
        True,
        NO_EFFECT,
        "transformers.Trainer's console bookkeeping; the run's streams (metrics.jsonl, events.jsonl) are fixed",
    ),
    Fate(
        "include_num_input_tokens_seen",
        "no",
        NO_EFFECT,
        "transformers.Trainer's console bookkeeping; the run's streams (metrics.jsonl, events.jsonl) are fixed",
    ),
    Fate(
        "log_level",
        "passive",
        NO_EFFECT,
        "transformers.Trainer's console bookkeeping; the run's streams (metrics.jsonl, events.jsonl) are fixed",
    ),
    Fate(
        "log_level_replica",
        "warning",
        NO_EFFECT,
        "transformers.Trainer's console bookkeeping; the run's streams (metrics.jsonl, events.jsonl) are fixed",
    ),
    Fate(
        "disable_tqdm",
        None,
        NO_EFFECT,
        "transformers.Trainer's console bookkeeping; the run's streams (metrics.jsonl, events.jsonl) are fixed",
    ),
    Fate(
        "report_to",
        "none",
        MAPPED,
        "report.to: tensorboard, wandb, trackio ('all': the installed ones); none; others refused",
    ),
    Fate("run_name", None, NO_EFFECT, "the studio names a run after its run directory (output_dir)"),
    Fate("project", "huggingface", MAPPED, "report.project, when report_to names wandb or trackio"),
    Fate("trackio_space_id", None, REFUSED, "grpo-studio's trackio outlet logs locally; remove it"),
    Fate("trackio_bucket_id", None, REFUSED, "grpo-studio's trackio outlet logs locally; remove it"),
    Fate("trackio_static_space_id", None, REFUSED, "grpo-studio's trackio outlet logs locally; remove it"),
    Fate(
        "eval_strategy",
        "no",
        MAPPED,
        "train.eval_every: 'steps' every eval_steps, 'epoch' every pass over train_dataset, 'no' 0; the eval rows are eval_dataset's (data.eval_source), logged as TRL's eval_reward and eval_rewards/NAME/mean (no eval_loss)",
    ),
    Fate(
        "eval_steps",
        None,
        MAPPED,
        "train.eval_every with eval_strategy 'steps' (None: logging_steps; below 1: a fraction of the steps, as transformers)",
    ),
    Fate("eval_delay", 0, REFUSED, "grpo-studio evaluates every train.eval_every steps from the first; remove it"),
    Fate(
        "per_device_eval_batch_size",
        8,
        NO_EFFECT,
        "the eval samples all its prompts in one sampler call (TRL's check that it divides by num_generations_eval is kept)",
    ),
    Fate("prediction_loss_only", False, NO_EFFECT, "the eval computes no loss (no eval_loss), only TRL's rewards"),
    Fate(
        "eval_on_start",
        False,
        MAPPED,
        "train.eval_before, beside eval_strategy 'steps' or 'epoch' (with 'no': refused)",
    ),
    Fate("eval_do_concat_batches", True, NO_EFFECT, EVAL_LOOP),
    Fate("eval_use_gather_object", False, NO_EFFECT, EVAL_LOOP),
    Fate("eval_accumulation_steps", None, NO_EFFECT, EVAL_LOOP),
    Fate("include_for_metrics", [], NO_EFFECT, EVAL_LOOP),
    Fate("batch_eval_metrics", False, NO_EFFECT, EVAL_LOOP),
    Fate(
        "save_only_model",
        False,
        NO_EFFECT,
        "checkpoints always carry the optimizer and the data cursor, so a resume is exact",
    ),
    Fate(
        "save_strategy",
        "steps",
        MAPPED,
        "train.save_every: save_steps with 'steps' (below 1: a fraction of the steps), rounded up to whole generations; 0 with 'no'; the studio also saves at the end",
    ),
    Fate(
        "save_steps",
        500,
        MAPPED,
        "train.save_every: save_steps with 'steps' (below 1: a fraction of the steps), rounded up to whole generations; 0 with 'no'; the studio also saves at the end",
    ),
    Fate("save_on_each_node", False, NO_EFFECT, "one process writes"),
    Fate("save_total_limit", None, MAPPED, "train.keep_checkpoints (None: 0, keep all)"),
    Fate("enable_jit_checkpoint", False, NO_EFFECT, "the studio always checkpoints on SIGTERM and SIGINT"),
    Fate("push_to_hub", False, REFUSED, "grpo-studio does not upload; `grpo-studio export` the run, then push"),
    Fate("hub_token", None, NO_EFFECT, "read only with push_to_hub (refused)"),
    Fate("hub_private_repo", None, NO_EFFECT, "read only with push_to_hub (refused)"),
    Fate("hub_model_id", None, NO_EFFECT, "read only with push_to_hub (refused)"),
    Fate("hub_strategy", "every_save", NO_EFFECT, "read only with push_to_hub (refused)"),
    Fate("hub_always_push", False, NO_EFFECT, "read only with push_to_hub (refused)"),
    Fate("hub_revision", None, NO_EFFECT, "read only with push_to_hub (refused)"),
    Fate(
        "load_best_model_at_end",
        False,
        REFUSED,
        "grpo-studio keeps the best checkpoint (train.best_metric) but does not reload it; remove it",
    ),
    Fate(
        "metric_for_best_model",
        None,
        REFUSED,
        "the best checkpoint is named by a studio metric (train.best_metric, CLI); remove it",
    ),
    Fate("greater_is_better", None, NO_EFFECT, "read only with metric_for_best_model (refused)"),
    Fate("ignore_data_skip", False, NO_EFFECT, "a checkpoint restores the prompt cursor exactly; nothing is skipped"),
    Fate("restore_callback_states_from_checkpoint", False, REFUSED, "callback state is not checkpointed; remove it"),
    Fate(
        "full_determinism", False, REFUSED, "runs are seeded (seed) but kernels are not forced deterministic; remove it"
    ),
    Fate("seed", 42, MAPPED, "train.seed", key="train.seed"),
    Fate("data_seed", None, REFUSED, "grpo-studio uses one seed (seed) for data order and sampling; remove it"),
    Fate(
        "use_cpu",
        False,
        MAPPED,
        "True: accepted where torch sees no GPU (training is on the CPU then); refused where it sees one (hide it with CUDA_VISIBLE_DEVICES='')",
    ),
    Fate(
        "accelerator_config",
        None,
        NO_EFFECT,
        "Accelerate's dataloader settings; the studio has no Accelerate dataloader",
    ),
    Fate(
        "parallelism_config",
        None,
        REFUSED,
        "the Python API trains in one process; use `grpo-studio train --nproc N` with train.parallel = fsdp",
    ),
    Fate("dataloader_drop_last", False, NO_EFFECT, "prompts come from an in-memory stream, not a DataLoader"),
    Fate("dataloader_num_workers", 0, NO_EFFECT, "prompts come from an in-memory stream, not a DataLoader"),
    Fate("dataloader_pin_memory", True, NO_EFFECT, "prompts come from an in-memory stream, not a DataLoader"),
    Fate("dataloader_persistent_workers", False, NO_EFFECT, "prompts come from an in-memory stream, not a DataLoader"),
    Fate("dataloader_prefetch_factor", None, NO_EFFECT, "prompts come from an in-memory stream, not a DataLoader"),
    Fate(
        "dataloader_multiprocessing_context", None, NO_EFFECT, "prompts come from an in-memory stream, not a DataLoader"
    ),
    Fate("dataloader_in_order", True, NO_EFFECT, "prompts come from an in-memory stream, not a DataLoader"),
    Fate(
        "remove_unused_columns",
        False,
        MAPPED,
        "False (TRL's default): every column reaches the reward functions; True: only prompt",
    ),
    Fate("label_names", None, NO_EFFECT, "GRPO has no labels and no length grouping"),
    Fate(
        "train_sampling_strategy",
        "random",
        REFUSED,
        "prompts are drawn in a seeded shuffled order ('random'); remove it",
    ),
    Fate("length_column_name", "length", NO_EFFECT, "GRPO has no labels and no length grouping"),
    Fate(
        "ddp_find_unused_parameters",
        None,
        REFUSED,
        "the Python API trains in one process; use `grpo-studio train --nproc N` with train.parallel = ddp",
    ),
    Fate(
        "ddp_bucket_cap_mb",
        None,
        REFUSED,
        "the Python API trains in one process; use `grpo-studio train --nproc N` with train.parallel = ddp",
    ),
    Fate(
        "ddp_broadcast_buffers",
        None,
        REFUSED,
        "the Python API trains in one process; use `grpo-studio train --nproc N` with train.parallel = ddp",
    ),
    Fate(
        "ddp_static_graph",
        None,
        REFUSED,
        "the Python API trains in one process; use `grpo-studio train --nproc N` with train.parallel = ddp",
    ),
    Fate(
        "ddp_backend",
        None,
        REFUSED,
        "the Python API trains in one process; use `grpo-studio train --nproc N` with train.parallel = ddp",
    ),
    Fate(
        "ddp_timeout",
        1800,
        REFUSED,
        "the Python API trains in one process; use `grpo-studio train --nproc N` with train.parallel = ddp",
    ),
    Fate(
        "fsdp",
        None,
        REFUSED,
        "the Python API trains in one process; use `grpo-studio train --nproc N` with train.parallel = fsdp",
    ),
    Fate(
        "fsdp_config",
        None,
        REFUSED,
        "the Python API trains in one process; use `grpo-studio train --nproc N` with train.parallel = fsdp",
    ),
    Fate(
        "deepspeed",
        None,
        REFUSED,
        "the Python API trains in one process; use `grpo-studio train --nproc N` with train.parallel = fsdp",
    ),
    Fate("debug", "", REFUSED, "transformers' debug modes are not available; remove it"),
    Fate(
        "skip_memory_metrics",
        True,
        NO_EFFECT,
        "transformers.Trainer's console bookkeeping; the run's streams (metrics.jsonl, events.jsonl) are fixed",
    ),
    Fate("do_train", False, NO_EFFECT, "flags for scripts; the trainer reads none of them"),
    Fate("do_eval", False, NO_EFFECT, "flags for scripts; the trainer reads none of them"),
    Fate("do_predict", False, NO_EFFECT, "flags for scripts; the trainer reads none of them"),
    Fate(
        "resume_from_checkpoint",
        None,
        NO_EFFECT,
        "scripts pass it to train(resume_from_checkpoint=...), which the API honours",
    ),
    Fate("local_rank", -1, NO_EFFECT, "set by launchers; the API trains in one process"),
    Fate(
        "model_init_kwargs",
        None,
        MAPPED,
        "dtype: model.dtype; attn_implementation, device_map: no effect; other keys refused",
    ),
    Fate("trust_remote_code", False, REFUSED, "grpo-studio loads transformers' own architectures only; remove it"),
    Fate("router_aux_loss_coef", None, REFUSED, "no MoE auxiliary loss in grpo-studio; remove it"),
    Fate(
        "disable_dropout",
        False,
        REFUSED,
        "the policy trains with its config's dropout (0 in SmolLM2, Qwen, Llama); set it to 0 there",
    ),
    Fate("cast_lm_head_to_fp32", False, REFUSED, "use model.dtype = fp32, or model.logits_chunk (an fp32 log-softmax)"),
    Fate("num_generations", 8, MAPPED, "rollout.num_generations", key="rollout.num_generations"),
    Fate("num_generations_eval", None, MAPPED, "train.eval_k, samples per eval prompt (None: num_generations)"),
    Fate("max_completion_length", 512, MAPPED, "rollout.max_completion_len", key="rollout.max_completion_len"),
    Fate(
        "ds3_gather_for_generation",
        True,
        NO_EFFECT,
        "the sampler and the packer choose cache and padding; no DeepSpeed",
    ),
    Fate(
        "shuffle_dataset",
        True,
        MAPPED,
        "True: the studio's seeded shuffled order (a different permutation from TRL's); False is refused",
    ),
    Fate("pad_to_multiple_of", "auto", NO_EFFECT, "the sampler and the packer choose cache and padding; no DeepSpeed"),
    Fate(
        "generation_batch_size",
        None,
        MAPPED,
        "completions per generation: steps_per_generation = generation_batch_size / per_device_train_batch_size, as TRL",
    ),
    Fate(
        "steps_per_generation",
        None,
        MAPPED,
        "train.steps_per_generation = steps_per_generation / gradient_accumulation_steps (TRL counts micro-steps, the studio optimizer steps)",
    ),
    Fate("temperature", 1.0, MAPPED, "rollout.temperature", key="rollout.temperature"),
    Fate("top_p", 1.0, MAPPED, "rollout.top_p", key="rollout.top_p"),
    Fate("top_k", 0, MAPPED, "rollout.top_k", key="rollout.top_k"),
    Fate("min_p", None, REFUSED, "the sampler takes temperature, top_p and top_k; remove it"),
    Fate(
        "generation_kwargs",
        None,
        REFUSED,
        "the sampler takes temperature, top_p, top_k and max_completion_length; remove it",
    ),
    Fate(
        "chat_template_kwargs",
        None,
        MAPPED,
        "accepted when the chat template reads none of its names (e.g. enable_thinking on SmolLM2); refused otherwise",
    ),
    Fate("repetition_penalty", 1.0, REFUSED, "it samples away from the policy the loss assumes; remove it"),
    Fate("cache_implementation", None, NO_EFFECT, "the sampler and the packer choose cache and padding; no DeepSpeed"),
    Fate("use_vllm", False, MAPPED, "rollout.backend: vllm, else hf"),
    Fate(
        "vllm_mode",
        "colocate",
        MAPPED,
        "'colocate': rollout.colocate; 'server' refused (the studio's server is `grpo-studio rollout-serve`, from the CLI)",
    ),
    Fate("vllm_model_impl", "vllm", REFUSED, "the studio runs vLLM's own model implementation; remove it"),
    Fate("vllm_enable_sleep_mode", False, MAPPED, "rollout.sleep, with use_vllm"),
    Fate(
        "vllm_structured_outputs_regex",
        None,
        REFUSED,
        "constrained decoding would sample away from the policy; remove it",
    ),
    Fate("vllm_server_base_url", None, NO_EFFECT, "read only with vllm_mode = 'server' (refused)"),
    Fate("vllm_server_host", "0.0.0.0", NO_EFFECT, "read only with vllm_mode = 'server' (refused)"),
    Fate("vllm_server_port", 8000, NO_EFFECT, "read only with vllm_mode = 'server' (refused)"),
    Fate("vllm_server_timeout", 240.0, NO_EFFECT, "read only with vllm_mode = 'server' (refused)"),
    Fate("vllm_group_port", 51216, NO_EFFECT, "read only with vllm_mode = 'server' (refused)"),
    Fate("vllm_gpu_memory_utilization", 0.3, MAPPED, "rollout.gpu_memory_utilization, with use_vllm"),
    Fate(
        "vllm_max_model_length", None, NO_EFFECT, "vLLM's length is rollout.max_prompt_len + rollout.max_completion_len"
    ),
    Fate("vllm_tensor_parallel_size", 1, REFUSED, "the studio's vLLM runs on one GPU; remove it"),
    Fate("beta", 0.0, MAPPED, "algo.beta", key="algo.beta"),
    Fate("num_iterations", 1, MAPPED, "train.num_iterations", key="train.num_iterations"),
    Fate("epsilon", 0.2, MAPPED, "algo.epsilon", key="algo.epsilon"),
    Fate("delta", None, MAPPED, "algo.delta (None: 0, off)"),
    Fate("epsilon_high", None, MAPPED, "algo.epsilon_high (None: epsilon, as TRL)"),
    Fate("sapo_temperature_neg", 1.05, NO_EFFECT, "read only by loss_type sapo and vespo (refused)"),
    Fate("sapo_temperature_pos", 1.0, NO_EFFECT, "read only by loss_type sapo and vespo (refused)"),
    Fate("vespo_k_pos", 2.0, NO_EFFECT, "read only by loss_type sapo and vespo (refused)"),
    Fate("vespo_lambda_pos", 3.0, NO_EFFECT, "read only by loss_type sapo and vespo (refused)"),
    Fate("vespo_k_neg", 3.0, NO_EFFECT, "read only by loss_type sapo and vespo (refused)"),
    Fate("vespo_lambda_neg", 2.0, NO_EFFECT, "read only by loss_type sapo and vespo (refused)"),
    Fate(
        "importance_sampling_level",
        "token",
        MAPPED,
        "algo.importance_sampling_level",
        key="algo.importance_sampling_level",
    ),
    Fate("reward_weights", None, MAPPED, "rewards.weights (one per reward function)"),
    Fate(
        "multi_objective_aggregation",
        "sum_then_normalize",
        REFUSED,
        "the studio sums weighted rewards before normalising (sum_then_normalize); remove it",
    ),
    Fate("scale_rewards", "group", MAPPED, "algo.scale_rewards (True: group, False: none)"),
    Fate("loss_type", "dapo", MAPPED, "algo.loss_type: grpo, bnpo, dr_grpo, dapo; cispo, sapo, luspo, vespo refused"),
    Fate(
        "mask_truncated_completions",
        False,
        MAPPED,
        "algo.mask_truncated_completions",
        key="algo.mask_truncated_completions",
    ),
    Fate("sync_ref_model", False, REFUSED, "the reference model is fixed in grpo-studio; remove it"),
    Fate("ref_model_mixup_alpha", 0.6, NO_EFFECT, "read only with sync_ref_model (refused)"),
    Fate("ref_model_sync_steps", 512, NO_EFFECT, "read only with sync_ref_model (refused)"),
    Fate("top_entropy_quantile", 1.0, REFUSED, "every completion token is trained on; remove it"),
    Fate("entropy_coef", 0.0, REFUSED, "no entropy bonus in grpo-studio; remove it"),
    Fate("use_adaptive_entropy", False, REFUSED, "no entropy bonus in grpo-studio; remove it"),
    Fate("entropy_coef_min", 0.0, NO_EFFECT, "read only with use_adaptive_entropy (refused)"),
    Fate("entropy_coef_max", 1.0, NO_EFFECT, "read only with use_adaptive_entropy (refused)"),
    Fate("entropy_coef_delta", 0.005, NO_EFFECT, "read only with use_adaptive_entropy (refused)"),
    Fate("entropy_target", 0.2, NO_EFFECT, "read only with use_adaptive_entropy (refused)"),
    Fate("max_tool_calling_iterations", None, MAPPED, "env.max_turns = iterations + 1 (None: 1000)"),
    Fate(
        "vllm_importance_sampling_correction",
        True,
        MAPPED,
        "with use_vllm: algo.is_level and algo.is_mode (token/sequence, truncate/mask); correction off: is_level none",
    ),
    Fate(
        "vllm_importance_sampling_mode",
        "sequence_mask",
        MAPPED,
        "with use_vllm: algo.is_level and algo.is_mode (token/sequence, truncate/mask); correction off: is_level none",
    ),
    Fate(
        "vllm_importance_sampling_clip_max",
        3.0,
        MAPPED,
        "algo.is_cap, with use_vllm (cap is TRL's old name of clip_max)",
    ),
    Fate(
        "vllm_importance_sampling_clip_min",
        None,
        REFUSED,
        "the correction band's floor is the CLI's algo.is_floor; remove it",
    ),
    Fate("off_policy_mask_threshold", None, REFUSED, "use the CLI's algo.is_mode = mask with algo.is_cap; remove it"),
    Fate("use_bias_correction_kl", True, MAPPED, "algo.use_bias_correction_kl", key="algo.use_bias_correction_kl"),
    Fate("log_completions", False, NO_EFFECT, "samples.jsonl in the run directory holds every completion"),
    Fate("log_multimodal", True, NO_EFFECT, "samples.jsonl in the run directory holds every completion"),
    Fate("num_completions_to_print", None, NO_EFFECT, "samples.jsonl in the run directory holds every completion"),
    Fate("log_unique_prompts", False, NO_EFFECT, "samples.jsonl in the run directory holds every completion"),
    Fate(
        "log_completions_hub_repo", None, REFUSED, "grpo-studio does not upload; samples.jsonl is in the run directory"
    ),
    Fate("use_transformers_continuous_batching", False, NO_EFFECT, "the studio's sampler (hf or vLLM) generates"),
    Fate("transformers_continuous_batching_config", None, NO_EFFECT, "the studio's sampler (hf or vLLM) generates"),
    Fate("use_transformers_paged", False, NO_EFFECT, "the studio's sampler (hf or vLLM) generates"),
    Fate(
        "vllm_importance_sampling_cap", None, MAPPED, "algo.is_cap, with use_vllm (cap is TRL's old name of clip_max)"
    ),
)
BY_FIELD = {fate.field: fate for fate in FATES}


def refuse(field: str, value: object, why: str) -> UserError:
    """The one line of a GRPOConfig field (or GRPOTrainer argument) the studio cannot honour."""
    return UserError(why, kind="GRPOConfig", key=field, value=value)


def check_refused(values: dict) -> None:
    """Every refused field left at TRL's default; the first that is not is one line."""
    for fate in FATES:
        if fate.kind == REFUSED and values[fate.field] != fate.default:
            raise refuse(fate.field, values[fate.field], fate.text)


def markdown_table() -> str:
    """docs/python-api.md's field table."""
    lines = ["| field | TRL default | fate | in grpo-studio |", "|---|---|---|---|"]
    for fate in FATES:
        lines.append(f"| `{fate.field}` | `{fate.default!r}` | {fate.kind} | {fate.text.replace('|', '/')} |")
    return "\n".join(lines) + "\n"
