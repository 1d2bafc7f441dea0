"""``radixgate serve`` as a process: flags override the config, READY line, SIGTERM drains, bad config exits 2."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import aiohttp

from tests.integration.conftest import Harness


async def test_serve_runs_a_proxy_and_stops_on_sigterm(harness: Harness, tmp_path: Path) -> None:
    fleet = await harness.fleet()
    config = tmp_path / "radixgate.yaml"
    config.write_text(f"workers:\n  static: [{fleet.urls[0]}]\nrouting:\n  policy: round_robin\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "serve", "--config", str(config), "--worker", fleet.urls[1],
        "--port", "0", "--admin-port", "0", "--policy", "least_load", "--log-level", "warning",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line.startswith("READY "), line
        fields = dict(part.split("=", 1) for part in line.split()[1:])
        async with aiohttp.ClientSession() as s:
            async with s.post(f"http://{fields['http']}/generate",
                              json={"text": "hello", "sampling_params": {"max_new_tokens": 2}}) as r:
                assert r.status == 200
            async with s.get(f"http://{fields['admin']}/workers") as r:
                info = await r.json()
        assert info["policy"] == "least_load"  # the flag overrode the file
        assert sorted(w["url"] for w in info["workers"]) == sorted(fleet.urls)  # --worker added to it
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_bad_config_value_exits_2_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("health:\n  interval_s: often\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "serve", "--config", str(config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert "health.interval_s" in err.decode()


async def test_an_unknown_policy_exits_2_naming_the_field() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "serve", "--policy", "fastest", "--port", "0", "--admin-port", "0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert "routing.policy" in err.decode()
