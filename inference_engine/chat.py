"""Chat prompts from the model's own Jinja template (``tokenizer.chat_template``).

Rendering follows Hugging Face transformers' chat-template conventions, as llama-cpp-python's
``Jinja2ChatFormatter`` does: a sandboxed Jinja2 environment with ``trim_blocks`` and ``lstrip_blocks``, the
``loopcontrols`` extension, a ``tojson`` filter that keeps non-ASCII text, and ``messages``, ``bos_token``,
``eos_token``, ``add_generation_prompt``, ``raise_exception`` and ``strftime_now`` in the context. A template that
rejects the conversation (Gemma's "roles must alternate") raises :class:`GGUFParityError` with its message.

The rendered prompt already holds whatever special tokens the template writes (Gemma's templates start with
``{{ bos_token }}``): tokenize it with ``parse_special=True`` and, when it starts with the BOS text, ``add_bos=False``
(llama-cpp-python never adds BOS to a Jinja-rendered prompt).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from inference_engine.errors import GGUFParityError

if TYPE_CHECKING:
    from inference_engine.gguf.file import GGUFFile

CHAT_TEMPLATE_KEY = "tokenizer.chat_template"


class _TemplateRejected(Exception):
    """Raised by a template's ``raise_exception(...)``."""


def _raise_exception(message: str) -> None:
    raise _TemplateRejected(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys: bool = False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _IgnoreGenerationTags(jinja2.ext.Extension):
    """transformers' ``{% generation %}...{% endgeneration %}`` marks assistant text for training; render it as is."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser):
        parser.stream.skip(1)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_IgnoreGenerationTags, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    return env


def chat_template(f: GGUFFile) -> str:
    """The GGUF's chat template; a model without one is a user error (one line, says what to do instead)."""
    template = f.metadata_value(CHAT_TEMPLATE_KEY)
    if not template:
        raise GGUFParityError(
            f"{f.path}: the model has no chat template ({CHAT_TEMPLATE_KEY} is missing); it is probably a base "
            "model: use plain text prompts, or pass a Jinja template string to render_chat"
        )
    return str(template)


def special_token_texts(f: GGUFFile) -> dict[str, str]:
    """``bos_token`` / ``eos_token`` as the template sees them: the texts of the ids llama.cpp uses."""
    from inference_engine.tokenizer.vocab import read_special_ids, string_array_item

    ids = read_special_ids(f.reader)
    return {
        f"{name}_token": (string_array_item(f.reader, "tokenizer.ggml.tokens", ids[name]) or "")
        if ids.get(name) is not None
        else ""
        for name in ("bos", "eos")
    }


def render_chat(
    source: GGUFFile | str,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    **context: Any,
) -> str:
    """Render ``messages`` (``[{"role": ..., "content": ...}, ...]``) into the model's prompt text.

    ``source`` is an open GGUF file (its ``tokenizer.chat_template``, ``bos_token`` and ``eos_token``) or a Jinja
    template string. Extra keyword arguments join the template context (``bos_token=``, ``tools=``, ...).
    """
    if isinstance(source, str):
        template, variables = source, {"bos_token": "", "eos_token": ""}
    else:
        template, variables = chat_template(source), special_token_texts(source)
    _check_messages(messages)
    # llama-cpp-python passes these as None when unused; templates test them with "is not none".
    variables.update({"tools": None, "tool_choice": None, "functions": None, "function_call": None})
    variables.update(context)
    try:
        compiled = _environment().from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise GGUFParityError(f"chat template is not valid Jinja (line {exc.lineno}: {exc.message})") from None
    try:
        return compiled.render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            raise_exception=_raise_exception,
            strftime_now=_strftime_now,
            **variables,
        )
    except _TemplateRejected as exc:
        raise GGUFParityError(f"the chat template rejected the messages: {exc}") from None
    except Exception as exc:  # noqa: BLE001  (whatever a template evaluates wrongly: str + int, bad keys, ...)
        raise GGUFParityError(f"the chat template failed: {type(exc).__name__}: {exc}") from None


def _check_messages(messages: Sequence[Mapping[str, Any]]) -> None:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise GGUFParityError("messages must be a list of {'role': ..., 'content': ...} dicts")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
            raise GGUFParityError(f"message {i} must be a dict with 'role' and 'content', got {message!r:.80}")
