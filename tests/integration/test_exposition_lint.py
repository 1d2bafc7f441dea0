"""``/metrics`` of a proxy that served a few hundred mixed requests passes ``promtool check metrics``.

Two checks of the same exposition: the lint rules promtool applies to label names (``quantile``
only on summaries, ``le`` only on histograms), in Python, always; and the real ``promtool`` when it
is installed (Debian: ``apt-get install prometheus``). A CI that installs it sets
``RADIXGATE_REQUIRE_PROMTOOL=1``: then its absence fails the test, never skips it. (Not keyed on
``CI`` itself: a CI without the package would go red for a tool it never had; the label lint in
Python still runs there.)
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.sim.config import SimConfig
from tests.integration.conftest import FAST, Harness, admin, base
from tests.integration.test_usage_accounting import MODEL

REQUESTS = 240


def _bodies() -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for i in range(REQUESTS):
        system = f"shared system prompt number {i % 6}. " * 10
        kind = i % 12
        if kind == 0:
            out.append(("/generate", {"text": system + f"q{i}", "sampling_params": {"max_new_tokens": 3}}))
        elif kind == 1:
            out.append(("/generate", {"text": system + f"q{i}", "stream": True, "sampling_params": {"max_new_tokens": 3}}))
        elif kind == 2:
            out.append(("/v1/chat/completions", {"model": MODEL, "max_tokens": 3, "stream": True,
                                                 "messages": [{"role": "user", "content": system + f"q{i}"}]}))
        elif kind == 3:
            out.append(("/v1/chat/completions", {"model": MODEL, "max_tokens": 3, "stream": True,
                                                 "stream_options": {"include_usage": True},
                                                 "messages": [{"role": "user", "content": system + f"q{i}"}]}))
        elif kind == 4:
            out.append(("/v1/completions", {"model": MODEL, "max_tokens": 3, "prompt": system + f"q{i}"}))
        elif kind == 5:
            out.append(("/v1/completions", {"model": MODEL, "max_tokens": 3, "stream": True, "prompt": system}))
        elif kind == 6:
            out.append(("/v1/chat/completions", {"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}))
        elif kind == 7:
            out.append(("/generate", {"sampling_params": {"max_new_tokens": 3}}))  # no prompt: 400
        elif kind in (8, 9):
            out.append(("/v1/responses", {"model": MODEL, "max_output_tokens": 3, "stream": kind == 9,
                                          "instructions": system, "input": f"q{i}"}))
        else:
            out.append(("/v1/messages", {"model": MODEL, "max_tokens": 3, "stream": kind == 11, "system": system,
                                         "messages": [{"role": "user", "content": f"q{i}"}]}))
    return out


async def _loaded_exposition(harness: Harness, client: aiohttp.ClientSession) -> str:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, enable_metrics=True, enable_cache_report=True)] * 2)
    app = await harness.proxy(fleet.urls, **{"diagnose.refresh_s": 0.0})
    gate = asyncio.Semaphore(16)

    async def one(path: str, body: dict[str, Any]) -> int:
        async with gate, client.post(base(app) + path, json=body) as r:
            await r.read()
            return r.status

    statuses = await asyncio.gather(*(one(p, b) for p, b in _bodies()))
    assert statuses.count(200) == REQUESTS * 10 // 12 and statuses.count(404) == statuses.count(400) == REQUESTS // 12
    async with client.get(admin(app) + "/metrics") as r:
        assert r.status == 200
        text = await r.text()
    assert "radixgate_diagnosis_ttft_seconds{" in text  # the diagnosis gauges have samples to lint
    return text


def label_problems(text: str) -> list[str]:
    """promtool's label lints: ``quantile`` on a non-summary, ``le`` on a non-histogram."""
    problems = []
    for family in text_string_to_metric_families(text):
        labels = {k for s in family.samples for k in s.labels}
        if "quantile" in labels and family.type != "summary":
            problems.append(f'{family.name} non-summary metrics should not have "quantile" label')
        if "le" in labels and family.type not in ("histogram", "gaugehistogram"):
            problems.append(f'{family.name} non-histogram metrics should not have "le" label')
    return problems


async def test_the_exposition_after_mixed_traffic_has_no_reserved_labels_misused(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    assert label_problems(await _loaded_exposition(harness, client)) == []


async def test_promtool_check_metrics_finds_nothing_after_mixed_traffic(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("RADIXGATE_REQUIRE_PROMTOOL"):
            pytest.fail("promtool is not installed but RADIXGATE_REQUIRE_PROMTOOL is set: "
                        "apt-get install -y prometheus")
        pytest.skip("promtool not installed (apt-get install -y prometheus; RADIXGATE_REQUIRE_PROMTOOL=1 "
                    "makes this a failure)")
    text = await _loaded_exposition(harness, client)
    done = await asyncio.to_thread(subprocess.run, [promtool, "check", "metrics"], input=text.encode(),
                                   capture_output=True, timeout=60)
    assert (done.returncode, done.stdout + done.stderr) == (0, b"")
