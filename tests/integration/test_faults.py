"""The fault matrix: real simulated workers with fault knobs, a real proxy, real sockets.

Each test names the fault and asserts what the client saw, what the proxy counted, and that the
fleet recovered. Time: workers run faster than real time; waits are polls with a bound.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from proxy.app import App
from proxy.sim.config import SimConfig
from tests.fixtures.sim_client import load
from tests.integration.conftest import FAST, Harness, admin, base, eventually
from tests.integration.reliability import StreamResult, accounting, scrape, scripted_worker, stream, total

PROMPT = "Write a detailed travel guide to the coastal towns of Portugal. " * 6


async def start_proxy(harness: Harness, urls: list[str], **overrides: object) -> App:
    """The proxy under test, round robin so that which worker gets what is known."""
    return await harness.proxy(urls, **{"routing.policy": "round_robin", **overrides})


def body(tokens: int, *, streamed: bool = True) -> dict[str, object]:
    return {"text": PROMPT, "stream": streamed, "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}


async def running(client: aiohttp.ClientSession, url: str) -> int:
    return int((await load(client, url))["num_running_reqs"])


async def healthy(client: aiohttp.ClientSession, app: App, worker: str) -> bool:
    return total(await scrape(client, admin(app)), "radixgate_worker_healthy", worker=worker) == 1


def balanced(m: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> bool:
    accepted, succeeded, failed = accounting(m)
    return accepted == succeeded + failed


async def test_a_worker_killed_mid_stream_ends_its_streams_with_an_error_spares_the_others_and_comes_back(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    # The victim dies (every connection dropped, port closed) once it generated 80 tokens in all:
    # mid-way through the two streams round robin gives it.
    fleet = await harness.fleet([SimConfig(time_scale=2.0, fault_die_after_tokens=80), SimConfig(time_scale=2.0)])
    victim = fleet.urls[0]
    app = await start_proxy(harness, fleet.urls, **{"health.eject_after_failures": 2, "health.eject_cooldown_s": 0.5})
    results: list[StreamResult] = await asyncio.gather(
        *(stream(client, base(app) + "/generate", body(400)) for _ in range(4)))
    broken = [r for r in results if not r.ok]
    whole = [r for r in results if r.ok]
    assert len(broken) == 2 and len(whole) == 2
    for r in broken:  # an explicit error, then [DONE], on a clean close, promptly
        assert r.status == 200 and r.explicit_error and r.error is not None
        assert r.error["code"] == 502 and r.error["message"]
        assert r.events[-1] == "[DONE]" and 1 <= len(r.tokens) < 60  # tokens came first, then the error
        assert r.elapsed_s < 1.5 and r.finished_at < min(w.finished_at for w in whole)
    for r in whole:  # the other worker's streams never noticed
        final = r.tokens[-1]["meta_info"]
        assert final["completion_tokens"] == 400 and final["finish_reason"]["type"] == "length"
    m = await scrape(client, admin(app))
    assert total(m, "radixgate_retries_total") == 0  # bytes had reached the clients: no retry
    assert total(m, "radixgate_upstream_failures_total", worker=victim, cause="stream_broken") == 2
    assert total(m, "radixgate_worker_ejections_total", worker=victim) == 1
    assert total(m, "radixgate_worker_healthy", worker=victim) == 0
    assert total(m, "radixgate_errors_total", cause="upstream_error") == 2 and balanced(m)

    fleet.workers[0].set_faults(die_after_tokens=None)
    await fleet.workers[0].start()  # same port, empty cache
    await eventually(lambda: healthy(client, app, victim), what="re-admission of the restarted worker")
    after = [await stream(client, base(app) + "/generate", body(4)) for _ in range(4)]
    assert all(r.ok for r in after)
    m = await scrape(client, admin(app))
    assert total(m, "radixgate_e2e_seconds_count", worker=victim, outcome="ok") >= 1  # routed to again


async def test_a_worker_that_hangs_before_the_first_token_is_timed_out_and_the_request_retried_elsewhere(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, fault_hang_before_first_token=True),
                                 SimConfig(time_scale=FAST)])
    hung, fine = fleet.urls
    # Probes off and no ejection: every other request is routed to the hung worker on purpose.
    app = await start_proxy(harness, fleet.urls, **{"upstream.first_byte_timeout_s": 0.3, "health.interval_s": 0,
                                             "health.eject_after_failures": 100})
    loop = asyncio.get_running_loop()
    for streamed in (True, False, True, False):
        started = loop.time()
        r = await stream(client, base(app) + "/generate", body(8, streamed=streamed))
        assert r.status == 200 and (r.ok if streamed else r.error is None)
        assert loop.time() - started < 1.5  # at most one first-byte timeout, never a hang
    m = await scrape(client, admin(app))
    timeouts = total(m, "radixgate_upstream_failures_total", worker=hung, cause="timeout")
    assert timeouts >= 2 and total(m, "radixgate_retries_total", cause="timeout") == timeouts
    # The non-stream ones were found hung by a health check, not by waiting out their deadline.
    assert total(m, "radixgate_long_answer_checks_total", worker=hung, outcome="hung") >= 1
    assert total(m, "radixgate_requests_succeeded_total") == 4 and balanced(m)
    assert total(m, "radixgate_e2e_seconds_count", worker=fine, outcome="ok") == 4
    await eventually(lambda: _idle(client, hung), what="the hung requests released on the worker")
    assert app.admission.core.outstanding(hung) == 0


async def test_a_non_stream_answer_longer_than_the_first_byte_timeout_is_waited_for_not_retried(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    # A non-stream answer arrives whole, at the end: past first_byte_timeout_s the worker is checked on
    # (its health probe), and while it passes, the wait goes on. Retrying would start the generation
    # over elsewhere and count a healthy worker as failing (two such answers would eject it).
    fleet = await harness.fleet([SimConfig(time_scale=2.0), SimConfig(time_scale=2.0)])
    app = await start_proxy(harness, fleet.urls, **{"upstream.first_byte_timeout_s": 0.15,
                                                    "health.eject_after_failures": 2})
    loop = asyncio.get_running_loop()
    for _ in range(2):
        started = loop.time()
        async with client.post(base(app) + "/generate", json=body(150, streamed=False)) as resp:
            assert resp.status == 200
            answer = await resp.json()
        assert answer["meta_info"]["completion_tokens"] == 150
        assert loop.time() - started > 0.3  # it did outlast two first-byte timeouts
    m = await scrape(client, admin(app))
    assert total(m, "radixgate_long_answer_checks_total", outcome="alive") >= 4
    assert total(m, "radixgate_long_answer_checks_total", outcome="hung") == 0
    assert total(m, "radixgate_retries_total") == 0 and total(m, "radixgate_upstream_failures_total") == 0
    assert total(m, "radixgate_worker_ejections_total") == 0 and balanced(m)


async def test_long_non_stream_answers_on_one_worker_share_its_health_probe(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=2.0)])
    app = await start_proxy(harness, fleet.urls, **{"upstream.first_byte_timeout_s": 0.15, "health.timeout_s": 5.0})
    probed: list[str] = []
    probe = app.pipeline.upstream.probe

    async def counted(url: str, path: str, timeout_s: float) -> int:  # the real probe, counted
        probed.append(path)
        return await probe(url, path, timeout_s)

    app.pipeline.upstream.probe = counted  # type: ignore[method-assign]
    replies = await asyncio.gather(*(client.post(base(app) + "/generate", json=body(150, streamed=False))
                                     for _ in range(6)))
    for r in replies:
        assert r.status == 200 and (await r.json())["meta_info"]["completion_tokens"] == 150
    m = await scrape(client, admin(app))
    checks = total(m, "radixgate_long_answer_checks_total", outcome="alive")
    assert checks >= 6 and probed == ["/health"]  # six answers checked on, one probe of the worker


async def _idle(client: aiohttp.ClientSession, url: str) -> bool:
    loads = await load(client, url)
    return int(loads["num_running_reqs"]) == 0 and int(loads["num_waiting_reqs"]) == 0


async def test_a_hung_worker_with_no_alternative_answers_504_in_bounded_time(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, fault_hang_before_first_token=True)])
    app = await start_proxy(harness, fleet.urls, **{"upstream.first_byte_timeout_s": 0.3, "health.interval_s": 0})
    r = await stream(client, base(app) + "/generate", body(8))
    assert r.status == 504 and r.error is not None and r.elapsed_s < 1.5


async def test_5xx_answers_are_retried_on_another_worker_before_anything_reached_the_client(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, fault_error_rate=1.0), SimConfig(time_scale=FAST)])
    failing = fleet.urls[0]
    app = await start_proxy(harness, fleet.urls, **{"health.eject_after_failures": 1000})
    results = [await stream(client, base(app) + "/generate", body(6, streamed=i % 2 == 0)) for i in range(8)]
    assert [r.status for r in results] == [200] * 8
    m = await scrape(client, admin(app))
    fails = total(m, "radixgate_upstream_failures_total", worker=failing, cause="http_5xx")
    assert fails >= 1 and total(m, "radixgate_retries_total", cause="http_5xx") == fails
    assert total(m, "radixgate_requests_succeeded_total") == 8 and balanced(m)


async def test_a_full_worker_queue_503_moves_requests_elsewhere_without_ejecting_the_worker(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    full = SimConfig(time_scale=FAST, max_running_requests=1, max_queued_requests=1)
    fleet = await harness.fleet([full, SimConfig(time_scale=FAST)])
    small = fleet.urls[0]
    # The proxy's own admission would shield the small worker: lift it so its queue overflows.
    app = await start_proxy(harness, fleet.urls, **{"admission.per_worker_limit": 16, "health.eject_after_failures": 1})
    results = await asyncio.gather(*(stream(client, base(app) + "/generate", body(60)) for _ in range(12)))
    assert all(r.ok for r in results), [r.status for r in results]
    m = await scrape(client, admin(app))
    busy = total(m, "radixgate_upstream_failures_total", worker=small, cause="worker_busy")
    assert busy >= 1 and total(m, "radixgate_retries_total", cause="worker_busy") == busy
    assert total(m, "radixgate_worker_ejections_total", worker=small) == 0
    assert total(m, "radixgate_worker_healthy", worker=small) == 1 and balanced(m)


async def test_a_slow_starting_worker_gets_no_request_until_it_is_healthy(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    starting = SimConfig(time_scale=FAST, fault_slow_start=50.0)  # 1 s of "starting" (503) in real time
    fleet = await harness.fleet([starting, SimConfig(time_scale=FAST)])
    slow = fleet.urls[0]
    app = await start_proxy(harness, fleet.urls)
    m = await scrape(client, admin(app))
    assert total(m, "radixgate_worker_healthy", worker=slow) == 0  # its first probe said 503
    sent = 0
    while not await healthy(client, app, slow):  # requests all through the start-up
        r = await stream(client, base(app) + "/generate", body(2, streamed=sent % 2 == 0))
        assert r.status == 200
        sent += 1
        assert sent < 2000
    assert sent >= 5
    m = await scrape(client, admin(app))
    assert total(m, "radixgate_upstream_failures_total", worker=slow) == 0  # never tried while starting
    assert total(m, "radixgate_retries_total") == 0
    for _ in range(4):
        assert (await stream(client, base(app) + "/generate", body(2))).ok
    m = await scrape(client, admin(app))
    assert total(m, "radixgate_e2e_seconds_count", worker=slow, outcome="ok") >= 1  # healthy: routed to


async def test_with_every_worker_down_requests_get_a_fast_503_with_retry_after_then_recover(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet()
    app = await start_proxy(harness, fleet.urls, **{"health.eject_after_failures": 2})
    assert (await stream(client, base(app) + "/generate", body(2))).ok
    for w in fleet.workers:
        await w.stop()
    loop = asyncio.get_running_loop()
    for i in range(6):  # from the very first request on, before probes noticed anything
        started = loop.time()
        async with client.post(base(app) + "/generate", json=body(2, streamed=i % 2 == 0)) as r:
            answer = await r.json()
            assert r.status == 503, answer
            assert int(r.headers["Retry-After"]) >= 1 and answer["error"]["message"]
        assert loop.time() - started < 0.5

    async def ready_is(status: int) -> bool:
        async with client.get(base(app) + "/ready") as r:
            return r.status == status

    await eventually(lambda: ready_is(503), what="not ready once the probes saw every worker down")
    for w in fleet.workers:
        await w.start()
    await eventually(lambda: ready_is(200), what="readiness after the workers came back")
    assert all([(await stream(client, base(app) + "/generate", body(2))).ok for _ in range(4)])
    assert balanced(await scrape(client, admin(app)))


async def test_clients_that_leave_mid_stream_have_their_upstream_aborted_and_every_slot_freed(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=1.0), SimConfig(time_scale=1.0)])
    app = await start_proxy(harness, fleet.urls)
    responses = [await client.post(base(app) + "/generate", json=body(5000)) for _ in range(6)]
    for r in responses:
        assert r.status == 200
        await r.content.readuntil(b"\n\n")  # the stream is flowing
    assert sum([await running(client, url) for url in fleet.urls]) == 6
    for r in responses:
        r.close()
    await eventually(lambda: _all_idle(client, fleet.urls), what="both workers idle after the clients left")

    async def freed() -> bool:
        m = await scrape(client, admin(app))
        return (total(m, "radixgate_upstream_aborts_total") == 6
                and total(m, "radixgate_errors_total", cause="client_disconnect") == 6
                and total(m, "radixgate_worker_in_flight_requests") == 0 and balanced(m))

    await eventually(freed, what="aborts sent, disconnects counted, in-flight back to 0")
    assert app.pipeline.active == 0
    assert all(app.admission.core.outstanding(url) == 0 for url in fleet.urls)


async def _all_idle(client: aiohttp.ClientSession, urls: list[str]) -> bool:
    return all([await _idle(client, url) for url in urls])


async def test_clients_that_leave_a_non_streamed_request_free_the_worker_and_the_connection_pool(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=1.0)])
    worker = fleet.urls[0]
    # Two pooled connections at most: a leaked one per departed client would starve the worker.
    app = await start_proxy(harness, fleet.urls, **{"upstream.max_connections_per_worker": 2})
    for _ in range(3):
        pending = asyncio.ensure_future(client.post(base(app) + "/generate", json=body(5000, streamed=False)))
        await eventually(lambda: _has_running(client, worker), what="the request running on the worker")
        pending.cancel()
        try:
            await pending
        except asyncio.CancelledError:
            pass
        await eventually(lambda: _idle(client, worker), what="the worker dropping the abandoned request")
    async with asyncio.timeout(5):
        r = await stream(client, base(app) + "/generate", body(4, streamed=False))
    assert r.status == 200

    async def counted() -> bool:
        m = await scrape(client, admin(app))
        return (total(m, "radixgate_errors_total", cause="client_disconnect") == 3
                and total(m, "radixgate_worker_in_flight_requests") == 0 and balanced(m))

    await eventually(counted, what="three disconnects counted and no request left in flight")


async def _has_running(client: aiohttp.ClientSession, url: str) -> bool:
    return await running(client, url) == 1


async def test_a_client_leaving_while_a_worker_trickles_a_non_streamed_answer_frees_the_pooled_connection(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    """A worker sends its answer's head and part of its body, then stalls; the client gives up."""
    from aiohttp import web

    stalled, released = asyncio.Event(), asyncio.Event()
    calls = 0

    async def generate(request: web.Request) -> web.StreamResponse:
        nonlocal calls
        await request.read()
        calls += 1
        if calls > 1:  # later requests are answered at once
            return web.json_response({"text": "fine", "meta_info": {"completion_tokens": 1}})
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(b'{"text": "half an ans')
        stalled.set()
        try:
            await asyncio.Event().wait()  # until the proxy drops the connection
        finally:
            released.set()
        return resp

    async with scripted_worker(generate) as url:
        # One pooled connection: if the departed client's connection were kept, nothing else gets through.
        app = await start_proxy(harness, [url], **{"upstream.max_connections_per_worker": 1,
                                                   "upstream.first_byte_timeout_s": 3.0, "scrape.interval_s": 0})
        pending = asyncio.ensure_future(client.post(base(app) + "/generate", json=body(4, streamed=False)))
        await asyncio.wait_for(stalled.wait(), 5)
        pending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pending
        await asyncio.wait_for(released.wait(), 5)  # the proxy closed the upstream connection
        async with client.post(base(app) + "/generate", json=body(4, streamed=False)) as r:
            assert r.status == 200 and (await r.json())["text"] == "fine"

        async def counted() -> bool:
            m = await scrape(client, admin(app))
            return total(m, "radixgate_errors_total", cause="client_disconnect") == 1 and balanced(m)

        await eventually(counted, what="the departed client counted as a disconnect")


async def test_requests_that_fail_on_every_worker_cannot_eject_the_whole_fleet(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    """A poison input makes every worker answer 500: passive ejection stops at half the fleet."""
    fleet = await harness.fleet([SimConfig(time_scale=FAST, fault_error_rate=1.0) for _ in range(3)])
    app = await start_proxy(harness, fleet.urls, **{"health.eject_after_failures": 1, "health.eject_cooldown_s": 60,
                                                    "health.max_ejected_fraction": 0.5})
    for _ in range(6):
        r = await stream(client, base(app) + "/generate", body(2, streamed=False))
        assert r.status in (502, 503)
    m = await scrape(client, admin(app))
    assert total(m, "radixgate_worker_ejections_total") == 1  # int(3 * 0.5) = 1
    assert total(m, "radixgate_worker_healthy") == 2
    for w in fleet.workers:
        w.set_faults(error_rate=0.0)
    assert all([(await stream(client, base(app) + "/generate", body(2))).ok for _ in range(4)])  # no 503 window
