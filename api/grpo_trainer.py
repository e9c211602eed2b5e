"""GRPOTrainer: TRL 1.16's constructor over the studio's engine. train() runs as `grpo-studio train` does, in this
process: the same config validation, run-directory checks and pre-flight (contract/launch.py), the same engine
Trainer, the same run directory (args.output_dir: config.toml, the streams, checkpoints), which
`grpo-studio attach OUTPUT_DIR` shows live.

What TRL takes as objects reaches the engine so:
    reward functions, environment factories   registered in this process (contract/user_code.REGISTRY) and named
                                              'py:NAME' in config.toml; async ones are awaited (rewards/runner.py)
    reward models (an id, a folder, an object) saved to RUN/reward_models/NAME with their processing class (TRL's
                                              default: the model id's tokenizer), 'rm:FOLDER' (rewards/reward_model.py);
                                              a saved folder given with no processing class is read where it is
    tools=[...]                               an environment class with the tools as its methods (reset -> None)
    train_dataset                             written to RUN/data/train.jsonl, data.source
    eval_dataset (with an eval_strategy)      written to RUN/data/eval.jsonl, data.eval_source
    a model object (PreTrainedModel)          saved to RUN/model with its tokenizer, model.name
    peft_config (LoraConfig)                  model.lora_rank/alpha/dropout/target_modules (no peft_config: a
                                              full fine-tune, as TRL)
    quantization_config (4-bit NF4)           model.load_in_4bit, model.double_quant
Refused in one line: rollout_func (it drives TRL's own trainer object), optimizers other than (None, None) (the
studio builds its AdamW and schedule from the config and checkpoints them), more than one process.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

from .contract import user_code
from .contract.config import set_key, validate
from .contract.errors import UserError
from .contract.run_files import atomic_write_text
from .field_fates import refuse
from .grpo_config import GRPOConfig, from_trl, studio_config, studio_keys, world_size

ENV_PROMPT_LEN = 2048  # rollout.max_prompt_len of an environment's episodes, which grow turn by turn


def _error(why: str, argument: str, value=UserError) -> UserError:
    if value is UserError:
        return UserError(why, kind="GRPOTrainer", key=argument)
    return UserError(why, kind="GRPOTrainer", key=argument, value=value)


def _name_of(fn) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


class GRPOTrainer:
    """TRL's GRPOTrainer signature; train(), save_model(). Mistakes are one UserError line each."""

    def __init__(
        self,
        model,
        reward_funcs=None,
        args=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
        tools=None,
        rollout_func=None,
        environment_factory=None,
    ):
        if rollout_func is not None:
            raise _error(
                "grpo-studio samples with its own sampler (rollout.backend); a rollout function that drives TRL's "
                "trainer object cannot run here; remove it",
                "rollout_func",
                _name_of(rollout_func),
            )
        if tuple(optimizers) != (None, None):
            raise _error(
                "grpo-studio builds its own AdamW and schedule from learning_rate, weight_decay, lr_scheduler_type "
                "and warmup_steps, and checkpoints them; pass (None, None)",
                "optimizers",
                "(" + ", ".join(type(o).__name__ for o in optimizers) + ")",
            )
        if world_size() > 1:
            raise _error(
                "the Python API trains in one process; for data parallelism use `grpo-studio train --nproc N`",
                "WORLD_SIZE",
                world_size(),
            )
        self.model_object = None if isinstance(model, str) else model
        model_name = model if isinstance(model, str) else _model_id(model)
        if args is None:  # TRL: GRPOConfig(f"{model_name}-GRPO")
            args = GRPOConfig(f"{model_name.split('/')[-1]}-GRPO")
        elif not isinstance(args, GRPOConfig):
            if not type(args).__module__.startswith("trl.") or not dataclasses.is_dataclass(args):
                raise _error("expected a grpo_studio.GRPOConfig or a trl.GRPOConfig", "args", type(args).__name__)
            args = from_trl(args)
        self.args = args
        self.run_dir = Path(args.output_dir or "trainer_output")
        self.processing_class = processing_class
        self.callbacks = [c() if isinstance(c, type) else c for c in callbacks or []]
        self.rows = _rows(train_dataset, environment_factory, args)
        self.eval_rows = self._eval_rows(eval_dataset, environment_factory)
        pairs = studio_keys(args, None if self.rows is None else len(self.rows))
        dtype = [value for key, value, _ in pairs if key == "model.dtype"][-1]
        pairs += self._model_keys(model, quantization_config, peft_config, dtype)
        self.saved_rewards: list[tuple[Path, object, object]] = []  # (folder, model, tokenizer), saved at train()
        pairs += self._reward_keys(reward_funcs, reward_processing_classes, environment_factory)
        pairs += self._env_keys(tools, environment_factory)
        pairs += self._data_keys()
        self.config = studio_config(pairs)
        self._hinted, self._engine = False, None

    # ---- the constructor's arguments as config keys ----------------------------------------------------------
    def _model_keys(self, model, quantization_config, peft_config, dtype: str) -> list[tuple]:
        if isinstance(model, str):
            keys = [("model.name", model, "model")]
        elif _is_model(model):
            if hasattr(model, "peft_config"):
                raise _error(
                    "a PeftModel: pass its base model and the LoraConfig as peft_config", "model", type(model).__name__
                )
            if getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False):
                raise _error(
                    "a quantised model object: pass its name and the BitsAndBytesConfig as quantization_config",
                    "model",
                    type(model).__name__,
                )
            keys = [("model.name", str(self.run_dir / "model"), "model")]
        else:
            raise _error("expected a model id, a folder, a packaged name or a PreTrainedModel", "model", repr(model))
        keys.append(("model.lora_rank", 0, "peft_config"))
        if peft_config is not None:
            if type(peft_config).__name__ != "LoraConfig":
                raise _error(
                    "grpo-studio trains LoRA adapters only; pass a LoraConfig",
                    "peft_config",
                    type(peft_config).__name__,
                )
            targets = peft_config.target_modules
            keys += [
                ("model.lora_rank", peft_config.r, "peft_config.r"),
                ("model.lora_alpha", peft_config.lora_alpha, "peft_config.lora_alpha"),
                ("model.lora_dropout", peft_config.lora_dropout, "peft_config.lora_dropout"),
            ]
            if targets is not None:
                targets = [targets] if isinstance(targets, str) else sorted(targets)
                keys.append(("model.lora_target_modules", targets, "peft_config.target_modules"))
        if quantization_config is not None:
            keys += self._quantization_keys(quantization_config, peft_config, dtype)
        return keys

    def _quantization_keys(self, quantization, peft_config, dtype: str) -> list[tuple]:
        """A BitsAndBytesConfig as model.load_in_4bit and model.double_quant: the base's linears in NF4 computing in
        model.dtype (engine/model/policy_loader.quantization), QLoRA's recipe; what that cannot honour is one line."""
        if self.model_object is not None:  # TRL: "your model is already instantiated ... will be ignored"
            print(
                "You passed `quantization_config` to the trainer, but your model is already instantiated. The "
                "`quantization_config` will be ignored.",
                file=sys.stderr,
                flush=True,
            )
            return []
        if peft_config is None:  # transformers' Trainer: no fine-tuning of a purely quantised model
            raise _error(
                "a 4-bit base cannot be fine-tuned in full; pass a LoraConfig as peft_config (QLoRA)",
                "quantization_config",
                type(quantization).__name__,
            )
        if not getattr(quantization, "load_in_4bit", False):
            raise _error(
                "grpo-studio quantises the base to 4-bit NF4 only: BitsAndBytesConfig(load_in_4bit=True, "
                "bnb_4bit_quant_type='nf4')",
                "quantization_config",
                type(quantization).__name__,
            )
        compute = str(quantization.bnb_4bit_compute_dtype).removeprefix("torch.")
        studio_dtype = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[dtype]
        checks = [
            ("bnb_4bit_quant_type", quantization.bnb_4bit_quant_type, "nf4", "set 'nf4' (QLoRA's NormalFloat4)"),
            (
                "bnb_4bit_compute_dtype",
                compute,
                ("float32", studio_dtype),
                f"the base computes in model.dtype ({studio_dtype}, from bf16/fp16); set that or leave float32",
            ),
            (
                "bnb_4bit_quant_storage",
                str(quantization.bnb_4bit_quant_storage).removeprefix("torch."),
                "uint8",
                "grpo-studio stores 4-bit weights as uint8; remove it",
            ),
            (
                "llm_int8_skip_modules",
                quantization.llm_int8_skip_modules,
                None,
                "grpo-studio quantises every linear but lm_head; remove it",
            ),
        ]
        for field, value, allowed, why in checks:
            if value not in (allowed if isinstance(allowed, tuple) else (allowed,)):
                raise _error(why, f"quantization_config.{field}", value)
        return [
            ("model.load_in_4bit", True, "quantization_config"),
            ("model.double_quant", bool(quantization.bnb_4bit_use_double_quant), "quantization_config"),
        ]

    def _reward_keys(self, reward_funcs, processing_classes, environment_factory) -> list[tuple]:
        funcs = [] if reward_funcs is None else reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
        if not funcs and environment_factory is None:  # TRL grpo_trainer.py: "No reward source provided"
            raise _error(
                "no reward source provided; pass reward_funcs, or an environment_factory whose class has get_reward",
                "reward_funcs",
                None,
            )
        classes = [None] * len(funcs)
        if processing_classes is not None:
            classes = processing_classes if isinstance(processing_classes, list) else [processing_classes]
            if len(classes) != len(funcs):
                raise _error(
                    f"the number of reward processing classes ({len(classes)}) must match the number of reward "
                    f"functions ({len(funcs)})",
                    "reward_processing_classes",
                )
        specs = []
        for i, (fn, tokenizer) in enumerate(zip(funcs, classes)):
            argument = f"reward_funcs[{i}]"
            if isinstance(fn, str) and tokenizer is None and (Path(fn).expanduser() / "config.json").is_file():
                specs.append(f"rm:{Path(fn).expanduser().absolute()}")  # saved with its tokenizer: read there
            elif isinstance(fn, str) or _is_model(fn):
                model = _reward_model(fn, argument) if isinstance(fn, str) else fn
                folder = self._reward_folder(fn if isinstance(fn, str) else _model_id(model), i)
                if tokenizer is None:
                    tokenizer = _reward_tokenizer(model, argument)
                self.saved_rewards.append((folder, model, tokenizer))
                specs.append(f"rm:{folder}")
            elif callable(fn):  # sync or async (rewards/runner.py awaits a coroutine function)
                specs.append(user_code.register(fn, _name_of(fn)))
            else:
                raise _error("expected a function, a reward model id or a reward model", argument, repr(fn))
        return [("rewards.funcs", specs, "reward_funcs")]

    def _reward_folder(self, model_id: str, i: int) -> Path:
        """RUN/reward_models/NAME, NAME the model id's last part as TRL names a reward model (its metrics:
        rewards/rm_NAME/*), or its position where that is empty or taken."""
        name = model_id.rstrip("/").split("/")[-1]
        taken = {folder.name for folder, _, _ in self.saved_rewards}
        return self.run_dir / "reward_models" / (name if name and name not in taken else str(i))

    def _env_keys(self, tools, environment_factory) -> list[tuple]:
        if tools is None and environment_factory is None:
            return []
        if isinstance(environment_factory, dict):
            raise _error(
                "grpo-studio runs one environment class per run; pass one factory", "environment_factory", "a dict"
            )
        factory = environment_factory if environment_factory is not None else _NoReset
        if tools:
            factory = _with_tools(factory, tools)
        return [
            ("env.environment", user_code.register(factory, _name_of(factory)), "environment_factory"),
            ("rollout.max_prompt_len", ENV_PROMPT_LEN, "environment_factory"),
        ]

    def _eval_rows(self, eval_dataset, environment_factory) -> list[dict] | None:
        """eval_dataset's rows where an eval_strategy evaluates them (transformers' Trainer: none then is an
        error); None where nothing is evaluated."""
        if self.args.eval_strategy in ("no", None):
            if eval_dataset is not None and not isinstance(eval_dataset, dict):
                _rows(eval_dataset, environment_factory, self.args, "eval_dataset")  # checked as TRL would
            return None
        if eval_dataset is None:
            raise _error(
                f"eval_strategy = {self.args.eval_strategy!r} evaluates an eval_dataset, and none was passed; pass "
                f"one, or set eval_strategy to 'no'",
                "eval_dataset",
                None,
            )
        if isinstance(eval_dataset, dict):
            raise _error(
                "grpo-studio evaluates one eval set; pass one Dataset (e.g. eval_dataset['name'])",
                "eval_dataset",
                f"a dict of {len(eval_dataset)}",
            )
        rows = _rows(eval_dataset, environment_factory, self.args, "eval_dataset")
        if self.rows and isinstance(rows[0]["prompt"], list) != isinstance(self.rows[0]["prompt"], list):
            kinds = ("conversational (messages)", "text")
            eval_kind, train_kind = kinds if isinstance(rows[0]["prompt"], list) else kinds[::-1]
            raise _error(
                f"its prompts are {eval_kind} and train_dataset's are {train_kind}; give both in one format",
                "eval_dataset",
                type(eval_dataset).__name__,
            )
        return rows

    def _data_keys(self) -> list[tuple]:
        conversational = isinstance(self.rows[0]["prompt"], list)
        data = self.run_dir / "data"
        keys = [
            ("data.source", str(data / "train.jsonl"), "train_dataset"),
            ("data.prompt_column", "prompt", "train_dataset"),
            ("data.eval_size", 0, "train_dataset"),
            ("data.system_prompt", "none", "train_dataset"),  # TRL adds no system prompt
            ("data.chat_template", "auto" if conversational else "none", "train_dataset"),  # text prompts as they are
        ]
        if self.eval_rows is not None:
            keys.append(("data.eval_source", str(data / "eval.jsonl"), "eval_dataset"))
        return keys

    # ---- train --------------------------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: bool | str | None = None) -> None:
        """Train to args.max_steps (or num_train_epochs) into args.output_dir; resume_from_checkpoint=True (or
        the newest checkpoint's path) continues the run there."""
        from .contract import launch

        resume = self._resume(resume_from_checkpoint)
        run_dir, cfg = self.run_dir, self.config
        self._prepare(resume)
        launch.preflight_check(cfg, force=False)
        if not self._hinted:
            print(f"watch it live: grpo-studio attach {run_dir}", flush=True)
            self._hinted = True
        from .engine.run.trainer import StoppedLoading, Trainer

        try:
            engine = Trainer(cfg, run_dir, resume=resume)
        except StoppedLoading as stopped:
            print(f"{stopped}: {run_dir}", flush=True)
            return
        from .callback_bridge import CallbackProgress

        steps_per_epoch = max(len(self.rows) // max(cfg.train.prompts_per_step, 1), 1)
        progress = CallbackProgress(
            launch.PlainProgress(cfg.train.steps), self.callbacks, self.args, engine, steps_per_epoch
        )
        save, restore = engine._save, engine._restore  # the hooks transformers' callbacks need, around the engine's
        evaluate = engine.eval_metrics

        def save_and_tell() -> None:
            save()
            progress.saved()

        def restore_and_begin(printer=None) -> None:  # transformers: the checkpoint's state, then on_train_begin
            restore(printer)
            progress.begin()

        def evaluate_and_tell(limit=None) -> dict:  # eval_on_start's, before step 1 (a step's come in its row)
            values = evaluate(limit)
            if engine.step_no == 0:
                progress.evaluated(values)
            return values

        engine._save, engine._restore, engine.eval_metrics = save_and_tell, restore_and_begin, evaluate_and_tell
        self._engine = engine
        try:
            if not resume:
                progress.begin()
            state = engine.run(progress)
            progress.end()
        finally:
            engine.close()
        print(f"{state} at step {engine.step_no}: {run_dir}", flush=True)

    def _prepare(self, resume: bool) -> None:
        """What `grpo-studio train` checks before a trainer starts (contract/launch.py), then the run's inputs
        written into the run directory and the prompts measured: self.config is then the run's."""
        from .contract import launch

        _rekeyed(lambda: launch.check_free(self.run_dir, resume))
        self._check_cpu()
        _rekeyed(lambda: launch.usable_run_dir(self.run_dir, "output_dir"))
        if not resume:
            self._write_inputs()
        self._measure_prompts(self.config)

    def _resume(self, resume_from_checkpoint) -> bool:
        if not resume_from_checkpoint:
            return False
        from .contract.run_files import checkpoint_folders

        newest = [path for _, path in checkpoint_folders(self.run_dir)]
        if isinstance(resume_from_checkpoint, str):
            given = Path(resume_from_checkpoint).resolve()
            if not newest or given != newest[-1].resolve():
                raise _error(
                    f"grpo-studio resumes from the newest checkpoint of output_dir "
                    f"({newest[-1] if newest else 'none yet'}); pass True",
                    "resume_from_checkpoint",
                    resume_from_checkpoint,
                )
        if not (self.run_dir / "config.toml").is_file():
            raise _error(f"{self.run_dir} holds no run to resume", "resume_from_checkpoint", resume_from_checkpoint)
        return True

    def _check_cpu(self) -> None:
        if not self.args.use_cpu:
            return
        import torch

        if torch.cuda.is_available():
            raise refuse("use_cpu", True, "hide the GPUs instead: CUDA_VISIBLE_DEVICES='' before the script starts")

    def _write_inputs(self) -> None:
        """The run's inputs as files in the run directory: the prompts, a model and reward models given as objects."""
        data = self.run_dir / "data"
        data.mkdir(exist_ok=True)
        for name, rows in (("train.jsonl", self.rows), ("eval.jsonl", self.eval_rows)):
            if rows is not None:
                atomic_write_text(
                    data / name, "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows)
                )
        if self.model_object is not None:
            self.model_object.save_pretrained(self.run_dir / "model")
            tokenizer = self.processing_class or _tokenizer_of(self.model_object)
            tokenizer.save_pretrained(self.run_dir / "model")
        for folder, reward_model, tokenizer in self.saved_rewards:  # rewards/reward_model.py reads both from there
            reward_model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)

    def _measure_prompts(self, cfg) -> None:
        """rollout.max_prompt_len (TRL 1.16 has no bound): the longest rendered prompt of the dataset; and
        chat_template_kwargs checked against the template."""
        from .engine.model import policy_loader
        from .engine.prompts import data, prompt_render

        tokenizer = policy_loader.load_tokenizer(policy_loader.resolve_model_path(cfg.model.name))
        template = str(getattr(tokenizer, "chat_template", None) or "")
        read = sorted(name for name in self.args.chat_template_kwargs or {} if name in template)
        if read:  # no key passes them to the template yet: refused where the template would read them
            raise refuse(
                "chat_template_kwargs",
                self.args.chat_template_kwargs,
                f"the chat template reads {', '.join(read)}, which grpo-studio does not pass; remove it",
            )
        if cfg.env.environment:  # an episode's prompt grows turn by turn: ENV_PROMPT_LEN
            return
        rows = data.load_rows(cfg.data, "train") + data.load_rows(cfg.data, "eval")
        longest = prompt_render.check_prompt_lengths(rows, cfg.data, tokenizer, 10**9)
        set_key(cfg, "rollout.max_prompt_len", max(longest, 1))
        validate(cfg)

    def save_model(self, output_dir: str | None = None) -> None:
        """The newest checkpoint's weights (LoRA merged) as a transformers folder in output_dir (default
        args.output_dir, beside the run's files), readable with from_pretrained."""
        from transformers import AutoTokenizer

        from .engine.out import export

        dest = Path(output_dir or self.run_dir)
        model, base_path, _ = export.merged_model(self.run_dir, export.find_checkpoint(self.run_dir, None))
        dest.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(dest, safe_serialization=True)
        AutoTokenizer.from_pretrained(base_path).save_pretrained(dest)


def _rekeyed(check) -> None:
    """A CLI check's one line, naming output_dir where it named --run-dir or --resume."""
    try:
        check()
    except UserError as err:
        if err.key in ("--run-dir", "--resume", "output_dir"):
            raise UserError(err.why, kind="GRPOTrainer", key="output_dir", value=err.value) from None
        raise


def _model_id(model) -> str:
    return str(getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__)


def _tokenizer_of(model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_model_id(model))


def _is_model(obj) -> bool:
    return hasattr(obj, "save_pretrained") and hasattr(obj, "config")


def _reward_model(name: str, argument: str):
    """TRL: a reward model named by id or folder is AutoModelForSequenceClassification.from_pretrained(name,
    num_labels=1), loaded by the constructor."""
    from transformers import AutoModelForSequenceClassification

    try:
        return AutoModelForSequenceClassification.from_pretrained(name, num_labels=1)
    except (OSError, ValueError, KeyError) as err:
        why = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        raise _error(f"cannot load a sequence-classification model from it ({why})", argument, name) from None


def _reward_tokenizer(model, argument: str):
    """TRL: a reward model without a processing class uses AutoTokenizer.from_pretrained(its model id)."""
    from transformers import AutoTokenizer

    name = str(getattr(model.config, "_name_or_path", "") or "")
    try:
        if name:
            return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    raise _error("no tokenizer found for this reward model's id; pass it in reward_processing_classes", argument, name)


def _rows(dataset, environment_factory, args, argument: str = "train_dataset") -> list[dict]:
    """A datasets.Dataset / IterableDataset (or a list of dicts) as rows with a `prompt` column, as TRL takes them;
    an IterableDataset is read to the prompts max_steps needs."""
    if dataset is None and environment_factory is not None and argument == "train_dataset":
        if args.max_steps <= 0:  # TRL grpo_trainer.py: no dataset, so no epoch to count
            raise refuse("max_steps", args.max_steps, "with no train_dataset, set max_steps > 0, as TRL")
        # TRL: one generation's placeholder prompts, each completed by the environment's reset()
        return [
            {"prompt": [{"role": "user", "content": ""}]}
            for _ in range(args.generation_batch_size // args.num_generations)
        ]
    if dataset is None:
        raise _error(
            "grpo-studio needs prompts: pass a dataset with a 'prompt' column, or an environment_factory",
            argument,
            None,
        )
    if type(dataset).__name__ == "IterableDataset" and argument == "eval_dataset":  # TRL evaluates all of it
        rows = [dict(row) for row in dataset]
    elif type(dataset).__name__ == "IterableDataset":
        if args.max_steps <= 0:
            raise refuse("max_steps", args.max_steps, "an IterableDataset has no length: set max_steps > 0, as TRL")
        need = math.ceil(args.max_steps * args.generation_batch_size / args.num_generations)
        rows = [dict(row) for _, row in zip(range(need), dataset)]
    elif hasattr(dataset, "column_names") or isinstance(dataset, list):
        rows = [dict(row) for row in dataset]
    else:
        raise _error("expected a datasets.Dataset or IterableDataset", argument, type(dataset).__name__)
    if not rows:
        raise _error("the dataset has no rows", argument)
    if "prompt" not in rows[0]:
        raise _error(f"no 'prompt' column (columns: {', '.join(map(str, rows[0]))}); TRL needs one", argument)
    if args.remove_unused_columns:
        rows = [{"prompt": row["prompt"]} for row in rows]
    return rows


class _NoReset:
    """The environment of tools=[...] alone: nothing to reset."""

    def reset(self, **kwargs) -> None:
        return None


def _with_tools(factory, tools: list) -> type:
    """A subclass of the environment class with each tool as a method (TRL's tools=: functions the model may
    call, sync or async); a tool stays a plain function (staticmethod), so its schema is its own."""
    if not isinstance(factory, type):
        raise _error(
            "with tools=, pass the environment's class as environment_factory", "environment_factory", _name_of(factory)
        )
    methods = {}
    for tool in tools:
        if not callable(tool):
            raise _error("expected a function", "tools", repr(tool))
        methods[_name_of(tool)] = staticmethod(tool)
    return type("tools" if factory is _NoReset else factory.__name__, (factory,), methods)
