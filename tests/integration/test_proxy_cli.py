"""``radixgate serve`` as a process: flags override the config, READY line, SIGTERM drains, bad config exits 2."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp

from proxy.config import load
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


async def test_check_validates_as_a_start_would_and_prints_a_config_that_loads_back(tmp_path: Path) -> None:
    config = tmp_path / "radixgate.yaml"
    config.write_text("routing:\n  policy: cache_aware\n  params: {cache_threshold: 0.4}\n"
                      "admission:\n  queue_size: 77\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "serve", "--config", str(config), "--worker", "http://10.0.0.1:30000",
        "--port", "9123", "--check", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "RADIXGATE_SCRAPE__INTERVAL_S": "0.25"})
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    printed = tmp_path / "effective.yaml"
    printed.write_bytes(out)
    # Every source merged (file, environment, flags), and the printout is itself a config that loads
    # to the same tree.
    effective = load(printed, env={})
    assert effective == load(config, env={"RADIXGATE_SCRAPE__INTERVAL_S": "0.25"},
                             overrides={"server.port": 9123, "workers.static": ["http://10.0.0.1:30000"]})
    assert (effective.routing.policy, effective.admission.queue_size, effective.scrape.interval_s,
            effective.server.port) == ("cache_aware", 77, 0.25, 9123)


async def test_check_fails_on_what_only_a_start_finds(tmp_path: Path) -> None:
    """Not a config value but a start's work: a keys file that is named but empty."""
    keys = tmp_path / "keys"
    keys.write_text("# none yet\n")
    config = tmp_path / "radixgate.yaml"
    config.write_text(f"security:\n  api_keys_file: {keys}\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "serve", "--config", str(config), "--check",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2 and out == b""
    assert "security.api_keys_file: no keys in" in err.decode()
