"""The pure parts of worker discovery: DNS wire format, resolv.conf, Kubernetes object rules, watch
event classification, and the discovery config checks."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from proxy.config import ConfigError, load
from proxy.workers import dns_wire
from proxy.workers.discovery import build_discovery_source, worker_url
from proxy.workers.discovery_dns import candidate_names, parse_hostport, parse_resolv_conf, srv_endpoints
from proxy.workers.k8s_objects import ObjectSet, classify_event, endpointslice_urls, pod_urls

# -- DNS --------------------------------------------------------------------------------------------


def response(answers: bytes, n_answers: int, *, additionals: bytes = b"", n_add: int = 0, flags: int = 0x8180,
             qid: int = 7) -> bytes:
    question = dns_wire.encode_name("_http._tcp.svc.test") + struct.pack("!HH", dns_wire.TYPE_SRV, 1)
    return struct.pack("!HHHHHH", qid, flags, 1, n_answers, 0, n_add) + question + answers + additionals


def srv_rr(port: int, target: bytes) -> bytes:
    rdata = struct.pack("!HHH", 0, 10, port) + target
    return b"\xc0\x0c" + struct.pack("!HHIH", dns_wire.TYPE_SRV, 1, 30, len(rdata)) + rdata


def test_a_query_asks_one_question_with_recursion_and_an_edns_payload_size() -> None:
    q = dns_wire.encode_query(0x1234, "_http._tcp.Sglang.test.", dns_wire.TYPE_SRV)
    qid, flags, qd, an, ns, ar = struct.unpack_from("!HHHHHH", q)
    assert (qid, flags & 0x0100, qd, an, ns, ar) == (0x1234, 0x0100, 1, 0, 0, 1)
    assert q[12:].startswith(b"\x05_http\x04_tcp\x06sglang\x04test\x00")
    assert struct.unpack("!H", q[-8:-6])[0] == 4096  # OPT "class" = UDP payload size


def test_srv_answers_decode_with_compressed_names_and_glue_addresses() -> None:
    target = b"\x08sglang-0" + b"\xc0\x17"  # "sglang-0" + pointer to "svc.test" inside the question
    glue = target + struct.pack("!HHIH", dns_wire.TYPE_A, 1, 30, 4) + bytes([10, 0, 0, 7])
    message = dns_wire.decode_message(response(srv_rr(30000, target), 1, additionals=glue, n_add=1))
    (srv,) = message.answers
    assert srv.name == "_http._tcp.svc.test"
    assert srv.data == dns_wire.SrvData(0, 10, 30000, "sglang-0.svc.test")
    assert srv_endpoints(message) == [("sglang-0.svc.test", 30000, ["10.0.0.7"])]


def test_an_srv_target_of_dot_means_no_service_and_yields_no_endpoint() -> None:
    message = dns_wire.decode_message(response(srv_rr(30000, b"\x00"), 1))
    assert srv_endpoints(message) == []


@pytest.mark.parametrize(("data", "reason"), [
    (b"\x00" * 5, "shorter than a DNS header"),
    (struct.pack("!HHHHHH", 1, 0x0100, 0, 0, 0, 0), "not a response"),
    (response(b"\xc0\x30", 1), "does not point backwards"),  # a pointer forward, past itself
    (response(srv_rr(1, b"\x05ab"), 1), "past the end"),
])
def test_malformed_messages_are_rejected_not_misread(data: bytes, reason: str) -> None:
    with pytest.raises(dns_wire.DnsFormatError, match=reason):
        dns_wire.decode_message(data)


def test_a_self_referencing_pointer_cannot_loop() -> None:
    answer_offset = len(response(b"", 0))
    looping = response(bytes([0xC0, answer_offset]), 1)  # the answer's name points at itself
    with pytest.raises(dns_wire.DnsFormatError, match="does not point backwards"):
        dns_wire.decode_message(looping)


def test_resolv_conf_gives_nameservers_and_the_last_search_line() -> None:
    text = "# generated\nnameserver 10.96.0.10\nsearch a.svc.cluster.local svc.cluster.local\n" \
           "nameserver 10.96.0.11 ; second\noptions ndots:5\nsearch llm.svc.cluster.local svc.cluster.local\n"
    assert parse_resolv_conf(text) == (["10.96.0.10", "10.96.0.11"], ["llm.svc.cluster.local", "svc.cluster.local"])


@pytest.mark.parametrize(("text", "expected"), [
    ("10.0.0.10", ("10.0.0.10", 53)), ("127.0.0.1:5353", ("127.0.0.1", 5353)),
    ("::1", ("::1", 53)), ("[::1]:5353", ("::1", 5353)),
])
def test_nameserver_addresses_parse_with_an_optional_port(text: str, expected: tuple[str, int]) -> None:
    assert parse_hostport(text) == expected


def test_relative_names_try_each_search_suffix_and_absolute_names_only_themselves() -> None:
    assert candidate_names("_http._tcp.sglang", ["llm.svc.cluster.local"]) == [
        "_http._tcp.sglang", "_http._tcp.sglang.llm.svc.cluster.local"]
    assert candidate_names("_http._tcp.sglang.llm.svc.cluster.local.", ["x"]) == [
        "_http._tcp.sglang.llm.svc.cluster.local"]


@pytest.mark.parametrize(("host", "url"), [
    ("10.0.0.1", "http://10.0.0.1:30000"), ("fd00::1", "http://[fd00::1]:30000"),
    ("sglang-0.sglang", "http://sglang-0.sglang:30000"),
])
def test_worker_urls_bracket_ipv6_addresses(host: str, url: str) -> None:
    assert worker_url("http", host, 30000) == url


# -- Kubernetes objects ---------------------------------------------------------------------------

def slice_(endpoints: list[dict[str, Any]], ports: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "s", "namespace": "llm"}, "endpoints": endpoints,
            "ports": ports if ports is not None else [{"name": "http", "port": 30000}]}


@pytest.mark.parametrize(("conditions", "counted"), [
    ({"ready": True}, True),
    ({}, True),  # the API: a nil ready means ready
    ({"ready": False}, False),
    ({"ready": True, "terminating": True}, False),  # publishNotReadyAddresses keeps ready while terminating
    ({"ready": False, "serving": True, "terminating": True}, False),
])
def test_an_endpoint_counts_only_when_ready_and_not_terminating(conditions: dict[str, Any], counted: bool) -> None:
    urls = endpointslice_urls(slice_([{"addresses": ["10.0.0.1"], "conditions": conditions}]),
                              scheme="http", port_name="http", default_port=1)
    assert urls == ({"http://10.0.0.1:30000"} if counted else set())


def test_a_slice_port_comes_from_its_name_or_the_configured_default() -> None:
    s = slice_([{"addresses": ["10.0.0.1", "10.0.0.99"]}], [{"name": "metrics", "port": 9000},
                                                           {"name": "http", "port": 30000}])
    assert endpointslice_urls(s, scheme="http", port_name="http", default_port=1) == {"http://10.0.0.1:30000"}
    assert endpointslice_urls(s, scheme="https", port_name="", default_port=8443) == {"https://10.0.0.1:8443"}
    assert endpointslice_urls(s, scheme="http", port_name="grpc", default_port=1) == frozenset()


@pytest.mark.parametrize(("change", "counted"), [
    ({}, True),
    ({"status": {"phase": "Pending"}}, False),
    ({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}, False),
    ({"status": {"podIP": ""}}, False),
    ({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}, False),
])
def test_a_pod_counts_only_when_running_ready_addressed_and_not_deleting(change: dict[str, Any], counted: bool) -> None:
    pod: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "llm"},
        "spec": {"containers": [{"name": "sglang", "ports": [{"name": "http", "containerPort": 30001}]}]},
        "status": {"phase": "Running", "podIP": "10.0.0.2", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    for section, values in change.items():
        pod[section] = {**pod[section], **values}
    urls = pod_urls(pod, scheme="http", port_name="http", default_port=1)
    assert urls == ({"http://10.0.0.2:30001"} if counted else set())


def test_object_set_replaces_an_objects_share_on_modify_and_drops_it_on_delete() -> None:
    objects = ObjectSet(lambda o: frozenset(o.get("urls", [])))
    objects.replace_all([{"metadata": {"name": "a"}, "urls": ["u1", "u2"]}, {"metadata": {"name": "b"}, "urls": ["u2"]}])
    assert objects.urls() == {"u1", "u2"}
    objects.apply("MODIFIED", {"metadata": {"name": "a"}, "urls": ["u3"]})
    assert objects.urls() == {"u2", "u3"}
    objects.apply("DELETED", {"metadata": {"name": "b"}})
    assert objects.urls() == {"u3"}
    objects.apply("DELETED", {"metadata": {"name": "never-seen"}})
    assert objects.urls() == {"u3"} and len(objects) == 1


@pytest.mark.parametrize(("event", "action", "version"), [
    ({"type": "ADDED", "object": {"metadata": {"resourceVersion": "5"}}}, "apply", "5"),
    ({"type": "DELETED", "object": {"metadata": {"resourceVersion": "6"}}}, "apply", "6"),
    ({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}, "bookmark", "9"),
    ({"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}, "relist", None),
    ({"type": "ERROR", "object": {"kind": "Status", "code": 500}}, "fail", None),
    ({"type": "SURPRISE", "object": {}}, "fail", None),
    (["not", "an", "event"], "fail", None),
])
def test_watch_events_are_classified(event: Any, action: str, version: str | None) -> None:
    step = classify_event(event)
    assert (step.action, step.resource_version) == (action, version)


# -- config -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("overrides", "message"), [
    ({"discovery.kind": "consul"}, "discovery.kind"),
    ({"discovery.kind": "dns"}, "discovery.dns.name"),
    ({"discovery.kind": "kubernetes"}, "discovery.kubernetes.label_selector"),
    ({"discovery.kind": "dns", "discovery.dns.name": "x", "workers.static": ["http://a:1"]}, "workers.static"),
    ({"discovery.kubernetes.resource": "services"}, "discovery.kubernetes.resource"),
    ({"discovery.port": 0}, "discovery.port"),
    ({"discovery.interval_s": -1}, "discovery.interval_s"),
])
def test_bad_discovery_config_fails_naming_the_field(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load(env={}, overrides=overrides)


def test_static_discovery_leaves_the_worker_list_to_workers_static() -> None:
    assert build_discovery_source(load(env={})) is None
