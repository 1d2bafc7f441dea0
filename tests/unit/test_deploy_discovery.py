"""The pure parts of worker discovery: DNS wire format, resolv.conf, Kubernetes object rules, watch
event classification, and the discovery config checks."""

from __future__ import annotations

from typing import Any

import dns.message
import dns.rdatatype
import dns.rrset
import pytest

from proxy.config import ConfigError, load
from proxy.workers.discovery import build_discovery_source, worker_url
from proxy.workers.discovery_dns import candidate_names, parse_hostport, parse_resolv_conf, srv_endpoints
from proxy.workers.k8s_objects import ObjectSet, classify_event, endpointslice_urls, pod_urls

# -- DNS --------------------------------------------------------------------------------------------


def srv_reply(*records: tuple[int, str], glue: dict[str, str] | None = None) -> dns.message.Message:
    """An SRV answer as a server sends it: (port, target) records, and A glue for some targets."""
    query = dns.message.make_query("_http._tcp.svc.test", dns.rdatatype.SRV)
    reply = dns.message.make_response(query)
    for port, target in records:
        reply.answer.append(dns.rrset.from_text("_http._tcp.svc.test.", 30, "IN", "SRV", f"0 10 {port} {target}"))
    for name, address in (glue or {}).items():
        reply.additional.append(dns.rrset.from_text(name, 30, "IN", "A", address))
    # Through the wire and back, with name compression, as the resolver receives it.
    return dns.message.from_wire(reply.to_wire())


def test_srv_answers_give_targets_ports_and_glue_addresses() -> None:
    message = srv_reply((30000, "sglang-0.svc.test."), (30001, "Sglang-1.svc.test."),
                        glue={"sglang-0.svc.test.": "10.0.0.7"})
    assert srv_endpoints(message) == [("sglang-0.svc.test", 30000, ["10.0.0.7"]), ("sglang-1.svc.test", 30001, [])]


def test_an_srv_target_of_dot_means_no_service_and_yields_no_endpoint() -> None:
    assert srv_endpoints(srv_reply((30000, "."))) == []


def test_resolv_conf_gives_nameservers_and_the_last_search_line() -> None:
    text = "# generated\nnameserver 10.96.0.10\nsearch a.svc.cluster.local svc.cluster.local\n" \
           "nameserver 10.96.0.11 ; second\noptions ndots:5\nsearch llm.svc.cluster.local svc.cluster.local\n"
    assert parse_resolv_conf(text) == (["10.96.0.10", "10.96.0.11"], ["llm.svc.cluster.local", "svc.cluster.local"], 5)


@pytest.mark.parametrize(("text", "expected"), [
    ("10.0.0.10", ("10.0.0.10", 53)), ("127.0.0.1:5353", ("127.0.0.1", 5353)),
    ("::1", ("::1", 53)), ("[::1]:5353", ("::1", 5353)),
])
def test_nameserver_addresses_parse_with_an_optional_port(text: str, expected: tuple[str, int]) -> None:
    assert parse_hostport(text) == expected


def test_relative_names_try_each_search_suffix_and_absolute_names_only_themselves() -> None:
    assert candidate_names("_http._tcp.sglang", ["llm.svc.cluster.local"]) == [
        "_http._tcp.sglang", "_http._tcp.sglang.llm.svc.cluster.local"]
    # Kubernetes' ndots:5: a name with fewer dots is tried with the suffixes first.
    assert candidate_names("_http._tcp.sglang", ["llm.svc.cluster.local"], ndots=5) == [
        "_http._tcp.sglang.llm.svc.cluster.local", "_http._tcp.sglang"]
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
