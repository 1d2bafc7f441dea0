"""Secrets re-read while serving: the API keys file and the TLS certificate and key.

Keys and certificates are rotated without a restart: a Kubernetes Secret mounted as files is
updated in place (a symlink swap), cert-manager renews a certificate, an operator edits the keys
file. ``Rotation`` checks the files every ``security.reload_interval_s`` (their inode, size and
modification time, following links) and re-reads what changed; ``radixgate serve`` also re-reads
all of them on SIGHUP. A file that no longer loads (unreadable, an empty keys file, a certificate
without its key) keeps what was loaded before, is logged, and counted as ``failed`` in
``radixgate_secret_reloads_total``: a bad rotation never leaves the ports open or without TLS.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from proxy.clock import Clock
from proxy.telemetry.metrics import Metrics

log = logging.getLogger(__name__)

Stamp = tuple[int, int, int] | None  # (inode, size, mtime ns) of the file a path leads to; None = missing


def stamp(path: str) -> Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


@dataclass
class Watched:
    name: str  # the metric's label: api_keys, tls
    paths: Sequence[str]
    reload: Callable[[], None]  # raises when the files do not load; then nothing changed
    stamps: list[Stamp] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.stamps = [stamp(p) for p in self.paths]


class Rotation:
    def __init__(self, items: Sequence[Watched], *, interval_s: float, clock: Clock, metrics: Metrics) -> None:
        self.items = [i for i in items if i.paths]
        self.interval_s = interval_s
        self._clock = clock
        self._metrics = metrics

    def check(self) -> None:
        """Re-read each item whose files changed since they were last read."""
        for item in self.items:
            now = [stamp(p) for p in item.paths]
            if now != item.stamps:
                item.stamps = now
                self._reload(item)

    def reload_all(self) -> None:
        """Re-read every item (SIGHUP)."""
        for item in self.items:
            item.stamps = [stamp(p) for p in item.paths]
            self._reload(item)

    def _reload(self, item: Watched) -> None:
        try:
            item.reload()
        except Exception as e:  # whatever a bad file raises, the old secret stays
            log.error("%s: reload failed, still serving the previous one: %s", item.name, e)
            self._metrics.inc(self._metrics.secret_reloads, item.name, "failed")
            return
        log.info("%s: reloaded", item.name)
        self._metrics.inc(self._metrics.secret_reloads, item.name, "ok")

    async def run(self) -> None:
        if not self.items or self.interval_s <= 0:
            return
        while True:
            await self._clock.sleep(self.interval_s)
            self.check()
