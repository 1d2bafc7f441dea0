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

Prompts are tokenized with the simulated worker's deterministic tokenizer, so the proxy's
character-based prefix estimate lines up exactly as it does against the simulator.

    python loadtests/gpu/engine_server.py --port 31001 [--block-size 32] [--max-running-requests 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import threading
import time
import uuid
from typing import Any

from aiohttp import web

from loadtests.simworker import tokenizer as tok

SERVED_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


class Engine:
    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
        from transformers.generation import ContinuousBatchingConfig, GenerationConfig
        from transformers.generation.continuous_batching import cache as cb_cache

        self.args = args
        self.matched_tokens: dict[str, int] = {}
        original = cb_cache.PagedAttentionCache.search_prefix_match
        engine = self

        def recording_match(cache: Any, request_id: str, prompt_ids: list[int]) -> int:
            matched = int(original(cache, request_id, prompt_ids))
            # Releases differ: some return matched blocks, 5.17 returns matched tokens. A block count
            # times the block size can never exceed the prompt, so a larger product means tokens.
            tokens = matched * cache.block_size
            engine.matched_tokens[request_id] = matched if tokens > len(prompt_ids) else tokens
            return matched

        cb_cache.PagedAttentionCache.search_prefix_match = recording_match  # type: ignore[method-assign]

        config = LlamaConfig(
            hidden_size=4096, intermediate_size=14336, num_hidden_layers=args.layers,
            num_attention_heads=32, num_key_value_heads=8, vocab_size=tok.VOCAB_SIZE + 256,
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
        threading.Thread(target=self._dispatch, daemon=True).start()

    def _dispatch(self) -> None:
        while not self._stop:
            try:
                out = self.manager.get_result(timeout=0.05)
            except queue.Empty:
                continue
            if out is None:
                continue
            with self.lock:
                target = self.queues.get(out.request_id)
            if target is not None:
                loop, q = target
                loop.call_soon_threadsafe(q.put_nowait, out)

    def submit(self, rid: str, ids: list[int], max_new_tokens: int) -> asyncio.Queue[Any]:
        q: asyncio.Queue[Any] = asyncio.Queue()
        with self.lock:
            self.queues[rid] = (asyncio.get_running_loop(), q)
            self.waiting[rid] = len(ids)
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
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.requests = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_post("/generate", self.generate)
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)
        r.add_get("/get_server_info", self.server_info)
        r.add_get("/get_model_info", self.model_info)
        r.add_get("/v1/models", self.models)
        r.add_get("/v1/loads", self.loads)
        r.add_get("/metrics", self.metrics)
        r.add_post("/abort_request", self.abort)
        return app

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(text="")

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
            "scheduler_info": {"status": "ok", "max_total_num_tokens": a.kv_tokens_hint},
            "internal_states": [{"effective_max_running_requests_per_dp": a.max_running_requests}],
            "version": "transformers-cb-shim",
        })

    def _load_snapshot(self) -> dict[str, Any]:
        load = self.engine.load()
        hit = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        return {"dp_rank": 0, **load, "max_running_requests": self.args.max_running_requests,
                "max_total_num_tokens": self.args.kv_tokens_hint, "cache_hit_rate": hit}

    async def loads(self, _: web.Request) -> web.Response:
        snap = self._load_snapshot()
        return web.json_response({"timestamp": time.time(), "version": "shim", "loads": [snap],
                                  "aggregate": {"total_running_reqs": snap["num_running_reqs"],
                                                "total_waiting_reqs": snap["num_waiting_reqs"]}})

    async def metrics(self, _: web.Request) -> web.Response:
        s = self._load_snapshot()
        lbl = f'{{model_name="{SERVED_MODEL}",engine_type="unified"}}'
        lines = [
            f"sglang:num_running_reqs{lbl} {s['num_running_reqs']}",
            f"sglang:num_queue_reqs{lbl} {s['num_waiting_reqs']}",
            f"sglang:cache_hit_rate{lbl} {s['cache_hit_rate']}",
            f"sglang:max_total_num_tokens{lbl} {self.args.kv_tokens_hint}",
            f"sglang:page_size{lbl} {self.args.block_size}",
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def abort(self, request: web.Request) -> web.Response:
        body = await request.json()
        rid = body.get("rid")
        if rid:
            self.engine.manager.cancel_request(request_id=rid)
        return web.Response(text="")

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        rid = str(body.get("rid") or uuid.uuid4().hex)
        ids = body.get("input_ids") or tok.encode(str(body.get("text", "")))
        sp = body.get("sampling_params") or {}
        max_new = int(sp.get("max_new_tokens", 128))
        received = time.perf_counter()
        q = self.engine.submit(rid, ids, max_new)
        stream = bool(body.get("stream"))
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
                generated.extend(new)
                finished = out.is_finished()
                if stream and resp is not None and (new or finished):
                    chunk = self._payload(rid, ids, generated, seed, out, received, first_token_at, finished)
                    await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                if finished:
                    break
        except (ConnectionResetError, asyncio.CancelledError):
            self.engine.manager.cancel_request(request_id=rid)
            raise
        finally:
            self.engine.finish(rid)
        cached = self.engine.matched_tokens.pop(rid, 0)
        self.prompt_tokens += len(ids)
        self.cached_tokens += cached
        self.requests += 1
        if stream and resp is not None:
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        return web.json_response(self._payload(rid, ids, generated, seed, out, received, first_token_at, True))

    def _payload(self, rid: str, ids: list[int], generated: list[int], seed: int, out: Any,
                 received: float, first_token_at: float | None, finished: bool) -> dict[str, Any]:
        text = " ".join(tok.output_word(seed, k) for k in range(len(generated)))
        meta: dict[str, Any] = {
            "id": rid, "finish_reason": {"type": "length", "length": len(generated)} if finished else None,
            "prompt_tokens": len(ids), "completion_tokens": len(generated),
            "cached_tokens": self.engine.matched_tokens.get(rid, 0), "reasoning_tokens": 0,
            "weight_version": "random", "num_retractions": 0,
        }
        if out is not None and out.lifespan[0] > 0:
            meta["queue_time"] = max(0.0, out.lifespan[0] - out.created_time)
        if finished:
            meta["e2e_latency"] = time.perf_counter() - received
            if first_token_at is not None:
                meta["first_token_latency"] = first_token_at - received
        return {"text": text, "output_ids": generated, "meta_info": meta}


async def warm_up(engine: Engine) -> None:
    q = engine.submit("warmup", tok.encode("warm up the kernels " * 64), 4)
    while not (await q.get()).is_finished():
        pass
    engine.finish("warmup")


async def main_async(args: argparse.Namespace) -> None:
    engine = await asyncio.to_thread(Engine, args)
    await warm_up(engine)
    runner = web.AppRunner(Server(engine, args).app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    print(f"READY http://{args.host}:{args.port} params={engine.params / 1e9:.2f}B", flush=True)
    await asyncio.Event().wait()


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
    p.add_argument("--kv-tokens-hint", type=int, default=400_000,
                   help="KV capacity reported to the proxy (the engine sizes its pool from memory)")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
