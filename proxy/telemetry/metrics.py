"""Every radixgate metric, defined in one place on an injected ``CollectorRegistry``.

Rules: prefix ``radixgate_``; units in names (``_seconds``, ``_total``, ``_ratio``); bucket sets are
named and chosen for LLM latencies (sub-millisecond proxy work up to half-hour generations); labels
are bounded: ``worker`` (configured URLs), ``frontend`` (http | grpc), ``outcome``, ``cause``,
``policy``, ``branch``, ``stage``, ``model`` (the learned bytes per token: at most
``token_estimate.MAX_MODELS``). Label sets of a removed worker are removed (``forget_worker``).

Gauges that describe current state (worker health, scraped engine state, in-flight, queue depth,
KV event streams, the learned bytes per token) are read at scrape time through custom collectors
(``gauges.py``), so they can never go stale or outlive a worker. Counters and histograms are updated
by the pipeline; their labelled children are cached here (``labels()`` is the slow part of an
observation) and the cache doubles as the list of label sets to drop when a worker leaves.

Invariant kept by the pipeline: for every frontend,
``requests_accepted_total == requests_succeeded_total + requests_failed_total`` once requests end,
and ``requests_failed_total == sum over cause of errors_total``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Histogram

from proxy.routing.base import PINNED
from proxy.routing.prefix_key import prefix_tokens
from proxy.telemetry.fastmetrics import CounterChild, FastCounter, FastHistogram, HistogramChild
from proxy.telemetry.gauges import (
    KvEventsCollector,
    MappingGauge,
    StateCollector,
    StateProvider,
    attach_diagnosis,
)

# Re-exported: the scrape-time gauges live in gauges.py; callers import them from here.
__all__ = ["BUCKETS", "LEFT_WORKER", "NO_WORKER", "Metrics", "StateProvider", "attach_diagnosis"]

if TYPE_CHECKING:
    from proxy.records import CompletedRequest
    from proxy.workers.kv_subscriber import KvSubscriber

# -- named bucket sets (seconds) ----------------------------------------------------------------
BUCKETS: dict[str, tuple[float, ...]] = {
    # Work the proxy itself does, and waits that should be near zero when healthy.
    "proxy": (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
    # Waiting in a queue (ours or the engine's): milliseconds to minutes.
    "queue": (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0),
    # Time to first token / first byte: a few ms (cached, short) to minutes (long prefill under load).
    "ttft": (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0,
             30.0, 60.0, 120.0, 300.0),
    # Gap between streamed chunks: ~1 ms (small model, H100) to seconds (preempted / overloaded).
    "itl": (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5),
    # Whole generations: tens of ms to half an hour.
    "e2e": (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0),
    # Prefix match lengths, in tokens (not seconds): nothing, a page, a system prompt, long context.
    "match_tokens": (0, 16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 131072),
}

NO_WORKER = "none"
# What a request that ends on a worker after it left the fleet reports under: the worker's own label
# sets were removed when it left, and one re-created per departed worker would stay for good (a
# series leak as pods come and go under discovery or the admin API).
LEFT_WORKER = "left"
MAX_LEFT = 4096  # departed workers remembered (oldest forgotten)

# Request-path metrics are FastCounter / FastHistogram (lock-free, see fastmetrics.py); the
# helpers below also accept prometheus_client's own Counter / Histogram.
AnyMetric = FastCounter | FastHistogram | Counter | Histogram  # worker label of a request that failed before one was chosen


class _WorkerChildren(NamedTuple):
    """A worker's labelled children that ``Metrics.record`` updates (one lookup per request)."""

    upstream_ttfb: HistogramChild
    ttft: HistogramChild
    upstream_ttft: HistogramChild
    itl: HistogramChild
    decode: HistogramChild
    worker_queue: HistogramChild
    worker_ttft: HistogramChild
    prompt_tokens: CounterChild
    cached_tokens: CounterChild
    completion_tokens: CounterChild


class _EndChildren(NamedTuple):
    result: CounterChild  # requests_succeeded or requests_failed
    error: FastCounter | None  # errors_total (labelled by cause) when the request failed
    proxy_overhead: HistogramChild
    e2e: HistogramChild
    worker: _WorkerChildren | None


class Metrics:
    """All metrics; one instance per App, on the registry it was given."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        r = registry
        self.requests_accepted = FastCounter(
            "radixgate_requests_accepted_total", "Requests a frontend accepted for processing.",
            ["frontend"], registry=r)
        self.requests_succeeded = FastCounter(
            "radixgate_requests_succeeded_total", "Requests that ended with a complete answer.",
            ["frontend"], registry=r)
        self.requests_failed = FastCounter(
            "radixgate_requests_failed_total", "Requests that ended with an error (see errors_total).",
            ["frontend"], registry=r)
        self.errors = FastCounter(
            "radixgate_errors_total", "Failed requests by cause (one per failed request).",
            ["frontend", "cause"], registry=r)
        self.upstream_failures = FastCounter(
            "radixgate_upstream_failures_total",
            "Failed attempts on a worker: connect_error, http_5xx, worker_busy (503), timeout, stream_broken, "
            "protocol_error (not HTTP / a redirect / framing), bad_answer (not JSON, a malformed event), "
            "too_large (over an upstream.max_*_bytes cap).",
            ["worker", "cause"], registry=r)
        self.long_answer_checks = FastCounter(
            "radixgate_long_answer_checks_total",
            "Health checks of a worker that owes a non-stream answer past upstream.first_byte_timeout_s: "
            "alive (keep waiting), hung (retried elsewhere).",
            ["worker", "outcome"], registry=r)
        self.retries = FastCounter(
            "radixgate_retries_total", "Attempts moved to another worker before anything reached the client.",
            ["cause"], registry=r)
        self.ejections = FastCounter(
            "radixgate_worker_ejections_total", "Passive ejections of a worker after repeated failures.",
            ["worker"], registry=r)
        self.aborts = FastCounter(
            "radixgate_upstream_aborts_total", "abort_request calls sent to a worker: the client left, or radixgate gave up on the answer.",
            ["worker"], registry=r)
        self.decisions = FastCounter(
            "radixgate_policy_decisions_total", "Routing decisions by policy and branch.",
            ["policy", "branch"], registry=r)
        self.admission_wait = FastHistogram(
            "radixgate_admission_wait_seconds", "Time a request waited in the proxy's admission queue.",
            ["frontend", "outcome"], buckets=BUCKETS["queue"], registry=r)
        self.prefix_hold = FastHistogram(
            "radixgate_prefix_hold_seconds",
            "Time a request was held for a prefix being prefilled on its worker (routing branch hold): "
            "released at that prefill's first token, or timed_out after routing.hold_max_s.",
            ["outcome"], buckets=BUCKETS["queue"], registry=r)
        self.proxy_overhead = FastHistogram(
            "radixgate_proxy_overhead_seconds",
            "Proxy time before dispatch, admission wait and prefix hold excluded (parse, hash, route).",
            ["frontend"], buckets=BUCKETS["proxy"], registry=r)
        self.upstream_ttfb = FastHistogram(
            "radixgate_upstream_ttfb_seconds", "Dispatch to upstream response headers.",
            ["worker"], buckets=BUCKETS["ttft"], registry=r)
        self.ttft = FastHistogram(
            "radixgate_ttft_seconds", "Time to first token as the client sees it (received to first token).",
            ["worker", "frontend"], buckets=BUCKETS["ttft"], registry=r)
        self.upstream_ttft = FastHistogram(
            "radixgate_upstream_ttft_seconds", "Dispatch to first token (the worker's share of TTFT).",
            ["worker"], buckets=BUCKETS["ttft"], registry=r)
        self.itl = FastHistogram(
            "radixgate_inter_token_latency_seconds", "Gap between consecutive token-bearing chunks.",
            ["worker"], buckets=BUCKETS["itl"], registry=r)
        self.decode = FastHistogram(
            "radixgate_decode_seconds", "First token to last token.",
            ["worker"], buckets=BUCKETS["e2e"], registry=r)
        self.e2e = FastHistogram(
            "radixgate_e2e_seconds", "Received to done, by outcome.",
            ["worker", "frontend", "outcome"], buckets=BUCKETS["e2e"], registry=r)
        self.worker_queue = FastHistogram(
            "radixgate_worker_queue_seconds", "The worker's own queue_time (meta_info, --enable-metrics).",
            ["worker"], buckets=BUCKETS["queue"], registry=r)
        self.worker_ttft = FastHistogram(
            "radixgate_worker_ttft_seconds", "The worker's own first_token_latency (meta_info).",
            ["worker"], buckets=BUCKETS["ttft"], registry=r)
        self.prompt_tokens = FastCounter(
            "radixgate_prompt_tokens_total", "Prompt tokens reported by workers.", ["worker"], registry=r)
        self.cached_tokens = FastCounter(
            "radixgate_cached_tokens_total", "Prompt tokens served from the worker's prefix cache.",
            ["worker"], registry=r)
        self.completion_tokens = FastCounter(
            "radixgate_completion_tokens_total", "Generated tokens reported by workers.", ["worker"], registry=r)
        self.health_probe_failures = FastCounter(
            "radixgate_health_probe_failures_total", "Failed active health probes.", ["worker"], registry=r)
        self.scrape_failures = FastCounter(
            "radixgate_scrape_failures_total", "Failed engine-state scrapes.", ["worker"], registry=r)
        self.worker_restarts = FastCounter(
            "radixgate_worker_restarts_total", "Detected worker restarts or cache flushes (generation bumps).",
            ["worker"], registry=r)
        self.worker_changes = FastCounter(
            "radixgate_worker_changes_total", "Requests to add or remove a worker on the admin port, by outcome "
            "(added, present, full, removed, absent, invalid, unauthorized, forbidden).",
            ["outcome"], registry=r)
        self.secret_reloads = FastCounter(
            "radixgate_secret_reloads_total", "Secrets re-read while serving (security.reload_interval_s, SIGHUP), "
            "by secret (api_keys, tls) and outcome (ok; failed: the previous one is still served).",
            ["secret", "outcome"], registry=r)
        self.response_lookups = FastCounter(
            "radixgate_response_lookups_total",
            "Responses ids looked up (GET / cancel / previous_response_id): known (remembered), found "
            "(by asking the workers), missing (no worker holds it), unreachable (a worker could not be asked).",
            ["outcome"], registry=r)
        self.peer_messages = FastCounter(
            "radixgate_peer_messages_total", "Messages sent to peer replicas (ok), and their connections' ends "
            "(self, http_NNN, timeout, connect_error, closed).", ["peer", "outcome"], registry=r)
        self.peer_received = FastCounter(
            "radixgate_peer_decisions_received_total", "Peer replicas' decisions received, by outcome "
            "(applied, prefilled and finished count items; the refusals count connections).", ["outcome"], registry=r)
        self.peer_decisions_dropped = FastCounter(
            "radixgate_peer_decisions_dropped_total", "Decisions dropped unsent because the peer buffer was full.",
            [], registry=r)
        self.peer_records_dropped = FastCounter(
            "radixgate_peer_records_dropped_total", "Finished requests dropped untold because the peer buffer was "
            "full (diagnose.fleet_view).", [], registry=r)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._by_worker: dict[str, list[tuple[AnyMetric, tuple[str, ...]]]] = {}
        # (worker, frontend, outcome) -> the children a finished request updates (see record).
        self._ends: dict[tuple[str | None, str, str], _EndChildren] = {}
        # Workers that left (forget_worker) and have not joined again (know_worker), oldest first.
        self._left: dict[str, None] = {}
        self._init_routing(r)

    # -- fast labelled access ----------------------------------------------------------------------
    def child(self, metric: AnyMetric, *labels: str, worker: str | None = None) -> Any:
        """The cached child for ``labels``; remembered under ``worker`` for removal (a worker that left
        is reported as ``LEFT_WORKER``)."""
        if worker is not None and worker in self._left:
            labels, worker = tuple(LEFT_WORKER if v == worker else v for v in labels), None
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = metric.labels(*labels)
            self._children[key] = found
            if worker is not None:
                self._by_worker.setdefault(worker, []).append((metric, labels))
        return found

    def inc(self, metric: FastCounter | Counter, *labels: str, amount: float = 1.0,
            worker: str | None = None) -> None:
        self.child(metric, *labels, worker=worker).inc(amount)

    def observe(self, metric: FastHistogram | Histogram, value: float, *labels: str,
                worker: str | None = None) -> None:
        self.child(metric, *labels, worker=worker).observe(value)

    def record(self, done: CompletedRequest) -> None:
        """Everything one finished request contributes (called once per request by the pipeline).

        Runs once per request on the event loop, so it reads the timing marks directly and takes the
        labelled children from per-label-set bundles instead of one cache lookup per metric.
        """
        fe, t, outcome = done.frontend, done.timing, done.outcome
        wk = done.worker  # label sets naming a real worker are forgotten with it
        self._record_routing(done)
        key = (wk, fe, outcome)
        ends = self._ends.get(key)
        if ends is None:
            ends = self._end_children(wk, fe, outcome)
            if wk not in self._left:  # a departed worker's are not kept: the rare case, looked up each time
                self._ends[key] = ends
        ends.result.inc()
        if ends.error is not None:
            self.inc(self.errors, fe, done.cause or "unknown")
        if done.admission is not None and done.admission_wait is not None:
            self.observe(self.admission_wait, done.admission_wait, fe, done.admission)
        received, dispatched = t.received, t.dispatched
        if dispatched is not None:  # proxy_overhead: before dispatch, admission wait and hold excluded
            admitted = t.admitted
            wait = max(0.0, admitted - received) if admitted is not None else 0.0
            ends.proxy_overhead.observe(max(0.0, dispatched - received - wait - t.prefix_hold))
        if t.done is not None:
            ends.e2e.observe(max(0.0, t.done - received))
        if wk is None:
            return
        w = ends.worker
        assert w is not None
        first_token = t.first_token
        if dispatched is not None and t.upstream_headers is not None:
            w.upstream_ttfb.observe(max(0.0, t.upstream_headers - dispatched))
        if first_token is not None:
            w.ttft.observe(max(0.0, first_token - received))
            if dispatched is not None:
                w.upstream_ttft.observe(max(0.0, first_token - dispatched))
            if t.last_token is not None:
                w.decode.observe(max(0.0, t.last_token - first_token))
        if t.token_gaps:
            w.itl.observe_many(t.token_gaps)
        if t.worker_queue_time is not None:
            w.worker_queue.observe(t.worker_queue_time)
        if t.worker_first_token_latency is not None:
            w.worker_ttft.observe(t.worker_first_token_latency)
        if t.prompt_tokens:
            w.prompt_tokens.inc(t.prompt_tokens)
        if t.cached_tokens:
            w.cached_tokens.inc(t.cached_tokens)
        if t.completion_tokens:
            w.completion_tokens.inc(t.completion_tokens)

    def _end_children(self, wk: str | None, fe: str, outcome: str) -> _EndChildren:
        ok = outcome == "ok"
        worker = None
        if wk is not None:
            worker = _WorkerChildren(*(self.child(m, *labels, worker=wk) for m, labels in (
                (self.upstream_ttfb, (wk,)), (self.ttft, (wk, fe)), (self.upstream_ttft, (wk,)),
                (self.itl, (wk,)), (self.decode, (wk,)), (self.worker_queue, (wk,)), (self.worker_ttft, (wk,)),
                (self.prompt_tokens, (wk,)), (self.cached_tokens, (wk,)), (self.completion_tokens, (wk,)))))
        return _EndChildren(
            result=self.child(self.requests_succeeded if ok else self.requests_failed, fe),
            error=None if ok else self.errors,
            proxy_overhead=self.child(self.proxy_overhead, fe),
            e2e=self.child(self.e2e, wk or NO_WORKER, fe, outcome, worker=wk),
            worker=worker)

    def know_worker(self, worker: str) -> None:
        """``worker`` joined (again): its requests are reported under its own label sets."""
        self._left.pop(worker, None)  # (a departed worker's end children were never cached)

    def forget_worker(self, worker: str) -> None:
        """Drop every label set that names ``worker`` (it left the fleet); what still ends on it
        reports as ``LEFT_WORKER``."""
        self._left[worker] = None
        while len(self._left) > MAX_LEFT:
            del self._left[next(iter(self._left))]
        self._ends = {k: v for k, v in self._ends.items() if k[0] != worker}
        for metric, labels in self._by_worker.pop(worker, []):
            self._children.pop((id(metric), labels), None)
            try:
                metric.remove(*labels)
            except KeyError:
                pass

    def attach_state(self, provider: StateProvider) -> None:
        """Register the scrape-time collector for worker and admission gauges."""
        self.registry.register(StateCollector(provider))


    # == routing decision quality (owned by the routing helper; keep additions inside this block) ==
    # Tokens are counted in the worker's units: our own estimates (predicted, available) are
    # rescaled by reported prompt tokens / estimated prompt tokens of the same request.
    def _init_routing(self, r: CollectorRegistry) -> None:
        # (policy, index) -> children of the predicted, reported and prompt counters. ``index``:
        # where the prediction came from, the worker's KV events ("events": an exact match in
        # tokens) or the proxy's own approximate index ("approximate").
        self._routing_rates: dict[tuple[str, str], tuple[CounterChild, ...]] = {}
        self.routing_predicted_cached = FastCounter(
            "radixgate_routing_predicted_cached_tokens_total",
            "Cached tokens the policy predicted on the worker it chose (requests with a cache report).",
            ["policy", "index"], registry=r)
        self.routing_reported_cached = FastCounter(
            "radixgate_routing_reported_cached_tokens_total",
            "Cached tokens workers reported, for the same requests as the predicted counter.",
            ["policy", "index"], registry=r)
        self.routing_prediction_error = FastCounter(
            "radixgate_routing_cache_prediction_error_tokens_total",
            "Predicted minus reported cached tokens, split by sign (over = predicted too many).",
            ["policy", "index", "direction"], registry=r)
        self.routing_available_cached = FastCounter(
            "radixgate_routing_available_cached_tokens_total",
            "Cached tokens one fleet-wide cache of the same total KV capacity would have hit.",
            ["policy"], registry=r)
        self.routing_prompt_tokens = FastCounter(
            "radixgate_routing_prompt_tokens_total",
            "Prompt tokens of the requests counted by the routing hit-rate counters.",
            ["policy", "index"], registry=r)
        self.routing_match_tokens = FastHistogram(
            "radixgate_routing_match_tokens",
            "Prefix match length the policy saw on the worker it chose, in (estimated) tokens.",
            ["policy"], buckets=BUCKETS["match_tokens"], registry=r)

    def attach_kv_events(self, subscribers: Callable[[], Iterable[KvSubscriber]]) -> None:
        """Register the ``radixgate_kv_events_*`` families, read from the workers' KV event
        subscribers at scrape time (``proxy/workers/kv_subscriber.py``)."""
        self.registry.register(KvEventsCollector(subscribers))

    def attach_peer_load(self, current: Callable[[], Mapping[str, int]]) -> None:
        """Register ``radixgate_peer_in_flight`` (label worker), read from ``current`` at scrape
        time: what the peer replicas last said they have in flight (``proxy/peers.py``)."""
        self.registry.register(MappingGauge(
            "radixgate_peer_in_flight",
            "Requests our peer replicas last said they have in flight, by worker (routing.peers): "
            "the load on each worker that this replica did not route.", "worker", current))

    def attach_prompt_bytes_per_token(self, current: Callable[[], Mapping[str, float]]) -> None:
        """Register ``radixgate_prompt_bytes_per_token`` (label model), read from ``current`` at
        scrape time: the learned estimate per model (``routing/token_estimate.py``)."""
        self.registry.register(MappingGauge(
            "radixgate_prompt_bytes_per_token",
            "UTF-8 bytes per prompt token learned from the prompt_tokens engines reported, by model "
            "(text prompts' token estimate; routing.chars_per_token until a model's first report).",
            "model", current))

    def attach_routing_model(self, current: Callable[[], Mapping[str, float]]) -> None:
        """Register ``radixgate_routing_ttft_model`` (label term), read from ``current`` at scrape
        time: the ttft policy's learned model (``routing/ttft_model.py``)."""
        self.registry.register(MappingGauge(
            "radixgate_routing_ttft_model",
            "The ttft policy's learned TTFT model: seconds for the base term and per unit of each other "
            "(uncached / unseen / queued token, running / waiting request), as routing uses them; "
            "uncached_token_fit is the fit's own cost of an uncached token before its floors.",
            "term", current))

    def _record_routing(self, done: CompletedRequest) -> None:
        route, decision, t = done.route, done.decision, done.timing
        if route is None or decision is None or decision.branch == PINNED:
            return
        policy = done.policy
        matched = decision.matched_tokens
        predicted = min(prefix_tokens(decision.matched_blocks, route.block_tokens) if matched is None else matched,
                        route.prompt_tokens)
        self.child(self.routing_match_tokens, policy).observe(predicted)
        if (done.outcome != "ok" or done.summed or t.cached_tokens is None or not t.prompt_tokens
                or not route.prompt_tokens):
            return
        scale = t.prompt_tokens / route.prompt_tokens
        predicted_reported = round(predicted * scale)
        error = predicted_reported - t.cached_tokens
        index = "approximate" if matched is None else "events"
        rates = self._routing_rates.get((policy, index))
        if rates is None:  # created on a first counted request, as the counters' children were
            rates = self._routing_rates[policy, index] = tuple(self.child(m, policy, index) for m in (
                self.routing_predicted_cached, self.routing_reported_cached, self.routing_prompt_tokens))
        predicted_c, reported_c, prompt_c = rates
        predicted_c.inc(predicted_reported)
        reported_c.inc(t.cached_tokens)
        self.child(self.routing_prediction_error, policy, index, "over" if error > 0 else "under").inc(abs(error))
        prompt_c.inc(t.prompt_tokens)

    def count_available(self, policy: str, tokens: int) -> None:
        """One request's available hit (computed by ``diagnose/reuse.py``'s fleet-wide cache model,
        which the diagnosis shares; this module only counts it)."""
        self.child(self.routing_available_cached, policy).inc(tokens)
    # == end of routing block ==
