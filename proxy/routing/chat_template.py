"""A model's chat template, rendered as its engine renders it (optional, with ``routing.tokenizer``).

SGLang and vLLM turn OpenAI chat messages into a prompt with the model's Jinja chat template (the
``chat_template`` of ``tokenizer_config.json``, or a ``chat_template.jinja`` beside it) and then
tokenize it without adding special tokens again (the template writes its own BOS), as Hugging
Face's ``apply_chat_template`` does. Rendering the same way here gives a chat prompt the token ids
the engine computes: exact counts, page-aligned blocks, matches against KV events.

Templates run in Jinja's immutable sandbox with the switches and helpers Hugging Face gives them
(``trim_blocks``, ``lstrip_blocks``, ``raise_exception``, ``tojson``, ``strftime_now``): the
template is the operator's, the messages are the client's, and neither may touch anything else.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any


class ChatTemplateError(ValueError):
    """The template refused the messages (``raise_exception``) or failed to render them."""


def _token(value: Any) -> str:
    """A special token as tokenizer_config.json writes it: a string or ``{"content": ...}``."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _flat(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """Text-only content parts joined into one string, as the engines give string-content templates
    (most are): ``[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]`` -> ``"a b"``."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    text = " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type", "text") == "text")
    return {**message, "content": text}


class ChatTemplate:
    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        try:
            from jinja2.exceptions import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as e:  # optional: only a tokenizer with a chat template needs it
            raise ChatTemplateError("a chat template needs the jinja2 package: pip install 'radixgate[bpe]'") from e

        def raise_exception(message: str) -> None:
            raise ChatTemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, autoescape=False)
        env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = time.strftime
        try:
            self._template = env.from_string(source)
        except TemplateError as e:
            raise ChatTemplateError(f"chat template does not compile: {e}") from e
        self.bos_token, self.eos_token = bos_token, eos_token

    @classmethod
    def from_dir(cls, path: str) -> ChatTemplate | None:
        """The template of a Hugging Face tokenizer directory; None when it has none."""
        if not os.path.isdir(path):
            return None
        config: dict[str, Any] = {}
        config_file = os.path.join(path, "tokenizer_config.json")
        if os.path.isfile(config_file):
            with open(config_file, encoding="utf-8") as f:
                loaded = json.load(f)
            config = loaded if isinstance(loaded, dict) else {}
        source: Any = None
        jinja_file = os.path.join(path, "chat_template.jinja")
        if os.path.isfile(jinja_file):  # the newer layout: the template in a file of its own
            with open(jinja_file, encoding="utf-8") as f:
                source = f.read()
        else:
            source = config.get("chat_template")
            if isinstance(source, list):  # several named templates: the default one
                named = {t.get("name"): t.get("template") for t in source if isinstance(t, Mapping)}
                source = named.get("default") or next(iter(named.values()), None)
        if not isinstance(source, str) or not source:
            return None
        return cls(source, _token(config.get("bos_token")), _token(config.get("eos_token")))

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        try:
            return str(self._template.render(messages=[_flat(m) for m in messages],
                                             add_generation_prompt=add_generation_prompt,
                                             bos_token=self.bos_token, eos_token=self.eos_token, tools=None))
        except ChatTemplateError:
            raise
        except Exception as e:  # the template is foreign code: whatever it raises is its failure
            raise ChatTemplateError(f"chat template failed on these messages: {e!r:.200}") from e
