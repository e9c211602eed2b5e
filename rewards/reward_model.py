"""A reward model as a reward function: rewards.funcs = ["rm:path/to/model"].

The model is a local Hugging Face sequence-classification folder (config.json + weights +
tokenizer). Each completion's score is the model's first logit on prompt + completion, as TRL's
GRPOTrainer scores a reward model: text prompts are concatenated with the completion;
conversational ones are rendered with the reward model's chat template (messages = prompt +
completion). Batches of rewards.reward_model_batch_size pairs, right-padded (the model reads its
last non-pad token), truncated from the left to the model's length so the completion's end is
kept; on the trainer's device, in the dtype the model was saved in, under inference_mode.
"""

from __future__ import annotations

from pathlib import Path

from ..contract.errors import UserError, describe, user_path

PREFIX = "rm:"


def _fail(entry: str, why: str) -> UserError:
    return UserError(why, key="rewards.funcs", value=entry)


def name_of(entry: str) -> str:
    """The metric name: rm_<folder name> (rewards/rm_<folder>/mean)."""
    return "rm_" + (Path(entry[len(PREFIX) :]).expanduser().name or "model")


class RewardModel:
    """Callable in TRL's signature; the loaded model and tokenizer stay on the trainer's device."""

    def __init__(self, entry: str, batch_size: int):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        path = entry[len(PREFIX) :]
        with user_path("rewards.funcs", entry):
            folder = Path(path).expanduser()
            if not (folder / "config.json").is_file():
                raise _fail(
                    entry,
                    "not a local folder with config.json; give rm:PATH to a saved "
                    "AutoModelForSequenceClassification (save_pretrained)",
                )
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(folder)
            self.model = AutoModelForSequenceClassification.from_pretrained(folder, dtype="auto")
        except (OSError, ValueError, KeyError) as err:
            raise _fail(entry, f"cannot load a sequence-classification model there ({describe(err)})") from None
        if self.tokenizer.pad_token_id is None:  # as TRL's GRPOTrainer: pad with EOS, and tell the model
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.tokenizer.padding_side, self.tokenizer.truncation_side = "right", "left"
        limit = getattr(self.model.config, "max_position_embeddings", None)
        self.max_length = min(limit or 10**9, self.tokenizer.model_max_length or 10**9)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the trainer's device
        self.model.to(self.device).eval()
        self.batch_size = batch_size
        self.torch = torch
        self.__name__ = name_of(entry)

    def text(self, prompt, completion) -> str:
        if isinstance(prompt, (list, tuple)):  # conversational: render prompt + completion messages
            messages = list(prompt) + (
                list(completion)
                if isinstance(completion, (list, tuple))
                else [{"role": "assistant", "content": completion}]
            )
            if self.tokenizer.chat_template:
                return self.tokenizer.apply_chat_template(messages, tokenize=False)
            return "\n\n".join(str(m.get("content", "")) for m in messages)
        return str(prompt) + str(completion)

    def __call__(self, prompts, completions, **kwargs) -> list[float]:
        texts = [self.text(p, c) for p, c in zip(prompts, completions)]
        scores: list[float] = []
        with self.torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(
                    texts[start : start + self.batch_size],
                    return_tensors="pt",
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    add_special_tokens=False,
                )
                logits = self.model(**batch.to(self.device)).logits
                scores += logits[:, 0].float().cpu().tolist()  # TRL: reward = logits[:, 0]
        return scores
