"""The suite runs on the loop ``radixgate serve`` runs on (tests/conftest.py)."""

from __future__ import annotations

import asyncio

import pytest
import uvloop


async def test_async_tests_run_on_uvloop_like_radixgate_serve() -> None:
    assert isinstance(asyncio.get_running_loop(), uvloop.Loop)


@pytest.mark.asyncio(loop_factories=["uvloop", "asyncio"])
async def test_a_test_that_names_both_loops_runs_once_on_each(request: pytest.FixtureRequest) -> None:
    loop = asyncio.get_running_loop()
    on_uvloop = isinstance(loop, uvloop.Loop)
    assert on_uvloop == request.node.name.endswith("[uvloop]")
