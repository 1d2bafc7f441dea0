"""KV cache events of SGLang and vLLM engines: their wire format, decoded (pure, no sockets).

Both engines publish with the same ``ZmqEventPublisher`` design (SGLang
``srt/disaggregation/kv_events.py``, vLLM ``distributed/kv_events.py``):
* a PUB socket sends multipart ``[topic, seq, payload]``: ``seq`` an 8-byte big-endian counter
  from 0 per publisher process (so a smaller one means the engine restarted);
* an optional ROUTER replay socket answers ``[b"", start_seq]`` (8 bytes) with one
  ``[b"", seq, payload]`` per buffered batch from ``start_seq`` on, then ``[b"", -1, b""]``
  (-1 as 8 signed bytes);
* ``payload`` is one msgpack-encoded ``EventBatch`` (msgspec ``Struct``s), in one of two layouts:
  array-like (SGLang, vLLM up to 0.10): ``[ts, [event, ...], dp_rank?]`` with each event
  ``[tag, field, ...]`` in declaration order; or a map (vLLM 0.11+):
  ``{"ts", "events", "data_parallel_rank"}`` with each event ``{"type": tag, field: value}``.
  Trailing (array) or any (map) fields left at their default are omitted (``omit_defaults``).
Events, by tag:
* ``BlockStored``: block_hashes, parent_block_hash (None at the root), token_ids (the blocks'
  tokens, in order), block_size, lora_id, then (newer) medium ("GPU", or "CPU" / disk for the
  hierarchical cache's lower tiers) and vLLM's lora_name, extra_keys, group_idx, ...; blocks
  stored under an adapter, a cache salt or multimodal inputs are ``scoped``;
* ``BlockRemoved``: block_hashes, then (newer) medium;
* ``AllBlocksCleared``: nothing.
Data-parallel ranks (SGLang ``--dp-size``, vLLM's DP engines): each rank's scheduler has its own
cache and its own publisher, on the configured ports plus its rank (``offset_endpoint``).
A block hash is an int (SGLang: a hash of the page's tokens, chained or not depending on the
version; vLLM before 0.11) or bytes (vLLM's sha256-based ``ExternalBlockHash``). Neither can be
recomputed here (Python's salted ``hash``, a random per-process seed), so the index keys blocks
by their token ids (``proxy.routing.kv_index``) and uses the engine's hashes only to find what a
later ``BlockRemoved`` names.

Everything read is bounded (``EventLimits``): a payload past its cap, a batch of too many events,
a block list or token list too long, or any field of the wrong type is an ``EventError``, never a
partial batch.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

BlockHash = int | bytes

# A replay answer's end marker: -1 as 8 signed big-endian bytes.
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def offset_endpoint(endpoint: str, rank: int) -> str | None:
    """Where data-parallel rank ``rank`` of an engine publishes when ``endpoint`` is what it was
    configured with: a TCP port moves up by the rank, an ``inproc://`` name takes ``_dp{rank}``
    (both engines' ``offset_endpoint_port``); None where no rank but 0 can publish (``ipc://``,
    which the engines refuse for rank > 0, or no port)."""
    if rank == 0:
        return endpoint
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{rank}"
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        if base != "tcp:/" and port.isdigit() and 0 < int(port) and int(port) + rank <= 65_535:
            return f"{base}:{int(port) + rank}"
    return None


class EventError(ValueError):
    """A payload that is not a well-formed, bounded KV event batch."""


@dataclass(frozen=True, slots=True)
class EventLimits:
    max_payload_bytes: int = 16 * 1024 * 1024
    max_events: int = 100_000
    max_blocks_per_event: int = 65_536
    max_tokens_per_event: int = 1 << 20


DEFAULT_LIMITS = EventLimits()


@dataclass(frozen=True, slots=True)
class Stored:
    hashes: tuple[BlockHash, ...]
    parent: BlockHash | None
    token_ids: Sequence[int]  # array("I") when decoded
    block_size: int
    medium: str | None = None
    # Cached under a LoRA adapter, a cache salt or multimodal inputs (lora_id, lora_name,
    # extra_keys): no prompt the proxy keys by its tokens alone can reuse these blocks.
    scoped: bool = False


@dataclass(frozen=True, slots=True)
class Removed:
    hashes: tuple[BlockHash, ...]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class Cleared:
    pass


Event = Stored | Removed | Cleared


@dataclass(frozen=True, slots=True)
class Batch:
    ts: float
    events: tuple[Event, ...]
    dp_rank: int | None = None


# Field order of the array-like layout (declaration order of the engines' Structs).
_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                  "lora_name", "extra_keys")
_REMOVED_FIELDS = ("block_hashes", "medium")


def decode_seq(raw: bytes, *, signed: bool = False) -> int:
    if len(raw) != 8:
        raise EventError(f"sequence number: expected 8 bytes, got {len(raw)}")
    return int.from_bytes(raw, "big", signed=signed)


def decode_batch(payload: bytes, limits: EventLimits = DEFAULT_LIMITS) -> Batch:
    if len(payload) > limits.max_payload_bytes:
        raise EventError(f"payload of {len(payload)} bytes over the {limits.max_payload_bytes}-byte cap")
    try:
        doc = msgpack.unpackb(payload, raw=False, strict_map_key=False, use_list=True,
                              max_str_len=1 << 16, max_bin_len=1 << 16,
                              max_array_len=max(limits.max_events, limits.max_tokens_per_event),
                              max_map_len=64)
    except (ValueError, msgpack.UnpackException, TypeError) as e:
        raise EventError(f"not msgpack: {e}") from None
    if isinstance(doc, list):
        if len(doc) < 2:
            raise EventError("array batch: expected [ts, events, ...]")
        ts, events, rank = doc[0], doc[1], doc[2] if len(doc) > 2 else None
    elif isinstance(doc, dict):
        ts, events, rank = doc.get("ts"), doc.get("events"), doc.get("data_parallel_rank", doc.get("attn_dp_rank"))
    else:
        raise EventError(f"batch: expected an array or a map, got {type(doc).__name__}")
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        raise EventError("batch ts: expected a number")
    if not isinstance(events, list):
        raise EventError("batch events: expected an array")
    if len(events) > limits.max_events:
        raise EventError(f"{len(events)} events over the {limits.max_events} cap")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool)):
        raise EventError("batch dp rank: expected an integer")
    return Batch(float(ts), tuple(_event(e, limits) for e in events), rank)


def _event(raw: Any, limits: EventLimits) -> Event:
    tag, fields = _tagged(raw)
    if tag == "BlockStored":
        f = _fields(fields, _STORED_FIELDS)
        hashes = _hashes(f.get("block_hashes"), limits)
        raw_tokens = f.get("token_ids")
        if not isinstance(raw_tokens, list) or len(raw_tokens) > limits.max_tokens_per_event:
            raise EventError("BlockStored token_ids: expected an array within the cap")
        try:  # C-level check of every id (an int in 0 .. 2**32-1), 20x cheaper than a Python loop
            tokens = array("I", raw_tokens)
        except (TypeError, OverflowError):
            raise EventError("BlockStored token_ids: expected token ids (0 <= id < 2**32)") from None
        size = f.get("block_size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise EventError("BlockStored block_size: expected a positive integer")
        if len(tokens) > len(hashes) * size or len(tokens) <= (len(hashes) - 1) * size:
            raise EventError(f"BlockStored: {len(tokens)} tokens do not fill {len(hashes)} blocks of {size}")
        parent = f.get("parent_block_hash")
        if parent is not None:
            parent = _hash(parent)
        return Stored(hashes, parent, tokens, size, _medium(f.get("medium")), _scoped(f))
    if tag == "BlockRemoved":
        f = _fields(fields, _REMOVED_FIELDS)
        return Removed(_hashes(f.get("block_hashes"), limits), _medium(f.get("medium")))
    if tag == "AllBlocksCleared":
        return Cleared()
    raise EventError(f"unknown event type {tag!r}")


def _tagged(raw: Any) -> tuple[str, Sequence[Any] | Mapping[str, Any]]:
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        return raw[0], raw[1:]
    if isinstance(raw, dict) and isinstance(raw.get("type"), str):
        return raw["type"], raw
    raise EventError("event: expected [tag, ...] or {'type': tag, ...}")


def _fields(fields: Sequence[Any] | Mapping[str, Any], names: tuple[str, ...]) -> Mapping[str, Any]:
    if isinstance(fields, Mapping):
        return fields
    return dict(zip(names, fields, strict=False))


def _scoped(f: Mapping[str, Any]) -> bool:
    """Whether stored blocks belong to an adapter, a cache salt or multimodal inputs (vLLM puts the
    last two in ``extra_keys``, one entry per block, None for a plain one)."""
    extra = f.get("extra_keys")
    if isinstance(extra, list):
        extra = next((e for e in extra if e is not None), None)
    return f.get("lora_id") not in (None, 0, "") or f.get("lora_name") not in (None, "") or extra is not None


def _hash(raw: Any) -> BlockHash:
    if isinstance(raw, bytes) and raw:
        return raw
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    raise EventError("block hash: expected an integer or bytes")


def _hashes(raw: Any, limits: EventLimits) -> tuple[BlockHash, ...]:
    if not isinstance(raw, list) or not raw or len(raw) > limits.max_blocks_per_event:
        raise EventError("block_hashes: expected a non-empty array within the cap")
    return tuple(_hash(h) for h in raw)


def _medium(raw: Any) -> str | None:
    if raw is None or isinstance(raw, str):
        return raw
    raise EventError("medium: expected a string")
