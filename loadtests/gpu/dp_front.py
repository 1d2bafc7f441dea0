"""One worker URL over several engines, as SGLang serves ``--dp-size N``: the engines are its
data-parallel ranks (a benchmark part, for ``routing.dp_ranks`` and smg's ``--dp-aware`` on real
engines; the GPU fleet's engine shim serves one rank each).

What a router sees is what SGLang's DP controller shows it (sglang-protocol.md): ``/get_server_info``
with ``dp_size`` and one ``internal_states`` entry per rank (each rank's own pool as
``memory_usage.token_capacity``), ``/v1/loads`` with one entry per ``dp_rank``, ``/metrics`` with a
``dp_rank`` label on every series, and each rank's KV events where the engine was told to publish
(``run_fleet.sh`` gives rank r of a front the port of rank 0 + r, SGLang's own offset). A generation
that names a rank (``data_parallel_rank`` or ``routed_dp_rank``, an int in range) goes there; any
other goes round robin (SGLang's default ``--load-balance-method``). The answer is streamed back
as the rank sends it.

    python3 loadtests/gpu/dp_front.py --port 32001 --ranks http://127.0.0.1:31001 http://127.0.0.1:31002

``GET /bench/front``: how many generations each rank took, and how many of those had named it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import re
from typing import Any

import aiohttp
from aiohttp import web

RANK_FIELDS = ("data_parallel_rank", "routed_dp_rank")
GENERATE_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
MAX_BODY = 16 * 1024 * 1024
MAX_ANSWER = 4 * 1024 * 1024  # a non-streamed status / info document from a rank
_SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?(\s.*)$")


def named_rank(body: Any, ranks: int) -> int | None:
    """The rank a generation names, where it names one in range (a bool is no rank)."""
    if not isinstance(body, dict):
        return None
    for field in RANK_FIELDS:
        v = body.get(field)
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < ranks:
            return v
    return None


def label_rank(text: str, rank: int) -> list[str]:
    """A rank's Prometheus text, each series with ``dp_rank`` added (comments dropped: the front's
    answer repeats each metric once per rank, as SGLang's ranks each export their own)."""
    out = []
    for line in text.splitlines():
        m = _SERIES.match(line)
        if m is None or line.startswith("#"):
            continue
        name, labels, rest = m.group(1), m.group(3), m.group(4)
        inner = f'dp_rank="{rank}"' + (f",{labels}" if labels else "")
        out.append(f"{name}{{{inner}}}{rest}")
    return out


def server_info(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank 0's document, as the DP controller's: ``dp_size`` and one internal state per rank."""
    states = []
    for doc in docs:
        own = (doc.get("internal_states") or [{}])[0]
        sched = doc.get("scheduler_info") or {}
        pool = doc.get("max_total_num_tokens") or sched.get("max_total_num_tokens") or doc.get("max_total_tokens")
        states.append({**own, **({"memory_usage": {"token_capacity": pool}} if pool else {})})
    return {**docs[0], "dp_size": len(docs), "internal_states": states}


def loads(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Every rank's load snapshot under its own ``dp_rank``, and their sum."""
    snaps = [{**(doc.get("loads") or [{}])[0], "dp_rank": r} for r, doc in enumerate(docs)]
    return {**docs[0], "loads": snaps, "aggregate": {
        "total_running_reqs": sum(int(s.get("num_running_reqs") or 0) for s in snaps),
        "total_waiting_reqs": sum(int(s.get("num_waiting_reqs") or 0) for s in snaps)}}


class Front:
    def __init__(self, ranks: list[str]) -> None:
        self.ranks = ranks
        self._turn = itertools.cycle(range(len(ranks)))
        self.took = [0] * len(ranks)
        self.named = [0] * len(ranks)
        self.session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        r = app.router
        for path in GENERATE_PATHS:
            r.add_post(path, self.generate)
        for path in ("/health", "/health_generate"):
            r.add_get(path, self.health)
        for path in ("/get_server_info", "/server_info"):
            r.add_get(path, self.info)
        for path in ("/get_model_info", "/model_info", "/v1/models"):
            r.add_get(path, self.first)
        r.add_get("/v1/loads", self.loads)
        r.add_get("/metrics", self.metrics)
        r.add_post("/flush_cache", self.to_all)
        r.add_post("/abort_request", self.to_all)
        r.add_get("/bench/front", self.counts)
        return app

    async def _open(self, _: web.Application) -> None:
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=300),
            connector=aiohttp.TCPConnector(limit=0))

    async def _close(self, _: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    @property
    def s(self) -> aiohttp.ClientSession:
        assert self.session is not None
        return self.session

    async def generate(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            return web.json_response({"error": "body is not JSON"}, status=400)
        rank = named_rank(body, len(self.ranks))
        if rank is None:
            rank = next(self._turn)
        else:
            self.named[rank] += 1
        self.took[rank] += 1
        if isinstance(body, dict) and any(k in body for k in RANK_FIELDS):
            # the controller's field, not the rank's: each engine serves one rank and may refuse it
            raw = json.dumps({k: v for k, v in body.items() if k not in RANK_FIELDS}).encode()
        try:
            async with self.s.post(self.ranks[rank] + request.path, data=raw,
                                   headers={"Content-Type": "application/json"}) as up:
                resp = web.StreamResponse(status=up.status, headers={
                    "Content-Type": up.headers.get("Content-Type", "application/json")})
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        except (aiohttp.ClientError, TimeoutError) as e:
            return web.json_response({"error": f"rank {rank}: {e!r}"}, status=502)

    async def _get_all(self, path: str) -> tuple[int, list[Any]]:
        """Every rank's answer to GET ``path``: (the first status other than 200, or 200; the docs)."""
        async def one(url: str) -> tuple[int, Any]:
            async with self.s.get(url + path, timeout=aiohttp.ClientTimeout(total=10)) as resp:
                data = await resp.content.read(MAX_ANSWER)
                if resp.status != 200:
                    return resp.status, None
                return 200, data
        answers = await asyncio.gather(*(one(u) for u in self.ranks), return_exceptions=True)
        docs = []
        for a in answers:
            if isinstance(a, BaseException):
                return 502, []
            if a[0] != 200:
                return a[0], []
            docs.append(a[1])
        return 200, docs

    async def health(self, request: web.Request) -> web.Response:
        status, _ = await self._get_all(request.path)
        return web.Response(status=200 if status == 200 else 503)

    async def info(self, request: web.Request) -> web.Response:
        status, docs = await self._get_all(request.path)
        if status != 200:
            return web.Response(status=status)
        return web.json_response(server_info([json.loads(d) for d in docs]))

    async def first(self, request: web.Request) -> web.Response:
        async with self.s.get(self.ranks[0] + request.path, timeout=aiohttp.ClientTimeout(total=10)) as up:
            return web.Response(status=up.status, body=await up.content.read(MAX_ANSWER),
                                content_type=up.content_type)

    async def loads(self, request: web.Request) -> web.Response:
        status, docs = await self._get_all(request.path)
        if status != 200:
            return web.Response(status=status, text=f"{status}")
        return web.json_response(loads([json.loads(d) for d in docs]))

    async def metrics(self, request: web.Request) -> web.Response:
        status, docs = await self._get_all(request.path)
        if status != 200:
            return web.Response(status=status, text=f"{status}")
        lines = [line for r, d in enumerate(docs) for line in label_rank(d.decode(), r)]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def to_all(self, request: web.Request) -> web.Response:
        raw = await request.read()
        statuses = []
        for url in self.ranks:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with self.s.post(url + request.path, data=raw, timeout=aiohttp.ClientTimeout(total=60),
                                       headers={"Content-Type": "application/json"}) as up:
                    await up.read()
                    statuses.append(up.status)
                    continue
            statuses.append(502)
        bad = [s for s in statuses if s != 200]
        return web.Response(status=bad[0] if bad else 200)

    async def counts(self, _: web.Request) -> web.Response:
        return web.json_response({"ranks": self.ranks, "took": self.took, "named": self.named})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ranks", nargs="+", required=True, help="the engines, rank 0 first")
    args = p.parse_args()
    print(f"READY http://{args.host}:{args.port} ranks={len(args.ranks)}", flush=True)
    web.run_app(Front(args.ranks).app(), host=args.host, port=args.port, access_log=None, print=None,
                handler_cancellation=True)


if __name__ == "__main__":
    main()
