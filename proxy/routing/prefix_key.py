"""Prompt canonicalisation and chained block hashes: the routing key of a request.

Rule:
  1. Canonical prompt. Token ids are used as they are. Text is used as its UTF-8 bytes. Chat
     messages are rendered turn by turn (``<|role|>\ncontent\n`` per message, content parts
     flattened in order), so the rendering of turn n+1 starts with the rendering of turn n and a
     follow-up turn shares every block of the conversation so far.
  2. Blocks. The unit is ``block_tokens`` tokens (token ids), or ``round(block_tokens *
     chars_per_token)`` UTF-8 bytes when there is no tokenizer (bytes, not characters: bytes per
     token vary less across scripts than characters per token, and slicing bytes is cheapest).
     Block boundaries sit at fixed positions, the same for every prompt, so two prompts share
     leading blocks exactly as far as they share leading text: the first ``2 * BLOCKS_PER_DOUBLING``
     blocks are one unit long, then each run of ``BLOCKS_PER_DOUBLING`` blocks is twice as long
     as the run before. Resolution stays within 1/``BLOCKS_PER_DOUBLING`` of the position (6% at
     16), every boundary is a multiple of the unit (so of the workers' page size, see
     ``block_tokens_for``), and a 32k-token prompt takes 128 blocks instead of 2,000 — this is
     what keeps hashing + matching + index update of a long prompt within the decision budget
     (a Python dict insert costs ~0.2 us, so per-block work is what a decision pays for).
     Only full blocks are hashed: a trailing partial block cannot be matched by an extension of
     the prompt. ``prefix_tokens(n, block_tokens)`` converts a matched block count to tokens.
  3. Chained hashes. ``h[0] = xxh3_64(block[0], seed=S)``, ``h[i] = xxh3_64(block[i], seed=h[i-1])``
     with ``S = xxh3_64(domain, model, salt)``: a block's hash names the whole prefix ending with
     it, and a different model (or salt, or text-vs-token-ids domain) changes every hash. The salt
     holds the request's cache scope (``cache_scope``): the fields that partition an engine's
     prefix cache — SGLang keys its radix tree by the LoRA adapter and the request's
     ``extra_key`` / ``cache_salt`` too, vLLM hashes the adapter and ``cache_salt`` into every
     block — so the same prompt under another adapter or salt shares no block with it, as on the
     engine. A request without them hashes as it always did.
  4. At most ``max_blocks`` blocks are hashed.
  5. Token accounting. Token ids count exactly. A text prompt counts ``bytes / bytes_per_token``
     tokens, and its unit block ``round(unit / bytes_per_token)`` tokens (at least 1), where
     ``bytes_per_token`` is the per-model estimate learned from engines' reports
     (``token_estimate.py``), else ``chars_per_token``. The byte unit itself is always cut for
     ``chars_per_token`` (the prior), so the hashes of a prompt never change as the estimate moves.

Complexity: O(prompt length) bytes hashed, O(log(prompt length) * BLOCKS_PER_DOUBLING) Python
steps. ``prompt_text`` (for character-matching policies) is the canonical text, or empty for
token ids, which come as ``prompt_ids`` instead.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import xxhash

from proxy.request import GenerateRequest
from proxy.routing.base import RouteRequest

# Smallest block, in tokens: below this the per-block bookkeeping costs more than it saves.
MIN_BLOCK_TOKENS = 16
# Blocks per doubling of the block length (after the first 2x this many one-unit blocks).
BLOCKS_PER_DOUBLING = 16


def block_tokens_for(page_sizes: Iterable[int], minimum: int = MIN_BLOCK_TOKENS) -> int:
    """Block size in tokens for these workers: the smallest multiple of every page size >= ``minimum``.

    A page size <= 0 is ignored (unknown). With no page sizes the answer is ``minimum``.
    """
    if minimum < 1:
        raise ValueError(f"minimum must be >= 1, got {minimum}")
    page = 1
    for size in page_sizes:
        if size > 0:
            page = math.lcm(page, size)
    return page * max(1, math.ceil(minimum / page))


def block_chars(block_tokens: int, chars_per_token: float) -> int:
    """UTF-8 bytes standing in for ``block_tokens`` tokens when there is no tokenizer."""
    return max(1, round(block_tokens * chars_per_token))


def block_ends(unit: int, length: int, max_blocks: int) -> Sequence[int]:
    """End offsets of the full blocks of a ``length``-long prompt (same units as ``unit``)."""
    # The layout depends only on (unit, max_blocks): cut a cached table instead of rebuilding it
    # on every decision (it was the largest single cost of routing a 32k-token prompt).
    table = _ends_table(unit, max_blocks)
    return table[: bisect.bisect_right(table, length)]


@functools.lru_cache(maxsize=64)
def _ends_table(unit: int, max_blocks: int) -> tuple[int, ...]:
    ends: list[int] = []
    pos, size, next_doubling = 0, unit, 2 * BLOCKS_PER_DOUBLING * unit
    while len(ends) < max_blocks:
        pos += size
        ends.append(pos)
        if pos >= next_doubling:
            size *= 2
            next_doubling *= 2
    return tuple(ends)


def prefix_tokens(n_blocks: int, block_tokens: int) -> int:
    """Tokens covered by the first ``n_blocks`` blocks (closed form of ``block_ends``)."""
    if n_blocks <= 0:
        return 0
    first = 2 * BLOCKS_PER_DOUBLING
    if n_blocks <= first:
        return n_blocks * block_tokens
    runs, rest = divmod(n_blocks - first, BLOCKS_PER_DOUBLING)
    covered = first * block_tokens << runs
    return covered + rest * (block_tokens << (runs + 1))


def uncached_tokens(request: RouteRequest, matched_blocks: int) -> int:
    """Prompt tokens a worker holding ``matched_blocks`` of ``request``'s blocks still has to prefill."""
    return request.prompt_tokens - min(prefix_tokens(matched_blocks, request.block_tokens), request.prompt_tokens)


def block_sizes(block_tokens: int, n_blocks: int) -> Sequence[int]:
    """Token length of each of the first ``n_blocks`` blocks."""
    table = _size_table(block_tokens)
    if n_blocks <= len(table):
        return table[:n_blocks]
    ends = block_ends(block_tokens, prefix_tokens(n_blocks, block_tokens), n_blocks)
    return [b - a for a, b in zip([0, *ends], ends, strict=False)]


@functools.lru_cache(maxsize=16)
def _size_table(block_tokens: int) -> tuple[int, ...]:
    # A memo of a pure function: block lengths for prompts up to 2048 blocks (millions of tokens).
    ends = block_ends(block_tokens, 1 << 62, 2048)
    return tuple(b - a for a, b in zip([0, *ends], ends, strict=False))


def blocks_within(tokens: int, block_tokens: int, limit: int) -> int:
    """Number of leading blocks (at most ``limit``) whose tokens all fit in ``tokens``."""
    lo, hi = 0, max(0, limit)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if prefix_tokens(mid, block_tokens) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return lo


def render_messages(messages: Sequence[Mapping[str, Any]]) -> str:
    """Chat messages as one text, turn by turn, so that appending turns only appends text."""
    return "".join(_render_message(m) for m in messages)


def _render_message(message: Mapping[str, Any]) -> str:
    role = str(message.get("role", ""))
    parts = [_content_text(message.get("content"))]
    for key in ("name", "tool_call_id"):
        if message.get(key) is not None:
            parts.append(f"[{key}={message[key]}]")
    if message.get("tool_calls"):
        parts.append(_json(message["tool_calls"]))
    return f"<|{role}|>\n{''.join(parts)}\n"


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out: list[str] = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                out.append(str(part.get("text", "")))
            else:
                # Images, audio, ...: their identity (URL or data) is part of the prefix.
                out.append(_json(part))
        return "".join(out)
    return _json(content)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


# Body fields that partition an engine's prefix cache (rule 3).
CACHE_SCOPE_FIELDS = ("lora_path", "lora_id", "extra_key", "cache_salt")


def cache_scope(payload: Mapping[str, Any]) -> str:
    """The request's cache scope, "" when it has none; a batch's is its first prompt's (as routing)."""
    parts = []
    for name in CACHE_SCOPE_FIELDS:
        value = payload.get(name)
        if isinstance(value, list):
            value = value[0] if value else None
        if isinstance(value, str | int) and not isinstance(value, bool) and value != "":
            parts.append(f"{name}={value}")
    return "\x00".join(parts)


def prefix_seed(model: str, domain: str, salt: str = "") -> int:
    """The seed of a hash chain: different model, salt or domain -> unrelated chains."""
    seed: int = xxhash.xxh3_64_intdigest(f"{domain}\x00{model}\x00{salt}".encode())
    return seed


def hash_blocks(data: bytes, ends: Sequence[int], itemsize: int, seed: int) -> tuple[int, ...]:
    """Chained xxh3_64 of ``data`` cut at ``ends`` (offsets in items of ``itemsize`` bytes)."""
    digest = xxhash.xxh3_64_intdigest
    hashes: list[int] = []
    append = hashes.append
    h, start = seed, 0
    for end in ends:
        stop = end * itemsize
        h = digest(data[start:stop], h)
        append(h)
        start = stop
    return tuple(hashes)


def hash_text(text: str, *, unit: int, max_blocks: int, seed: int) -> tuple[int, ...]:
    """Chained hashes of the full blocks of ``text`` (``unit`` = UTF-8 bytes per unit block)."""
    data = text.encode("utf-8", "surrogatepass")
    return hash_blocks(data, block_ends(unit, len(data), max_blocks), 1, seed)


def hash_token_ids(
    token_ids: Sequence[int], *, block_tokens: int, max_blocks: int, seed: int
) -> tuple[int, ...]:
    """Chained hashes of the full blocks of ``token_ids``."""
    ends = block_ends(block_tokens, len(token_ids), max_blocks)
    if not ends:
        return ()
    covered = token_ids[: ends[-1]]
    try:
        ids = array("I", covered)  # 4 bytes: every real vocabulary fits
    except OverflowError:
        ids = array("q", covered)
    return hash_blocks(ids.tobytes(), ends, ids.itemsize, seed)


def build_route_request(
    req: GenerateRequest,
    *,
    block_tokens: int,
    chars_per_token: float,
    max_blocks: int,
    salt: str = "",
    bytes_per_token: float | None = None,
    text_ids: Sequence[int] | None = None,
) -> RouteRequest:
    """The routing view of ``req``: canonical prompt, chained block hashes, token estimate.

    ``chars_per_token`` sizes the text hash unit (the prior); ``bytes_per_token`` (learned, None =
    the prior) counts a text prompt's tokens and its unit block's tokens (rule 5). ``text_ids``: a
    text prompt's token ids from the model's tokenizer (``routing.tokenizer``), or a chat prompt's
    from its chat template: it is then keyed and counted as those token ids, exactly as the same
    prompt sent as ``input_ids``.
    """
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    if chars_per_token <= 0:
        raise ValueError(f"chars_per_token must be > 0, got {chars_per_token}")
    if bytes_per_token is not None and bytes_per_token <= 0:
        raise ValueError(f"bytes_per_token must be > 0, got {bytes_per_token}")
    max_blocks = max(0, max_blocks)
    scope = cache_scope(req.payload)
    if scope:
        salt = f"{salt}\x01{scope}"
    prompt_ids: Sequence[int] = ()
    prompt_bytes = 0
    ids = req.input_ids if req.input_ids is not None else text_ids
    if ids is not None:
        prompt_ids = ids
        hashes = hash_token_ids(
            ids, block_tokens=block_tokens, max_blocks=max_blocks, seed=prefix_seed(req.model, "ids", salt)
        )
        prompt_text = ""
        prompt_tokens = len(ids)
    else:
        prompt_text = render_messages(req.messages) if req.messages is not None else (req.text or "")
        unit = block_chars(block_tokens, chars_per_token)
        data = prompt_text.encode("utf-8", "surrogatepass")
        prompt_bytes = len(data)
        ends = block_ends(unit, prompt_bytes, max_blocks)
        hashes = hash_blocks(data, ends, 1, prefix_seed(req.model, "text", salt))
        per_token = chars_per_token if bytes_per_token is None else bytes_per_token
        prompt_tokens = math.ceil(prompt_bytes / per_token)
        if bytes_per_token is not None:
            block_tokens = max(1, round(unit / bytes_per_token))
    return RouteRequest(
        model=req.model,
        block_hashes=hashes,
        block_tokens=block_tokens,
        prompt_tokens=prompt_tokens,
        prompt_bytes=prompt_bytes,
        session_key=req.session_key,
        prompt_text=prompt_text,
        prompt_ids=prompt_ids,
        priority=req.priority,
        stream=req.stream,
        cache_scoped=bool(scope),
    )
