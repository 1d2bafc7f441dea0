"""The serving process's collector settings (proxy/gctune.py): start-up heap frozen, rarer young passes."""

from __future__ import annotations

import gc

from proxy.gctune import GEN0_THRESHOLD, settle_after_startup


def test_settling_freezes_the_start_up_heap_and_raises_the_young_threshold() -> None:
    before = gc.get_threshold()
    try:
        settle_after_startup()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (GEN0_THRESHOLD, before[1], before[2])
        gc.unfreeze()
        settle_after_startup(gen0_threshold=0)  # 0: freeze only, thresholds left alone
        assert gc.get_threshold() == (GEN0_THRESHOLD, before[1], before[2])
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
