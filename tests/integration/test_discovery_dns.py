"""DNS discovery against real resolution on loopback: getaddrinfo for A/AAAA, and a small real DNS
server (UDP + TCP on 127.0.0.1, written here independently of proxy.workers.dns_wire) for SRV."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import struct
import typing
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from proxy.config import load
from proxy.workers.discovery import build_discovery_source
from proxy.workers.discovery_dns import DnsSource, DnsTransientError

# -- a tiny authoritative server --------------------------------------------------------------


@dataclass
class Zone:
    """name → SRV (priority, weight, port, target); glue name → addresses; behaviour switches."""

    srv: dict[str, list[tuple[int, int, int, str]]] = field(default_factory=dict)
    glue: dict[str, list[str]] = field(default_factory=dict)
    servfail: bool = False
    drop: bool = False
    truncate_udp: bool = False
    garble: bool = False  # answer with the right id and then bytes that are no DNS message
    queries: list[tuple[str, str]] = field(default_factory=list)  # (transport, name)


def _name(name: str) -> bytes:
    return b"".join(bytes([len(p)]) + p.encode() for p in name.split(".") if p) + b"\x00"


def _read_question(query: bytes) -> tuple[int, str, bytes]:
    qid = struct.unpack_from("!H", query)[0]
    pos, labels = 12, []
    while query[pos]:
        labels.append(query[pos + 1 : pos + 1 + query[pos]].decode())
        pos += 1 + query[pos]
    question = query[12 : pos + 5]
    return qid, ".".join(labels).lower(), question


def answer(zone: Zone, query: bytes, transport: str) -> bytes | None:
    qid, qname, question = _read_question(query)
    zone.queries.append((transport, qname))
    if zone.drop:
        return None
    if zone.garble:
        return struct.pack("!HHHHHH", qid, 0x8180, 1, 1, 0, 0) + question + b"\xc0\x30\x00"
    flags = 0x8180  # QR, RD, RA
    if zone.servfail:
        return struct.pack("!HHHHHH", qid, flags | 2, 1, 0, 0, 0) + question
    if qname not in zone.srv:
        return struct.pack("!HHHHHH", qid, flags | 3, 1, 0, 0, 0) + question
    answers = b""
    for priority, weight, port, target in zone.srv[qname]:
        rdata = struct.pack("!HHH", priority, weight, port) + _name(target)
        # Owner name compressed as a pointer to the question name at offset 12.
        answers += b"\xc0\x0c" + struct.pack("!HHIH", 33, 1, 30, len(rdata)) + rdata
    extra, n_extra = b"", 0
    for _, _, _, target in zone.srv[qname]:
        for addr in zone.glue.get(target, []):
            ip = ipaddress.ip_address(addr)
            rtype = 1 if ip.version == 4 else 28
            extra += _name(target) + struct.pack("!HHIH", rtype, 1, 30, len(ip.packed)) + ip.packed
            n_extra += 1
    if transport == "udp" and zone.truncate_udp:
        return struct.pack("!HHHHHH", qid, flags | 0x0200, 1, 0, 0, 0) + question
    header = struct.pack("!HHHHHH", qid, flags, 1, len(zone.srv[qname]), 0, n_extra)
    return header + question + answers + extra


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, zone: Zone) -> None:
        self.zone = zone

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        reply = answer(self.zone, data, "udp")
        if reply is not None:
            self.transport.sendto(reply, addr)


@contextlib.asynccontextmanager
async def dns_server(zone: Zone) -> AsyncIterator[tuple[str, int]]:
    async def on_tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        (length,) = struct.unpack("!H", await reader.readexactly(2))
        reply = answer(zone, await reader.readexactly(length), "tcp")
        if reply is not None:
            writer.write(struct.pack("!H", len(reply)) + reply)
            await writer.drain()
        writer.close()
        await writer.wait_closed()

    tcp = await asyncio.start_server(on_tcp, "127.0.0.1", 0)
    port = tcp.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    udp, _ = await loop.create_datagram_endpoint(lambda: _Udp(zone), local_addr=("127.0.0.1", port))
    try:
        yield ("127.0.0.1", port)
    finally:
        udp.close()
        tcp.close()
        await tcp.wait_closed()


SRV_NAME = "_http._tcp.sglang.llm.svc.test"


def fleet_zone() -> Zone:
    return Zone(
        srv={SRV_NAME: [(0, 50, 30001, "sglang-0.sglang.llm.svc.test"), (0, 50, 30002, "sglang-1.sglang.llm.svc.test")]},
        glue={"sglang-0.sglang.llm.svc.test": ["127.0.0.11"], "sglang-1.sglang.llm.svc.test": ["::1"]},
    )


class SteppedSleep:
    """An injected sleep that waits until the test lets the loop go round once more."""

    def __init__(self) -> None:
        self.waiting: asyncio.Queue[asyncio.Event] = asyncio.Queue()

    async def __call__(self, seconds: float) -> None:
        gate = asyncio.Event()
        await self.waiting.put(gate)
        await gate.wait()

    async def step(self) -> None:
        gate = await asyncio.wait_for(self.waiting.get(), 10)
        gate.set()


async def collect(source: DnsSource, out: asyncio.Queue[frozenset[str]]) -> None:
    async with contextlib.aclosing(source.watch()) as updates:
        async for urls in updates:
            await out.put(urls)


# -- tests ------------------------------------------------------------------------------------


async def test_a_records_of_localhost_resolve_through_getaddrinfo_to_loopback_workers() -> None:
    source = DnsSource("localhost", port=30000, interval_s=0)
    sets = [urls async for urls in source.watch()]
    assert len(sets) == 1
    assert "http://127.0.0.1:30000" in sets[0]
    hosts = {u.removeprefix("http://").rsplit(":", 1)[0].strip("[]") for u in sets[0]}
    assert all(ipaddress.ip_address(h).is_loopback for h in hosts)


async def test_srv_records_give_one_worker_per_target_with_the_record_port_and_glue_address() -> None:
    async with dns_server(fleet_zone()) as ns:
        source = DnsSource(SRV_NAME, port=1, srv=True, interval_s=0, nameserver=ns)
        assert await source.resolve() == {"http://127.0.0.11:30001", "http://[::1]:30002"}


async def test_srv_target_without_glue_is_resolved_with_getaddrinfo() -> None:
    zone = Zone(srv={SRV_NAME: [(0, 0, 30005, "localhost")]})
    async with dns_server(zone) as ns:
        urls = await DnsSource(SRV_NAME, port=1, srv=True, interval_s=0, nameserver=ns).resolve()
    assert "http://127.0.0.1:30005" in urls


async def test_a_truncated_udp_answer_is_asked_again_over_tcp() -> None:
    zone = fleet_zone()
    zone.truncate_udp = True
    async with dns_server(zone) as ns:
        urls = await DnsSource(SRV_NAME, port=1, srv=True, interval_s=0, nameserver=ns).resolve()
    assert urls == {"http://127.0.0.11:30001", "http://[::1]:30002"}
    assert [t for t, _ in zone.queries] == ["udp", "tcp"]


async def test_a_relative_name_is_tried_with_each_search_suffix_in_turn() -> None:
    zone = fleet_zone()
    async with dns_server(zone) as ns:
        source = DnsSource(
            "_http._tcp.sglang", port=1, srv=True, interval_s=0, nameserver=ns,
            search=("other.test", "llm.svc.test"),
        )
        urls = await source.resolve()
    assert urls == {"http://127.0.0.11:30001", "http://[::1]:30002"}
    assert [n for _, n in zone.queries] == [
        "_http._tcp.sglang", "_http._tcp.sglang.other.test", "_http._tcp.sglang.llm.svc.test",
    ]


async def test_no_such_name_is_an_answer_meaning_no_workers() -> None:
    async with dns_server(Zone()) as ns:
        assert await DnsSource(SRV_NAME, port=1, srv=True, interval_s=0, nameserver=ns).resolve() == frozenset()


async def test_server_failure_and_silence_are_transient_errors_not_empty_sets() -> None:
    zone = fleet_zone()
    async with dns_server(zone) as ns:
        source = DnsSource(SRV_NAME, port=1, srv=True, interval_s=0, nameserver=ns, timeout_s=0.3)
        zone.servfail = True
        with pytest.raises(DnsTransientError, match="rcode 2"):
            await source.resolve()
        zone.servfail, zone.drop = False, True
        with pytest.raises(DnsTransientError):
            await source.resolve()


async def test_watch_yields_the_first_set_then_only_changes_and_keeps_the_last_set_through_failures() -> None:
    zone = fleet_zone()
    sleep = SteppedSleep()
    out: asyncio.Queue[frozenset[str]] = asyncio.Queue()
    async with dns_server(zone) as ns:
        source = DnsSource(SRV_NAME, port=1, srv=True, interval_s=5.0, nameserver=ns, sleep=sleep, timeout_s=2)
        consumer = asyncio.create_task(collect(source, out))
        try:
            assert await asyncio.wait_for(out.get(), 10) == {"http://127.0.0.11:30001", "http://[::1]:30002"}
            await sleep.step()  # unchanged answer: no new set
            zone.servfail = True
            await sleep.step()  # failure: no new set either (the last one stands)
            zone.servfail = False
            zone.srv[SRV_NAME] = zone.srv[SRV_NAME][:1]  # sglang-1 leaves
            await sleep.step()
            assert await asyncio.wait_for(out.get(), 10) == {"http://127.0.0.11:30001"}
            await sleep.waiting.get()  # the loop is asleep again: everything it saw is in `out`
            assert out.empty()
            assert len(zone.queries) == 4
        finally:
            consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consumer


async def test_a_failed_first_lookup_yields_none_known_yet_and_the_loop_carries_on() -> None:
    zone = fleet_zone()
    zone.servfail = True
    sleep = SteppedSleep()
    out: asyncio.Queue[frozenset[str]] = asyncio.Queue()
    async with dns_server(zone) as ns:
        source = DnsSource(SRV_NAME, port=1, srv=True, interval_s=5.0, nameserver=ns, sleep=sleep)
        consumer = asyncio.create_task(collect(source, out))
        try:
            assert await asyncio.wait_for(out.get(), 10) == frozenset()
            zone.servfail = False
            await sleep.step()
            assert await asyncio.wait_for(out.get(), 10) == {"http://127.0.0.11:30001", "http://[::1]:30002"}
        finally:
            consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consumer


async def test_config_selects_the_dns_source_with_its_fields() -> None:
    cfg = load(env={}, overrides={
        "discovery.kind": "dns", "discovery.dns.name": SRV_NAME, "discovery.dns.srv": True,
        "discovery.dns.nameserver": "127.0.0.1:5353", "discovery.port": 31000, "discovery.interval_s": 2,
    })
    source = build_discovery_source(cfg)
    assert isinstance(source, DnsSource)
    assert (source.name, source.srv, source.nameservers, source.port, source.interval_s) == (
        SRV_NAME, True, (("127.0.0.1", 5353),), 31000, 2.0,
    )


async def test_a_nameserver_that_fails_is_followed_by_the_next_one() -> None:
    # resolv.conf lists several nameservers; the first is silent, the second answers.
    silent, good = Zone(drop=True), fleet_zone()
    async with dns_server(silent) as dead, dns_server(good) as live:
        source = DnsSource(SRV_NAME, port=1, srv=True, interval_s=0, nameservers=(dead, live), timeout_s=0.3)
        assert await source.resolve() == {"http://127.0.0.11:30001", "http://[::1]:30002"}
    assert silent.queries and good.queries


async def test_a_garbled_answer_is_a_transient_error() -> None:
    zone = fleet_zone()
    zone.garble = True
    async with dns_server(zone) as ns:
        with pytest.raises(DnsTransientError):
            await DnsSource(SRV_NAME, port=1, srv=True, interval_s=0, nameserver=ns, timeout_s=0.3).resolve()
