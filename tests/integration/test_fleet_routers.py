"""The fleet benchmark's router processes (``loadtests/gpu/fleet.py`` ``Routers``), against simulated
workers: a ``fresh=on`` router restarts between rounds with nothing learned kept."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import psutil

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


def test_a_time_limits_sigterm_after_the_last_phase_still_leaves_its_summary(tmp_path: Path) -> None:
    # run_fleet.sh's BUDGET_S ends a run by SIGTERM; one that lands in the clean-up after the last
    # phase (stopping the routers) used to skip the summary's write, losing a measured cell.
    with subprocess.Popen(
            [sys.executable, "-m", "loadtests.gpu.fleet", "--sim", "2", "--sim-profile", "zero", "--routers",
             "round_robin", "--rates", "2", "--phase-s", "1", "--drain-s", "2", "--warmup-s", "0", "--prompts", "text",
             "--out", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        try:
            deadline = time.monotonic() + 90
            assert proc.stdout is not None
            for line in proc.stdout:  # the phase's line is printed once its summary is in memory
                if "round_robin @ 2/s:" in line or time.monotonic() > deadline:
                    break
            children = psutil.Process(proc.pid).children(recursive=True)  # the simulated workers, the router
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        finally:
            proc.kill()
    (cell,) = [json.loads(line) for line in (tmp_path / "summary.jsonl").read_text().splitlines()]
    assert cell["summary"]["round_robin"]["2"]["n"] > 0
    _, alive = psutil.wait_procs(children, timeout=15)  # and none of its processes outlives it
    assert children and not alive
