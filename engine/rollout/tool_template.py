"""The chat template episodes render with, chosen and checked before the first step.

data.chat_template = auto takes the tokenizer's own template when it can render a tool-calling conversation
(the assistant's call and the tool's result both appear: TRL's supports_tool_calling); a ChatML model whose
template renders only `content` (SmolLM2's) gets presets/templates/chatml_tools.jinja; a Jinja template or
.jinja file is used as given. Whichever it is must
- keep earlier turns as they were when turns follow (prefix-preserving), or environment tokens would not be the
  difference of two renders;
- end an assistant turn with the tokenizer's eos token, the token the sampler stops on and the mask trains.
Each failure is one line naming data.chat_template.
"""

from __future__ import annotations

from ...contract import bundled
from ...contract.errors import UserError, describe
from ..prompts import prompt_render

CHATML_TOOLS = bundled.PRESETS / "templates" / "chatml_tools.jinja"
_NAME, _ARG, _RESULT = "tool_name_a8f3", "tool_arg_b9d4", "tool_result_c4f9"  # sentinels a template must render
PROBE = [
    {"role": "user", "content": "hi"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": _NAME, "arguments": {_ARG: 1}}}],
    },
    {"role": "tool", "name": _NAME, "content": _RESULT},
]


def _err(value: str, why: str) -> UserError:
    return UserError(why, key="data.chat_template", value=value)


def _renders_tools(tokenizer, template: str | None) -> bool:
    try:
        text = tokenizer.apply_chat_template(PROBE, chat_template=template, tokenize=False)
    except Exception:  # noqa: BLE001 - a template that rejects the tool roles cannot serve
        return False
    return all(s in text for s in (_NAME, _ARG, _RESULT))


def choose(tokenizer, data_cfg) -> str:
    """The Jinja template of the run's episodes, checked."""
    value = data_cfg.chat_template
    if value in ("plain", "none"):
        raise _err(
            value, "an environment's episodes need a chat template; allowed: auto, a Jinja template or .jinja file"
        )
    template = prompt_render.custom_template(data_cfg)
    if template is None:
        own = getattr(tokenizer, "chat_template", None)
        if own and _renders_tools(tokenizer, own):
            template = own
        elif "<|im_start|>" in tokenizer.get_vocab():
            template = CHATML_TOOLS.read_text(encoding="utf-8")
        else:
            name = getattr(tokenizer, "name_or_path", "the model")
            raise _err(
                value,
                f"{name}'s chat template cannot render tool calls and it is not a ChatML model; give a Jinja "
                f"template or .jinja file that renders tool_calls and tool messages",
            )
    elif not _renders_tools(tokenizer, template):
        raise _err("a template", "it does not render an assistant's tool_calls and a tool message's content")
    check(tokenizer, template, value)
    return template


def check(tokenizer, template: str, value: str = "auto") -> None:
    """Refuse a template that is not prefix-preserving or whose assistant turn does not end with eos."""
    render = lambda messages, generation: list(  # noqa: E731
        tokenizer.apply_chat_template(
            messages, chat_template=template, add_generation_prompt=generation, tokenize=True, return_dict=False
        )
    )
    try:
        turn = render(PROBE[:2] + [{"role": "user", "content": "next"}], False)
        before, after = render(PROBE[:2], False), render(PROBE, True)
    except Exception as err:  # noqa: BLE001 - the user's Jinja
        raise _err(value, f"rendering a tool-calling conversation failed ({describe(err)})") from None
    eos = tokenizer.eos_token_id
    ends = [i for i, t in enumerate(before) if t == eos]
    if not ends or eos not in turn[len(render(PROBE[:1], True)) :]:
        raise _err(
            value,
            f"an assistant turn must end with the eos token {tokenizer.eos_token!r}, the token sampling stops on",
        )
    if after[: ends[-1] + 1] != before[: ends[-1] + 1]:
        raise _err(value, "the template renders earlier turns differently when turns follow (not prefix-preserving)")
