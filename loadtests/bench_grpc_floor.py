"""The gRPC transport floor: grpc and aiohttp alone, no proxy, the server in a child process.

    .venv/bin/python -m loadtests.bench_grpc_floor [--messages 1 17] [--calls 600]
        [--server-option grpc.http2.bdp_probe=0 ...] [--only grpc/aio ...]

A grpc.aio server writing N small messages per call (what radixgate's gRPC front does per run of
tokens), grpc's sync server (handlers on a thread pool, no event loop), and an aiohttp SSE handler
writing N events (what its HTTP front does), at concurrency 1 and 32. Clients, in this process:
grpc.aio, grpc's sync stack with ``SingleThreadedUnaryStream`` (a thread per concurrent call; the
option is ignored by grpc.aio), aiohttp. Per call: wall; the server's CPU (psutil on the child) and
context switches (all its threads): what a fast C++/Go/Rust client would still pay; this client's
CPU. ``loadtests/bench_overhead_grpc.py`` runs it last. Every loop is bounded by a call count.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator

import aiohttp
import grpc
import grpc.experimental
import psutil

from proxy._proto.radixgate.v1 import generate_pb2 as pb
from proxy._proto.radixgate.v1 import generate_pb2_grpc as pb_grpc

SINGLE_THREADED = [(grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)]
CASES = (("http", "aiohttp"), ("grpc", "aio"), ("grpc", "sync-st"), ("grpc-sync", "aio"))


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def context_switches(proc: psutil.Process) -> int:
    """Voluntary + involuntary context switches of all the process's threads (psutil counts only the
    main thread's on Linux, and grpc's work runs on threads of its own)."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{proc.pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{proc.pid}/task/{task}/status") as f:
                total += sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)
    except OSError:
        return sum(proc.num_ctx_switches())
    return total



async def floor_server(kind: str, messages: int, options: list[tuple[str, int | str]]) -> None:
    """Child: a grpc.aio, grpc sync or aiohttp server writing ``messages`` messages per call; prints its
    port, serves until stdin closes."""
    from aiohttp import web

    class Writer(pb_grpc.GenerationServicer):
        async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> None:  # type: ignore[type-arg]
            for _ in range(messages):
                await context.write(pb.GenerateResponse(text="tok ", token_count=1))

    async def sse(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(messages):
            await resp.write(b'data: {"text":"tok "}\n\n')
        await resp.write_eof()
        return resp

    class SyncWriter(pb_grpc.GenerationServicer):
        def Generate(self, request: pb.GenerateRequest, context: grpc.ServicerContext) -> Iterator[pb.GenerateResponse]:
            for _ in range(messages):
                yield pb.GenerateResponse(text="tok ", token_count=1)

    stop: list[Callable[[], Awaitable[None]]] = []
    if kind == "grpc-sync":  # grpc's sync server: handlers on a thread pool, no event loop involved
        sync_server = grpc.server(concurrent.futures.ThreadPoolExecutor(64))
        pb_grpc.add_GenerationServicer_to_server(SyncWriter(), sync_server)  # type: ignore[no-untyped-call]
        port = sync_server.add_insecure_port("127.0.0.1:0")
        sync_server.start()

        async def stop_sync() -> None:
            sync_server.stop(0)

        stop.append(stop_sync)
    elif kind == "grpc":
        server = grpc.aio.server(options=options)
        pb_grpc.add_GenerationServicer_to_server(Writer(), server)  # type: ignore[no-untyped-call]
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        stop.append(lambda: server.stop(0))
    else:
        app = web.Application()
        app.router.add_post("/g", sse)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = runner.addresses[0][1]
        stop.append(runner.cleanup)
    print(port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await stop[0]()


async def floor_case(server: str, client: str, messages: int, concurrency: int, calls: int,
                     options: tuple[str, ...] = ()) -> dict[str, float]:
    """One floor row: ``server`` (grpc | grpc-sync | http) in a child process, ``client`` (aio | sync-st |
    aiohttp) here."""
    child = subprocess.Popen([sys.executable, "-m", "loadtests.bench_grpc_floor", "--serve", server,  # noqa: ASYNC220
                              "--messages", str(messages), *(f"--server-option={o}" for o in options)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdin is not None
    try:
        port = int(child.stdout.readline())
        server_proc = psutil.Process(child.pid)
        async with contextlib.AsyncExitStack() as stack:
            if client == "aiohttp":
                session = await stack.enter_async_context(aiohttp.ClientSession())

                async def once() -> None:
                    async with session.post(f"http://127.0.0.1:{port}/g", data=b"{}") as r:
                        async for _ in r.content.iter_any():
                            pass
            elif client == "aio":
                # The generated stubs carry no annotations (grpcio-tools writes no .pyi for services).
                stub = pb_grpc.GenerationStub(  # type: ignore[no-untyped-call]
                    await stack.enter_async_context(grpc.aio.insecure_channel(f"127.0.0.1:{port}")))

                async def once() -> None:
                    async for _ in stub.Generate(pb.GenerateRequest(text="x")):
                        pass
            else:
                channel = stack.enter_context(grpc.insecure_channel(f"127.0.0.1:{port}", options=SINGLE_THREADED))
                sync_stub = pb_grpc.GenerationStub(channel)  # type: ignore[no-untyped-call]  # generated, unannotated
                pool = stack.enter_context(concurrent.futures.ThreadPoolExecutor(concurrency))

                def blocking() -> None:
                    for _ in sync_stub.Generate(pb.GenerateRequest(text="x")):
                        pass

                async def once() -> None:
                    await asyncio.get_running_loop().run_in_executor(pool, blocking)
            for _ in range(20):
                await once()
            left = calls

            async def loop() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    await once()

            c0, s0, x0 = time.process_time(), cpu_seconds(server_proc), context_switches(server_proc)
            t0 = time.perf_counter()
            await asyncio.gather(*(loop() for _ in range(concurrency)))
            wall = time.perf_counter() - t0
            return {"wall_ms": wall / calls * 1e3,
                    "server_cpu_ms": (cpu_seconds(server_proc) - s0) / calls * 1e3,
                    "server_ctx_switches": (context_switches(server_proc) - x0) / calls,
                    "client_cpu_ms": (time.process_time() - c0) / calls * 1e3}
    finally:
        child.stdin.close()
        child.wait(30)


async def transport_floor(message_counts: tuple[int, ...], calls: int = 600, options: tuple[str, ...] = (),
                          cases: tuple[tuple[str, str], ...] = CASES) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    print("transport floor, no proxy; per call: wall, server CPU (child process), server context switches, "
          "client CPU (ms)")
    for messages in message_counts:
        for concurrency in (1, 32):
            for server, client in cases:
                row = await floor_case(server, client, messages, concurrency, calls, options)
                out[f"{server}/{client}/m{messages}/c{concurrency}"] = row
                print(f"  {server:>9} server, {client:>7} client, {messages:>2} msgs, c={concurrency:<2}: "
                      + "  ".join(f"{k} {v:6.3f}" for k, v in row.items()))
            grpc_row = out.get(f"grpc/aio/m{messages}/c{concurrency}")
            http_row = out.get(f"http/aiohttp/m{messages}/c{concurrency}")
            if grpc_row and http_row:
                print(f"  -> server-side gRPC - HTTP: {grpc_row['server_cpu_ms'] - http_row['server_cpu_ms']:.3f} ms "
                      f"CPU per call ({messages} msgs, c={concurrency})")
    return out


def _option(text: str) -> tuple[str, int | str]:
    key, _, value = text.partition("=")
    return key, int(value) if value.lstrip("-").isdigit() else value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, nargs="+", default=[1, 17], help="messages per call")
    parser.add_argument("--calls", type=int, default=600, help="calls per row")
    parser.add_argument("--json", help="also write the rows as JSON to this file")
    parser.add_argument("--server-option", action="append", default=[], metavar="KEY=VALUE",
                        help="a grpc.aio server option, e.g. grpc.http2.bdp_probe=0 (repeatable)")
    parser.add_argument("--only", choices=[f"{s}/{c}" for s, c in CASES], action="append",
                        help="run only these server/client rows (repeatable)")
    parser.add_argument("--serve", choices=("grpc", "grpc-sync", "http"), help=argparse.SUPPRESS)  # the child
    args = parser.parse_args(argv)
    import uvloop

    if args.serve:
        uvloop.run(floor_server(args.serve, args.messages[0], [_option(o) for o in args.server_option]))
        return 0
    cases = tuple(c for c in CASES if not args.only or f"{c[0]}/{c[1]}" in args.only)
    rows = uvloop.run(transport_floor(tuple(args.messages), args.calls, tuple(args.server_option), cases))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
