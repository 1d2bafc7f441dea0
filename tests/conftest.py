"""Shared test set-up: async tests run on uvloop, as ``radixgate serve`` does (``proxy/cli.py``).

pytest-asyncio asks ``pytest_asyncio_loop_factories`` which event loops a test may run on. Every
async test gets uvloop. A test about the difference between loops names both with
``@pytest.mark.asyncio(loop_factories=["uvloop", "asyncio"])`` and then runs once on each
(ids ``[uvloop]`` / ``[asyncio]``). Threads that run their own loop (``tests/property``) create a
uvloop loop themselves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
import uvloop

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.new_event_loop,  # the default loop: only for tests that name it
}


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item
                                  ) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    marker = item.get_closest_marker("asyncio")
    if marker is not None and marker.kwargs.get("loop_factories"):
        return LOOPS
    return {"uvloop": LOOPS["uvloop"]}
