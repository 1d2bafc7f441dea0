"""The relay: an opened stream's events to the client, as they come, until its end.

Owns the stream from the attempt's first events on. Each run of complete events is counted
(``StreamAccountant``: tokens, usage, the final meta), marked on the timing (each token-bearing
chunk), stripped of a usage chunk the caller did not ask for, cut after ``[DONE]`` or an error
event, and yielded. After the first token reaches the client, ``on_first_token`` tells the policy
and the holds (the prefix is in the worker's cache now).

A stream ends at its deadline by the clock (one timer, ``Clock.call_at``), whatever the worker
still sends: a worker dribbling a byte at a time never completes an event. If the worker dies or
breaks the protocol mid-stream, the stream ends with an error event (``sse_frames.error_event``). The
proxy's own drain ends it with ``cut(err)``: the error is the drain's, not the worker's.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable

from proxy.errors import RadixgateError, UpstreamError, UpstreamTimeout
from proxy.pipeline.attempt import Opened
from proxy.pipeline.parts import Parts
from proxy.request import GenerateRequest
from proxy.sse import FinalMeta, StreamAccountant
from proxy.sse_frames import MalformedEvent, check_events, drop_usage_events, error_event, until_end
from proxy.timing import RequestTiming
from proxy.workers.http1 import UpstreamIdle, UpstreamProtocolError
from proxy.workers.upstream import CONNECT_ERRORS


class Relay:
    def __init__(self, parts: Parts, req: GenerateRequest, *, worker: str, rid: str, opened: Opened,
                 timing: RequestTiming, deadline: float, total_s: float, hide_usage: bool,
                 on_first_token: Callable[[bytes], None]) -> None:
        self._parts, self._worker, self._rid = parts, worker, rid
        self._opened = opened
        self._timing = timing
        self._deadline, self._total_s = deadline, total_s
        self._hide_usage = hide_usage
        self._on_first_token = on_first_token
        self._acct = StreamAccountant(req.dialect)
        self._error_style = req.dialect.error_style
        self._abortable = req.dialect.abortable  # else the closed connection is the abort
        self._cut: RadixgateError | None = None  # why the proxy itself ended the stream (drain)
        self._gen: AsyncGenerator[bytes, None] | None = None
        self._closed = False
        self.upstream_done = False  # the worker's stream ended ([DONE] or an error event)
        self.error: RadixgateError | None = None  # the stream broke after relaying began
        self.meta = FinalMeta()

    @property
    def worker_ended(self) -> bool:
        """Whether the worker's stream reached ``[DONE]`` or its own error event."""
        return self._acct.done or self._acct.error is not None

    @property
    def ended(self) -> bool:
        """Whether the last run yielded held the stream's end: the worker's, or our error event."""
        return self._acct.done or self._acct.error is not None or self.error is not None

    def chunks(self) -> AsyncGenerator[bytes, None]:
        if self._gen is None:
            self._gen = self._run()
        return self._gen

    def cut(self, err: RadixgateError) -> bool:
        """End the stream with ``err`` (the drain's last word): closing the connection makes the relay
        stop at its next read, the one place a stream already knows how to end with an error."""
        if self.upstream_done or self._closed:
            return False
        self._cut = err
        self._opened.answer.close()
        return True

    async def close(self) -> None:
        """The exchange ends: stop relaying; a stream the worker had not finished is closed and its
        generation aborted (the client left, or the stream went silent) — unless the connection broke,
        which leaves nothing to abort."""
        if self._closed:
            return
        if self._gen is not None:
            await self._gen.aclose()
        self._closed = True
        answer = self._opened.answer
        if not self.upstream_done:
            answer.close()
        answer.release()
        if not self.upstream_done and not isinstance(self.error, UpstreamError) and self._abortable:
            self._parts.abort(self._worker, self._rid)

    async def _run(self) -> AsyncGenerator[bytes, None]:
        parts, t, acct, opened = self._parts, self._timing, self._acct, self._opened
        clock = parts.clock
        data, now = opened.first, opened.first_at
        opened.first = b""
        resp = opened.answer
        err: RadixgateError
        deadline = clock.call_at(self._deadline, lambda: resp.fail(TimeoutError()))
        try:
            while data:
                first = False
                if acct.feed(data):
                    first = t.first_token is None
                    t.mark_token(now)
                if self._hide_usage:
                    data = drop_usage_events(data)  # counted above; the caller did not ask for it
                if acct.done or acct.error is not None:
                    data = until_end(data)
                if data:
                    yield data
                if first:  # after the client has its first token, not before
                    self._on_first_token(data)
                if acct.done or acct.error is not None:
                    break
                data = await opened.reader.next_run()
                if data:
                    check_events(data)
                now = clock.now()
                if now > self._deadline:
                    raise TimeoutError
            self.upstream_done = True
            if acct.done or acct.error is not None:
                self.meta = acct.final()
                return
            err = UpstreamError("the worker closed the stream before it finished")
        except UpstreamIdle as e:
            err = UpstreamTimeout(str(e))
        except TimeoutError:
            err = UpstreamTimeout(f"the stream ran past the request's deadline ({self._total_s:.3g} s: "
                                  "upstream.total_timeout_s or the caller's own timeout)")
        except (MalformedEvent, UpstreamProtocolError) as e:
            resp.close()  # what follows a malformed event is not worth reading
            err = UpstreamError(f"the worker's stream broke: {e}")
        except CONNECT_ERRORS as e:
            err = UpstreamError(f"the worker connection broke mid-stream: {e!r}")
        finally:
            deadline.cancel()
        self.upstream_done = False
        self.meta = acct.final()
        if self._cut is not None:  # we closed it ourselves: not the worker's failure
            err = self._cut
        else:
            timeout = isinstance(err, UpstreamTimeout)
            parts.failed(self._worker, "timeout" if timeout else "stream_broken", sick=not timeout)
        self.error = err
        yield error_event(err, self._error_style)
