"""SGLang's Prometheus metrics (``sglang:`` names, 0.5.23 labels) on an isolated registry.

Gauges are refreshed from the engine right before each scrape; counters and histograms are fed
as requests finish. Bucket sets are SGLang's defaults (metrics_collector.py).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from proxy.sim.engine import Engine
from proxy.sim.scheduler import SimRequest

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
               0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600,
               1200, 1800, 2400)
QUEUE_BUCKETS = (0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100,
                 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500,
                 3000)

SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
TOKENIZER_LABELS = ("model_name", "engine_type")


class SimMetrics:
    def __init__(self, engine: Engine, model_name: str) -> None:
        self.engine = engine
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.sched = {"model_name": model_name, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
                      "moe_ep_rank": "0"}
        self.tok = {"model_name": model_name, "engine_type": "unified"}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"sglang:{name}", doc, SCHEDULER_LABELS, registry=r, multiprocess_mode="mostrecent")

        self.running = gauge("num_running_reqs", "The number of running requests.")
        self.queued = gauge("num_queue_reqs", "The number of requests in the waiting queue.")
        self.used_tokens = gauge("num_used_tokens", "The number of used tokens.")
        self.token_usage = gauge("token_usage", "The token usage.")
        self.gen_throughput = gauge("gen_throughput", "The generation throughput (token/s).")
        self.cache_hit_rate = gauge("cache_hit_rate", "The prefix cache hit rate.")
        self.max_total = gauge("max_total_num_tokens", "Maximum total number of tokens in the KV pool.")
        self.page_size = gauge("page_size", "KV cache page size in tokens.")
        self.kv_available = gauge("kv_available_tokens", "Free KV tokens.")
        self.kv_evictable = gauge("kv_evictable_tokens", "Evictable (cached, unreferenced) KV tokens.")
        self.cache_config = Gauge("sglang:cache_config_info", "KV cache configuration.",
                                  ("model_name", "page_size", "num_pages"), registry=r)
        self.queue_time = Histogram("sglang:queue_time_seconds", "Time spent in the waiting queue.",
                                    SCHEDULER_LABELS, buckets=QUEUE_BUCKETS, registry=r)
        streaming = (*TOKENIZER_LABELS, "is_streaming")
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Time to first token.", streaming,
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "Inter-token latency.", TOKENIZER_LABELS,
                             buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "End-to-end request latency.", streaming,
                             buckets=E2E_BUCKETS, registry=r)
        self.prompt_tokens = Counter("sglang:prompt_tokens", "Prompt tokens processed.", TOKENIZER_LABELS, registry=r)
        self.generation_tokens = Counter("sglang:generation_tokens", "Generation tokens processed.",
                                         TOKENIZER_LABELS, registry=r)
        self.cached_tokens = Counter("sglang:cached_tokens", "Prompt tokens served from the prefix cache.",
                                     TOKENIZER_LABELS, registry=r)
        self.requests = Counter("sglang:num_requests", "Requests processed.", TOKENIZER_LABELS, registry=r)
        self.aborted = Counter("sglang:num_aborted_requests", "Requests aborted.", TOKENIZER_LABELS, registry=r)
        ps = engine.cache.page_size
        self.cache_config.labels(model_name=model_name, page_size=str(ps),
                                 num_pages=str(engine.max_total_tokens // ps)).set(1)

    def observe_finished(self, req: SimRequest, streaming: bool) -> None:
        t = self.tok
        s = {**t, "is_streaming": str(streaming).lower()}
        self.requests.labels(**t).inc()
        self.prompt_tokens.labels(**t).inc(len(req.input_ids))
        self.generation_tokens.labels(**t).inc(len(req.output_ids))
        self.cached_tokens.labels(**t).inc(req.cached_tokens)
        if req.finish_reason and req.finish_reason.get("type") == "abort":
            self.aborted.labels(**t).inc()
        if req.admitted_at is not None:
            self.queue_time.labels(**self.sched).observe(req.admitted_at - req.arrival)
        if req.first_token_at is not None:
            self.ttft.labels(**s).observe(req.first_token_at - req.arrival)
        if req.finished_at is not None:
            self.e2e.labels(**s).observe(req.finished_at - req.arrival)

    def observe_inter_token(self, seconds: float) -> None:
        self.itl.labels(**self.tok).observe(seconds)

    def render(self) -> bytes:
        e, c = self.engine, self.engine.cache
        lb = self.sched
        self.running.labels(**lb).set(e.scheduler.num_running)
        self.queued.labels(**lb).set(len(e.scheduler.waiting))
        self.used_tokens.labels(**lb).set(c.used_tokens)
        self.token_usage.labels(**lb).set(c.used_tokens / c.capacity)
        self.gen_throughput.labels(**lb).set(e.gen_throughput())
        self.cache_hit_rate.labels(**lb).set(e.scheduler.last_batch_hit_rate)
        self.max_total.labels(**lb).set(c.capacity)
        self.page_size.labels(**lb).set(c.page_size)
        self.kv_available.labels(**lb).set(c.available_tokens)
        self.kv_evictable.labels(**lb).set(c.evictable_tokens)
        return generate_latest(self.registry)
