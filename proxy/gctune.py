"""Cyclic garbage-collector settings for the serving process (called once, after start-up).

Rule: once the app is built and listening, collect once, then ``gc.freeze()`` everything allocated so
far (modules, config, the app's object graph) into the permanent generation, and raise the
youngest generation's threshold. Why: on the overhead bench (``loadtests/bench_overhead.py``) perf
put about a fifth of the proxy's CPU in the cyclic collector. Every older-generation pass walked
the whole import-time heap (aiohttp, prometheus_client, grpc, …), none of which ever becomes
garbage, and the request path allocates enough short-lived containers (futures, tasks, dicts) to
start a young-generation pass every few requests. Reference counting still frees acyclic garbage
at once; only reference cycles wait a little longer for a pass.
"""

from __future__ import annotations

import gc

# Young-generation threshold (CPython's default is 700 net container allocations).
GEN0_THRESHOLD = 20_000


def settle_after_startup(gen0_threshold: int = GEN0_THRESHOLD) -> None:
    """Freeze the start-up heap and make young-generation passes rarer; ``gen0_threshold`` 0 leaves
    the thresholds alone (freeze only)."""
    gc.collect()
    gc.freeze()
    if gen0_threshold > 0:
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(gen0_threshold, gen1, gen2)
