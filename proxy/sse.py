"""What SGLang / OpenAI responses say, read without getting in their way (pure, no I/O).

Two readers of the same bytes:
* ``StreamAccountant`` — for relaying. It sees each run of *complete* SSE events (``data: …\\n\\n``)
  as it is relayed and notes only what timing and accounting need: whether the run carried new
  output (a token mark), an error event, ``[DONE]``, and the last payload (parsed once, at the
  end, for ``meta_info`` / ``usage``). SGLang-native chunks are not JSON-parsed on the way: every
  data event other than ``[DONE]`` or an error carries output. OpenAI chunks are parsed, because a
  role-only or usage-only chunk carries no token.
* ``EventDecoder`` — for frontends that re-encode (gRPC): every event becomes a typed
  ``TextDelta`` / ``ErrorEvent``, cumulative SGLang text turned into deltas.

``FinalMeta`` is what the end of a response tells us: finish reason, prompt / cached / completion
tokens, and the worker's own timing (``queue_time``, ``first_token_latency``, ``e2e_latency``).

The bytes themselves (payloads, the stream's end, the checks on a worker's events) are
``sse_frames.py``'s. Numbers read from a worker must be finite, counts in [0, 2**53): anything
else reads as "not reported".
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy import safejson
from proxy.request import Dialect
from proxy.sse_frames import DONE, DONE_EVENT, MalformedEvent, iter_payloads, last_output_payload, parse_event

_DONE_INSIDE = b"\n\ndata: [DONE]\n"  # a [DONE] event after another event of the same run
_DONE_LAST = b"\n\ndata: [DONE]\n\n"  # a [DONE] event ending a run of several events


@dataclass(slots=True)
class FinalMeta:
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    queue_time: float | None = None
    first_token_latency: float | None = None
    e2e_latency: float | None = None
    error: Mapping[str, Any] | None = None
    # A Responses answer's id (what GET /v1/responses/{id} and previous_response_id name).
    response_id: str | None = None
    # Result objects summed into the token counts (an SGLang list answer: a batch, or n samples of
    # one prompt): more than one, and the counts are the work done, not the routed prompt's.
    parts: int = 1


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str
    # New output token ids, when the worker sends them (SGLang native ``output_ids``).
    token_ids: tuple[int, ...] = ()
    # Cumulative completion tokens so far, when reported.
    completion_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    message: str
    code: int | None = None


_MAX_COUNT = 2**53


def as_count(v: Any) -> int | None:
    """A count a worker reported: an integer in [0, 2**53), else None (not reported)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _MAX_COUNT else None


_int = as_count


def _float(v: Any) -> float | None:
    if not isinstance(v, int | float) or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _finish(v: Any) -> str | None:
    if isinstance(v, Mapping):
        return str(v.get("type")) if v.get("type") is not None else None
    return str(v) if v is not None else None


def meta_from(dialect: Dialect, obj: Any, into: FinalMeta | None = None) -> FinalMeta:
    """Fill ``into`` from one response object (non-stream body or a stream chunk)."""
    m = into or FinalMeta()
    if isinstance(obj, list):  # SGLang batch: sum the requests
        m.parts = max(m.parts, len(obj))
        for item in obj:
            part = meta_from(dialect, item)
            for name in ("prompt_tokens", "cached_tokens", "completion_tokens"):
                a, b = getattr(m, name), getattr(part, name)
                if b is not None:
                    setattr(m, name, (a or 0) + b)
            m.finish_reason = part.finish_reason or m.finish_reason
        return m
    if not isinstance(obj, Mapping):
        return m
    if isinstance(obj.get("error"), Mapping):
        m.error = obj["error"]
        return m
    if dialect is Dialect.RESPONSES:
        return _responses_meta(obj, m)
    if dialect is Dialect.MESSAGES:
        return _messages_meta(obj, m)
    if dialect in (Dialect.SGLANG, Dialect.RERANK):  # a ranked document carries its pair's meta_info
        info = obj.get("meta_info")
        if isinstance(info, Mapping):
            m.finish_reason = _finish(info.get("finish_reason")) or m.finish_reason
            m.prompt_tokens = _int(info.get("prompt_tokens")) or m.prompt_tokens
            m.cached_tokens = _int(info.get("cached_tokens")) if "cached_tokens" in info else m.cached_tokens
            m.completion_tokens = _int(info.get("completion_tokens")) or m.completion_tokens
            m.queue_time = _float(info.get("queue_time")) or m.queue_time
            m.first_token_latency = _float(info.get("first_token_latency")) or m.first_token_latency
            m.e2e_latency = _float(info.get("e2e_latency")) or m.e2e_latency
        return m
    choices = obj.get("choices")
    if isinstance(choices, list):
        for c in choices:
            if isinstance(c, Mapping) and c.get("finish_reason"):
                m.finish_reason = _finish(c["finish_reason"])
    _usage(obj.get("usage"), m, "prompt_tokens", "completion_tokens", "prompt_tokens_details")
    return m


def _usage(usage: Any, m: FinalMeta, prompt: str, completion: str, details: str) -> None:
    """An OpenAI-style usage object (chat / completions, or Responses' names for the same)."""
    if isinstance(usage, Mapping):
        m.prompt_tokens = _int(usage.get(prompt))
        m.completion_tokens = _int(usage.get(completion))
        inner = usage.get(details)
        if isinstance(inner, Mapping):
            m.cached_tokens = _int(inner.get("cached_tokens"))


_MAX_ID = 256  # a response id longer than this is no id this proxy keeps


def _responses_meta(obj: Mapping[str, Any], m: FinalMeta) -> FinalMeta:
    """A Responses object (a whole answer, or the ``response`` a stream event carries): its id,
    status and usage (``input_tokens``, ``input_tokens_details.cached_tokens``, ``output_tokens``)."""
    inner = obj.get("response")
    resp: Mapping[str, Any] = inner if isinstance(inner, Mapping) else obj
    rid = resp.get("id")
    if isinstance(rid, str) and 0 < len(rid) <= _MAX_ID:
        m.response_id = rid
    status = resp.get("status")
    if isinstance(status, str) and status not in ("queued", "in_progress"):
        details = resp.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, Mapping) else None
        m.finish_reason = "length" if reason == "max_output_tokens" else status[:40]
        if status == "failed":
            err = resp.get("error")
            m.error = err if isinstance(err, Mapping) else {"message": "the response failed"}
    _usage(resp.get("usage"), m, "input_tokens", "output_tokens", "input_tokens_details")
    return m


def _messages_meta(obj: Mapping[str, Any], m: FinalMeta) -> FinalMeta:
    """An Anthropic message (whole, or what ``message_start`` / ``message_delta`` carry): its stop
    reason and usage. As SGLang fills it, ``input_tokens`` is the whole prompt and
    ``cache_read_input_tokens`` its cached part (Anthropic's own API counts them apart)."""
    inner = obj.get("message")
    msg: Mapping[str, Any] = inner if isinstance(inner, Mapping) else obj
    delta = obj.get("delta")
    stop = (delta if isinstance(delta, Mapping) else msg).get("stop_reason")
    if isinstance(stop, str) and stop:
        m.finish_reason = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length"}.get(stop, stop[:40])
    usage = obj.get("usage") if isinstance(obj.get("usage"), Mapping) else msg.get("usage")
    if isinstance(usage, Mapping):
        # message_start's usage comes before any output (SGLang's: zeros); message_delta's is final.
        prompt, done = _int(usage.get("input_tokens")), _int(usage.get("output_tokens"))
        if prompt:
            m.prompt_tokens = prompt
        if done is not None and (done or m.completion_tokens is None):
            m.completion_tokens = done
        cached = _int(usage.get("cache_read_input_tokens"))
        if cached is not None and (cached or m.cached_tokens is None):
            m.cached_tokens = cached
    return m


def messages_has_output(obj: Mapping[str, Any]) -> bool:
    """A ``content_block_delta`` with text, thinking or tool-call JSON in it."""
    delta = obj.get("delta")
    return obj.get("type") == "content_block_delta" and isinstance(delta, Mapping) and any(
        isinstance(delta.get(k), str) and delta[k] for k in ("text", "thinking", "partial_json"))


# A Responses stream ends with one of these (no [DONE]); "error" is the spec's error event.
RESPONSES_END = frozenset({"response.completed", "response.incomplete", "response.failed"})


def responses_has_output(obj: Mapping[str, Any]) -> bool:
    """Whether a Responses stream event carries generated output: a non-empty ``*.delta`` (text,
    reasoning, refusal, function-call arguments); created / in_progress / item events do not."""
    kind, delta = obj.get("type"), obj.get("delta")
    return isinstance(kind, str) and kind.endswith(".delta") and isinstance(delta, str) and bool(delta)


def error_of(obj: Any) -> ErrorEvent | None:
    if isinstance(obj, Mapping) and isinstance(obj.get("error"), Mapping):
        err = obj["error"]
        return ErrorEvent(str(err.get("message", "")), _int(err.get("code")))
    return None


def token_ids(ids: Any) -> tuple[int, ...]:
    """A chunk's ``output_ids`` as ints; ``ValueError`` for anything else (1e999, "7", 1.5)."""
    if not all(type(i) is int for i in ids):
        raise ValueError(f"output_ids: expected integers, got {ids!r:.80}")
    return tuple(ids)


def first_token_counts(dialect: Dialect, data: bytes) -> tuple[int | None, int | None]:
    """(prompt_tokens, cached_tokens) from the run that carried a stream's first token.

    SGLang's native chunks carry ``meta_info`` in every event, so the prompt's cache hit is known
    at the first token; OpenAI chunks report usage only at the end: (None, None). Parsed once per
    request, and only the run's first output event.
    """
    if dialect is not Dialect.SGLANG:
        return None, None
    for payload in iter_payloads(data):
        if payload == DONE or payload.startswith(b'{"error"'):
            continue
        try:
            info = safejson.loads(payload).get("meta_info")
        except (ValueError, AttributeError):
            return None, None
        if not isinstance(info, Mapping):
            return None, None
        return _int(info.get("prompt_tokens")), _int(info.get("cached_tokens"))
    return None, None


def openai_has_output(obj: Mapping[str, Any]) -> bool:
    for c in obj.get("choices") or ():
        if not isinstance(c, Mapping):
            continue
        if c.get("text"):
            return True
        delta = c.get("delta")
        if isinstance(delta, Mapping) and (delta.get("content") or delta.get("reasoning_content")
                                           or delta.get("tool_calls")):
            return True
    return False


@dataclass(slots=True)
class StreamAccountant:
    dialect: Dialect
    done: bool = False
    error: Mapping[str, Any] | None = None
    events: int = 0
    token_events: int = 0
    meta: FinalMeta = field(default_factory=FinalMeta)
    _last: bytes | None = None  # the last run that carried output (parsed once, at the end)

    def feed(self, data: bytes) -> bool:
        """Account one run of complete events; True when it carried new output."""
        if self.dialect is Dialect.RESPONSES:
            return self._feed_responses(data)
        if self.dialect is Dialect.MESSAGES:
            return self._feed_messages(data)
        if self.dialect is not Dialect.SGLANG:
            return self._feed_openai(data)
        # Native chunks are counted, not parsed: an event starts a run or follows a blank line,
        # and JSON never holds a raw newline, so b"\n\ndata:" cannot occur inside a payload.
        n = data.count(b"\n\ndata:") + (1 if data.startswith(b"data:") else 0)
        if not n:
            return False
        self.events += n
        # [DONE] counts only as a whole event (a model may write "data: [DONE]" in its text), and it
        # is nearly always a run's last: test the end first, scan only when it is not there.
        if data.endswith(_DONE_LAST) or data.startswith(DONE_EVENT) or _DONE_INSIDE in data:
            self.done = True
            n -= 1
        if b'data: {"error"' in data:
            for payload in iter_payloads(data):
                if payload.startswith(b'{"error"'):
                    self.error = _error_of_payload(payload)
                    n -= 1
        if n <= 0:
            return False
        self.token_events += n
        self._last = data
        return True

    def _feed_openai(self, data: bytes) -> bool:
        carried = False
        for payload in iter_payloads(data):
            self.events += 1
            if payload == DONE:
                self.done = True
            elif payload.startswith(b'{"error"'):
                self.error = _error_of_payload(payload)
            else:
                obj = parse_event(payload)
                if not isinstance(obj, Mapping):
                    raise MalformedEvent(f"an event is a JSON {type(obj).__name__}, not an object")
                if openai_has_output(obj):
                    carried = True
                    self.token_events += 1
                meta_from(self.dialect, obj, self.meta)
        return carried

    def _objects(self, data: bytes) -> Iterator[Mapping[str, Any]]:
        """The run's events parsed, each counted; a ``[DONE]`` (no part of these APIs, but an end
        all the same) ends the stream."""
        for payload in iter_payloads(data):
            self.events += 1
            if payload == DONE:
                self.done = True
                continue
            obj = parse_event(payload)
            if not isinstance(obj, Mapping):
                raise MalformedEvent(f"an event is a JSON {type(obj).__name__}, not an object")
            yield obj

    def _feed_responses(self, data: bytes) -> bool:
        """Every event is parsed (each is small: one delta, or the response at its start and end)."""
        carried = False
        for obj in self._objects(data):
            kind = obj.get("type")
            if isinstance(obj.get("error"), Mapping) and kind is None:
                self.error = obj["error"]
            elif kind == "error":
                self.error = {"message": str(obj.get("message", ""))[:500], "code": obj.get("code")}
            elif responses_has_output(obj):
                carried = True
                self.token_events += 1
            elif isinstance(obj.get("response"), Mapping):
                _responses_meta(obj, self.meta)
                if kind in RESPONSES_END:
                    self.done = True
                    if self.meta.error is not None:
                        self.error = self.meta.error
                    elif not self.token_events and self.meta.completion_tokens:
                        carried = True  # output sent whole at the end, no deltas: its first token is here
        return carried

    def _feed_messages(self, data: bytes) -> bool:
        """Anthropic events: deltas carry tokens, ``message_start`` / ``message_delta`` the usage,
        ``message_stop`` ends the stream, ``error`` fails it."""
        carried = False
        for obj in self._objects(data):
            kind = obj.get("type")
            if kind == "error" or (kind is None and isinstance(obj.get("error"), Mapping)):
                err = obj.get("error")
                self.error = err if isinstance(err, Mapping) else {"message": str(err)[:500]}
            elif messages_has_output(obj):
                carried = True
                self.token_events += 1
            elif kind in ("message_start", "message_delta"):
                _messages_meta(obj, self.meta)
            elif kind == "message_stop":
                self.done = True
        return carried

    def final(self) -> FinalMeta:
        """What the stream told (never raises: a malformed last chunk reports nothing)."""
        if self._last is not None:
            last = last_output_payload(self._last)
            self._last = None
            if last is not None:
                try:
                    meta_from(self.dialect, safejson.loads(last), self.meta)
                except ValueError:
                    pass
        if self.meta.completion_tokens is None and self.token_events:
            self.meta.completion_tokens = self.token_events  # OpenAI stream without usage: chunks
        if self.error is not None:
            self.meta.error = self.error
        return self.meta


@dataclass(slots=True)
class EventDecoder:
    """Typed events from complete SSE runs; SGLang's cumulative text becomes deltas."""

    dialect: Dialect
    _text: str = ""
    _ids_len: int = 0

    def decode(self, data: bytes) -> list[TextDelta | ErrorEvent]:
        out: list[TextDelta | ErrorEvent] = []
        for payload in iter_payloads(data):
            if payload == DONE:
                continue
            out.extend(self.decode_object(parse_event(payload)))
        return out

    def decode_object(self, obj: Any) -> list[TextDelta | ErrorEvent]:
        err = error_of(obj)
        if err is not None:
            return [err]
        if not isinstance(obj, Mapping):
            return []
        if self.dialect is Dialect.SGLANG:
            raw_text, raw_ids, raw_info = obj.get("text"), obj.get("output_ids"), obj.get("meta_info")
            text: str = raw_text if isinstance(raw_text, str) else ""
            ids: list[Any] = raw_ids if isinstance(raw_ids, list) else []
            info: Mapping[str, Any] = raw_info if isinstance(raw_info, Mapping) else {}
            completion = _int(info.get("completion_tokens"))
            # SGLang streams cumulative text by default (a chunk extends the text so far);
            # with --incremental-streaming-output each chunk is a delta.
            if self._text and text.startswith(self._text):
                new_text, self._text = text[len(self._text):], text
            else:
                new_text = text
                self._text += text
            if completion is not None and len(ids) == completion and len(ids) >= self._ids_len:
                new_ids, self._ids_len = ids[self._ids_len:], len(ids)
            else:
                new_ids = ids
                self._ids_len += len(ids)
            return [TextDelta(new_text, token_ids(new_ids), completion)]
        pieces: list[str] = []
        for c in obj.get("choices") or ():
            if isinstance(c, Mapping):
                delta = c.get("delta")
                if isinstance(delta, Mapping) and isinstance(delta.get("content"), str):
                    pieces.append(delta["content"])
                elif isinstance(c.get("text"), str):
                    pieces.append(c["text"])
                elif isinstance(c.get("message"), Mapping):
                    pieces.append(str(c["message"].get("content") or ""))
        raw_usage = obj.get("usage")
        usage: Mapping[str, Any] = raw_usage if isinstance(raw_usage, Mapping) else {}
        if not pieces and not usage:
            return []
        return [TextDelta("".join(pieces), (), _int(usage.get("completion_tokens")))]


def _error_of_payload(payload: bytes) -> Mapping[str, Any]:
    err = parse_event(payload).get("error")
    return err if isinstance(err, Mapping) else {"message": str(err)[:200]} if err else {}
