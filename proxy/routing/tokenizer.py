"""The model's own tokenizer for routing (``routing.tokenizer``), optional.

With it, a text prompt is keyed by the token ids the engine will see (``tokenizer.json`` through
the ``tokenizers`` library, special tokens added as SGLang's tokenizer manager does), so its
token count is exact, its blocks align with the engine's pages and it matches the engine's KV
events (``proxy/workers/kv_events.py``) like a token-id prompt. Without it, text is keyed by bytes
and counted by the learned bytes per token (``token_estimate.py``).

Encoding costs ~1.3 µs a token on one core (``loadtests/bench_kv_events.py``: 49 ms for 36k
tokens), so it runs in a worker thread through ``encode_batch``, which releases the GIL while
the Rust encoder runs: the event loop keeps serving meanwhile. Chat prompts are rendered with the model's chat template
when the tokenizer directory has one (``chat_template.py``, as the engine renders them) and then
tokenized without special tokens (the template writes its own); without a template, or when it
refuses the messages (the engine will answer that request with its own error), they keep the
byte keys.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.routing.chat_template import ChatTemplate, ChatTemplateError


class TokenizerUnavailable(RuntimeError):
    pass


class PromptTokenizer:
    def __init__(self, path: str) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as e:  # optional: only routing.tokenizer needs it
            raise TokenizerUnavailable(
                "routing.tokenizer needs the tokenizers package: pip install 'radixgate[bpe]'") from e
        file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        try:
            self._bpe: Any = Tokenizer.from_file(file)
        except Exception as e:  # the library raises its own exception type for a bad file
            raise TokenizerUnavailable(f"routing.tokenizer: cannot load {file}: {e}") from e
        self.path = file
        try:
            self.chat: ChatTemplate | None = ChatTemplate.from_dir(path)
        except (ChatTemplateError, OSError, ValueError) as e:
            raise TokenizerUnavailable(f"routing.tokenizer: the chat template of {path}: {e}") from e

    def encode(self, text: str) -> list[int]:
        return list(self._bpe.encode_batch([text], add_special_tokens=True)[0].ids)

    async def encode_async(self, text: str) -> list[int]:
        return await asyncio.to_thread(self.encode, text)

    def encode_chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int] | None:
        """The engine's token ids of a chat prompt; None without a template or when it refuses them."""
        if self.chat is None:
            return None
        try:
            text = self.chat.render(messages)
        except ChatTemplateError:
            return None
        return list(self._bpe.encode_batch([text], add_special_tokens=False)[0].ids)

    async def encode_chat_async(self, messages: Sequence[Mapping[str, Any]]) -> list[int] | None:
        return await asyncio.to_thread(self.encode_chat, messages)
