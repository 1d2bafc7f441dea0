"""Worker discovery from DNS: a headless Service's records, re-resolved every ``interval_s``.

Two modes (``discovery.dns``):

* **A/AAAA** (default): ``name`` resolves through the event loop's ``getaddrinfo`` (so
  ``/etc/hosts``, search domains and the system resolver all apply); every address becomes
  ``scheme://addr:discovery.port`` (IPv6 in brackets).
* **SRV** (``srv: true``): ``name`` is an SRV name such as ``_http._tcp.sglang.llm.svc.cluster.local``;
  each record's target and port give one worker. Addresses come from the answer's additional
  section when the server sent them (CoreDNS does for headless Services), else from
  ``getaddrinfo(target)``. Priority and weight are ignored: every listed target is a worker, and
  load is the router's business. Queries are dnspython's (``dns.asyncquery``: UDP with EDNS0 at
  4 KiB, TCP when the answer is truncated; its message parser, hardened against malformed
  answers) to the configured nameserver, else each nameserver of ``/etc/resolv.conf`` in turn
  while one fails; a relative name is tried with the ``search`` suffixes in resolv.conf's order
  (``options ndots``: a name with at least that many dots is tried as given first).

Failure rule: "no such name" / "no records" is an answer (the Service has no ready pods), so the set
becomes empty; a timeout or server failure is *not* an answer, so the last good set is kept and the
error logged. We resolve by IP rather than handing hostnames to the upstream pool, so a restarted
pod (new IP, cold cache) reads as one worker leaving and another joining.

``watch()`` yields the first answer (an empty set if the first lookup fails), then each changed
set; ``interval_s = 0`` resolves once.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path

import dns.asyncquery
import dns.exception
import dns.message
import dns.rcode
import dns.rdatatype

from proxy.config import DiscoveryConfig
from proxy.workers.discovery import worker_url

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]
# getaddrinfo's "no such name" / "no address for the name" answers; everything else is transient.
_NO_NAME_ERRNOS = frozenset(
    code for code in (getattr(socket, "EAI_NONAME", None), getattr(socket, "EAI_NODATA", None)) if code is not None
)


class DnsTransientError(RuntimeError):
    """The resolver did not answer (timeout, SERVFAIL, network error): keep the last good set."""


def parse_hostport(text: str, default_port: int = 53) -> tuple[str, int]:
    """``"10.0.0.10"``, ``"10.0.0.10:5353"``, ``"::1"`` or ``"[::1]:5353"`` → (host, port)."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else default_port
    if text.count(":") == 1:
        host, _, port = text.partition(":")
        return host, int(port)
    return text, default_port


def parse_resolv_conf(text: str) -> tuple[list[str], list[str], int]:
    """(nameservers, search suffixes, ndots) from resolv.conf text; the last search/domain line wins."""
    nameservers: list[str] = []
    search: list[str] = []
    ndots = 1
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split(";", 1)[0].split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            nameservers.append(fields[1])
        elif fields and fields[0] in ("search", "domain"):
            search = fields[1:]
        elif fields and fields[0] == "options":
            for option in fields[1:]:
                if option.startswith("ndots:") and option[6:].isdigit():
                    ndots = min(15, int(option[6:]))
    return nameservers, search, ndots


def normalize_name(name: str) -> str:
    return name.rstrip(".").lower()


def candidate_names(name: str, search: Iterable[str], ndots: int = 1) -> list[str]:
    """A name with a trailing dot is absolute; otherwise as given and with each suffix, the name
    as given first when it has at least ``ndots`` dots (resolv.conf's rule), last otherwise."""
    if name.endswith("."):
        return [normalize_name(name)]
    base = normalize_name(name)
    suffixed = [f"{base}.{normalize_name(s)}" for s in search if s.strip(".")]
    return [base, *suffixed] if base.count(".") >= ndots else [*suffixed, base]


def srv_endpoints(message: dns.message.Message) -> list[tuple[str, int, list[str]]]:
    """(target, port, addresses from the additional section) for each usable SRV answer."""
    glue: dict[str, list[str]] = {}
    for rrset in message.additional:
        if rrset.rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA):
            glue.setdefault(normalize_name(rrset.name.to_text()), []).extend(rd.address for rd in rrset)
    endpoints = []
    for rrset in message.answer:
        if rrset.rdtype != dns.rdatatype.SRV:
            continue
        for rd in rrset:
            target = normalize_name(rd.target.to_text())
            if not target:  # "." means "service decidedly not available here" (RFC 2782)
                continue
            endpoints.append((target, int(rd.port), glue.get(target, [])))
    return endpoints


class DnsSource:
    """A WorkerSource over DNS; see the module docstring for the rules."""

    def __init__(
        self,
        name: str,
        *,
        port: int,
        scheme: str = "http",
        srv: bool = False,
        interval_s: float = 5.0,
        nameserver: tuple[str, int] | None = None,
        search: tuple[str, ...] = (),
        nameservers: tuple[tuple[str, int], ...] = (),
        ndots: int = 1,
        timeout_s: float = 2.0,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.name = name
        self.port = port
        self.scheme = scheme
        self.srv = srv
        self.interval_s = interval_s
        # Tried in turn while one fails; ``nameserver`` alone = just that one.
        self.nameservers = (nameserver,) if nameserver is not None else nameservers
        self.search = search
        self.ndots = ndots
        self.timeout_s = timeout_s
        self._sleep = sleep

    @classmethod
    def from_config(cls, cfg: DiscoveryConfig, *, resolv_conf: Path = Path("/etc/resolv.conf")) -> DnsSource:
        servers: list[str] = []
        search: list[str] = []
        ndots = 1
        if cfg.dns.srv:
            try:
                servers, search, ndots = parse_resolv_conf(resolv_conf.read_text())
            except OSError:
                pass
            if cfg.dns.nameserver:
                servers = [cfg.dns.nameserver]
        return cls(
            cfg.dns.name,
            port=cfg.port,
            scheme=cfg.scheme,
            srv=cfg.dns.srv,
            interval_s=cfg.interval_s,
            nameservers=tuple(parse_hostport(ns) for ns in servers or ["127.0.0.1"]) if cfg.dns.srv else (),
            search=tuple(search),
            ndots=ndots,
            timeout_s=cfg.dns.timeout_s,
        )

    async def watch(self) -> AsyncIterator[frozenset[str]]:
        last: frozenset[str] | None = None
        while True:
            try:
                urls = await self.resolve()
            except DnsTransientError as e:
                log.warning("dns discovery: %s; keeping %d known workers", e, len(last or ()))
                if last is None:  # the first answer failed: say "none known yet" rather than nothing
                    last = frozenset()
                    yield last
            else:
                if urls != last:
                    last = urls
                    yield urls
            if self.interval_s <= 0:
                return
            await self._sleep(self.interval_s)

    async def resolve(self) -> frozenset[str]:
        if self.srv:
            return await self._resolve_srv()
        return frozenset(
            worker_url(self.scheme, addr, self.port) for addr in await self._addresses(self.name, self.port)
        )

    async def _addresses(self, host: str, port: int) -> list[str]:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        except socket.gaierror as e:
            if e.errno in _NO_NAME_ERRNOS:
                return []
            raise DnsTransientError(f"resolving {host}: {e}") from e
        # Strip an IPv6 zone id ("fe80::1%eth0"); the rest of sockaddr is (host, port, ...).
        return sorted({str(info[4][0]).split("%", 1)[0] for info in infos})

    async def _resolve_srv(self) -> frozenset[str]:
        message = None
        for candidate in candidate_names(self.name, self.search, self.ndots):
            reply = await self._query(candidate)
            if reply.rcode() == dns.rcode.NXDOMAIN:
                continue
            if reply.rcode() != dns.rcode.NOERROR:
                raise DnsTransientError(f"SRV {candidate}: server answered rcode {reply.rcode()}")
            message = reply
            break
        if message is None:
            return frozenset()
        urls: set[str] = set()
        for target, port, glue in srv_endpoints(message):
            addresses = glue or await self._addresses(target, port)
            urls.update(worker_url(self.scheme, addr, port) for addr in addresses)
        return frozenset(urls)

    async def _query(self, name: str) -> dns.message.Message:
        """One SRV question to the first nameserver that answers (any rcode is an answer)."""
        if not self.nameservers:
            raise DnsTransientError("SRV mode needs a nameserver")
        errors = []
        for host, port in self.nameservers:
            query = dns.message.make_query(name, dns.rdatatype.SRV, use_edns=0, payload=4096)
            try:
                reply, _ = await asyncio.wait_for(
                    dns.asyncquery.udp_with_fallback(query, host, timeout=self.timeout_s, port=port), self.timeout_s)
                return reply
            except (TimeoutError, OSError, dns.exception.DNSException) as e:
                errors.append(f"{host}:{port}: {e!r}")
        raise DnsTransientError(f"SRV {name}: no nameserver answered ({'; '.join(errors)})")
