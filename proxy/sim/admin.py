"""Health, information, load and management endpoints of the simulated worker (SGLang 0.5.23 shapes)."""

from __future__ import annotations

import asyncio
import datetime
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from proxy.sim.metrics import SimMetrics
from proxy.sim.server import SimWorker, error_response

SGLANG_VERSION = "0.5.23"
Handler = Callable[[web.Request], Awaitable[web.Response]]
LOAD_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})
FLUSH_OK = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or "
            "waiting requests, the operation will not be performed.)\n")


def server_args(worker: SimWorker) -> dict[str, Any]:
    cfg, eng = worker.config, worker.engine
    return {
        "model_path": cfg.served_model_name,
        "tokenizer_path": cfg.served_model_name,
        "served_model_name": cfg.served_model_name,
        "host": cfg.host,
        "port": worker.port,
        "dtype": "bfloat16",
        "context_length": eng.context_length,
        "mem_fraction_static": eng.profile.mem_fraction_static,
        "max_running_requests": eng.limits.max_running_requests,
        "max_queued_requests": cfg.max_queued_requests,
        "max_total_tokens": cfg.max_total_tokens,
        "chunked_prefill_size": eng.limits.chunked_prefill_size,
        "max_prefill_tokens": cfg.max_prefill_tokens,
        "prefill_max_requests": eng.limits.prefill_max_requests,
        "schedule_policy": cfg.schedule_policy,
        "schedule_conservativeness": 1.0,
        "page_size": cfg.page_size,
        "stream_interval": cfg.stream_interval,
        "incremental_streaming_output": cfg.incremental_streaming_output,
        "enable_metrics": cfg.enable_metrics,
        "enable_cache_report": cfg.enable_cache_report,
        "enable_mixed_chunk": eng.limits.enable_mixed_chunk,
        "disable_radix_cache": False,
        "radix_eviction_policy": "lru",
        "tp_size": 1,
        "dp_size": cfg.dp_size,
        "pp_size": 1,
    }


def load_snapshot(worker: SimWorker, include: set[str] | None, rank: int = 0) -> dict[str, Any]:
    eng = worker.ranks[rank]
    cache = eng.cache
    sched = eng.scheduler
    used = cache.used_tokens
    load: dict[str, Any] = {
        "dp_rank": rank,
        "num_running_reqs": sched.num_running,
        "num_waiting_reqs": len(sched.waiting),
        "num_waiting_uncached_tokens": sched.waiting_uncached_tokens(),
        "num_used_tokens": used,
        "num_total_tokens": cache.tree_tokens + cache.private_tokens,
        "max_total_num_tokens": cache.capacity,
        "max_running_requests": eng.limits.max_running_requests,
        "token_usage": round(used / cache.capacity, 4),
        "gen_throughput": round(eng.gen_throughput(), 2),
        "cache_hit_rate": round(sched.last_batch_hit_rate, 4),
        "utilization": round(sched.num_running / eng.limits.max_running_requests, 4),
    }
    every = include is None or "all" in include
    if every or "memory" in include:  # type: ignore[operator]
        kv_bytes = cache.capacity * eng.profile.model.kv_bytes_per_token
        load["memory"] = {"weight_gb": round(eng.profile.model.weight_bytes / 1e9, 2),
                          "kv_cache_gb": round(kv_bytes / 1e9, 2), "graph_gb": 0.5, "token_capacity": cache.capacity}
    if every or "queues" in include:  # type: ignore[operator]
        load["queues"] = {"waiting": len(sched.waiting), "grammar": 0, "paused": 0, "retracted": 0}
    return load


def add_routes(app: web.Application, worker: SimWorker) -> None:
    async def health(request: web.Request) -> web.Response:
        cfg = worker.config
        if worker.starting() or cfg.fault_fail_health:
            return web.Response(status=503)
        if cfg.fault_hang_before_first_token:  # the 1-token probe never answers
            await asyncio.sleep(HEALTH_TIMEOUT / cfg.time_scale)
            return web.Response(status=503)
        return web.Response(status=200)

    async def ready(request: web.Request) -> web.Response:
        return web.Response(status=503 if worker.starting() else 200)

    async def server_info(request: web.Request) -> web.Response:
        eng = worker.engine
        info = server_args(worker)
        info["scheduler_info"] = {"status": "ready", "max_total_num_tokens": eng.cache.capacity,
                                  "max_req_input_len": eng.context_length - 1,
                                  "startup_time": worker.started_at + worker.wall_offset}
        info["internal_states"] = [{  # one per DP rank, as SGLang lists them
            "effective_max_running_requests_per_dp": e.limits.max_running_requests,
            "last_gen_throughput": e.gen_throughput(),
            "memory_usage": {"weight": round(e.profile.model.weight_bytes / 2**30, 2),
                             "kvcache": round(e.cache.capacity * e.profile.model.kv_bytes_per_token / 2**30, 2),
                             "token_capacity": e.cache.capacity},
            "world_size": 1,
        } for e in worker.ranks]
        info["version"] = SGLANG_VERSION
        info["launch_command"] = "python -m proxy.sim"
        info["simworker"] = {"worker_id": worker.worker_id, "profile": worker.config.profile,
                             "time_scale": worker.config.time_scale, "gpu": eng.profile.gpu.name,
                             "simulated_busy_seconds": eng.busy_seconds, "lag_seconds": eng.lag_seconds}
        if worker.kv_publisher is not None:  # where its KV events are (ports picked at start)
            kv = {"endpoint": worker.kv_publisher.endpoint, "replay_endpoint": worker.kv_publisher.replay_endpoint}
            info["simworker"]["kv_events"] = kv
            # As SGLang lists its server args: the config, here with the ports really bound.
            info["kv_events_config"] = json.dumps({"publisher": "zmq", **kv, "topic": worker.kv_publisher.settings.topic})
        return web.json_response(info)

    async def model_info(request: web.Request) -> web.Response:
        name = worker.config.served_model_name
        return web.json_response({
            "model_path": name, "tokenizer_path": name, "served_model_name": name, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": "default", "load_format": "auto",
            "reasoning_parser": None, "tool_call_parser": None, "disaggregation_mode": "null",
            "has_image_understanding": False, "has_audio_understanding": False, "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
        })

    def model_card() -> dict[str, Any]:
        return {"id": worker.config.served_model_name, "object": "model", "created": int(worker.wall_offset),
                "owned_by": "sglang", "root": worker.config.served_model_name, "parent": None,
                "max_model_len": worker.engine.context_length}

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [model_card()]})

    async def one_model(request: web.Request) -> web.Response:
        if request.match_info["model"] != worker.config.served_model_name:
            return error_response(f"The model `{request.match_info['model']}` does not exist.", 404, openai=True)
        return web.json_response(model_card())

    async def loads(request: web.Request) -> web.Response:
        raw = request.query.get("include")
        include = {s.strip() for s in raw.split(",")} if raw else None
        if include is not None and not include <= LOAD_SECTIONS:
            return web.json_response({"detail": f"Invalid include sections: {sorted(include - LOAD_SECTIONS)}. "
                                      f"Valid options: {sorted(LOAD_SECTIONS)}"}, status=400)
        snaps = [load_snapshot(worker, include, r) for r in range(len(worker.ranks))]
        if request.query.get("format") == "prometheus":
            return web.Response(text=loads_prometheus(snaps), content_type="text/plain")
        return web.json_response({
            "timestamp": datetime.datetime.now(datetime.UTC).isoformat(),
            "version": SGLANG_VERSION,
            "accelerator": worker.engine.profile.gpu.name,
            "num_accelerators": 1,
            "loads": snaps,
            "aggregate": {"total_running_reqs": sum(s["num_running_reqs"] for s in snaps),
                          "total_waiting_reqs": sum(s["num_waiting_reqs"] for s in snaps),
                          "total_reqs": sum(s["num_running_reqs"] + s["num_waiting_reqs"] for s in snaps),
                          "avg_token_usage": round(sum(s["token_usage"] for s in snaps) / len(snaps), 4),
                          "avg_throughput": round(sum(s["gen_throughput"] for s in snaps) / len(snaps), 2),
                          "avg_utilization": round(sum(s["utilization"] for s in snaps) / len(snaps), 4)},
        })

    async def old_load(request: web.Request) -> web.Response:
        return web.json_response([{"dp_rank": i, "num_reqs": e.scheduler.num_running + len(e.scheduler.waiting),
                                   "num_waiting_reqs": len(e.scheduler.waiting), "num_tokens": e.cache.used_tokens}
                                  for i, e in enumerate(worker.ranks)])

    async def flush(request: web.Request) -> web.Response:
        busy = [e.scheduler for e in worker.ranks if e.scheduler.num_running or e.scheduler.waiting]
        if busy or not all(e.flush_cache() for e in worker.ranks):
            sched = busy[0] if busy else worker.engine.scheduler
            return web.Response(status=400, text=(
                "Cache not flushed. Please check backend logs for more details. (When there are running or "
                f"waiting requests, the operation will not be performed.) #queue-req: {len(sched.waiting)}, "
                f"#running-req: {sched.num_running}\n"))
        return web.Response(status=200, text=FLUSH_OK)

    async def abort(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        if body.get("abort_all"):
            for e in worker.ranks:
                e.abort_all()
        elif isinstance(body.get("rid"), str):
            worker.abort(body["rid"])
        return web.Response(status=200)

    def reported(handler: Handler) -> Handler:
        """Load reports exist unless the worker plays an engine without them (minimal_reports)."""
        async def guarded(request: web.Request) -> web.Response:
            if worker.config.minimal_reports:
                return web.Response(status=404, text="404: Not Found")
            return await handler(request)
        return guarded

    async def bench_stats(request: web.Request) -> web.Response:
        # For benchmarks only (routers are not told of it): the true prefix reuse, whatever is reported.
        return web.json_response(worker.bench_stats())

    async def bench_mode(request: web.Request) -> web.Response:
        body = await request.json()
        worker.config.minimal_reports = bool(body.get("minimal_reports"))
        return web.json_response({"minimal_reports": worker.config.minimal_reports})

    async def metrics(request: web.Request) -> web.Response:
        if worker.config.minimal_reports:
            return web.Response(status=404, text="404: Not Found")
        assert isinstance(worker.metrics, SimMetrics)
        return web.Response(body=worker.metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    r = app.router
    r.add_get("/health", health)
    r.add_get("/health_generate", health)
    r.add_get("/ready", ready)
    for path in ("/get_server_info", "/server_info"):
        r.add_get(path, server_info)
    for path in ("/get_model_info", "/model_info"):
        r.add_get(path, model_info)
    r.add_get("/v1/models", models)
    r.add_get("/v1/models/{model:.+}", one_model)
    r.add_get("/v1/loads", reported(loads))
    r.add_get("/get_load", reported(old_load))
    r.add_get("/bench/stats", bench_stats)
    r.add_post("/bench/mode", bench_mode)
    r.add_get("/flush_cache", flush)
    r.add_post("/flush_cache", flush)
    r.add_post("/abort_request", abort)
    if worker.metrics is not None:
        r.add_get("/metrics", metrics)


HEALTH_TIMEOUT = 20.0  # SGLANG_HEALTH_CHECK_TIMEOUT, simulated seconds


def loads_prometheus(snaps: list[dict[str, Any]]) -> str:
    """``/v1/loads?format=prometheus``: one gauge per field, a sample per rank."""
    series: dict[str, list[str]] = {}
    for snap in snaps:
        for key, value in snap.items():
            if key == "dp_rank":
                continue
            items = [(f"sglang_{key}_{k}", v) for k, v in value.items()] if isinstance(value, dict) else [(f"sglang_{key}", value)]
            for name, v in items:
                if isinstance(v, (int, float)):
                    series.setdefault(name, []).append(f'{name}{{dp_rank="{snap["dp_rank"]}"}} {v}')
    lines = [line for name, samples in series.items() for line in (f"# TYPE {name} gauge", *samples)]
    return "\n".join(lines) + "\n"
