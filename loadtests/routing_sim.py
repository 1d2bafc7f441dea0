"""A virtual-time fleet: radixgate's routing policies driving simulated SGLang schedulers.

Why: wall-clock load tests on a small shared box measure the box (a starved process adds its
scheduling delay to every TTFT). Here time is virtual, so a run is exact and repeatable and costs
only CPU. What is real: the routing code (``prefix_key.build_route_request``, the policies, their
``on_first_token`` / ``on_complete`` learning), and each worker's scheduler, radix prefix cache and roofline step times
(``proxy.sim``: the same classes the HTTP simulated worker runs). What is left out: HTTP
and proxy overhead (see bench_overhead), the proxy's admission queue (its default per-worker limit
is the worker's max_running_requests, which these loads never reach; ``worker_tokens`` is a
what-if queue in tokens instead).

Event loop: arrivals (the trace), step completions (one per busy worker) and scrapes (every
``scrape_interval_s``: snapshots of running / queued / waiting uncached tokens / token usage, as
radixgate's scraper publishes them, so policies see state as stale as in production). An arrival
is routed with the latest scrape plus the routing replica's own in-flight count, submitted to the
chosen scheduler, and its worker starts a step if idle; a ``hold`` decision (``Decision.after``)
keeps it aside until that request's first token (or a peer's notice of it, or ``hold_max_s``), then
routes it again, as the pipeline does. A step's end applies it and records first
tokens, token gaps and completions; a completion goes back to the replica that routed it.
Several replicas (independent policy instances, each seeing every ``replicas``-th request) model
proxies that share nothing. ``shared_gpu``: the workers are engine processes on one GPU, shared
as the profile's ``gpu_sharing`` says (``gpu_share.gpu_pool``: whole steps first come first
served, or weighted time slices, as the real GPU fleet runs them; a step's end can then move
when another engine's step joins, so the loop asks the pool for its next event instead of
keeping fixed step ends); ``minimal_reports``: engines that report
only token counts (snapshots without engine state, no ``cached_tokens``), as that fleet's engines;
``shim_reports``: engines that report their load as the GPU fleet's engine shim does (a request
waits until its first token, its whole prompt counted; SGLang's queue is only what is not yet
scheduled, its batch what is);
``encode``: the engines' tokenizer, with the proxy's bytes-per-token estimate learned from each
answer's ``prompt_tokens`` as the pipeline does (``routing/token_estimate.py``); ``encode_chat``:
its chat template, which chat prompts go through as a worker's (``protocol.chat_prompt_ids``).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from proxy.clock import ManualClock
from proxy.loadgen.workloads import RequestSpec
from proxy.request import Dialect, GenerateRequest
from proxy.routing.base import Completion, Decision, FirstToken, Policy, RouteRequest, WorkerSnapshot
from proxy.routing.dp_rank import RankBook, affinity_key
from proxy.routing.kv_index import EngineBlocks, Match
from proxy.routing.prefix_key import build_route_request, prefix_tokens, uncached_tokens
from proxy.routing.registry import build_named
from proxy.routing.token_estimate import TokenEstimate
from proxy.sim import protocol, tokenizer
from proxy.sim.config import SimConfig
from proxy.sim.engine import Engine
from proxy.sim.gpu_share import GpuSteps, gpu_pool
from proxy.sim.perf import step_parts
from proxy.sim.scheduler import SimRequest, Step
from proxy.workers.kv_events import decode_batch

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass
class Outcome:
    group: str
    arrival: float
    worker: str = ""
    first: float | None = None
    done: float | None = None
    gaps: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    # Cached tokens the routing replica predicted on the worker it chose, in its own token units
    # (exact with KV events; else the estimate, for text prompts in estimated tokens).
    predicted: int = 0
    est_prompt_tokens: int = 0
    branch: str = ""
    held_s: float = 0.0  # held at the proxy for a prefix being prefilled (Decision.after)
    index: int = -1  # its place in the trace (outcomes are listed as submitted: holds reorder them)


class VirtualWorker:
    """One simulated SGLang worker advanced by the event loop instead of asyncio."""

    def __init__(self, url: str, config: SimConfig, minimal_reports: bool = False,
                 generation: int = 0, shim_reports: bool = False) -> None:
        self.url = url
        self.shim_reports = shim_reports
        # What the registry would say of it: a new one after a restart or a flush it was told of.
        self.generation = generation
        self.minimal_reports = minimal_reports
        self.engine = Engine(config, clock=ManualClock())
        self.scheduler = self.engine.scheduler
        self.step: Step | None = None
        self.requests = 0
        # With kv_events: the worker's cache as its events describe it (applied at each step end).
        self.kv_table: EngineBlocks | None = None

    def pump_events(self, now: float) -> None:
        """The cache's events since the last pump, through the real decoder, into the table:
        what a subscriber would hold, without the transport's delay."""
        events = self.engine.cache.events
        if self.kv_table is None or not events:
            return
        for event in decode_batch(bytes(msgpack.packb([now, events]))).events:
            self.kv_table.apply(event)
        events.clear()

    def snapshot(self) -> WorkerSnapshot:
        sched, cache = self.scheduler, self.engine.cache
        if self.minimal_reports:  # only /get_server_info answers: the static shape
            return WorkerSnapshot(url=self.url, max_running_requests=self.engine.limits.max_running_requests,
                                  max_total_tokens=cache.capacity, page_size=cache.page_size, models=(MODEL,),
                                  generation=self.generation)
        if self.shim_reports:  # loadtests/gpu/engine_server.py, Engine.load
            pending = [*sched.waiting, *sched.prefilling]
            running, queued, tokens = len(sched.running), len(pending), sum(len(r.input_ids) for r in pending)
        else:
            running, queued, tokens = sched.num_running, len(sched.waiting), sched.waiting_uncached_tokens()
        return WorkerSnapshot(
            url=self.url, running=running, queued=queued, waiting_uncached_tokens=tokens,
            token_usage=cache.used_tokens / cache.capacity, cache_hit_rate=sched.last_batch_hit_rate,
            max_running_requests=self.engine.limits.max_running_requests,
            max_total_tokens=cache.capacity, page_size=cache.page_size, models=(MODEL,),
            generation=self.generation)

    def start_step(self, now: float) -> tuple[float, float] | None:
        """Form the next step; its (host, device) seconds, or None when there is no work."""
        self.step = self.scheduler.next_step(now)
        if self.step is None:
            return None
        if self.step.work.first_step:
            # Warm, as every engine a benchmark measures is (the GPU fleet's warm-up phase and
            # the engines' own start): the profile's one-time first-step cost (1.5 s for the
            # transformers engines) paid at each phase's start by four engines sharing a GPU
            # put them seconds behind at 6 req/s for the whole phase (fleet_sim TTFT p50 3.4 s
            # where the same placement through fidelity.replay, which skips it too, gave 0.9 s).
            self.step.work = dataclasses.replace(self.step.work, first_step=False)
        return step_parts(self.engine.profile, self.step.work)


def dp_snapshot(url: str, ranks: Sequence[VirtualWorker]) -> WorkerSnapshot:
    """One worker of several data-parallel ranks as its scrape reads it: the ranks' states summed
    (``scrape.parse_loads`` over ``/v1/loads``), their pools together."""
    snaps = [r.snapshot() for r in ranks]
    if len(snaps) == 1:
        return dataclasses.replace(snaps[0], url=url)
    first = snaps[0]

    def total(name: str) -> int | None:
        values = [getattr(x, name) for x in snaps]
        return None if any(v is None for v in values) else sum(values)
    usage = [x.token_usage for x in snaps if x.token_usage is not None]
    return dataclasses.replace(
        first, url=url, running=total("running"), queued=total("queued"),
        waiting_uncached_tokens=total("waiting_uncached_tokens"),
        token_usage=sum(usage) / len(usage) if len(usage) == len(snaps) else None,
        max_running_requests=total("max_running_requests"), max_total_tokens=total("max_total_tokens"),
        dp_size=len(snaps))


def prompt_ids(spec: RequestSpec, encode: Callable[[str], list[int]] = tokenizer.encode,
               encode_chat: Callable[[list[dict[str, Any]]], list[int] | None] | None = None) -> list[int]:
    if spec.messages is not None:
        return protocol.chat_prompt_ids(spec.messages, encode, encode_chat)
    return encode(spec.text or "")


def route_of(spec: RequestSpec, *, block_tokens: int = 16, chars_per_token: float = 4.0,
             bytes_per_token: float | None = None, text_ids: list[int] | None = None) -> RouteRequest:
    req = GenerateRequest(dialect=Dialect.CHAT if spec.messages is not None else Dialect.SGLANG, payload={},
                          model=MODEL, text=spec.text, messages=spec.messages, stream=True)
    return build_route_request(req, block_tokens=block_tokens, chars_per_token=chars_per_token, max_blocks=2048,
                               bytes_per_token=bytes_per_token, text_ids=text_ids)


class _EventsView:
    """``WorkerSnapshot.kv`` over one worker's event table (``proxy.routing.base.KvView``)."""

    def __init__(self, table: EngineBlocks) -> None:
        self.table = table

    def match(self, token_ids: Sequence[int]) -> Match:
        return self.table.match(token_ids)

    def rank_matches(self, token_ids: Sequence[int]) -> list[int]:
        return [self.table.match(token_ids).tokens]


def simulate(
    policy_name: str | Callable[[], Policy],
    specs: Sequence[RequestSpec],
    arrivals: Sequence[float],
    *,
    workers: int = 4,
    sim: SimConfig | None = None,
    replicas: int = 1,
    scrape_interval_s: float = 0.5,
    seed: int = 0,
    params: dict[str, object] | None = None,
    first_token_feedback: bool = True,
    peer_sync_s: float | None = None,
    peer_load: bool = True,
    hold_max_s: float = 1.0,
    shared_gpu: bool = False,
    minimal_reports: bool = False,
    shim_reports: bool = False,
    encode: Callable[[str], list[int]] | None = None,
    encode_chat: Callable[[list[dict[str, Any]]], list[int] | None] | None = None,
    block_tokens: int = 16,
    engines: list[VirtualWorker] | None = None,
    kept: list[Policy] | None = None,
    kv_events: bool = False,
    tokenize: bool = False,
    generation: int = 0,
    worker_tokens: int = 0,
    steal_after_s: float = math.inf,
    dp: int = 1,
    dp_ranks: bool = False,
) -> tuple[list[Outcome], list[VirtualWorker]]:
    """Run one trace through ``replicas`` instances of a policy in front of ``workers`` workers.

    ``first_token_feedback``: tell policies of each first token, as the proxy does for streamed
    answers (False: only completions, as for non-streamed ones). ``peer_sync_s``: replicas tell
    each other their decisions, arriving this many seconds later (``routing.peers``); None = they
    share nothing; ``peer_load`` False: the decisions alone, not each replica's requests in flight
    per worker (``Policy.on_peer_load``; before 2026-12-01 night). ``hold_max_s``: the longest a request is held for a prefix being prefilled
    (``Decision.after``, ``routing.hold_max_s``). ``engines``: workers of an earlier run to go on
    with (their caches as that run left them; arrival times then continue from its end).
    ``kept``: the replicas' policies of an earlier run to go on with (empty: the ones built here
    are put in it), as a proxy process lives through a benchmark's rounds.
    ``kv_events``: every replica reads each worker's KV events (``kv_events.endpoint``; one table
    per worker stands for the identical tables of the replicas' subscribers) and keys text prompts
    by the engines' token ids (``routing.tokenizer``); ``tokenize`` alone does the latter only.
    ``generation``: the new workers' generation; a ``kept`` policy that saw another forgets what
    it believed they held (a flush or restart it was told of).
    ``worker_tokens`` (a what-if; radixgate's admission counts requests, not tokens): the proxy
    keeps each worker's prompt tokens in flight within this budget, queueing the rest at the proxy
    per chosen worker, first in first out; a worker with room and nothing queued for it takes the
    oldest request queued for another once that one has waited ``steal_after_s`` (work stealing
    with a locality delay; the policy is asked again with that worker alone: branch ``steal``).
    One replica only.
    ``dp``: each worker is that many data-parallel ranks (SGLang ``--dp-size``: an engine and a
    cache each, behind one URL; the policy sees the worker, its scrape the ranks summed); a rank
    is chosen per request as the proxy's ``routing.dp_ranks`` does (``dp_ranks``: each replica's
    own requests in flight per rank and its ``RankBook``; no KV events), else round robin, as the
    worker's own controller does."""
    sim = sim or SimConfig()
    if worker_tokens > 0 and replicas > 1:
        raise ValueError("worker_tokens: one replica only")
    if dp > 1 and kv_events:
        raise ValueError("dp: KV events per rank are not simulated")
    fleet = engines or [VirtualWorker(f"http://w{i}" if dp == 1 else f"http://w{i}/dp{r}", sim, minimal_reports,
                                      generation, shim_reports) for i in range(workers) for r in range(dp)]
    # the GPU(s) of this run: every step of the previous run (``engines``) has ended
    gpu: GpuSteps[str] = gpu_pool(fleet[0].engine.profile, len(fleet), shared=shared_gpu)  # by worker URL
    tokens = TokenEstimate(4.0) if encode is not None else None
    engine_of = {w.url: w for w in fleet}
    # the workers the policy sees (each with its ranks, in rank order), and an engine's worker
    ranks_of: dict[str, list[VirtualWorker]] = {}
    for w in fleet:
        ranks_of.setdefault(w.url.rsplit("/dp", 1)[0] if dp > 1 else w.url, []).append(w)
    worker_of = {e.url: u for u, rs in ranks_of.items() for e in rs}
    books = [RankBook() for _ in range(replicas)]
    rank_in_flight: list[dict[str, int]] = [dict.fromkeys(engine_of, 0) for _ in range(replicas)]
    turns = dict.fromkeys(ranks_of, 0)

    def rank_for(replica: int, url: str, route: RouteRequest) -> VirtualWorker:
        ranks = ranks_of[url]
        if len(ranks) == 1:
            return ranks[0]
        if not dp_ranks:  # the worker's controller: round robin
            turns[url] += 1
            return ranks[(turns[url] - 1) % len(ranks)]
        loads = [rank_in_flight[replica][r.url] for r in ranks]
        return ranks[books[replica].place(url, affinity_key(route), len(ranks), loads)]
    views: dict[str, _EventsView] = {}
    if kv_events:
        for w in fleet:  # (dp 1: an engine is its worker)
            if w.kv_table is None:
                w.engine.cache.events, w.kv_table = [], EngineBlocks()
            views[w.url] = _EventsView(w.kv_table)
    policies: list[Policy] = list(kept) if kept else [
        policy_name() if callable(policy_name) else build_named(policy_name, params or {}, rng=random.Random(seed + r))
        for r in range(replicas)]
    if kept is not None and not kept:
        kept.extend(policies)
    in_flight: list[dict[str, int]] = [dict.fromkeys(ranks_of, 0) for _ in range(replicas)]
    scraped = {u: dp_snapshot(u, rs) for u, rs in ranks_of.items()}
    for policy in policies:  # as the registry tells the policy of the worker set at start-up
        policy.on_worker_change(list(scraped.values()))
    outcomes: list[Outcome] = []
    # rid -> (outcome, route, replica, request)
    live: dict[str, tuple[Outcome, RouteRequest, int, SimRequest]] = {}
    seq = 0
    next_scrape = arrivals[0] if arrivals else 0.0
    i = 0
    # (at, seq, from replica, worker, route, uncached tokens, key; route None = a first-token
    # notice, a dict = the replica's requests in flight per worker)
    peer_events: list[tuple[float, int, int, str, RouteRequest | dict[str, int] | None, int, str]] = []
    # Decision.after -> requests held until that prefill ends: (index, route, arrival, release by)
    held: dict[Hashable, list[tuple[int, RouteRequest, float, float]]] = {}
    hold_ends: list[tuple[float, int, Hashable]] = []  # (release by, tiebreak, key)
    # worker_tokens: requests queued at the proxy per chosen worker (index, route, arrival,
    # queued at, decision), each worker's prompt tokens in flight, and when to look for steals
    waiting: dict[str, deque[tuple[int, RouteRequest, float, float, Decision]]] = {u: deque() for u in ranks_of}
    load = dict.fromkeys(ranks_of, 0)
    steal_checks: list[float] = []

    def room(url: str, tokens: int) -> bool:
        return worker_tokens <= 0 or load[url] == 0 or load[url] + tokens <= worker_tokens

    def drain(url: str, now: float) -> None:
        """A worker's tokens went down: start what waits for it, then take another's oldest."""
        line = waiting[url]
        while line and room(url, line[0][1].prompt_tokens):
            j, route, arrival, _, decision = line.popleft()
            submit(j, route, arrival, now, decision)
        while not line:
            heads = [(q[0][3], u) for u, q in waiting.items() if u != url and q and now - q[0][3] >= steal_after_s]
            if not heads:
                return
            source = waiting[min(heads)[1]]
            if not room(url, source[0][1].prompt_tokens):
                return
            j, route, arrival, _, _ = source.popleft()
            snap = dataclasses.replace(scraped[url], in_flight=in_flight[0][url], kv=views.get(url))
            submit(j, route, arrival, now, dataclasses.replace(policies[0].select(route, [snap]), branch="steal"))

    def release(key: Hashable, now: float, *, expired: bool = False) -> None:
        waiting = held.pop(key, [])
        if expired:  # only those whose time is up; the rest keep waiting
            keep = [h for h in waiting if h[3] > now]
            if keep:
                held[key] = keep
            waiting = [h for h in waiting if h[3] <= now]
        for j, route, arrival, _ in waiting:
            dispatch(j, dataclasses.replace(route, held=True), arrival, now)

    def tell_load(replica: int, now: float) -> None:
        nonlocal seq
        if peer_sync_s is not None and replicas > 1 and peer_load:
            seq += 1
            heapq.heappush(peer_events, (now + peer_sync_s, seq, replica, "", dict(in_flight[replica]), 0, ""))

    def dispatch(i: int, route: RouteRequest, arrival: float, now: float) -> None:
        nonlocal seq
        replica = i % replicas
        snaps = [dataclasses.replace(scraped[u], in_flight=in_flight[replica][u], kv=views.get(u)) for u in ranks_of]
        decision = policies[replica].select(route, snaps)
        if decision.after is not None:
            held.setdefault(decision.after, []).append((i, route, arrival, now + hold_max_s))
            seq += 1
            heapq.heappush(hold_ends, (now + hold_max_s, seq, decision.after))
            return
        if waiting[decision.worker] or not room(decision.worker, route.prompt_tokens):
            waiting[decision.worker].append((i, route, arrival, now, decision))
            if math.isfinite(steal_after_s):
                heapq.heappush(steal_checks, now + steal_after_s)
            return
        submit(i, route, arrival, now, decision)

    def submit(i: int, route: RouteRequest, arrival: float, now: float, decision: Decision) -> None:
        nonlocal seq
        spec, replica = specs[i], i % replicas
        url = decision.worker
        worker = rank_for(replica, url, route)
        if peer_sync_s is not None and replicas > 1:
            seq += 1
            uncached = uncached_tokens(route, decision.matched_blocks)
            heapq.heappush(peer_events, (now + peer_sync_s, seq, replica, url, route, uncached, f"r{i}"))
        req = SimRequest(rid=f"r{i}", input_ids=prompt_ids(spec, encode or tokenizer.encode, encode_chat),
                         max_new_tokens=spec.max_new_tokens)
        predicted = (decision.matched_tokens if decision.matched_tokens is not None
                     else min(prefix_tokens(decision.matched_blocks, route.block_tokens), route.prompt_tokens))
        outcome = Outcome(spec.group, arrival, url, branch=decision.branch, held_s=now - arrival,
                          predicted=predicted, est_prompt_tokens=route.prompt_tokens, index=i)
        outcomes.append(outcome)
        live[req.rid] = (outcome, route, replica, req)
        in_flight[replica][url] += 1
        rank_in_flight[replica][worker.url] += 1
        load[url] += route.prompt_tokens
        tell_load(replica, now)
        worker.requests += 1
        worker.scheduler.submit(req, now)
        if worker.step is None:
            start(worker, now)

    def start(worker: VirtualWorker, now: float) -> None:
        parts = worker.start_step(now)
        if parts is not None:
            worker.pump_events(now)  # what forming the step evicted
            gpu.submit(worker.url, now, *parts)

    def step_done(worker: VirtualWorker, now: float) -> None:
        """Apply a finished step: first tokens, token gaps, completions; then the next step."""
        nonlocal seq
        url = worker_of[worker.url]
        assert worker.step is not None
        for req in worker.scheduler.finish_step(worker.step, now):
            outcome, route, replica, _ = live[req.rid]
            if outcome.first is None:
                outcome.first = now
                outcome.prompt_tokens, outcome.cached_tokens = len(req.input_ids), req.cached_tokens
                reported = None if minimal_reports else outcome.cached_tokens
                if first_token_feedback:
                    policies[replica].on_first_token(FirstToken(url, route, outcome.prompt_tokens, reported))
                release(id(route), now)
                if peer_sync_s is not None and replicas > 1:
                    seq += 1
                    heapq.heappush(peer_events, (now + peer_sync_s, seq, replica, url, None, 0, req.rid))
            elif req.last_token_at == now:
                outcome.gaps.append(now - (outcome.done or outcome.first))
            outcome.done = now
            if req.finished:
                del live[req.rid]
                in_flight[replica][url] -= 1
                rank_in_flight[replica][worker.url] -= 1
                load[url] -= route.prompt_tokens
                tell_load(replica, now)
                if tokens is not None:
                    tokens.observe(MODEL, route.prompt_bytes, outcome.prompt_tokens)
                policies[replica].on_complete(Completion(
                    url, route, True, outcome.prompt_tokens, None if minimal_reports else outcome.cached_tokens,
                    outcome.first - outcome.arrival, len(req.output_ids), now - outcome.first))
        if worker_tokens > 0:
            drain(url, now)  # (while its step is still set: the submits leave starting to below)
        worker.step = None
        worker.pump_events(now)  # what the step stored
        start(worker, now)

    while i < len(specs) or held or any(w.step is not None for w in fleet) or any(waiting.values()):
        t_arrival = arrivals[i] if i < len(specs) else math.inf
        # the next instant the GPU changes: a step ends, or (time slices) joins the GPU
        t_step = gpu.next_event()
        if peer_events and peer_events[0][0] <= min(t_arrival, t_step):
            at, _, source, url, peer_route, uncached, key = heapq.heappop(peer_events)
            for r, policy in enumerate(policies):
                if r != source:
                    if isinstance(peer_route, dict):
                        policy.on_peer_load(f"replica{source}", peer_route)
                    elif peer_route is None:
                        policy.on_peer_prefilled(url, key)
                    else:
                        policy.on_peer_decision(url, peer_route, uncached, key)
            if peer_route is None:
                release(key, at)
            continue
        if steal_checks and steal_checks[0] <= min(t_arrival, t_step):
            at = heapq.heappop(steal_checks)
            for u in ranks_of:
                if not waiting[u]:
                    drain(u, at)
            continue
        if hold_ends and hold_ends[0][0] <= min(t_arrival, t_step):
            at, _, hold = heapq.heappop(hold_ends)  # a Decision.after; the peer events' keys are str
            if hold in held:
                release(hold, at, expired=True)
            continue
        if next_scrape <= min(t_arrival, t_step):
            scraped = {u: dp_snapshot(u, rs) for u, rs in ranks_of.items()}
            next_scrape += scrape_interval_s
            continue
        if t_arrival <= t_step:
            learned = tokens.bytes_per_token(MODEL) if tokens is not None else None
            by_ids = (kv_events or tokenize) and specs[i].messages is None
            ids = prompt_ids(specs[i], encode or tokenizer.encode) if by_ids else None
            dispatch(i, route_of(specs[i], block_tokens=block_tokens, bytes_per_token=learned, text_ids=ids),
                     t_arrival, t_arrival)
            i += 1
            continue
        now = t_step
        for url in gpu.done(now):
            step_done(engine_of[url], now)
    return outcomes, fleet
