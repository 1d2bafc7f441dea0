"""The Anthropic Messages API as far as routing needs it (pure, no I/O): a request's ``system``
and ``messages`` read as the chat turns SGLang renders them to (it serves ``/v1/messages`` by
translating to a chat completion), so Anthropic and OpenAI traffic with one system prompt share
prefix keys. Stateless: nothing is stored on the worker."""

from __future__ import annotations

import json
from typing import Any

from proxy.errors import BadRequest


def _blocks_text(blocks: list[Any], where: str) -> tuple[str, list[dict[str, Any]]]:
    """A message's content blocks: its text (text blocks joined by spaces, as the chat template
    path joins parts; a tool call as Llama 3.1's template writes it; an image keys by its JSON),
    and the tool results, which become turns of their own (SGLang's translation to chat)."""
    pieces: list[str] = []
    results: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise BadRequest(f"{where}.content[{j}]: must be a content block object with a type")
        kind = block["type"]
        if kind == "text":
            text = block.get("text")
            if not isinstance(text, str):
                raise BadRequest(f"{where}.content[{j}].text: must be a string")
            pieces.append(text)
        elif kind == "tool_use":  # as Llama 3.1's template writes a call
            pieces.append(json.dumps({"name": block.get("name", ""), "parameters": block.get("input") or {}}))
        elif kind == "tool_result":
            content = block.get("content", "")
            if isinstance(content, list):
                content = "\n".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
            results.append({"role": "tool", "content": content if isinstance(content, str) else str(content)})
        elif kind not in ("thinking", "redacted_thinking"):
            pieces.append(json.dumps(block, sort_keys=True))
    return " ".join(pieces), results


def conversation(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of an Anthropic request (``system`` first); ``BadRequest`` names the
    malformed field, as SGLang's own validation would refuse it."""
    max_tokens = payload.get("max_tokens")
    if type(max_tokens) is not int or max_tokens < 1:
        raise BadRequest("max_tokens: required, an integer >= 1")
    out: list[dict[str, Any]] = []
    system = payload.get("system")
    if isinstance(system, str):
        if system:
            out.append({"role": "system", "content": system})
    elif isinstance(system, list):
        if system:  # its text blocks joined by newlines, as SGLang does
            out.append({"role": "system", "content": "\n".join(
                str(b.get("text", "")) for b in system if isinstance(b, dict) and b.get("type") == "text")})
    elif system is not None:
        raise BadRequest("system: must be a string or a list of text blocks")
    msgs = payload.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("messages: required, a non-empty list of message objects")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise BadRequest(f"messages[{i}].role: must be 'user' or 'assistant'")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
        elif isinstance(content, list):
            text, results = _blocks_text(content, f"messages[{i}]")
            out.extend(results)
            if text or not results:
                out.append({"role": m["role"], "content": text})
        else:
            raise BadRequest(f"messages[{i}].content: must be a string or a list of content blocks")
    return out
