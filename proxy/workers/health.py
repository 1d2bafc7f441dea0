"""Worker health: active probes with thresholds, passive ejection on failed requests, re-admission.

Rule, per worker (``HealthTracker``, pure, time from the caller):
* Active: ``fail_threshold`` failed probes in a row (non-200, timeout, connect error) mark the worker
  down; ``recover_threshold`` passing probes in a row mark it up again. A worker starts up (the
  app runs one probe round before serving).
* Passive: ``eject_after_failures`` failed requests in a row (connect error or 5xx other than 503 —
  a 503 "queue full" is back-pressure, not sickness) eject the worker; any success resets the count.
  An ejected worker stays out at least ``eject_cooldown_s``; then the next passing probe re-admits it
  (with probes off, the end of the cooldown does). The registry caps passive ejection at
  ``max_ejected_fraction`` of the workers (at least one), so requests that fail everywhere — a
  poison input — cannot empty the fleet; active probes are not capped.
* A worker takes requests when it is up and not ejected.

``HealthChecker`` is the loop: every ``interval_s`` it probes every worker concurrently (0 = off);
``probe_soon(url)`` probes one worker at once (a worker that just joined takes no request before a
probe passed — see ``registry.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from enum import StrEnum

from proxy.config import HealthConfig

log = logging.getLogger("radixgate.health")


class Change(StrEnum):
    DOWN = "down"
    UP = "up"
    EJECTED = "ejected"
    READMITTED = "readmitted"


class HealthTracker:
    """The health state machine of one worker."""

    __slots__ = ("_cfg", "_ejected_at", "_fail_run", "_ok_run", "_request_fail_run", "probes_on", "up")

    def __init__(self, cfg: HealthConfig) -> None:
        self._cfg = cfg
        self.probes_on = cfg.interval_s > 0
        self.up = True
        self._fail_run = 0
        self._ok_run = 0
        self._request_fail_run = 0
        self._ejected_at: float | None = None

    @property
    def ejected(self) -> bool:
        return self._ejected_at is not None

    def available(self, now: float) -> bool:
        if self._ejected_at is not None and not self.probes_on \
                and now - self._ejected_at >= self._cfg.eject_cooldown_s:
            self._ejected_at = None  # probes off: the cooldown alone re-admits
            self._request_fail_run = 0
        return self.up and self._ejected_at is None

    def on_probe(self, ok: bool, now: float) -> Change | None:
        if ok:
            self._fail_run = 0
            self._ok_run += 1
            if self._ejected_at is not None and now - self._ejected_at >= self._cfg.eject_cooldown_s:
                self._ejected_at = None
                self._request_fail_run = 0
                if self.up:
                    return Change.READMITTED
            if not self.up and self._ok_run >= self._cfg.recover_threshold:
                self.up = True
                return Change.UP
            return None
        self._ok_run = 0
        self._fail_run += 1
        if self.up and self._fail_run >= self._cfg.fail_threshold:
            self.up = False
            return Change.DOWN
        return None

    def on_request(self, ok: bool, now: float, *, may_eject: bool = True) -> Change | None:
        """A request to the worker finished: ``ok`` False for connect errors and non-503 5xx.
        ``may_eject`` False: count the failure but stay in (the fleet's ejection cap is reached)."""
        if ok:
            self._request_fail_run = 0
            return None
        self._request_fail_run += 1
        if may_eject and self._ejected_at is None and self._request_fail_run >= self._cfg.eject_after_failures:
            self._ejected_at = now
            return Change.EJECTED
        return None


class HealthChecker:
    """Probes ``{url}{endpoint}`` for every worker; reports each result to ``report(url, ok)``."""

    def __init__(self, cfg: HealthConfig, *, probe: Callable[[str, str, float], Awaitable[int]],
                 report: Callable[[str, bool], None], urls: Callable[[], list[str]]) -> None:
        self.cfg = cfg
        self._probe = probe
        self._report = report
        self._urls = urls
        self._soon: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        if self.cfg.interval_s <= 0:
            return
        try:
            while True:
                await asyncio.sleep(self.cfg.interval_s)
                await self.probe_all()
        finally:
            for task in self._soon:
                task.cancel()

    def probe_soon(self, url: str) -> None:
        """Probe ``url`` now, not at the next round (no-op with probes off)."""
        if self.cfg.interval_s <= 0:
            return
        task = asyncio.get_running_loop().create_task(self._check(url))
        self._soon.add(task)
        task.add_done_callback(self._soon.discard)

    async def probe_all(self) -> None:
        await asyncio.gather(*(self._check(url) for url in self._urls()))

    async def _check(self, url: str) -> None:
        try:
            status = await self._probe(url, self.cfg.endpoint, self.cfg.timeout_s)
            ok = status == 200
        except (OSError, TimeoutError) as e:
            log.debug("probe %s failed: %s", url, e)
            ok = False
        self._report(url, ok)
