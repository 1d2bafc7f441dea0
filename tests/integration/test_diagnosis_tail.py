"""GET /diagnosis/tail on the admin port: the slowest recent requests of a real proxy in front of
simulated workers, each cut into the parts of its time, with its rid and trace id."""

from __future__ import annotations

import aiohttp

from proxy.sim.config import SimConfig
from tests.integration.conftest import FAST, Harness, admin, base

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


async def test_the_tail_names_its_requests_and_where_their_time_went(
    harness: Harness, client: aiohttp.ClientSession
) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST)])
    app = await harness.proxy(fleet.urls)
    for i, tokens in enumerate((2, 2, 2, 2, 64)):
        body = {"text": f"prompt {i} " * (40 if i == 4 else 1), "rid": f"req-{i}", "stream": True,
                "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}
        headers = {"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"} if i == 4 else {}
        async with client.post(f"{base(app)}/generate", json=body, headers=headers) as r:
            assert r.status == 200
            await r.read()
    async with client.get(f"{admin(app)}/diagnosis/tail", params={"n": "3", "by": "e2e"}) as r:
        assert r.status == 200
        doc = await r.json()
    assert doc["by"] == "e2e" and doc["requests_in_window"] == 5 and len(doc["requests"]) == 3
    top = doc["requests"][0]
    # 64 tokens against 2: the longest answer is the slowest end to end, and its decode dominated.
    assert top["rid"] == "req-4" and top["trace_id"] == TRACE and top["dominant"] == "decode"
    assert top["worker"] == fleet.urls[0] and top["completion_tokens"] == 64
    assert set(top["parts_s"]) >= {"admission", "routing", "prefill", "decode"}
    assert sum(top["parts_s"].values()) <= top["e2e_s"] + 1e-3
    e2e = [row["e2e_s"] for row in doc["requests"]]
    assert e2e == sorted(e2e, reverse=True)

    async with client.get(f"{admin(app)}/diagnosis/tail") as r:  # by TTFT, 10 at most
        doc = await r.json()
    assert doc["by"] == "ttft" and len(doc["requests"]) == 5 and "ttft_s" in doc["requests"][0]

    for params, field in (({"n": "0"}, "n:"), ({"n": "x"}, "n:"), ({"n": "201"}, "n:"), ({"by": "itl"}, "by:"),
                          ({"window_s": "-1"}, "window_s:"), ({"window_s": "abc"}, "window_s:")):
        async with client.get(f"{admin(app)}/diagnosis/tail", params=params) as r:
            assert r.status == 400, params
            assert (await r.json())["error"]["message"].startswith(field), params
