"""Worker discovery from DNS: a headless Service's records, re-resolved every ``interval_s``.

Two modes (``discovery.dns``):

* **A/AAAA** (default): ``name`` resolves through the event loop's ``getaddrinfo`` (so
  ``/etc/hosts``, search domains and the system resolver all apply); every address becomes
  ``scheme://addr:discovery.port`` (IPv6 in brackets).
* **SRV** (``srv: true``): ``name`` is an SRV name such as ``_http._tcp.sglang.llm.svc.cluster.local``;
  each record's target and port give one worker. Addresses come from the answer's additional
  section when the server sent them (CoreDNS does for headless Services), else from
  ``getaddrinfo(target)``. Priority and weight are ignored: every listed target is a worker, and
  load is the router's business. The query goes over UDP (EDNS0, 4 KiB) to the configured
  nameserver or the first one in ``/etc/resolv.conf``, with the ``search`` suffixes tried in turn
  for a relative name, and over TCP when the answer is truncated. No dependency: the stdlib has
  no SRV lookup, and ``dns_wire`` is a few dozen lines.

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
import random
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path

from proxy.config import DiscoveryConfig
from proxy.workers import dns_wire
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


def parse_resolv_conf(text: str) -> tuple[list[str], list[str]]:
    """(nameservers, search suffixes) from resolv.conf text; the last search/domain line wins."""
    nameservers: list[str] = []
    search: list[str] = []
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split(";", 1)[0].split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            nameservers.append(fields[1])
        elif fields and fields[0] in ("search", "domain"):
            search = fields[1:]
    return nameservers, search


def candidate_names(name: str, search: Iterable[str]) -> list[str]:
    """A name with a trailing dot is absolute; otherwise try it as given, then with each suffix."""
    if name.endswith("."):
        return [dns_wire.normalize_name(name)]
    base = dns_wire.normalize_name(name)
    return [base, *(f"{base}.{dns_wire.normalize_name(s)}" for s in search if s.strip("."))]


def srv_endpoints(message: dns_wire.Message) -> list[tuple[str, int, list[str]]]:
    """(target, port, addresses from the additional section) for each usable SRV answer."""
    glue: dict[str, list[str]] = {}
    for record in message.additionals:
        if record.rtype in (dns_wire.TYPE_A, dns_wire.TYPE_AAAA) and isinstance(record.data, str):
            glue.setdefault(record.name, []).append(record.data)
    endpoints = []
    for record in message.answers:
        if record.rtype != dns_wire.TYPE_SRV or not isinstance(record.data, dns_wire.SrvData):
            continue
        target = dns_wire.normalize_name(record.data.target)
        if not target:  # "." means "service decidedly not available here" (RFC 2782)
            continue
        endpoints.append((target, record.data.port, glue.get(target, [])))
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
        timeout_s: float = 2.0,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.name = name
        self.port = port
        self.scheme = scheme
        self.srv = srv
        self.interval_s = interval_s
        self.nameserver = nameserver
        self.search = search
        self.timeout_s = timeout_s
        self._sleep = sleep
        self._rng = rng or random.Random()

    @classmethod
    def from_config(cls, cfg: DiscoveryConfig, *, resolv_conf: Path = Path("/etc/resolv.conf")) -> DnsSource:
        nameserver: tuple[str, int] | None = None
        search: list[str] = []
        if cfg.dns.srv:
            try:
                servers, search = parse_resolv_conf(resolv_conf.read_text())
            except OSError:
                servers = []
            configured = cfg.dns.nameserver or (servers[0] if servers else "127.0.0.1")
            nameserver = parse_hostport(configured)
        return cls(
            cfg.dns.name,
            port=cfg.port,
            scheme=cfg.scheme,
            srv=cfg.dns.srv,
            interval_s=cfg.interval_s,
            nameserver=nameserver,
            search=tuple(search),
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
        for candidate in candidate_names(self.name, self.search):
            reply = await self._query(candidate, dns_wire.TYPE_SRV)
            if reply.rcode == dns_wire.RCODE_NXDOMAIN:
                continue
            if reply.rcode != dns_wire.RCODE_OK:
                raise DnsTransientError(f"SRV {candidate}: server answered rcode {reply.rcode}")
            message = reply
            break
        if message is None:
            return frozenset()
        urls: set[str] = set()
        for target, port, glue in srv_endpoints(message):
            addresses = glue or await self._addresses(target, port)
            urls.update(worker_url(self.scheme, addr, port) for addr in addresses)
        return frozenset(urls)

    async def _query(self, name: str, qtype: int) -> dns_wire.Message:
        assert self.nameserver is not None, "SRV mode needs a nameserver"
        qid = self._rng.getrandbits(16)
        query = dns_wire.encode_query(qid, name, qtype)
        try:
            reply = await asyncio.wait_for(self._udp_exchange(query, qid), self.timeout_s)
            if reply.truncated:
                reply = await asyncio.wait_for(self._tcp_exchange(query, qid), self.timeout_s)
        except (TimeoutError, OSError, dns_wire.DnsFormatError) as e:
            raise DnsTransientError(f"SRV {name} via {self.nameserver[0]}:{self.nameserver[1]}: {e!r}") from e
        return reply

    async def _udp_exchange(self, query: bytes, qid: int) -> dns_wire.Message:
        assert self.nameserver is not None
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[dns_wire.Message] = loop.create_future()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _ReplyProtocol(qid, answer), remote_addr=self.nameserver
        )
        try:
            transport.sendto(query)
            return await answer
        finally:
            transport.close()

    async def _tcp_exchange(self, query: bytes, qid: int) -> dns_wire.Message:
        assert self.nameserver is not None
        reader, writer = await asyncio.open_connection(*self.nameserver)
        try:
            writer.write(struct.pack("!H", len(query)) + query)
            await writer.drain()
            (length,) = struct.unpack("!H", await reader.readexactly(2))
            reply = dns_wire.decode_message(await reader.readexactly(length))
        finally:
            writer.close()
            await writer.wait_closed()
        if reply.qid != qid:
            raise dns_wire.DnsFormatError("TCP answer has the wrong query id")
        return reply


class _ReplyProtocol(asyncio.DatagramProtocol):
    """Resolve the future with the first well-formed reply carrying our id; ignore the rest."""

    def __init__(self, qid: int, answer: asyncio.Future[dns_wire.Message]) -> None:
        self._qid = qid
        self._answer = answer

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        if self._answer.done():
            return
        try:
            message = dns_wire.decode_message(data)
        except dns_wire.DnsFormatError:
            return
        if message.qid == self._qid:
            self._answer.set_result(message)

    def error_received(self, exc: Exception) -> None:
        if not self._answer.done():
            self._answer.set_exception(exc)
