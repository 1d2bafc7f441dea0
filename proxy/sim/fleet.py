"""Fleet: start N simulated workers on loopback ports and stop them cleanly.

    async with Fleet.in_process([SimConfig(time_scale=50.0), SimConfig()]) as fleet:
        fleet.urls                       # "http://127.0.0.1:PORT", each answering HTTP
        w = fleet.workers[0]             # .url .config .engine; await w.stop(); await w.start()
        w.set_faults(fail_health=True)   # live, for in-process workers
    async with Fleet.subprocesses([SimConfig()] * 4) as fleet:
        await fleet.workers[1].kill(); await fleet.workers[1].start()

``in_process`` runs every worker on the caller's event loop; ``subprocesses`` runs one
``python -m proxy.sim`` per worker and reads its ``READY http://...`` line. A restart
reuses the port and starts with an empty cache. Readiness is polled (GET /get_model_info answers
200 even during a simulated slow start, so slow-start tests still see the 503 health phase).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import sys
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Protocol

import aiohttp

from proxy.sim.config import SimConfig, base_url, fault_updates
from proxy.sim.engine import Engine
from proxy.sim.server import SimWorker

READY_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.02


async def wait_ready(url: str, limit_s: float = READY_TIMEOUT_S) -> None:
    """Poll until the worker answers HTTP."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
        while True:
            try:
                async with session.get(f"{url}/get_model_info") as resp:
                    if resp.status == 200:
                        return
            except (TimeoutError, aiohttp.ClientError):
                pass
            if loop.time() > deadline:
                raise TimeoutError(f"simulated worker at {url} not ready after {limit_s} s")
            await asyncio.sleep(POLL_INTERVAL_S)


class WorkerHandle(Protocol):
    config: SimConfig

    @property
    def url(self) -> str: ...
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def kill(self) -> None: ...
    def set_faults(self, **knobs: Any) -> None: ...


class InProcessWorker:
    def __init__(self, config: SimConfig) -> None:
        self.config = dataclasses.replace(config)
        self.worker: SimWorker | None = None
        self._port = config.port

    @property
    def url(self) -> str:
        return base_url(self.config.host, self._port)

    @property
    def engine(self) -> Engine:
        if self.worker is None:
            raise RuntimeError("the worker is stopped")
        return self.worker.engine

    @property
    def running(self) -> bool:
        return self.worker is not None and not self.worker.dead

    async def start(self) -> None:
        if self.running:
            return
        if self.worker is not None:  # died from a fault: finish its shutdown first
            await self.worker.stop()
        self.worker = SimWorker(dataclasses.replace(self.config, port=self._port))
        await self.worker.start()
        self._port = self.worker.port
        await wait_ready(self.url)

    async def stop(self) -> None:
        worker, self.worker = self.worker, None
        if worker is not None:
            await worker.stop()

    async def kill(self) -> None:
        await self.stop()

    def set_faults(self, **knobs: Any) -> None:
        updates = fault_updates(**knobs)
        self.config = dataclasses.replace(self.config, **updates)
        if self.worker is not None:
            self.worker.set_faults(**updates)


def cli_args(config: SimConfig) -> list[str]:
    """SimConfig -> the worker's command line (flags spelled as SGLang's)."""
    args: list[str] = []
    defaults = SimConfig()
    for field in dataclasses.fields(SimConfig):
        value = getattr(config, field.name)
        if value == getattr(defaults, field.name) and field.name != "port":
            continue
        flag = "--" + field.name.replace("_", "-")
        if isinstance(value, bool):
            if value:
                args.append(flag)
        elif isinstance(value, tuple):  # a repeatable flag
            for item in value:
                args += [flag, str(item)]
        elif value is not None:
            args += [flag, str(value)]
    return args


class SubprocessWorker:
    def __init__(self, config: SimConfig) -> None:
        self.config = dataclasses.replace(config)
        self._port = config.port
        self.process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return base_url(self.config.host, self._port)

    async def start(self) -> None:
        if self.process is not None and self.process.returncode is None:
            return
        cmd = [sys.executable, "-m", "proxy.sim", *cli_args(dataclasses.replace(self.config, port=self._port))]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.process = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env)
        assert self.process.stdout is not None
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), READY_TIMEOUT_S)
        except TimeoutError:
            await self.kill()
            raise
        text = line.decode().strip()
        if not text.startswith("READY "):
            await self.kill()
            raise RuntimeError(f"simulated worker failed to start: {text!r}")
        self._port = int(text.rsplit(":", 1)[1])
        await wait_ready(self.url)

    async def stop(self) -> None:
        await self._end(kill=False)

    async def kill(self) -> None:
        await self._end(kill=True)

    async def _end(self, kill: bool) -> None:
        proc, self.process = self.process, None
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill() if kill else proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10.0)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if proc.stdout is not None:
            with contextlib.suppress(Exception):
                await proc.stdout.read()

    def set_faults(self, **knobs: Any) -> None:
        """Faults of a subprocess worker take effect at its next start."""
        self.config = dataclasses.replace(self.config, **fault_updates(**knobs))


class Fleet:
    def __init__(self, workers: Sequence[InProcessWorker | SubprocessWorker]) -> None:
        self.workers = list(workers)

    @classmethod
    def in_process(cls, configs: Sequence[SimConfig]) -> Fleet:
        return cls([InProcessWorker(c) for c in configs])

    @classmethod
    def subprocesses(cls, configs: Sequence[SimConfig]) -> Fleet:
        return cls([SubprocessWorker(c) for c in configs])

    @property
    def urls(self) -> list[str]:
        return [w.url for w in self.workers]

    async def start(self) -> None:
        try:
            await asyncio.gather(*(w.start() for w in self.workers))
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        await asyncio.gather(*(w.stop() for w in self.workers), return_exceptions=True)

    async def __aenter__(self) -> Fleet:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()
