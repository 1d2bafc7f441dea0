"""The DNS wire format (RFC 1035, RFC 2782 SRV, RFC 6891 EDNS0), just enough for SRV discovery.

Pure bytes in, records out; no sockets here (the query loop is in ``discovery_dns``). We write the
few lines this needs instead of adding a resolver dependency: the stdlib's ``getaddrinfo`` answers
A/AAAA but never SRV.

* A query is one question with RD set and an EDNS0 OPT record offering a 4096-byte UDP payload,
  so that a large headless Service fits in one datagram; a truncated (TC) answer is retried over
  TCP by the caller.
* Names in answers may be compressed (RFC 1035 §4.1.4): a pointer jumps back into the message.
  Pointers may only go backwards, and the number of jumps is capped, so a hostile message cannot
  loop.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

TYPE_A = 1
TYPE_AAAA = 28
TYPE_SRV = 33
TYPE_OPT = 41
CLASS_IN = 1

RCODE_OK = 0
RCODE_SERVFAIL = 2
RCODE_NXDOMAIN = 3

_FLAG_QR = 0x8000
_FLAG_TC = 0x0200
_FLAG_RD = 0x0100
_EDNS_UDP_PAYLOAD = 4096
_MAX_POINTER_JUMPS = 32


class DnsFormatError(ValueError):
    """The bytes are not a well-formed DNS message."""


@dataclass(frozen=True)
class SrvData:
    priority: int
    weight: int
    port: int
    target: str


@dataclass(frozen=True)
class Record:
    name: str
    rtype: int
    ttl: int
    # SrvData for SRV, the address text for A / AAAA, the raw bytes otherwise.
    data: SrvData | str | bytes


@dataclass(frozen=True)
class Message:
    qid: int
    rcode: int
    truncated: bool
    answers: tuple[Record, ...]
    additionals: tuple[Record, ...]


def normalize_name(name: str) -> str:
    """Lower-case, without the trailing dot: the form names are compared in."""
    return name.rstrip(".").lower()


def encode_name(name: str) -> bytes:
    out = bytearray()
    for label in normalize_name(name).split("."):
        raw = label.encode("idna") if label else b""
        if not raw:
            raise ValueError(f"empty label in DNS name {name!r}")
        if len(raw) > 63:
            raise ValueError(f"DNS label longer than 63 bytes in {name!r}")
        out.append(len(raw))
        out += raw
    out.append(0)
    if len(out) > 255:
        raise ValueError(f"DNS name longer than 255 bytes: {name!r}")
    return bytes(out)


def encode_query(qid: int, name: str, qtype: int) -> bytes:
    header = struct.pack("!HHHHHH", qid, _FLAG_RD, 1, 0, 0, 1)
    question = encode_name(name) + struct.pack("!HH", qtype, CLASS_IN)
    # OPT pseudo-record: root name, type 41, "class" = UDP payload size, ttl = ext-rcode/flags.
    opt = b"\x00" + struct.pack("!HHIH", TYPE_OPT, _EDNS_UDP_PAYLOAD, 0, 0)
    return header + question + opt


def _read_name(data: bytes, offset: int) -> tuple[str, int]:
    """Return (name, offset just after the name as written at ``offset``)."""
    labels: list[str] = []
    end_after: int | None = None
    jumps = 0
    pos = offset
    while True:
        if pos >= len(data):
            raise DnsFormatError("name runs past the end of the message")
        length = data[pos]
        if length & 0xC0 == 0xC0:
            if pos + 1 >= len(data):
                raise DnsFormatError("truncated compression pointer")
            target = ((length & 0x3F) << 8) | data[pos + 1]
            if end_after is None:
                end_after = pos + 2
            if target >= pos or jumps >= _MAX_POINTER_JUMPS:
                raise DnsFormatError("compression pointer does not point backwards")
            jumps += 1
            pos = target
            continue
        if length & 0xC0:
            raise DnsFormatError(f"unsupported label type 0x{length:02x}")
        pos += 1
        if length == 0:
            break
        if pos + length > len(data):
            raise DnsFormatError("label runs past the end of the message")
        labels.append(data[pos : pos + length].decode("ascii", errors="replace").lower())
        pos += length
    return ".".join(labels), (end_after if end_after is not None else pos)


def _read_record(data: bytes, offset: int) -> tuple[Record, int]:
    name, pos = _read_name(data, offset)
    if pos + 10 > len(data):
        raise DnsFormatError("record header runs past the end of the message")
    rtype, _rclass, ttl, rdlength = struct.unpack_from("!HHIH", data, pos)
    pos += 10
    end = pos + rdlength
    if end > len(data):
        raise DnsFormatError("record data runs past the end of the message")
    payload: SrvData | str | bytes
    if rtype == TYPE_A and rdlength == 4:
        payload = str(ipaddress.IPv4Address(data[pos:end]))
    elif rtype == TYPE_AAAA and rdlength == 16:
        payload = str(ipaddress.IPv6Address(data[pos:end]))
    elif rtype == TYPE_SRV and rdlength >= 7:
        priority, weight, port = struct.unpack_from("!HHH", data, pos)
        target, _ = _read_name(data, pos + 6)
        payload = SrvData(priority, weight, port, target)
    else:
        payload = data[pos:end]
    return Record(name, rtype, ttl, payload), end


def decode_message(data: bytes) -> Message:
    if len(data) < 12:
        raise DnsFormatError("shorter than a DNS header")
    qid, flags, qdcount, ancount, nscount, arcount = struct.unpack_from("!HHHHHH", data, 0)
    if not flags & _FLAG_QR:
        raise DnsFormatError("not a response")
    pos = 12
    for _ in range(qdcount):
        _, pos = _read_name(data, pos)
        pos += 4
    sections: list[list[Record]] = [[], [], []]
    for section, count in zip(sections, (ancount, nscount, arcount), strict=True):
        for _ in range(count):
            record, pos = _read_record(data, pos)
            section.append(record)
    return Message(
        qid=qid,
        rcode=flags & 0x000F,
        truncated=bool(flags & _FLAG_TC),
        answers=tuple(sections[0]),
        additionals=tuple(sections[2]),
    )
