"""A real continuous-batching engine on a GPU behind the SGLang worker protocol (a subset).

Runs Hugging Face transformers' ``ContinuousBatchingManager`` (paged attention, prefix block
sharing) with a Llama-3.1-8B-shaped model (random weights: timing does not depend on the values)
and serves the parts of SGLang's HTTP API that radixgate uses: ``/generate`` (stream and not),
``/health``, ``/get_server_info``, ``/get_model_info``, ``/v1/models``, ``/v1/loads``,
``/metrics`` (``sglang:`` gauges), ``/abort_request``. It exists so the proxy, its timing and its
diagnosis (NVML idle gaps included) can be exercised on a real GPU; it is not SGLang.

``cached_tokens`` is the engine's own prefix match: the shim wraps
``PagedAttentionCache.search_prefix_match`` (which returns the matched block count) and reports
the matched tokens for that request, so the hit rate is measured, not assumed.

Prompts are tokenized with ``--tokenizer`` (a Hugging Face ``tokenizer.json``; the fleet benchmark
uses the BPE under ``loadtests/gpu/tokenizer``), else the simulated worker's deterministic one.
``--kv-tokens`` fixes the KV pool (blocks x block size), so a benchmark can size it below its
working set. ``--minimal-reports`` answers as a deployment without ``--enable-cache-report`` /
``--enable-metrics``: no ``cached_tokens``, no ``/v1/loads`` and no ``/metrics`` (404).
OpenAI ``/v1/completions`` and ``/v1/chat/completions`` render chat turns as the simulated worker
does (the tokenizer directory's chat template, else ``proxy.sim.protocol.render_chat``).

Eviction is the engine's own: a finished request's complete blocks stay hashed for reuse and are
taken back when free blocks run out, most recently freed first (``BlockManager``'s
``_init_block_ids.popitem()``), not least recently used as SGLang's radix cache does.

    python loadtests/gpu/engine_server.py --port 31001 [--tokenizer DIR] [--kv-tokens N] [--minimal-reports]
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import logging
import os
import queue
import threading
import time
import uuid
from collections import deque
from typing import Any

from aiohttp import web

from loadtests.gpu import batch_log
from loadtests.gpu.kv_tracker import BlockChains, KvTracker, engine_hash
from proxy.routing.chat_template import ChatTemplateError
from proxy.sim import tokenizer as tok
from proxy.sim.protocol import BadRequest, render_chat

log = logging.getLogger("engine_server")

SERVED_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
HEALTH_PROBE_S = 20.0  # SGLang's /health probe timeout
LOOP_DEAD = "generation loop not running"


class StepTimes:
    """When the engine's steps ended, from the outputs they produced: a step streams one output per
    request it advanced, all at once, so outputs less than ``gap_s`` apart are one step (20 ms:
    over Python's 5 ms thread switch, which can pause the drain, and under the engine's 60 ms a
    step). Each entry is [the step's first output (perf_counter s), outputs in it]. Steps that
    produced no output (a prefill chunk that did not finish its prompt) are not seen.
    Thread-safe: marked by the dispatch thread, drained by the server's loop."""

    def __init__(self, gap_s: float = 0.02, maxlen: int = 100_000) -> None:
        self.gap_s = gap_s
        self._steps: deque[list[float]] = deque(maxlen=maxlen)
        self._lock = threading.Lock()

    def mark(self, now: float) -> None:
        with self._lock:
            if self._steps and now - self._steps[-1][2] < self.gap_s:
                self._steps[-1][1] += 1
                self._steps[-1][2] = now
            else:
                self._steps.append([now, 1, now])

    def drain(self) -> list[list[float]]:
        with self._lock:
            out = [[round(t, 4), int(n)] for t, n, _ in self._steps]
            self._steps.clear()
        return out


class Engine:
    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
        from transformers.generation import ContinuousBatchingConfig, GenerationConfig
        from transformers.generation.continuous_batching import cache as cb_cache

        self.args = args
        self.encoder = tok.Encoder(args.tokenizer)
        self.matched_tokens: dict[str, int] = {}
        self.cache: Any = None  # the PagedAttentionCache, seen at its first prefix match
        # --kv-events-config: prompts submitted since the publisher's last look (it names their
        # blocks with the engine's own hash once the cache is known)
        self.recent_prompts: deque[list[int]] = deque(maxlen=10_000)
        original = cb_cache.PagedAttentionCache.search_prefix_match
        engine = self

        def recording_match(cache: Any, request_id: str, prompt_ids: list[int]) -> int:
            engine.cache = cache
            matched = int(original(cache, request_id, prompt_ids))
            # Releases differ: some return matched blocks, 5.17 returns matched tokens. A block count
            # times the block size can never exceed the prompt, so a larger product means tokens.
            tokens = matched * cache.block_size
            engine.matched_tokens[request_id] = matched if tokens > len(prompt_ids) else tokens
            return matched

        # method-assign where transformers is installed (it ships py.typed); unused where it is absent (CI)
        cb_cache.PagedAttentionCache.search_prefix_match = recording_match  # type: ignore[method-assign, unused-ignore]
        self.batches = batch_log.BatchLog()  # for /bench/trace: the scheduler's own batches
        batch_log.install(self.batches)

        config = LlamaConfig(
            hidden_size=4096, intermediate_size=14336, num_hidden_layers=args.layers,
            num_attention_heads=32, num_key_value_heads=8, vocab_size=self.encoder.vocab_size,
            max_position_embeddings=32768, rope_theta=500000.0, eos_token_id=None, bos_token_id=None,
        )
        torch.manual_seed(0)
        torch.set_default_dtype(torch.bfloat16)
        with torch.device("cuda"):
            model = LlamaForCausalLM._from_config(config, attn_implementation="paged|sdpa")
        model = model.to(torch.bfloat16)
        model.eval()
        self.params = sum(p.numel() for p in model.parameters())
        gen = GenerationConfig(max_new_tokens=128, do_sample=False, pad_token_id=0)
        cbc = ContinuousBatchingConfig(
            block_size=args.block_size, max_batch_tokens=args.max_batch_tokens,
            num_blocks=(args.kv_tokens // args.block_size) if args.kv_tokens else None,
            max_memory_percent=args.mem_fraction, max_requests_per_batch=args.max_running_requests,
            allow_block_sharing=True, scheduler_type="fifo", use_cuda_graph=args.cuda_graph or None,
        )
        self.manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cbc)
        self.manager.start()
        self.queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any]]] = {}
        self.lock = threading.Lock()
        self.running: set[str] = set()
        self.waiting: dict[str, int] = {}
        self._stop = False
        self.last_output = time.monotonic()  # the engine's last sign of progress (an output, or idle)
        self.steps = StepTimes()  # for /bench/trace: how the engine processes sharing a GPU interleave
        threading.Thread(target=self._dispatch, daemon=True).start()

    def unhealthy(self) -> str | None:
        """Why this engine cannot serve, as SGLang's /health finds out with its 1-token probe (20 s):
        the generation loop died (transformers logs it and keeps accepting requests: an engine
        whose KV and batch footprint did not fit its memory share died at its first batch and
        answered /health for a whole phase), or work is in flight and nothing came out for 20 s."""
        running = getattr(self.manager, "is_running", None)
        if callable(running) and not running():
            return LOOP_DEAD
        with self.lock:
            busy = bool(self.running or self.waiting)
        if busy and time.monotonic() - self.last_output > HEALTH_PROBE_S:
            return f"no output for {HEALTH_PROBE_S:g} s with requests in flight"
        return None

    def _dispatch(self) -> None:
        while not self._stop:
            try:
                out = self.manager.get_result(timeout=0.05)
            except queue.Empty:
                if self.unhealthy() == LOOP_DEAD:
                    # As SGLang's server does when its scheduler dies: exit, so that clients and
                    # routers see a dead worker (and run_fleet.sh a failed start) rather than one
                    # that accepts requests and never answers.
                    log.error("generation loop died; exiting")
                    os._exit(3)
                continue
            if out is None:
                continue
            self.steps.mark(time.perf_counter())
            self.last_output = time.monotonic()
            with self.lock:
                target = self.queues.get(out.request_id)
            if target is not None:
                loop, q = target
                loop.call_soon_threadsafe(q.put_nowait, out)

    def submit(self, rid: str, ids: list[int], max_new_tokens: int) -> asyncio.Queue[Any]:
        q: asyncio.Queue[Any] = asyncio.Queue()
        with self.lock:
            if not (self.running or self.waiting):  # idle until now: the silence before is not a stall
                self.last_output = time.monotonic()
            self.queues[rid] = (asyncio.get_running_loop(), q)
            self.waiting[rid] = len(ids)
        if self.args.kv_events_config:
            self.recent_prompts.append(ids)
        # eos -1: never stop early (random weights; the client asked for ignore_eos semantics)
        self.manager.add_request(input_ids=ids, request_id=rid, max_new_tokens=max_new_tokens, streaming=True,
                                 eos_token_id=-1)
        return q

    def started(self, rid: str) -> None:
        with self.lock:
            if self.waiting.pop(rid, None) is not None:
                self.running.add(rid)

    def finish(self, rid: str) -> None:
        with self.lock:
            self.queues.pop(rid, None)
            self.waiting.pop(rid, None)
            self.running.discard(rid)

    def flush_prefix_cache(self) -> int:
        """Forget every cached block no request holds (benchmarks flush between phases so no
        phase inherits another's cache); only while nothing is in flight. Returns blocks freed."""
        with self.lock:
            if self.queues or self.cache is None:
                return -1
            bm = self.cache._block_manager
            freed = 0
            for block_id in list(bm._init_block_ids):
                block = bm._id_to_block.pop(block_id, None)
                if block is not None and block.hash is not None:
                    bm._hash_to_id.pop(block.hash, None)
                bm._uninit_block_ids.append(block_id)
                freed += 1
            bm._init_block_ids.clear()
            return freed

    def total_blocks(self) -> int | None:
        bm = getattr(self.cache, "_block_manager", None)
        return getattr(bm, "num_blocks", None) if bm is not None else None

    def free_blocks(self) -> tuple[int, int]:
        """(never-used or flushed blocks, freed blocks still hashed for reuse): both can be
        allocated; the second only by evicting a cached prefix. (-1, -1) before the first request."""
        bm = getattr(self.cache, "_block_manager", None)
        if bm is None:
            return -1, -1
        return len(getattr(bm, "_uninit_block_ids", ())), len(getattr(bm, "_init_block_ids", ()))

    def load(self) -> dict[str, Any]:
        with self.lock:
            return {
                "num_running_reqs": len(self.running),
                "num_waiting_reqs": len(self.waiting),
                "num_waiting_uncached_tokens": sum(self.waiting.values()),
            }


class Server:
    def __init__(self, engine: Engine, args: argparse.Namespace) -> None:
        self.engine = engine
        self.args = args
        self.kv_tokens = args.kv_tokens or args.kv_tokens_hint
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.requests = 0
        # For benchmarks (``GET /bench/trace``, read and cleared once per phase): every finished
        # request's times on this engine, and a sampled timeline of its batch and free KV blocks,
        # so a router's tail can be traced to what the engine did (waits for memory, a long queue).
        self.trace: deque[dict[str, Any]] = deque(maxlen=20_000)
        self.timeline: deque[list[float]] = deque(maxlen=20_000)
        self.kv_endpoints: dict[str, str | None] = {}  # where --kv-events-config publishes, once open
        self.kv_tracker: KvTracker | None = None
        self.kv_publisher: Any = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_post("/generate", self.generate)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat)
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)
        r.add_get("/get_server_info", self.server_info)
        r.add_get("/server_info", self.server_info)
        r.add_get("/get_model_info", self.model_info)
        r.add_get("/model_info", self.model_info)
        r.add_get("/v1/models", self.models)
        r.add_get("/v1/loads", self.loads)
        r.add_get("/metrics", self.metrics)
        r.add_post("/abort_request", self.abort)
        r.add_get("/bench/stats", self.bench_stats)
        r.add_get("/bench/trace", self.bench_trace)
        r.add_post("/bench/mode", self.bench_mode)
        r.add_post("/flush_cache", self.flush)
        return app

    async def health(self, _: web.Request) -> web.Response:
        why = self.engine.unhealthy()
        return web.Response(status=503, text=why) if why else web.Response(text="")

    async def model_info(self, _: web.Request) -> web.Response:
        return web.json_response({"model_path": SERVED_MODEL, "served_model_name": SERVED_MODEL,
                                  "tokenizer_path": SERVED_MODEL, "is_generation": True,
                                  "preferred_sampling_params": None})

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": SERVED_MODEL, "object": "model", "owned_by": "radixgate-gpu", "max_model_len": 32768}]})

    async def server_info(self, _: web.Request) -> web.Response:
        a = self.args
        return web.json_response({
            "model_path": SERVED_MODEL, "served_model_name": SERVED_MODEL,
            "max_running_requests": a.max_running_requests, "chunked_prefill_size": a.max_batch_tokens,
            "max_prefill_tokens": a.max_batch_tokens, "schedule_policy": "fcfs", "page_size": a.block_size,
            "max_total_num_tokens": self.kv_tokens,
            "scheduler_info": {"status": "ok", "max_total_num_tokens": self.kv_tokens},
            "internal_states": [{"effective_max_running_requests_per_dp": a.max_running_requests}],
            "version": "transformers-cb-shim",
            **({"kv_events_config": json.dumps({"publisher": "zmq", **self.kv_endpoints})} if self.kv_endpoints else {}),
        })

    def _load_snapshot(self) -> dict[str, Any]:
        load = self.engine.load()
        hit = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        snap = {"dp_rank": 0, **load, "max_running_requests": self.args.max_running_requests,
                "max_total_num_tokens": self.kv_tokens, "cache_hit_rate": hit}
        usage = self.token_usage()
        if usage is not None:
            snap["token_usage"] = usage
        return snap

    def token_usage(self) -> float | None:
        """KV in use as SGLang counts it: blocks neither free nor holding an evictable cached
        prefix, over the pool (None before the engine has a block table)."""
        total = self.engine.total_blocks()
        free, cached = self.engine.free_blocks()
        if not total or free < 0:
            return None
        return round(max(0, total - free - cached) / total, 4)

    async def bench_stats(self, _: web.Request) -> web.Response:
        # For benchmarks only (routers are not told of it): the true prefix reuse, whatever is reported.
        with self.engine.lock:
            active = len(self.engine.queues)
        return web.json_response({"prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                                  "requests": self.requests, "active": active})

    async def bench_trace(self, _: web.Request) -> web.Response:
        doc = {"requests": list(self.trace), "timeline": list(self.timeline),
               "timeline_fields": ["t", "running", "waiting", "waiting_tokens", "free_blocks", "cached_blocks"],
               "blocks": self.engine.total_blocks(), "block_size": self.args.block_size,
               "steps": self.engine.steps.drain(), "steps_fields": ["t", "outputs"],
               "batches": self.engine.batches.drain(), "batches_fields": batch_log.FIELDS}
        self.trace.clear()
        self.timeline.clear()
        return web.json_response(doc)

    async def sample(self, every_s: float = 0.25) -> None:
        while True:
            load = self.engine.load()
            free, cached = self.engine.free_blocks()
            self.timeline.append([round(time.perf_counter(), 3), load["num_running_reqs"], load["num_waiting_reqs"],
                                  load["num_waiting_uncached_tokens"], free, cached])
            await asyncio.sleep(every_s)

    async def flush(self, _: web.Request) -> web.Response:
        freed = self.engine.flush_prefix_cache()
        if freed < 0:
            return web.Response(status=400, text="Cache not flushed: requests are in flight.\n")
        if self.kv_tracker is not None and self.kv_publisher is not None:
            await self.kv_publisher.publish_events(self.kv_tracker.cleared())
        return web.Response(text=f"Cache flushed ({freed} blocks).\n")

    async def publish_kv_events(self, every_s: float = 0.05) -> None:
        """--kv-events-config: diff the engine's table of cached blocks (``kv_tracker.py``) and
        publish what changed, on SGLang's wire (``proxy.sim.kv_publish``), forever. A look that
        fails is logged and the next one tried: a publisher that died silently would leave a
        stream that says nothing is ever stored."""
        from proxy.sim.kv_publish import KvEventsSettings, KvPublisher

        publisher = KvPublisher(KvEventsSettings.parse(self.args.kv_events_config), dp_rank=self.args.dp_rank)
        publisher.start()
        self.kv_publisher = publisher
        self.kv_endpoints = {"endpoint": publisher.endpoint, "replay_endpoint": publisher.replay_endpoint}
        errors: set[str] = set()
        warned = False
        while True:
            await asyncio.sleep(every_s)
            try:
                stored = await self._publish_once(publisher)
            except Exception as e:  # logged once per kind, then the next look
                if repr(e) not in errors:
                    errors.add(repr(e))
                    log.exception("kv events: a look at the block table failed")
                continue
            tracker = self.kv_tracker
            if stored == 0 and not warned and tracker is not None and tracker.unknown > 64:
                warned = True
                log.warning("kv events: the engine holds %d blocks and none is a prompt block by our hash",
                            tracker.unknown)

    async def _publish_once(self, publisher: Any) -> int | None:
        bm = getattr(self.engine.cache, "_block_manager", None)
        if bm is None:
            return None
        if self.kv_tracker is None:  # the engine's own hash, once its cache exists
            self.kv_tracker = KvTracker(BlockChains(engine_hash(bm.compute_hash), self.args.block_size))
            log.info("kv events: engine hash %s", inspect.signature(bm.compute_hash))
        while self.engine.recent_prompts:
            self.kv_tracker.chains.add_prompt(self.engine.recent_prompts.popleft())
        try:
            present = list(bm._hash_to_id)  # one C-level copy under the GIL
        except RuntimeError:  # resized mid-copy by the engine thread: next look
            return None
        events = self.kv_tracker.diff(present)
        if events:
            await publisher.publish_events(events)
        return len(self.kv_tracker.published)

    async def bench_mode(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.args.minimal_reports = bool(body.get("minimal_reports"))
        return web.json_response({"minimal_reports": self.args.minimal_reports})

    async def loads(self, _: web.Request) -> web.Response:
        if self.args.minimal_reports:
            return web.Response(status=404, text="404: Not Found")
        snap = self._load_snapshot()
        return web.json_response({"timestamp": time.time(), "version": "shim", "loads": [snap],
                                  "aggregate": {"total_running_reqs": snap["num_running_reqs"],
                                                "total_waiting_reqs": snap["num_waiting_reqs"]}})

    async def metrics(self, _: web.Request) -> web.Response:
        if self.args.minimal_reports:
            return web.Response(status=404, text="404: Not Found")
        s = self._load_snapshot()
        lbl = f'{{model_name="{SERVED_MODEL}",engine_type="unified"}}'
        lines = [
            f"sglang:num_running_reqs{lbl} {s['num_running_reqs']}",
            f"sglang:num_queue_reqs{lbl} {s['num_waiting_reqs']}",
            f"sglang:cache_hit_rate{lbl} {s['cache_hit_rate']}",
            *([f"sglang:token_usage{lbl} {s['token_usage']}"] if "token_usage" in s else []),
            f"sglang:max_total_num_tokens{lbl} {self.kv_tokens}",
            f"sglang:page_size{lbl} {self.args.block_size}",
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def abort(self, request: web.Request) -> web.Response:
        body = await request.json()
        rid = body.get("rid")
        if rid:
            self.engine.manager.cancel_request(request_id=rid)
        return web.Response(text="")

    # -- generation ----------------------------------------------------------------------------

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        ids = body.get("input_ids") or self.engine.encoder.encode(str(body.get("text", "")))
        sp = body.get("sampling_params") or {}
        return await self._run(request, "generate", str(body.get("rid") or uuid.uuid4().hex), ids,
                               int(sp.get("max_new_tokens", 128)), bool(body.get("stream")), False)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=True)

    async def _openai(self, request: web.Request, chat: bool) -> web.StreamResponse:
        body = await request.json()
        try:
            if chat:
                text = render_chat(body.get("messages"))  # validates; the tokenizer's template renders
                ids = self.engine.encoder.encode_chat(body["messages"]) or self.engine.encoder.encode(text)
            else:
                prompt = body.get("prompt")
                ids = list(prompt) if isinstance(prompt, list) else self.engine.encoder.encode(str(prompt or ""))
        except (BadRequest, ChatTemplateError) as e:  # a template's refusal is the caller's 400, as SGLang's
            return web.json_response({"object": "error", "message": str(e), "code": 400}, status=400)
        max_new = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return await self._run(request, "chat" if chat else "completions", str(body.get("rid") or uuid.uuid4().hex),
                               ids, max_new, bool(body.get("stream")), usage)

    async def _run(self, request: web.Request, dialect: str, rid: str, ids: list[int], max_new: int,
                   stream: bool, include_usage: bool) -> web.StreamResponse:
        received = time.perf_counter()
        q = self.engine.submit(rid, ids, max_new)
        resp: web.StreamResponse | None = None
        if stream:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
        seed = tok.output_seed(ids)
        first_token_at: float | None = None
        generated: list[int] = []
        out: Any = None
        try:
            while True:
                out = await q.get()
                if out.error:
                    raise RuntimeError(out.error)
                if first_token_at is None and out.generated_tokens:
                    first_token_at = time.perf_counter()
                    self.engine.started(rid)
                new = out.generated_tokens[len(generated):]
                before = len(generated)
                generated.extend(new)
                finished = out.is_finished()
                if stream and resp is not None and (new or finished):
                    if dialect == "generate":
                        chunk = self._payload(rid, ids, generated, seed, out, received, first_token_at, finished)
                    else:
                        delta = "".join(" " + tok.output_word(seed, k) for k in range(before, len(generated)))
                        chunk = self._openai_chunk(rid, dialect, delta, before == 0, finished)
                    await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                if finished:
                    break
        except (ConnectionResetError, asyncio.CancelledError):
            self.engine.manager.cancel_request(request_id=rid)
            raise
        finally:
            self.engine.finish(rid)
        cached = self.engine.matched_tokens.get(rid, 0)
        try:
            return await self._answer(resp, dialect, rid, ids, generated, seed, out, received, first_token_at,
                                      cached, include_usage)
        finally:
            self.engine.matched_tokens.pop(rid, None)

    async def _answer(self, resp: web.StreamResponse | None, dialect: str, rid: str, ids: list[int],
                      generated: list[int], seed: int, out: Any, received: float, first_token_at: float | None,
                      cached: int, include_usage: bool) -> web.StreamResponse:
        self.prompt_tokens += len(ids)
        self.cached_tokens += cached
        self.requests += 1
        queued = out.lifespan[0] - out.created_time if out is not None and out.lifespan[0] > 0 else None
        self.trace.append({"at": round(received, 4), "first": round(first_token_at, 4) if first_token_at else None,
                           "done": round(time.perf_counter(), 4), "prompt": len(ids), "cached": cached,
                           "queued": round(queued, 4) if queued is not None else None})
        if resp is not None:
            if include_usage and dialect != "generate":
                chunk = {"id": rid, "object": self._object(dialect, True), "model": SERVED_MODEL, "choices": [],
                         "usage": self._usage(ids, generated, cached)}
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        if dialect == "generate":
            return web.json_response(self._payload(rid, ids, generated, seed, out, received, first_token_at, True))
        text = " ".join(tok.output_word(seed, k) for k in range(len(generated)))
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        choice.update({"message": {"role": "assistant", "content": text}} if dialect == "chat" else {"text": text})
        return web.json_response({"id": rid, "object": self._object(dialect, False), "model": SERVED_MODEL,
                                  "choices": [choice], "usage": self._usage(ids, generated, cached)})

    @staticmethod
    def _object(dialect: str, chunk: bool) -> str:
        if dialect == "chat":
            return "chat.completion.chunk" if chunk else "chat.completion"
        return "text_completion"

    def _usage(self, ids: list[int], generated: list[int], cached: int) -> dict[str, Any]:
        usage: dict[str, Any] = {"prompt_tokens": len(ids), "completion_tokens": len(generated),
                                 "total_tokens": len(ids) + len(generated)}
        if not self.args.minimal_reports:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return usage

    def _openai_chunk(self, rid: str, dialect: str, delta: str, first: bool, finished: bool) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if finished else None}
        if dialect == "chat":
            choice["delta"] = ({"role": "assistant"} if first else {}) | {"content": delta}
        else:
            choice["text"] = delta
        return {"id": rid, "object": self._object(dialect, True), "model": SERVED_MODEL, "choices": [choice],
                "usage": None}

    def _payload(self, rid: str, ids: list[int], generated: list[int], seed: int, out: Any,
                 received: float, first_token_at: float | None, finished: bool) -> dict[str, Any]:
        text = " ".join(tok.output_word(seed, k) for k in range(len(generated)))
        meta: dict[str, Any] = {
            "id": rid, "finish_reason": {"type": "length", "length": len(generated)} if finished else None,
            "prompt_tokens": len(ids), "completion_tokens": len(generated),
            "reasoning_tokens": 0, "weight_version": "random", "num_retractions": 0,
        }
        if not self.args.minimal_reports:
            meta["cached_tokens"] = self.engine.matched_tokens.get(rid, 0)
            if out is not None and out.lifespan[0] > 0:
                meta["queue_time"] = max(0.0, out.lifespan[0] - out.created_time)
        if finished:
            meta["e2e_latency"] = time.perf_counter() - received
            if first_token_at is not None and not self.args.minimal_reports:
                meta["first_token_latency"] = first_token_at - received
        return {"text": text, "output_ids": generated, "meta_info": meta}


async def warm_up(engine: Engine) -> None:
    q = engine.submit("warmup", engine.encoder.encode("warm up the kernels " * 64), 4)
    while not (await q.get()).is_finished():
        pass
    engine.finish("warmup")


async def main_async(args: argparse.Namespace) -> None:
    engine = await asyncio.to_thread(Engine, args)
    await warm_up(engine)
    server = Server(engine, args)
    # handler_cancellation: a client that goes away cancels its request in the engine, queued or
    # not, as SGLang aborts a disconnected request; without it, requests a phase's drain gave up on
    # kept the engine busy into the next phase (run 17: its prefill outlived the 60 s wait, the flush
    # was refused, and the next router started on that engine's backlog and leftover cache).
    runner = web.AppRunner(server.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    kv_task = asyncio.create_task(server.publish_kv_events()) if args.kv_events_config else None
    print(f"READY http://{args.host}:{args.port} params={engine.params / 1e9:.2f}B", flush=True)
    try:
        await server.sample()  # forever: the timeline of /bench/trace
    finally:
        if kv_task is not None:
            kv_task.cancel()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--max-batch-tokens", type=int, default=8192)
    p.add_argument("--max-running-requests", type=int, default=64)
    p.add_argument("--mem-fraction", type=float, default=0.35)
    p.add_argument("--cuda-graph", action="store_true",
                   help="capture CUDA graphs (the engine's lever against host-side stalls)")
    p.add_argument("--tokenizer", default=None, help="Hugging Face tokenizer.json (file or directory)")
    p.add_argument("--kv-tokens", type=int, default=0,
                   help="KV pool in tokens (0: the engine sizes it from --mem-fraction)")
    p.add_argument("--kv-tokens-hint", type=int, default=400_000,
                   help="KV capacity reported to the proxy when --kv-tokens is 0")
    p.add_argument("--kv-events-config", default="",
                   help='SGLang\'s: {"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": ...}; '
                        "the cached prompt blocks of the engine's table as BlockStored / BlockRemoved (kv_tracker.py)")
    p.add_argument("--dp-rank", type=int, default=0,
                   help="the data-parallel rank this engine serves behind dp_front.py (its KV event batches name it)")
    p.add_argument("--minimal-reports", action="store_true",
                   help="no cached_tokens, /v1/loads or /metrics (no --enable-cache-report / --enable-metrics)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
