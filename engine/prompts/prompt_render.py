"""Prompt text: a row's prompt rendered for the model, tokenized, and its length checked.

`prompt_text(row, data, tokenizer)` renders a row's prompt for the model through data.chat_template
("auto" = the tokenizer's template with the generation prompt, a text prompt as one user turn; a
tokenizer without one takes text prompts as they are; "plain" = the contents joined by blank lines; "none" = text
prompts as they are; or a Jinja template string / .jinja file).
`encode_prompts` tokenizes rendered prompts as the trainer feeds them to the sampler, and
`check_prompt_lengths` refuses a too-short rollout.max_prompt_len before the first step.
The rows come from data.py (`load_rows`), whose prompts are text or chat messages (`is_conversational`).
"""

from __future__ import annotations

from pathlib import Path

from ...contract.config import DataConfig
from ...contract.errors import UserError, describe, user_path


def _err(key: str, value, why: str) -> UserError:
    return UserError(why, key=f"data.{key}", value=value)


class BuiltMessages(list):
    """Chat messages the loader built from a text prompt (system prompt + question); the plain
    template is an acceptable fallback for them, unlike for conversational source data."""


def is_conversational(prompt) -> bool:
    return (
        isinstance(prompt, (list, tuple))
        and all(isinstance(m, dict) and "content" in m for m in prompt)
        and len(prompt) > 0
    )


# The roles chat templates render: ChatML's (SmolLM2, Qwen) and Llama's system/user/assistant/tool, and the
# developer turn of OpenAI's harmony format (gpt-oss). Anything else renders wrongly or raises in the template.
ROLES = ("system", "developer", "user", "assistant", "tool")


def kind_of(value) -> str:
    """A JSON value's kind as the messages name it ("a number", "null", "a list of 3")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    return type(value).__name__


def message_problem(messages: list | tuple) -> str | None:
    """What keeps `messages` from being a chat prompt, or None: every message an object with a role of ROLES
    and text content, and at least one user turn."""
    if not messages:
        return "the message list is empty"
    for number, message in enumerate(messages, 1):
        if not isinstance(message, dict):
            return f"message {number} is {kind_of(message)}, not an object with role and content"
        if "role" not in message:
            hint = " (ShareGPT's from/value: rename them role/content)" if "from" in message else ""
            return f"message {number} has no role{hint}; allowed: {', '.join(ROLES)}"
        role = message["role"]
        if role not in ROLES:
            return f"message {number} has role {role!r}; allowed: {', '.join(ROLES)}"
        if not isinstance(message.get("content"), str):
            what = "no content" if "content" not in message else f"content {kind_of(message['content'])}"
            return f'message {number} ({role}) has {what}; allowed: text ("" for none)'
    if not any(m["role"] == "user" for m in messages):
        roles = ", ".join(dict.fromkeys(m["role"] for m in messages))
        return f"no user turn (roles: {roles})"
    return None


def custom_template(data: DataConfig) -> str | None:
    """The Jinja template named by data.chat_template, or None for auto/plain."""
    value = data.chat_template
    if value in ("auto", "plain", "none"):
        return None
    if value.endswith((".jinja", ".j2", ".jinja2")) and "{" not in value:
        with user_path("data.chat_template", value):
            path = Path(value).expanduser()
            if not path.is_file():
                raise _err(
                    "chat_template",
                    value,
                    "file not found; allowed: auto, plain, none, a Jinja template string or a .jinja file",
                )
            return path.read_bytes().decode("utf-8")
    if "{" not in value:
        raise _err("chat_template", value, "allowed: auto, plain, none, a Jinja template string or a .jinja file")
    return value


def plain(messages: list[dict]) -> str:
    """The plain template: message contents separated by blank lines, ending in a newline."""
    return "\n\n".join(str(m["content"]).strip() for m in messages) + "\n"


def render_ids(tokenizer, messages: list[dict], template: str | None, tools, generation: bool) -> list[int]:
    """A conversation's ids through `template` (None: the tokenizer's own), `tools` listed, with or without
    the generation prompt: what episodes and the warm-up cut their turns from."""
    return list(
        tokenizer.apply_chat_template(
            messages,
            tools=tools,
            chat_template=template,
            add_generation_prompt=generation,
            tokenize=True,
            return_dict=False,
        )
    )


def _render(tokenizer, messages: list[dict], **kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)


def _without_default_system(tokenizer, messages: list, kwargs: dict) -> list:
    """data.system_prompt = 'none': messages with no system turn, rendered with the least system text. Some
    templates (SmolLM2's, Qwen2.5's) add a default system prompt when none is given; an empty system turn
    keeps it out."""
    if messages and messages[0].get("role") == "system":
        return messages
    empty = [{"role": "system", "content": ""}, *messages]
    return empty if len(_render(tokenizer, empty, **kwargs)) < len(_render(tokenizer, messages, **kwargs)) else messages


def prompt_text(row: dict, data: DataConfig, tokenizer=None) -> str:
    """The prompt string the model sees. With data.chat_template = 'auto' and a tokenizer that has a chat
    template, every prompt renders through it with the generation prompt: a text prompt as one user turn
    ('none' keeps text prompts as they are, as TRL does)."""
    prompt = row["prompt"] if "prompt" in row else row[data.prompt_column]
    has_own = tokenizer is not None and getattr(tokenizer, "chat_template", None)
    if not is_conversational(prompt):
        if data.chat_template in ("plain", "none") or data.chat_template == "auto" and not has_own:
            return str(prompt)
        prompt = [{"role": "user", "content": str(prompt)}]
    if data.chat_template == "none":
        raise _err(
            "chat_template",
            "none",
            f"{data.source} is conversational (column {data.prompt_column!r} holds "
            f"messages) and 'none' sends text prompts as they are; allowed: auto, "
            f"plain, a Jinja template string or a .jinja file",
        )
    template = custom_template(data)
    if data.chat_template == "plain":
        return plain(prompt)
    if template is None and not has_own:
        if not isinstance(prompt, BuiltMessages):
            name = getattr(tokenizer, "name_or_path", None) or "the model"
            raise _err(
                "chat_template",
                data.chat_template,
                f"{name} has no chat template but {data.source} is conversational (column "
                f"{data.prompt_column!r} holds messages); set data.chat_template to a Jinja template, "
                f"a .jinja file, or 'plain'",
            )
        return plain(prompt)  # prompts we built from text (GSM8K + system prompt): plain is fine
    kwargs = {"chat_template": template} if template else {}
    try:
        if data.system_prompt == "none":
            prompt = _without_default_system(tokenizer, prompt, kwargs)
        return _render(tokenizer, prompt, **kwargs)
    except Exception as err:  # a Jinja syntax error, an undefined variable, raise_exception() in the template
        raise _err("chat_template", data.chat_template, f"rendering a prompt failed ({describe(err)})") from None


def encode_prompts(tokenizer, texts: list[str], max_len: int) -> list[list[int]]:
    """Token ids of rendered prompts, no special tokens added (the template has them). A prompt longer than
    max_len (rollout.max_prompt_len) is refused: cutting either end would lose the template's head or the
    generation prompt. `check_prompt_lengths` finds the longest before the first step."""
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    refuse_longer(max(map(len, ids), default=0), max_len, "a prompt")
    return ids


def check_prompt_lengths(rows: list[dict], data: DataConfig, tokenizer, max_len: int) -> int:
    """The longest rendered prompt of `rows` in tokens, refused in one line when over max_len."""
    texts = [prompt_text(row, data, tokenizer) for row in rows]
    longest = max((len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]), default=0)
    refuse_longer(longest, max_len, "the longest prompt of the dataset")
    return longest


def refuse_longer(longest: int, max_len: int, what: str) -> None:
    """The one wording of the rollout.max_prompt_len rule."""
    if longest > max_len:
        raise UserError(
            f"{what} renders to {longest} tokens; allowed: at least {longest}, or shorter prompts",
            key="rollout.max_prompt_len",
            value=max_len,
        )
