"""Kubernetes discovery against a stand-in API server speaking the real list/watch wire format."""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from proxy.config import load
from proxy.workers.discovery import build_discovery_source
from proxy.workers.discovery_k8s import KubernetesSource
from tests.integration.k8s_standin import StandinApi, endpoint_slice, pod, serve

NS = "llm"
SELECTOR = "kubernetes.io/service-name=sglang"


class Updates:
    """Runs ``source.watch()`` in a task; ``next()`` waits (bounded) for the next yielded set."""

    def __init__(self, source: KubernetesSource) -> None:
        self.queue: asyncio.Queue[frozenset[str]] = asyncio.Queue()
        self.source = source
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async with contextlib.aclosing(self.source.watch()) as updates:
            async for urls in updates:
                await self.queue.put(urls)

    async def next(self) -> frozenset[str]:
        return await asyncio.wait_for(self.queue.get(), 10)

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@contextlib.asynccontextmanager
async def watching(source: KubernetesSource) -> AsyncIterator[Updates]:
    updates = Updates(source)
    try:
        yield updates
    finally:
        await updates.close()


async def until(predicate: object, what: str) -> None:
    """Poll a condition (bounded); the stand-in's request log is what we watch."""
    assert callable(predicate)
    for _ in range(1000):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def make_source(base: str, token_file: Path, **kw: object) -> KubernetesSource:
    params: dict[str, object] = dict(
        api_server=base, namespace=NS, label_selector=SELECTOR, port_name="http", token_file=str(token_file),
        watch_timeout_s=30, interval_s=0.01, backoff_max_s=0.05, rng=random.Random(7),
    )
    params.update(kw)
    return KubernetesSource(**params)  # type: ignore[arg-type]


def rotate(token_file: Path, token: str) -> None:
    token_file.write_text(token)


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("test-token\n")
    return path


async def test_list_keeps_only_ready_non_terminating_endpoints_on_the_named_port(token_file: Path) -> None:
    api = StandinApi()
    await api.put("endpointslices", NS, endpoint_slice(
        "sglang-a", "sglang", [("10.0.0.1", True, False), ("10.0.0.2", False, False), ("10.0.0.3", False, True)], 30000))
    await api.put("endpointslices", NS, endpoint_slice("other-a", "other", [("10.0.9.9", True, False)], 30000))
    async with serve(api) as base:
        source = make_source(base, token_file, interval_s=0)
        sets = [s async for s in source.watch()]
    assert sets == [{"http://10.0.0.1:30000"}]
    assert api.requests[0]["labelSelector"] == SELECTOR


async def test_watch_applies_added_modified_and_deleted_events_and_never_drops_a_delete(token_file: Path) -> None:
    api = StandinApi()
    await api.put("endpointslices", NS, endpoint_slice("sglang-a", "sglang", [("10.0.0.1", True, False)], 30000))
    async with serve(api) as base, watching(make_source(base, token_file)) as updates:
        assert await updates.next() == {"http://10.0.0.1:30000"}
        await until(lambda: api.watch_versions(), "the watch to start")
        await api.put("endpointslices", NS, endpoint_slice("sglang-b", "sglang", [("10.0.0.2", True, False)], 30000))
        assert await updates.next() == {"http://10.0.0.1:30000", "http://10.0.0.2:30000"}
        # sglang-0 stops being ready: MODIFIED removes it from its slice's share.
        await api.put("endpointslices", NS, endpoint_slice("sglang-a", "sglang", [("10.0.0.1", False, True)], 30000))
        assert await updates.next() == {"http://10.0.0.2:30000"}
        await api.delete("endpointslices", NS, "sglang-b")
        assert await updates.next() == frozenset()
        assert api.list_count() == 1  # all of that came over one watch, no relist


async def test_a_bookmark_moves_the_resource_version_the_next_watch_starts_from(token_file: Path) -> None:
    api = StandinApi()
    await api.put("endpointslices", NS, endpoint_slice("sglang-a", "sglang", [("10.0.0.1", True, False)], 30000))
    async with serve(api) as base, watching(make_source(base, token_file)) as updates:
        await updates.next()
        await until(lambda: len(api.watch_versions()) == 1, "the first watch")
        first = api.watch_versions()[0]
        await api.bookmark()
        bookmark_rv = str(api.rv)
        await until(lambda: api.events_sent == 1, "the bookmark to be written")
        api.end_watches()  # the client reads up to the end of the stream, bookmark included
        await until(lambda: len(api.watch_versions()) == 2, "the second watch")
        assert first != bookmark_rv
        assert api.watch_versions()[-1] == bookmark_rv
        assert api.list_count() == 1
        assert updates.queue.empty()


@pytest.mark.parametrize("gone_as_http", [False, True], ids=["410-error-event", "410-http-status"])
async def test_gone_resource_version_relists_and_catches_changes_missed_while_away(
    token_file: Path, gone_as_http: bool
) -> None:
    api = StandinApi(gone_as_http=gone_as_http)
    await api.put("endpointslices", NS, endpoint_slice("sglang-a", "sglang", [("10.0.0.1", True, False)], 30000))
    await api.put("endpointslices", NS, endpoint_slice("sglang-b", "sglang", [("10.0.0.2", True, False)], 30000))
    async with serve(api) as base, watching(make_source(base, token_file)) as updates:
        assert await updates.next() == {"http://10.0.0.1:30000", "http://10.0.0.2:30000"}
        await until(lambda: api.watch_versions(), "the watch to start")
        # While the watcher is cut off, sglang-b is deleted and the history compacted away.
        api.stall_watches = 1
        api.end_watches()
        await until(lambda: len(api.watch_versions()) >= 2, "a stalled rewatch")
        await api.delete("endpointslices", NS, "sglang-b")
        api.compact()
        api.end_watches()
        assert await updates.next() == {"http://10.0.0.1:30000"}
        assert api.list_count() == 2


async def test_api_errors_keep_the_last_set_and_back_off_exponentially_with_jitter(token_file: Path) -> None:
    api = StandinApi()
    await api.put("endpointslices", NS, endpoint_slice("sglang-a", "sglang", [("10.0.0.1", True, False)], 30000))
    sleeps: list[float] = []

    async def record_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        await asyncio.sleep(0)

    async with serve(api) as base:
        source = make_source(base, token_file, interval_s=1.0, backoff_max_s=4.0, sleep=record_sleep)
        async with watching(source) as updates:
            assert await updates.next() == {"http://10.0.0.1:30000"}
            await until(lambda: api.watch_versions(), "the watch to start")
            api.fail_requests = 5
            api.end_watches()
            await until(lambda: api.fail_requests == 0 and len(api.watch_versions()) >= 2, "recovery")
            await api.put("endpointslices", NS, endpoint_slice("sglang-b", "sglang", [("10.0.0.2", True, False)], 30000))
            # The first set stood through five failures; the next one is the change, not an empty set.
            assert await updates.next() == {"http://10.0.0.1:30000", "http://10.0.0.2:30000"}
    # One backoff for the cut stream (it ended early with no event), then one per 500.
    nominal = [1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    assert len(sleeps) == 6
    assert all(0.8 * n <= s <= 1.2 * n for s, n in zip(sleeps, nominal, strict=True)), sleeps


async def test_when_the_first_list_fails_the_source_says_none_known_yet_then_lists_again(token_file: Path) -> None:
    api = StandinApi(fail_requests=2)
    await api.put("endpointslices", NS, endpoint_slice("sglang-a", "sglang", [("10.0.0.1", True, False)], 30000))
    async with serve(api) as base, watching(make_source(base, token_file)) as updates:
        assert await updates.next() == frozenset()
        assert await updates.next() == {"http://10.0.0.1:30000"}
        assert api.list_count() == 3


async def test_a_silent_stalled_watch_is_abandoned_and_reopened(token_file: Path) -> None:
    api = StandinApi(stall_watches=1)
    await api.put("endpointslices", NS, endpoint_slice("sglang-a", "sglang", [("10.0.0.1", True, False)], 30000))
    async with serve(api) as base:
        source = make_source(base, token_file, watch_timeout_s=1, stall_slack_s=0.3)
        async with watching(source) as updates:
            assert await updates.next() == {"http://10.0.0.1:30000"}
            await until(lambda: len(api.watch_versions()) >= 2, "the stalled watch to be replaced")
            await api.put("endpointslices", NS, endpoint_slice("sglang-b", "sglang", [("10.0.0.2", True, False)], 30000))
            assert await updates.next() == {"http://10.0.0.1:30000", "http://10.0.0.2:30000"}
            api.end_watches()


async def test_pods_mode_keeps_running_ready_pods_and_drops_one_as_soon_as_it_is_deleting(token_file: Path) -> None:
    api = StandinApi()
    await api.put("pods", NS, pod("sglang-0", "10.0.1.1"))
    await api.put("pods", NS, pod("sglang-1", "10.0.1.2", ready=False))
    await api.put("pods", NS, pod("sglang-2", "10.0.1.3", phase="Pending", ready=False))
    await api.put("pods", NS, pod("web-0", "10.0.1.9", labels={"app": "web"}))
    async with serve(api) as base:
        source = make_source(base, token_file, resource="pods", label_selector="app=sglang")
        async with watching(source) as updates:
            assert await updates.next() == {"http://10.0.1.1:30000"}
            await until(lambda: api.watch_versions(), "the watch to start")
            await api.put("pods", NS, pod("sglang-1", "10.0.1.2"))
            assert await updates.next() == {"http://10.0.1.1:30000", "http://10.0.1.2:30000"}
            await api.put("pods", NS, pod("sglang-0", "10.0.1.1", deleting=True))
            assert await updates.next() == {"http://10.0.1.2:30000"}
    assert api.requests[0]["path"] == f"/api/v1/namespaces/{NS}/pods"


async def test_the_token_is_sent_as_bearer_and_reread_after_rotation(token_file: Path) -> None:
    api = StandinApi(token="old")
    rotate(token_file, "old")
    await api.put("endpointslices", NS, endpoint_slice("sglang-a", "sglang", [("10.0.0.1", True, False)], 30000))
    async with serve(api) as base, watching(make_source(base, token_file)) as updates:
        assert await updates.next() == {"http://10.0.0.1:30000"}
        await until(lambda: api.watch_versions(), "the watch to start")
        api.token = "new"  # the server rotates; the old token now gets 401
        api.end_watches()
        await until(lambda: sum(r["auth"] == "denied" for r in api.requests) >= 3, "a few 401s")
        rotate(token_file, "new")  # the kubelet refreshes the projected token
        await until(lambda: api.requests[-1]["auth"] == "ok" and api.requests[-1].get("watch") == "1",
                    "an authorised watch again")
        await api.put("endpointslices", NS, endpoint_slice("sglang-b", "sglang", [("10.0.0.2", True, False)], 30000))
        assert await updates.next() == {"http://10.0.0.1:30000", "http://10.0.0.2:30000"}


# A test CA and a server certificate for 127.0.0.1, valid until 2126 (openssl, EC P-256).
TEST_CA = """-----BEGIN CERTIFICATE-----
MIIBoDCCAUWgAwIBAgIUCSeX+jCz6yPlTb1RUipn1D2hX9AwCgYIKoZIzj0EAwIw
HDEaMBgGA1UEAwwRcmFkaXhnYXRlIHRlc3QgQ0EwIBcNMjYxMTI5MTIwOTQ1WhgP
MjEyNjExMDUxMjA5NDVaMBwxGjAYBgNVBAMMEXJhZGl4Z2F0ZSB0ZXN0IENBMFkw
EwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAErL/r1dOJnXjnkqXKETinjbJiOJ9fw8wh
ovnu/fuGTn9gihYt2VNVOqxN5ga8lVWrMxI/XwVxLCeNkCutWIKfL6NjMGEwHQYD
VR0OBBYEFGv+EVwlpATgAxJCTCUOdyED3deEMB8GA1UdIwQYMBaAFGv+EVwlpATg
AxJCTCUOdyED3deEMA8GA1UdEwEB/wQFMAMBAf8wDgYDVR0PAQH/BAQDAgEGMAoG
CCqGSM49BAMCA0kAMEYCIQCXDY8qU59vMkU9DTm9VJXCsfJYXC3c/sGvOKv76hhf
HwIhAMa157K/pvZFvXAMPlxMfpctB1BgRAV7Ka1ELIu4DEEg
-----END CERTIFICATE-----
"""
TEST_SERVER_CERT = """-----BEGIN CERTIFICATE-----
MIIByDCCAW6gAwIBAgIUCnRHCwx4hCh1Ar6ENO0xk0SOXqswCgYIKoZIzj0EAwIw
HDEaMBgGA1UEAwwRcmFkaXhnYXRlIHRlc3QgQ0EwIBcNMjYxMTI5MTIwOTQ1WhgP
MjEyNjExMDUxMjA5NDVaMBUxEzARBgNVBAMMCmt1YmVybmV0ZXMwWTATBgcqhkjO
PQIBBggqhkjOPQMBBwNCAARYAmFYi708p2uWSjsNaYkFWIgTaJLvSSnsBbQm60HW
yKI3yPqUFuriQlxwZx6vItSX+sWBO2JRSmx73agG0M7fo4GSMIGPMBoGA1UdEQQT
MBGHBH8AAAGCCWxvY2FsaG9zdDAMBgNVHRMBAf8EAjAAMA4GA1UdDwEB/wQEAwIH
gDATBgNVHSUEDDAKBggrBgEFBQcDATAfBgNVHSMEGDAWgBRr/hFcJaQE4AMSQkwl
DnchA93XhDAdBgNVHQ4EFgQUS3lgP11zEC3F0cGrfK3YHeRnjGEwCgYIKoZIzj0E
AwIDSAAwRQIhAJ7HW33ivaVAEAnLdqCWPg87bYHgz3P4sqW4PlCTgRZhAiALksWp
WzmQQfLfcUFlYdECmoKGQguirpgMbex50ADuyQ==
-----END CERTIFICATE-----
"""
TEST_SERVER_KEY = """-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg7F9hSqQA8kN/gdb+
2O7wLYfupHZ816yfkql2aqdtT5GhRANCAARYAmFYi708p2uWSjsNaYkFWIgTaJLv
SSnsBbQm60HWyKI3yPqUFuriQlxwZx6vItSX+sWBO2JRSmx73agG0M7f
-----END PRIVATE KEY-----
"""


async def test_https_api_server_is_verified_against_the_configured_ca(token_file: Path, tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text(TEST_CA)
    (tmp_path / "server.pem").write_text(TEST_SERVER_CERT + TEST_SERVER_KEY)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(tmp_path / "server.pem")
    api = StandinApi()
    await api.put("endpointslices", NS, endpoint_slice("sglang-a", "sglang", [("10.0.0.1", True, False)], 30000))
    async with serve(api, server_ctx) as base:
        assert base.startswith("https://")
        trusted = make_source(base, token_file, interval_s=0, ca_file=str(tmp_path / "ca.crt"))
        assert [s async for s in trusted.watch()] == [{"http://10.0.0.1:30000"}]
        served = len(api.requests)
        # Without the CA the handshake fails: nothing is learned, and the server never sees a request.
        untrusted = make_source(base, token_file, interval_s=0, ca_file=str(tmp_path / "missing.crt"))
        assert [s async for s in untrusted.watch()] == [frozenset()]
        assert len(api.requests) == served


async def test_config_selects_the_kubernetes_source_and_reads_the_pod_namespace(tmp_path: Path) -> None:
    cfg = load(env={"RADIXGATE_DISCOVERY__KIND": "kubernetes",
                    "RADIXGATE_DISCOVERY__KUBERNETES__LABEL_SELECTOR": "app=sglang",
                    "RADIXGATE_DISCOVERY__KUBERNETES__RESOURCE": "pods"})
    source = build_discovery_source(cfg)
    assert isinstance(source, KubernetesSource)
    (tmp_path / "namespace").write_text("inference\n")
    source = KubernetesSource.from_config(cfg.discovery, namespace_file=tmp_path / "namespace")
    assert source.path == "/api/v1/namespaces/inference/pods"
    assert source.label_selector == "app=sglang"
