"""HTTP/1.1 response framing for ``http1.py``, pure (no I/O): the head, and a chunked body.

Malformed input is a ``ValueError`` here; the connection turns it into ``UpstreamProtocolError``.
"""

from __future__ import annotations

import re
from typing import NamedTuple

MAX_HEAD_BYTES = 64 * 1024
MAX_INTERIM = 8  # interim 1xx heads skipped before the final one
_STATUS = re.compile(r"[1-5][0-9][0-9]")


class Head(NamedTuple):
    """A final response head and how its body is framed."""

    status: int
    headers: dict[str, str]  # names lower-cased
    content_type: str  # media type only, lower-cased
    keep_alive: bool
    framing: str  # "length" | "chunked" | "eof"
    length: int = 0  # "length": the body's bytes


def parse_head(head: bytes, interim: int) -> Head | None:
    """The head (up to, not including, its blank line); None for an interim ``1xx`` (the final one
    follows). ``interim``: how many were skipped already."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or parts[0] not in ("HTTP/1.1", "HTTP/1.0") or not _STATUS.fullmatch(parts[1]):
        raise ValueError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    status = int(parts[1])
    if 100 <= status < 200:
        if status == 101 or interim >= MAX_INTERIM:
            raise ValueError(f"worker answered {lines[0][:40]!r}: no final response")
        return None  # an interim answer (100 Continue, 103 Early Hints)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection and (parts[0] != "HTTP/1.0" or "keep-alive" in connection)
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return Head(status, headers, content_type, keep_alive, "chunked")
    if "content-length" in headers:
        length = headers["content-length"]
        if not (length.isascii() and length.isdigit()) or len(length) > 18:
            raise ValueError(f"bad Content-Length {length[:30]!r}")
        return Head(status, headers, content_type, keep_alive, "length", int(length))
    if status in (204, 304):
        return Head(status, headers, content_type, keep_alive, "length")
    return Head(status, headers, content_type, False, "eof")  # the close ends the body


class ChunkedDecoder:
    """``Transfer-Encoding: chunked`` body bytes out of the reads that carry them (trailers skipped)."""

    __slots__ = ("_remaining", "buf", "done")

    def __init__(self) -> None:
        # > 0: bytes left in this chunk's data; -1: a size line next; -2: a chunk's CRLF next;
        # -3: trailer lines after the last chunk, up to an empty one.
        self._remaining = -1
        self.buf = b""  # bytes not decoded yet (a size line or CRLF split over reads; after the end)
        self.done = False

    def feed(self, data: bytes) -> bytes:
        """The body bytes ``data`` completes (b"" for none); ``done`` once the body ended."""
        buf = self.buf + data if self.buf else data
        pos, size = 0, len(buf)
        pieces: list[bytes] = []
        while pos < size:
            if self._remaining > 0:  # inside a chunk's data
                take = min(self._remaining, size - pos)
                pieces.append(buf[pos:pos + take])
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    self._remaining = -2  # expect CRLF
                continue
            if self._remaining == -2:
                if size - pos < 2:
                    break
                pos += 2
                self._remaining = -1
                continue
            if self._remaining == -3:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    break
                empty = end == pos
                pos = end + 2
                if empty:
                    self.done = True
                    break
                continue
            end = buf.find(b"\r\n", pos)
            if end < 0:
                break
            try:
                length = int(buf[pos:end], 16)  # the common case: no chunk extension
            except ValueError:
                size_text = buf[pos:end].split(b";", 1)[0].strip()
                try:
                    length = int(size_text, 16)
                except ValueError:
                    raise ValueError(f"bad chunk size {size_text[:20]!r}") from None
            if length < 0:
                raise ValueError(f"bad chunk size {buf[pos:end][:20]!r}")
            pos = end + 2
            if length == 0:
                self._remaining = -3
                continue
            stop = pos + length
            if stop + 2 <= size:  # the whole chunk and its CRLF are here (one token per chunk: usual)
                pieces.append(buf[pos:stop])
                pos = stop + 2
                continue
            self._remaining = length
        self.buf = buf[pos:] if pos < size else b""
        if not pieces:
            return b""
        return b"".join(pieces) if len(pieces) > 1 else pieces[0]
