"""The fleet benchmark's router processes (``loadtests/gpu/fleet.py`` ``Routers``), against simulated
workers: a ``fresh=on`` router restarts between rounds with nothing learned kept."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from loadtests.gpu.fleet import TOKENIZER, Routers
from proxy.sim.config import SimConfig
from tests.integration.conftest import FAST, Harness


async def test_a_restarted_router_answers_on_new_ports_and_its_old_process_is_gone(
        harness: Harness, tmp_path: Path) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST)] * 2)
    routers = Routers(["ttft/fresh=on"], fleet.urls, tmp_path, TOKENIZER, window_s=30)
    try:
        await routers.start()
        old_base, old_admin, (old_proc,) = routers.bases["ttft/fresh=on"][0], routers.admins["ttft/fresh=on"], routers.procs
        await routers.restart("ttft/fresh=on")
        (new_base,) = routers.bases["ttft/fresh=on"]
        assert new_base != old_base and old_proc.returncode is not None
        assert routers.every_admin == [routers.admins["ttft/fresh=on"]] != [old_admin]
        assert len(routers.procs) == 1 and routers.procs[0].returncode is None
        async with aiohttp.ClientSession() as s, s.post(
                f"{new_base}/generate", json={"text": "hello", "sampling_params": {"max_new_tokens": 2}}) as r:
            assert r.status == 200
    finally:
        await routers.stop()
