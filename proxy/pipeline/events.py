"""Complete SSE events out of a worker's stream, as they arrive.

A worker's bytes come in whatever pieces TCP made; the relay only ever hands on whole events
(a run of them ending in a blank line). A partial event waits in pieces, joined once when its
blank line comes (no copy per read), at most ``upstream.max_event_bytes`` of it: beyond, the
stream is broken (``MalformedEvent``).
"""

from __future__ import annotations

from proxy.pipeline.transport import Answer
from proxy.sse_frames import MalformedEvent


class EventReader:
    __slots__ = ("_answer", "_len", "_limit", "_pending")

    def __init__(self, answer: Answer, max_event_bytes: int) -> None:
        self._answer = answer
        self._limit = max_event_bytes
        self._pending: list[bytes] = []  # a partial SSE event, in the pieces it arrived in
        self._len = 0

    def clear(self) -> None:
        """Free a partial event now (a failed attempt's), whoever still holds the reader."""
        self._pending.clear()

    async def next_run(self) -> bytes:
        """The next run of complete SSE events; b"" at the end (a trailing partial event is dropped)."""
        read = self._answer.readany
        pending = self._pending
        while True:
            data = await read()
            if not data:
                return b""
            if pending:
                if b"\n\n" not in data and not (data[:1] == b"\n" and pending[-1].endswith(b"\n")):
                    pending.append(data)
                    self._len += len(data)
                    self._check_partial()
                    continue
                data = b"".join(pending) + data
                pending.clear()
            cut = data.rfind(b"\n\n") + 2
            if cut == 1:
                pending.append(data)
                self._len = len(data)
                self._check_partial()
                continue
            self._len = len(data) - cut
            if self._len:
                pending.append(data[cut:])
                self._check_partial()
                data = data[:cut]
            return data

    def _check_partial(self) -> None:
        if self._len > self._limit:
            self._pending.clear()  # freed at once, not when the exception's frames are
            raise MalformedEvent(f"the worker sent an event of more than {self._limit} bytes without its end "
                                 "(upstream.max_event_bytes)")
