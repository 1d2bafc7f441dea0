"""Which workers the proxy routes to: the configured source's set, changed at runtime (pure).

An operator adds and removes workers through the admin port (``proxy/frontends/workers_api.py``:
``POST /workers``, ``DELETE /workers/{url}``, and sglang-router's ``/add_worker`` /
``/remove_worker``); the configured source (``workers.static``, DNS or Kubernetes discovery) keeps
announcing its own set. The members are ``(source ∪ added) − removed``:

* an added URL stays until it is removed (whatever the source says);
* a removed URL the source lists stays out while the source keeps listing it; once the source
  drops it, the removal is forgotten, so a worker that later appears at that address is new;
* adding a removed URL back undoes the removal.

Nothing persists across a restart: the config (or discovery) is the lasting truth. The set is
bounded: an addition that would make more than ``workers.max_workers`` members is refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from urllib.parse import urlsplit

from proxy.workers.registry import normalise_url

MAX_URL_CHARS = 2048


class Origin(StrEnum):
    SOURCE = "source"  # workers.static or discovery
    API = "api"        # added on the admin port


class MembershipFull(Exception):
    """Adding would pass ``workers.max_workers``."""


def worker_url(raw: object) -> str:
    """A worker base URL as the registry keys it; ``ValueError`` says what is wrong with ``raw``.

    ``http(s)://host[:port][/path]``: no credentials (they would sit in logs and labels), no query
    or fragment (request paths are appended to it).
    """
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError("must be a non-empty string")
    text = raw.strip()
    if len(text) > MAX_URL_CHARS:
        raise ValueError(f"longer than {MAX_URL_CHARS} characters")
    if not text.isascii() or any(c.isspace() or ord(c) < 0x20 or c == "\x7f" for c in text):
        raise ValueError("must be ASCII without spaces or control characters")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"must start with http:// or https://, got {text[:64]!r}")
    if not parts.hostname:
        raise ValueError("has no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry credentials (use security.upstream_api_key_env)")
    if parts.query or parts.fragment or text.endswith(("?", "#")):
        raise ValueError("must not have a query or a fragment")
    try:
        parts.port  # noqa: B018 — raises on a port out of range or not a number
    except ValueError:
        raise ValueError("has an invalid port") from None
    return normalise_url(text)


class Membership:
    """The members, from the source's last set and the runtime changes."""

    def __init__(self, *, max_workers: int) -> None:
        self.max_workers = max_workers
        self._source: frozenset[str] = frozenset()
        self._added: set[str] = set()
        self._removed: set[str] = set()

    def members(self) -> frozenset[str]:
        return (self._source | self._added) - self._removed

    def origin(self, url: str) -> Origin | None:
        if url not in self.members():
            return None
        return Origin.SOURCE if url in self._source else Origin.API

    def removed(self) -> frozenset[str]:
        """URLs the source lists that were removed here."""
        return frozenset(self._removed)

    def from_source(self, urls: Iterable[str]) -> frozenset[str]:
        """The source's new set; returns the members."""
        self._source = frozenset(normalise_url(u) for u in urls)
        self._removed &= self._source  # a removal lasts while the source lists the URL
        return self.members()

    def add(self, url: str) -> bool:
        """Make ``url`` (already ``worker_url``-checked) a member; False if it was one."""
        members = self.members()
        if url in members:
            return False
        if len(members) >= self.max_workers:
            raise MembershipFull(f"workers.max_workers ({self.max_workers}) reached")
        self._removed.discard(url)
        if url not in self._source:
            self._added.add(url)
        return True

    def remove(self, url: str) -> bool:
        """Stop routing to ``url``; False if it was no member."""
        if url not in self.members():
            return False
        self._added.discard(url)
        if url in self._source:
            self._removed.add(url)
        return True
