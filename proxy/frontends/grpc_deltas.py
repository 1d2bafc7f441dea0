"""What one gRPC message carries, read straight from a run of the worker's SSE bytes (pure).

The gRPC frontend sends one ``GenerateResponse`` per run of upstream events. From a run it needs
only the text the run added, how many tokens that is, and (rarely) an error event. The reference
reading is ``sse.EventDecoder`` + ``grpc_messages.tokens_added``: json.loads on every event. On
SGLang's native stream every chunk repeats the whole text and ``output_ids`` so far, so that costs
O(answer) per chunk, O(answer²) per answer, and was most of the gRPC path's per-token CPU.

``RunReader.read`` gives the reference's results with less work. A native chunk laid out as SGLang
writes it, ``{"text":"…","output_ids":[…],…}``, whose text and ids start with exactly the bytes of
the previous chunk's text and ids (cumulative streaming, the default), is read without parsing what
it repeats:

* the new text is the bytes after the old text up to the closing quote, decoded as json.loads
  decodes them (strict UTF-8, as ``safejson``) — used only when they hold no backslash and no control
  character, i.e. when JSON's string decoding is the identity on them;
* the new ids are checked to be JSON integers and counted, not converted;
* the rest (``meta_info``: a few hundred bytes) goes through json.loads itself, so its values, and
  the refusal of anything json.loads would refuse, are json's own — except that a rest equal to the
  last one json read but for meta_info's own completion count is read from that template.

Every other chunk — an error event, an escape or a control character in the new text, another key
order, a repeated ``text`` / ``output_ids`` / an ``error`` key, ``--incremental-streaming-output``,
any OpenAI chunk — takes the reference path, which also re-learns the raw text bytes the next chunk
is compared with. Equality with the reference, malformed input included (both raise), is a property
test: ``tests/unit/test_grpc_deltas.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from json.decoder import scanstring  # type: ignore[attr-defined]  # json's own string scanner
from typing import Any, NamedTuple

from proxy import safejson
from proxy.frontends.grpc_messages import tokens_added
from proxy.request import Dialect
from proxy.sse import ErrorEvent, EventDecoder, TextDelta, as_count, error_of, token_ids
from proxy.sse_frames import DONE, iter_payloads, parse_event

_TEXT_KEYS = (b'{"text":"', b'{"text": "')
_WS = b" \t\n\r"  # JSON's whitespace (bytes.strip() would also take \x0b and \x0c)
_INT = rb"-?(?:0|[1-9][0-9]*)"
_IDS_KEY = re.compile(rb'[ \t\n\r]*,[ \t\n\r]*"output_ids"[ \t\n\r]*:[ \t\n\r]*\[')
_IDS = re.compile(rb"[ \t\n\r]*(?:" + _INT + rb"[ \t\n\r]*(?:,[ \t\n\r]*" + _INT + rb"[ \t\n\r]*)*)?")
_MORE_IDS = re.compile(rb"(?:,[ \t\n\r]*" + _INT + rb"[ \t\n\r]*)*")
_CONTROL = re.compile(rb"[\x00-\x1f]")
_NUMBER = re.compile(_INT)
_COMPLETION_KEY = re.compile(rb'"completion_tokens"[ \t\n\r]*:[ \t\n\r]*')
_REPEATED = ("text", "output_ids", "error")


class RunRead(NamedTuple):
    """One run's share of the answer: text added, tokens added, and the error that ended it, if any
    (``text`` / ``tokens`` then cover the events before the error)."""

    text: str
    tokens: int
    error: ErrorEvent | None


class RunReader:
    """Reads one stream's runs in order (it keeps the stream's text and token count so far)."""

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        self._decoder = EventDecoder(dialect)  # the reference path for OpenAI dialects
        self._emitted = 0  # output tokens counted so far (tokens_added's ``emitted``)
        # Native state, as EventDecoder keeps it: the text so far (joined lazily) and the ids count.
        self._parts: list[str] = []
        self._ids_len = 0
        # The raw JSON-string bytes of the text so far, when known (decoding them gives the text).
        self._raw_text: bytes | None = b""
        # A raw id-list body already checked to hold ``_raw_ids_count`` integers (the last fast chunk's).
        self._raw_ids: bytes | None = None
        self._raw_ids_count = 0
        # What follows the ids, split around the completion count: (bytes before, bytes after).
        self._template: tuple[bytes, bytes] | None = None

    def read(self, data: bytes) -> RunRead:
        """``data``: one run of complete SSE events. Raises what json.loads / int() would."""
        if self._dialect is not Dialect.SGLANG:
            return self._read_reference(data)
        parts: list[str] = []
        tokens = 0
        error: ErrorEvent | None = None
        for payload in iter_payloads(data):
            if payload == DONE:
                continue
            got = self._fast(payload) or self._slow(payload)
            if got is None:
                continue
            if isinstance(got, ErrorEvent):
                error = error or got
            elif error is None:  # past an error the run is still read (a malformed event raises), not counted
                text, added = got
                self._emitted += added
                parts.append(text)
                tokens += added
        return RunRead("".join(parts), tokens, error)

    def _read_reference(self, data: bytes) -> RunRead:
        parts: list[str] = []
        tokens = 0
        for event in self._decoder.decode(data):
            if isinstance(event, ErrorEvent):
                return RunRead("".join(parts), tokens, event)
            added = tokens_added(event, self._emitted)
            self._emitted += added
            tokens += added
            parts.append(event.text)
        return RunRead("".join(parts), tokens, None)

    # -- native chunks ----------------------------------------------------------------------------
    def _text(self) -> str:
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def _fast(self, p: bytes) -> tuple[str, int] | None:
        """(new text, tokens added) of a chunk that extends the last one byte for byte; else None."""
        raw = self._raw_text
        if raw is None:
            return None
        start = 9 if p.startswith(_TEXT_KEYS[0]) else 10 if p.startswith(_TEXT_KEYS[1]) else 0
        if not start or not p.startswith(raw, start):
            return None
        i = start + len(raw)  # raw ends where a JSON string token ends: i starts a fresh one
        j = p.find(b'"', i)
        if j < 0:
            return None
        new = p[i:j]
        if b"\\" in new or _CONTROL.search(new):
            return None
        try:
            delta = new.decode("utf-8")  # strict, as safejson decodes the reference path
        except UnicodeDecodeError:
            return None
        key = _IDS_KEY.match(p, j + 1)
        if key is None:
            return None
        a = key.end()
        b = p.find(b"]", a)
        if b < 0:
            return None
        ids = p[a:b]
        n_ids = self._count_ids(ids)
        if n_ids is None:
            return None
        read = self._rest(p[b + 1:])
        if read is None:
            return None
        completion = read[0]
        self._raw_text, self._raw_ids, self._raw_ids_count = p[start:j], ids, n_ids
        self._parts.append(delta)  # the text so far ended where ``delta`` starts (cumulative chunk)
        return delta, self._count(delta, n_ids, completion)

    def _rest(self, rest: bytes) -> tuple[int | None] | None:
        """``(completion_tokens,)`` from what follows the id list; None when the reference must read it.

        ``meta_info`` changes little from chunk to chunk: usually only the completion count. So the
        last rest json.loads read is kept as a template (the bytes around that count); a rest that
        differs from it only in that integer is read without parsing. Learnt only when the rest has
        no backslash (every quote is then structural) and exactly one ``"completion_tokens":`` key
        whose integer is the one json read, so the slot is meta_info's own count."""
        template = self._template
        if template is not None and rest.startswith(template[0]) and rest.endswith(template[1]):
            number = rest[len(template[0]):len(rest) - len(template[1])]
            if _NUMBER.fullmatch(number):
                return (_int(int(number)),)
        body = rest.lstrip(_WS)
        if body.rstrip(_WS) == b"}":
            return (None,)
        if not body.startswith(b",") or not body[1:].lstrip(_WS).startswith(b'"'):
            return None
        try:
            others = safejson.loads(b"{" + body[1:])
        except ValueError:
            return None
        if any(k in others for k in _REPEATED):
            return None  # json keeps a repeated key's last value; the reference path knows which
        info = others.get("meta_info")
        completion = _int(info.get("completion_tokens")) if isinstance(info, Mapping) else None
        self._template = _template(rest, completion)
        return (completion,)

    def _count_ids(self, ids: bytes) -> int | None:
        """How many JSON integers the list body ``ids`` holds; None when it is not just integers."""
        known = self._raw_ids
        if known is not None and ids.startswith(known):
            more = ids[len(known):]
            if self._raw_ids_count:
                if _MORE_IDS.fullmatch(more):
                    return self._raw_ids_count + more.count(b",")
            elif _IDS.fullmatch(more):
                return more.count(b",") + 1 if more.strip(_WS) else 0
        if _IDS.fullmatch(ids):
            return ids.count(b",") + 1 if ids.strip(_WS) else 0
        return None

    def _count(self, new_text: str, n_ids: int, completion: int | None) -> int:
        """EventDecoder's id rule, then tokens_added (not yet added to ``_emitted``), from the count of
        ids alone."""
        if completion is not None and n_ids == completion and n_ids >= self._ids_len:
            n_new, self._ids_len = n_ids - self._ids_len, n_ids
        else:
            n_new = n_ids
            self._ids_len += n_ids
        if completion is not None:
            return max(0, completion - self._emitted)
        return n_new if n_new else 1 if new_text else 0

    def _slow(self, p: bytes) -> tuple[str, int] | ErrorEvent | None:
        """The reference reading of one native chunk (EventDecoder.decode_object + tokens_added)."""
        obj = parse_event(p)
        err = error_of(obj)
        if err is not None:
            return err
        if not isinstance(obj, Mapping):
            return None
        raw_text, raw_ids, raw_info = obj.get("text"), obj.get("output_ids"), obj.get("meta_info")
        text: str = raw_text if isinstance(raw_text, str) else ""
        ids: list[Any] = raw_ids if isinstance(raw_ids, list) else []
        info: Mapping[str, Any] = raw_info if isinstance(raw_info, Mapping) else {}
        completion = _int(info.get("completion_tokens"))
        before = self._text()
        if before and text.startswith(before):
            new_text = text[len(before):]
            self._parts = [text]
        else:
            new_text = text
            self._parts = [before + text]
        if completion is not None and len(ids) == completion and len(ids) >= self._ids_len:
            new_ids, self._ids_len = ids[self._ids_len:], len(ids)
        else:
            new_ids = ids
            self._ids_len += len(ids)
        delta = TextDelta(new_text, token_ids(new_ids), completion)
        self._raw_text = _raw_string(p, self._parts[0])
        return new_text, tokens_added(delta, self._emitted)


def _raw_string(p: bytes, text: str) -> bytes | None:
    """The raw bytes of ``p``'s leading ``"text"`` string when they decode to ``text``; else None."""
    start = 9 if p.startswith(_TEXT_KEYS[0]) else 10 if p.startswith(_TEXT_KEYS[1]) else 0
    if not start:
        return b"" if not text else None
    s = p.decode("utf-8", "surrogatepass")  # json.loads parsed p: this cannot fail
    value, end = scanstring(s, start)
    if value != text:
        return None
    return s[start:end - 1].encode("utf-8", "surrogatepass")


def _template(rest: bytes, completion: int | None) -> tuple[bytes, bytes] | None:
    """``rest`` split around the integer of its one ``"completion_tokens"`` key, when that is safe."""
    if completion is None or b"\\" in rest:
        return None
    keys = list(_COMPLETION_KEY.finditer(rest))
    if len(keys) != 1:
        return None
    number = _NUMBER.match(rest, keys[0].end())
    if number is None or int(number.group()) != completion:  # (a float there: json's completion is None)
        return None
    return rest[:number.start()], rest[number.end():]


_int = as_count  # the reference's reading of a count
