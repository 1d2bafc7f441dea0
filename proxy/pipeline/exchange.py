"""One request's way through the pipeline, as an explicit state machine.

    NEW → ADMITTING → ROUTING ⇄ HOLDING
                         ↓ ↑ (Retry: another worker)
                      ATTEMPTING → ANSWERED (a whole answer) | RELAYING (a stream) → ENDED

Each state has one owner: the admission lease is held by the exchange's exit stack (``async
with`` semantics: released however the exchange ends); a hold is ``holds.Holds``; an attempt is
``attempt.attempt`` (it owns its answer until it returns it); a stream is ``relay.Relay``; the end
is ``end.finish``. The exchange only moves between states and keeps what the frontends read:
``status`` / ``content_type`` / ``body`` for a whole answer, ``chunks()`` / ``events()`` /
``event_runs()`` for a stream.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from enum import StrEnum
from types import TracebackType

from proxy import safejson
from proxy.admission import Lease
from proxy.errors import ModelNotFound, NoHealthyWorker, RadixgateError, ResponseNotFound, UpstreamError
from proxy.pipeline.attempt import Opened, Retry, Target, Whole, attempt
from proxy.pipeline.end import Ending, finish
from proxy.pipeline.holds import hold_limit
from proxy.pipeline.parts import Parts
from proxy.pipeline.relay import Relay
from proxy.records import Finished, body_with_rid, wants_usage_hidden, with_field
from proxy.request import Dialect, GenerateRequest
from proxy.routing.base import (
    PINNED,
    Decision,
    FirstToken,
    IgnoresFeedback,
    NoWorkerAvailable,
    RouteRequest,
    WorkerSnapshot,
)
from proxy.routing.dp_rank import CALLER_FIELDS, affinity_key
from proxy.routing.dp_rank import FIELD as DP_FIELD
from proxy.routing.prefix_key import block_tokens_for, build_route_request
from proxy.sse import ErrorEvent, EventDecoder, FinalMeta, TextDelta, first_token_counts
from proxy.timing import RequestTiming

# Where SGLang reads data_parallel_rank: /generate and the OpenAI completions and chat endpoints.
DP_DIALECTS = frozenset({Dialect.SGLANG, Dialect.COMPLETIONS, Dialect.CHAT})


class Phase(StrEnum):
    NEW = "new"
    ADMITTING = "admitting"
    ROUTING = "routing"
    HOLDING = "holding"
    ATTEMPTING = "attempting"
    ANSWERED = "answered"
    RELAYING = "relaying"
    ENDED = "ended"


def not_served(model: str, served: Sequence[str], *, show: int = 8) -> str:
    """The 404 message: bounded whatever the caller sent or the fleet serves (200k models, a 1 MB name)."""
    name = model if len(model) <= 100 else model[:100] + "..."
    more = f" and {len(served) - show} more" if len(served) > show else ""
    return f"model {name!r} is not served here (serving: {', '.join(m[:100] for m in served[:show])}{more})"


def models_of(snaps: Sequence[WorkerSnapshot]) -> list[str]:
    seen: dict[str, None] = {}
    for s in snaps:
        for m in s.models:
            seen.setdefault(m, None)
    return list(seen)


class Exchange:
    def __init__(self, parts: Parts, req: GenerateRequest, received: float) -> None:
        self._parts, self.req = parts, req
        self.timing = RequestTiming(received=received)
        self.rid = req.rid or req.dialect.new_rid()
        self.phase = Phase.NEW
        self.streaming = req.stream
        self.status = 0
        self.content_type = "application/json"
        self.body = b""
        self.worker: str | None = None
        self.decision: Decision | None = None
        self.route: RouteRequest | None = None
        self.retries = 0
        self._meta = FinalMeta()  # a whole answer's; a stream's is the relay's
        self._error: RadixgateError | None = None  # an answer a frontend could not decode
        self._lease: Lease | None = None
        self._rank: tuple[str, int] | None = None  # (worker, DP rank) counted in parts.dp_in_flight
        self.dp_rank: int | None = None  # the DP rank the last attempt named (its record's)
        self._held = contextlib.AsyncExitStack()  # the admission lease, entered and left as ``async with``
        self._relay: Relay | None = None
        # An OpenAI stream whose caller did not ask for usage: asked for anyway, not relayed.
        self._hide_usage = wants_usage_hidden(req)
        total = parts.config.upstream.total_timeout_s
        if req.timeout_s is not None:
            total = min(total, req.timeout_s)
        self._total = total
        self._deadline = received + total  # on the clock
        parts.metrics.inc(parts.metrics.requests_accepted, req.frontend)
        parts.live.add(self)

    @property
    def meta(self) -> FinalMeta:
        return self._relay.meta if self._relay is not None else self._meta

    @property
    def error(self) -> RadixgateError | None:
        """Set when the answer failed after it began reaching the client (or could not be decoded)."""
        if self._error is None and self._relay is not None:
            return self._relay.error
        return self._error

    async def __aenter__(self) -> Exchange:
        try:
            await self._start()
        except BaseException as e:
            await self._end(e)
            raise
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._end(e)

    def cut(self, err: RadixgateError) -> bool:
        """End a stream still relaying with ``err`` as its error event (the drain's last word)."""
        return self._relay is not None and self._relay.cut(err)

    # -- ADMITTING → ROUTING ⇄ HOLDING → ATTEMPTING -------------------------------------------------
    def _serving(self, snaps: Sequence[WorkerSnapshot]) -> list[WorkerSnapshot]:
        """Healthy workers serving the requested model; 404 when no worker (healthy or not) serves it."""
        model = self.req.model
        healthy = [s for s in snaps if s.healthy]
        if not model or not any(s.models for s in snaps):
            return healthy
        if not any(model in s.models or not s.models for s in snaps):
            raise ModelNotFound(not_served(model, models_of(self._parts.registry.published())))
        return [s for s in healthy if model in s.models or not s.models]

    async def _start(self) -> None:
        p, t = self._parts, self.timing
        cfg = p.config
        snaps = p.registry.snapshots()
        serving = self._serving(snaps)
        if not serving:
            raise NoHealthyWorker("no healthy worker can take the request", retry_after=1.0)
        text_ids = None
        if p.tokenizer is not None and self.req.input_ids is None:  # in a thread: ~1.3 µs a token
            if self.req.messages is not None:
                text_ids = await p.tokenizer.encode_chat_async(self.req.messages)
            elif self.req.text is not None:
                text_ids = await p.tokenizer.encode_async(self.req.text)
        route = build_route_request(
            self.req, block_tokens=block_tokens_for(s.page_size for s in serving),
            chars_per_token=cfg.routing.chars_per_token, max_blocks=cfg.routing.max_blocks,
            bytes_per_token=p.token_estimate.bytes_per_token(self.req.model), text_ids=text_ids)
        if cfg.routing.hold_max_s <= 0:  # holds are off: a policy routes it at once
            route = dataclasses.replace(route, held=True)
        if self.req.pinned is not None:
            # Its worker's prompt is the stored conversation, then this input: these blocks are no
            # prefix of it, and an index told they are cached there would mislead the next request.
            route = dataclasses.replace(route, block_hashes=())
        self.route = route
        self.phase = Phase.ADMITTING
        self._lease = lease = p.admission.lease(priority=self.req.priority, timeout_s=self._deadline - p.clock.now())
        await self._held.enter_async_context(lease)
        t.admitted = p.clock.now()
        target = Target(self.req, self.rid, body_with_rid(self.req, None if self.req.rid else self.rid,
                                                          ask_usage=self._hide_usage), self._deadline, self._total)
        tried: set[str] = set()
        last: Retry | None = None
        stale = lease.wait_s > 0  # waited for a slot: route on the state of now, not of arrival
        while True:
            self.phase = Phase.ROUTING
            if stale:
                snaps = p.registry.snapshots()
            stale = True
            candidates = [s for s in lease.eligible(self._serving(snaps)) if s.url not in tried]
            if not candidates and last is not None:
                err, last = last.error, None  # no frame -> Retry -> error -> frame cycle keeps buffers alive
                raise err
            if self.req.pinned is not None:
                if self.req.pinned in tried and last is not None:
                    err, last = last.error, None
                    raise err
                decision = self._pinned(self.req.pinned, snaps)
            else:
                try:
                    decision = p.policy.select(self.route, candidates)
                except NoWorkerAvailable:
                    raise NoHealthyWorker("no healthy worker can take the request", retry_after=1.0) from None
            p.metrics.inc(p.metrics.decisions, p.policy.name, decision.branch)
            if decision.after is not None:
                await self._hold(decision)
                continue
            lease.assign(decision.worker)
            self.worker, self.decision = decision.worker, decision
            ranked = self._on_rank(target, decision.worker, candidates)
            for listener in p.route_listeners:
                listener.routed(decision.worker, self.route, decision.matched_blocks, self.rid,
                                self._rank[1] if self._rank is not None else None)
            t.dispatched = p.clock.now()
            self.phase = Phase.ATTEMPTING
            try:
                got = await attempt(p, ranked, decision.worker, t)
            except Retry as r:
                p.failed(decision.worker, r.cause, sick=r.sick)
                tried.add(decision.worker)
                last = r
                if len(tried) > cfg.upstream.max_retries:
                    last = None  # (see above: the cycle would hold the failed attempt's buffers until a GC pass)
                    raise r.error from None
                self.retries += 1
                p.metrics.inc(p.metrics.retries, r.cause)
                continue
            self._answered(got, decision.worker)
            return

    def _on_rank(self, target: Target, worker: str, snaps: Sequence[WorkerSnapshot]) -> Target:
        """``target`` naming the DP rank of ``worker`` to take it, where ``routing.dp_ranks`` asks and
        the worker has ranks (``proxy/routing/dp_rank.py``); as it is otherwise."""
        p = self._parts
        self._release_rank()  # a retry's earlier attempt, to this worker or another, counts no more
        self.dp_rank = None
        if not p.config.routing.dp_ranks or self.route is None or self.req.dialect not in DP_DIALECTS:
            return target
        engine = p.registry.engine(worker)
        if engine is None or engine.dp_size is None or engine.dp_size < 2:
            return target
        n, ours, key = engine.dp_size, p.dp_in_flight, affinity_key(self.route)
        field = next((f for f in CALLER_FIELDS if f in self.req.payload), None)
        if field is not None:  # the caller chose the rank: it stands, and the prefix is there now
            rank = self.req.payload[field]
            if type(rank) is not int or not 0 <= rank < n:
                return target
            p.rank_book.put(worker, key, rank)
        else:
            scraped = engine.dp_outstanding
            loads = [max(scraped[r] if scraped is not None and len(scraped) == n else 0, ours.get((worker, r), 0))
                     for r in range(n)]
            kv = next((s.kv for s in snaps if s.url == worker), None)
            matched = kv.rank_matches(self.route.prompt_ids) if kv is not None and self.route.prompt_ids \
                and not self.route.cache_scoped else None
            rank = p.rank_book.place(worker, key, n, loads, matched)
        self._rank, self.dp_rank = (worker, rank), rank
        ours[self._rank] = ours.get(self._rank, 0) + 1
        return target if field is not None else dataclasses.replace(target, body=with_field(target.body, DP_FIELD, rank))

    def _release_rank(self) -> None:
        if self._rank is not None:
            ours = self._parts.dp_in_flight
            left = ours.get(self._rank, 1) - 1
            if left > 0:
                ours[self._rank] = left
            else:
                ours.pop(self._rank, None)
            self._rank = None

    def _pinned(self, worker: str, snaps: Sequence[WorkerSnapshot]) -> Decision:
        """The one worker a pinned request may go to (the policy is not asked, and no other worker
        is tried: none holds what it needs). Gone from the fleet: 404, what it stored went with it;
        down: 503, to come back later."""
        if not any(s.url == worker for s in snaps):
            raise ResponseNotFound(f"the worker that stored the previous response ({worker}) left the fleet")
        if not any(s.url == worker for s in self._serving(snaps)):
            raise NoHealthyWorker(f"the worker that stored the previous response ({worker}) is not healthy now",
                                  retry_after=1.0)
        return Decision(worker=worker, branch=PINNED, reason="previous_response_id")

    async def _hold(self, decision: Decision) -> None:
        """Wait for the prefill ``decision.after`` names, at most ``routing.hold_max_s``, the decision's
        ``hold_s`` (what the policy says the hold is worth) and the deadline; then route again."""
        p = self._parts
        assert decision.after is not None and self.route is not None
        self.phase = Phase.HOLDING
        start = p.clock.now()
        limit = hold_limit(p.config.routing.hold_max_s, decision.hold_s, self._deadline - start)
        outcome = "timed_out"
        if limit > 0:
            outcome = "cancelled"
            try:
                outcome = await p.holds.wait(decision.after, limit)
            finally:
                held = p.clock.now() - start
                self.timing.prefix_hold += held
                p.metrics.observe(p.metrics.prefix_hold, held, outcome)
        if outcome == "timed_out":
            # Stop holding anyone for it: a peer that went away never says it is done.
            p.policy.on_peer_prefilled(decision.worker, decision.after)
        self.route = dataclasses.replace(self.route, held=True)

    def _answered(self, got: Whole | Opened, worker: str) -> None:
        self.status, self.content_type = got.status, got.content_type
        if isinstance(got, Whole):
            self.phase = Phase.ANSWERED
            self.streaming = False
            self.body = got.body
            if got.meta is not None:
                self._meta = got.meta
            return
        self.phase = Phase.RELAYING
        self._relay = Relay(self._parts, self.req, worker=worker, rid=self.rid, opened=got, timing=self.timing,
                            deadline=self._deadline, total_s=self._total, hide_usage=self._hide_usage,
                            on_first_token=self._first_token)

    def _first_token(self, data: bytes) -> None:
        """The prompt is prefilled and in the worker's cache: tell the policy now, not at the end."""
        p = self._parts
        if self.worker is None or self.route is None:
            return
        if not isinstance(p.policy, IgnoresFeedback):  # the others learn nothing from the counts
            prompt_tokens, cached_tokens = first_token_counts(self.req.dialect, data)
            p.policy.on_first_token(FirstToken(self.worker, self.route, prompt_tokens, cached_tokens))
        if p.holds:
            p.holds.release(id(self.route))
        for listener in p.route_listeners:
            listener.prefilled(self.worker, self.rid)

    # -- RELAYING: what the frontends read ------------------------------------------------------------
    def chunks(self) -> AsyncIterator[bytes]:
        """Complete SSE events as raw bytes, as they arrive; ends after ``[DONE]`` or an error event."""
        assert self._relay is not None, "chunks() of an answer that is not a stream"
        return self._relay.chunks()

    @property
    def last_chunk(self) -> bool:
        """Whether the chunk ``chunks()`` just yielded is the stream's last (``[DONE]`` or an error event),
        so a frontend can send it together with the end of its response (one write, not two)."""
        return (self._relay is not None and self._relay.ended) or self._error is not None

    async def events(self) -> AsyncIterator[TextDelta | ErrorEvent | Finished]:
        """Typed events of the answer, then ``Finished`` (the gRPC frontend's view)."""
        async for run in self.event_runs():
            for event in run:
                yield event

    async def event_runs(self) -> AsyncIterator[list[TextDelta | ErrorEvent | Finished]]:
        """``events()`` grouped by what arrived together, so a frontend can send one message per group
        (fewer writes when the worker outpaces the client, never a wait). The stream's last run comes
        with ``Finished``, which needs no further read."""
        decoder = EventDecoder(self.req.dialect)
        last: list[TextDelta | ErrorEvent | Finished] = []
        if self._relay is not None:
            relay = self._relay
            async for data in relay.chunks():
                try:
                    run: list[TextDelta | ErrorEvent | Finished] = [*decoder.decode(data)]
                except ValueError as e:
                    err = self.broken_event(e)
                    last = [ErrorEvent(err.message, err.status)]
                    break
                if relay.worker_ended:
                    last = run
                elif run:
                    yield run
        elif self.status != 200:
            try:
                found = decoder.decode_object(safejson.loads(self.body))
            except ValueError:
                found = []
            last = [next((e for e in found if isinstance(e, ErrorEvent)),
                         ErrorEvent(self.body.decode(errors="replace")[:500], self.status))]
        else:
            try:
                last = [*decoder.decode_object(safejson.loads(self.body))]
            except ValueError as e:
                err = self.broken_event(e)
                last = [ErrorEvent(err.message, err.status)]
        assert self.worker is not None
        yield [*last, Finished(self.meta, self.worker, self.rid, self.timing)]

    def broken_event(self, e: ValueError) -> RadixgateError:
        """A frontend decoding the answer found what it cannot read (an event that is not JSON, token
        ids that are not integers): the request failed, as the worker's fault (502)."""
        found = self.error
        if found is None:
            found = self._error = UpstreamError(f"the worker's answer is malformed: {str(e)[:200]}")
            if self.worker is not None:
                self._parts.metrics.inc(self._parts.metrics.upstream_failures, self.worker, "bad_answer",
                                        worker=self.worker)
        return found

    # -- ENDED --------------------------------------------------------------------------------------
    async def _end(self, exc: BaseException | None) -> None:
        if self.phase is Phase.ENDED:
            return
        self.phase = Phase.ENDED
        p = self._parts
        self.timing.done = p.clock.now()
        relay = self._relay
        if relay is not None:
            await relay.close()
        await self._held.aclose()  # the lease's slot is free again
        self._release_rank()
        answered = relay.upstream_done if relay is not None else self.status != 0
        finish(p, Ending(exc, self.error, answered, self.streaming, self.status, self.meta),
               req=self.req, rid=self.rid, timing=self.timing, worker=self.worker, decision=self.decision,
               route=self.route, retries=self.retries, lease=self._lease, dp_rank=self.dp_rank)
        p.live.discard(self)
