from __future__ import annotations

import dataclasses

import pytest

from proxy.diagnose import cache_replay, signals
from proxy.diagnose.cache_replay import cache_signal, replay_matched_blocks
from proxy.diagnose.shadow import _as_placed
from proxy.diagnose.signals import Distribution
from proxy.diagnose.window import SnapshotSample
from proxy.routing.base import WorkerSnapshot
from tests.unit.diagnose_builders import chain, record


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert signals.percentile(values, 0.5) == 50.0
    assert signals.percentile(values, 0.95) == 95.0
    assert signals.percentile([], 0.5) is None
    assert Distribution.of([1.0, None, 3.0]).n == 2


def test_spread_is_p95_over_p50_and_unknown_without_a_middle() -> None:
    assert Distribution(10, 0.5, 2.0).spread == 4.0
    assert Distribution(0, None, None).spread is None
    assert Distribution(10, 0.0, 1.0).spread is None


def test_replay_hits_what_was_seen_before_in_prefix_order() -> None:
    recs = [record(blocks=chain(1, 4)), record(blocks=chain(1, 6)), record(blocks=chain(2, 3))]
    assert replay_matched_blocks(recs, None) == [0, 4, 0]


def test_replay_stops_at_the_first_missing_block() -> None:
    first = record(blocks=(1, 2, 3))
    diverging = record(blocks=(1, 9, 3))
    assert replay_matched_blocks([first, diverging], None) == [0, 1]


def test_replay_capacity_evicts_least_recently_used_chains() -> None:
    a, b = chain(1, 4), chain(2, 4)
    recs = [record(blocks=a), record(blocks=b), record(blocks=a)]
    # 4 blocks of 16 tokens fit one chain: b evicts a.
    assert replay_matched_blocks(recs, 64) == [0, 0, 0]
    assert replay_matched_blocks(recs, 128) == [0, 0, 4]


def test_replay_evicts_leaves_before_their_parents() -> None:
    # A 6-block chain in a 4-block cache keeps its first blocks (parents touched last), like a radix tree.
    recs = [record(blocks=chain(1, 6)), record(blocks=chain(1, 2))]
    assert replay_matched_blocks(recs, 64) == [0, 2]


def test_captured_is_what_workers_reported() -> None:
    recs = [record(blocks=chain(1, 4), prompt=100, cached=0), record(blocks=chain(1, 4), prompt=100, cached=60)]
    c = cache_signal(recs, None)
    assert c.captured == pytest.approx(60 / 200)
    assert c.reporting_requests == 2


def test_available_counts_repeats_a_fleet_cache_would_serve() -> None:
    # Same 64-token prompt twice; the workers missed both times (round robin on a cold pair).
    recs = [record(blocks=chain(1, 4), received=0.0), record(blocks=chain(1, 4), received=1.0)]
    c = cache_signal(recs, 10_000)
    assert c.captured == 0.0
    assert c.available == pytest.approx(64 / 128)
    assert c.reuse_ceiling == pytest.approx(64 / 128)


def test_without_reports_the_cache_is_estimated_from_each_workers_own_replay() -> None:
    # Engines that report no cached tokens: one prompt twice on the same worker, then once on
    # another (round robin's spread). Each worker's own cache serves only its own repeats.
    recs = [record(blocks=chain(1, 4), worker=w, received=float(i), cached=None)
            for i, w in enumerate(["http://w0", "http://w0", "http://w1"])]
    c = cache_signal(recs, 10_000)
    assert c.estimated and c.reporting_requests == 3
    assert c.captured == pytest.approx(64 / 192)  # only w0's repeat
    assert c.available == pytest.approx(128 / 192)  # one fleet-wide cache serves both repeats
    # A decision's own prediction (exact with KV events) counts where it says more.
    predicted = [dataclasses.replace(r, predicted_cached_tokens=64) for r in recs]
    assert cache_signal(predicted, 10_000).captured == pytest.approx(3 * 64 / 192)


def test_a_worker_of_dp_ranks_is_one_cache_per_rank_in_the_estimate() -> None:
    # One prompt four times on a worker of 2 DP ranks. Unnamed, its controller takes the ranks in
    # turn: each rank computes the prompt once (2 of 4 hit), whatever the decisions predicted
    # (they saw the worker as one cache). Named rank 1 every time: 3 of 4 hit, as on one cache.
    ranks = {"http://w0": 2}
    unnamed = [dataclasses.replace(record(blocks=chain(1, 4), received=float(i), cached=None),
                                   predicted_cached_tokens=64 if i else 0) for i in range(4)]
    c = cache_signal(unnamed, 10_000, dp_sizes=ranks)
    assert c.estimated and c.captured == pytest.approx(2 * 64 / 256)
    assert cache_signal(unnamed, 10_000).captured == pytest.approx(3 * 64 / 256)  # one rank: as it was
    named = [dataclasses.replace(r, dp_rank=1) for r in unnamed]
    assert cache_signal(named, 10_000, dp_sizes=ranks).captured == pytest.approx(3 * 64 / 256)
    # Each rank holds its share of the worker's KV: of 64 tokens, 32 (2 of the 4 blocks of 16).
    assert cache_replay.per_worker_matched_blocks(named, 64) == [0, 4, 4, 4]
    assert cache_replay.per_worker_matched_blocks(named, 64, dp_sizes=ranks) == [0, 2, 2, 2]


def test_the_shadow_models_the_windows_own_placements_with_a_cache_per_rank() -> None:
    # The TTFT model is fitted on the window's placements as they were: on a worker of 2 ranks
    # that named none, the prompt is computed once per rank, not once.
    recs = [record(blocks=chain(1, 4), received=float(i), cached=None) for i in range(4)]
    one = [p.uncached for p in _as_placed(recs, ["http://w0"], 10_000, None)]
    two = [p.uncached for p in _as_placed(recs, ["http://w0"], 10_000, {"http://w0": 2})]
    assert (one, two) == ([64.0, 0.0, 0.0, 0.0], [64.0, 64.0, 0.0, 0.0])


def test_the_shadow_policies_reach_the_ranks_the_proxy_would_send_them_to() -> None:
    from proxy.diagnose.shadow import replay

    # One 128-token prompt eight times, 2 workers of 2 DP ranks. As one cache per worker, ttft
    # (affinity) computes it once and round robin twice. Ranks unnamed (routing.dp_ranks off),
    # each worker's controller takes its ranks in turn: every rank a request reaches computes it.
    # Named, the rank book keeps the prompt on one rank: as one cache.
    recs = [record(blocks=chain(1, 8), received=float(i), cached=None) for i in range(8)]
    urls = ["http://w0", "http://w1"]

    def captured(sizes: dict[str, int] | None, named: bool) -> dict[str, float]:
        return {r.policy: r.captured for r in replay(recs, urls, 10_000, dp_sizes=sizes, dp_ranks=named).results}

    one = captured(None, False)
    assert (one["ttft"], one["round_robin"]) == (pytest.approx(7 / 8), pytest.approx(6 / 8))
    ranks = dict.fromkeys(urls, 2)
    unnamed = captured(ranks, False)
    assert (unnamed["ttft"], unnamed["round_robin"]) == (pytest.approx(6 / 8), pytest.approx(4 / 8))
    assert captured(ranks, True) == pytest.approx(one)


def test_the_dp_ranks_of_the_newest_snapshot_shape_the_cache_estimate() -> None:
    recs = [record(blocks=chain(1, 4), received=float(i), cached=None) for i in range(4)]
    one = SnapshotSample(0.0, (WorkerSnapshot("http://w0", max_total_tokens=10_000),))
    two = SnapshotSample(1.0, (WorkerSnapshot("http://w0", max_total_tokens=10_000, dp_size=2),))
    assert signals.compute_signals(recs, [one], with_shadow=False).cache.captured == pytest.approx(3 / 4)
    assert signals.compute_signals(recs, [one, two], with_shadow=False).cache.captured == pytest.approx(2 / 4)


def test_reports_from_any_worker_turn_the_estimate_off() -> None:
    recs = [record(blocks=chain(1, 4), prompt=64, cached=0), record(blocks=chain(1, 4), prompt=64, cached=48)]
    assert not cache_signal(recs, 10_000).estimated


def test_available_is_floored_at_a_hit_that_happened() -> None:
    # A cache warm from before the window: the worker hit, the replay (starting cold) cannot.
    recs = [record(blocks=chain(1, 4), prompt=64, cached=48)]
    c = cache_signal(recs, 10_000)
    assert c.captured == c.available == c.reuse_ceiling == pytest.approx(48 / 64)


def test_replay_blocks_convert_to_reported_tokens() -> None:
    # The proxy estimated 64 tokens (4 blocks); the worker's tokenizer counted 80.
    recs = [record(blocks=chain(1, 4), prompt=80, received=0.0), record(blocks=chain(1, 4), prompt=80, received=1.0)]
    assert cache_signal(recs, None).available == pytest.approx(80 / 160)


def test_a_small_fleet_cache_lowers_available_below_the_ceiling() -> None:
    recs = [record(blocks=chain(i % 3, 4), received=float(i)) for i in range(30)]
    small = cache_signal(recs, 64)
    assert small.available == 0.0
    assert small.reuse_ceiling == pytest.approx(27 / 30)


def test_requests_without_cache_reports_get_an_estimate_marked_so() -> None:
    c = cache_signal([record(blocks=chain(1, 4), cached=None)], None)
    assert c.estimated and c.captured == 0.0 and c.available == 0.0 and c.reporting_requests == 1
    assert cache_signal([], None).captured is None


def test_fleet_capacity_sums_the_latest_sample_or_is_unknown() -> None:
    known = SnapshotSample(1.0, (WorkerSnapshot("a", max_total_tokens=100), WorkerSnapshot("b", max_total_tokens=50)))
    partial = SnapshotSample(2.0, (WorkerSnapshot("a", max_total_tokens=100), WorkerSnapshot("b")))
    assert cache_replay.fleet_capacity_tokens([known]) == 150
    assert cache_replay.fleet_capacity_tokens([known, partial]) is None
    assert cache_replay.fleet_capacity_tokens([]) is None


def test_occupancy_averages_per_worker_and_skips_stale_snapshots() -> None:
    def snap(url: str, running: int, usage: float, queued: int, stale: bool = False) -> WorkerSnapshot:
        return WorkerSnapshot(url, running=running, max_running_requests=10, token_usage=usage, queued=queued,
                              stale=stale, max_total_tokens=1000)

    samples = [
        SnapshotSample(0.0, (snap("a", 2, 0.2, 0), snap("b", 10, 0.9, 4))),
        SnapshotSample(1.0, (snap("a", 4, 0.4, 0), snap("b", 10, 0.1, 0, stale=True))),
    ]
    o = signals.occupancy_signal(samples)
    a, b = o.workers
    assert (a.worker, a.samples, a.occupancy_mean, a.occupancy_max) == ("a", 2, pytest.approx(0.3), 0.4)
    assert (b.samples, b.occupancy_mean, b.queued_mean) == (1, 1.0, 4.0)
    assert o.occupancy_mean == pytest.approx((0.2 + 1.0 + 0.4) / 3)
    assert o.queueing_share == pytest.approx(1 / 3)


def test_latency_split_reads_ok_requests_but_every_known_ttft() -> None:
    recs = [record(prefill=0.1 * (i + 1), queue=0.01 * i, overhead=0.001, gaps=(0.02, 0.04)) for i in range(10)]
    recs.append(record(prefill=100.0, outcome="error"))  # failed after its first token, 100 s in
    lat = signals.latency_signal(recs)
    # its TTFT was what it was: a tail read from the successful requests alone would hide it
    assert lat.ttft.n == 11 and lat.ttft.p95 == pytest.approx(100.0)
    assert lat.upstream_ttft.n == 10  # the other stages are the successful requests'
    assert lat.worker_queue.p50 == pytest.approx(0.04)
    assert (lat.itl.p50, lat.itl.p95) == (pytest.approx(0.02), pytest.approx(0.04))
    assert lat.itl_jitter == pytest.approx(2.0)
    total_ttft = sum(r.timing.ttft or 0 for r in recs[:10])
    assert lat.proxy_overhead_share == pytest.approx(0.010 / total_ttft)
    names = [name for name, _ in lat.stages]
    assert names[:5] == ["admission_wait", "prefix_hold", "proxy_overhead", "worker_queue", "prefill"]
    prefill = dict(lat.stages)["prefill"]
    assert prefill.p50 == pytest.approx(0.5)


@pytest.mark.parametrize(("why", "text_prompt", "expected"), [
    ("token ids: the hash block is in tokens", False, (20,)),
    ("text: a byte span over the learned bytes per token, nothing a page could divide", True, ()),
])
def test_only_hash_blocks_in_tokens_are_checked_against_page_sizes(why: str, text_prompt: bool,
                                                                   expected: tuple[int, ...]) -> None:
    rec = dataclasses.replace(record(blocks=chain(1, 2), block_tokens=20), text_prompt=text_prompt)
    assert signals.compute_signals([rec], []).block_tokens == expected, why


def test_compute_signals_collects_policies_block_and_page_sizes() -> None:
    recs = [record(blocks=chain(1, 2), policy="round_robin"), record(blocks=chain(1, 2), policy="round_robin")]
    sample = SnapshotSample(0.0, (WorkerSnapshot("http://w0", page_size=64, max_total_tokens=4096),))
    s = signals.compute_signals(recs, [sample])
    assert s.policies == ("round_robin",)
    assert s.block_tokens == (16,)
    assert s.page_sizes == (64,)
    assert s.cache.capacity_tokens == 4096
    assert s.gpu.available is False and s.gpu.idle_share is None
    assert s.window.requests == 2


def test_workers_of_several_dp_ranks_are_counted_from_the_newest_snapshot() -> None:
    recs = [record(blocks=chain(1, 2), policy="ttft")]
    old = SnapshotSample(0.0, (WorkerSnapshot("http://w0", dp_size=4), WorkerSnapshot("http://w1", dp_size=4)))
    new = SnapshotSample(1.0, (WorkerSnapshot("http://w0", dp_size=4), WorkerSnapshot("http://w1")))
    s = signals.compute_signals(recs, [old, new], with_shadow=False)
    assert (s.dp_workers, s.dp_ranks) == (1, False)
    assert signals.compute_signals(recs, [new], with_shadow=False, dp_ranks=True).dp_ranks is True
    assert signals.compute_signals(recs, [], with_shadow=False).dp_workers == 0


def test_long_prompts_use_the_growing_block_layout_of_prefix_key() -> None:
    # 40 blocks of a 16-token unit cover 32 x 16 + 8 x 32 = 768 tokens (blocks double after 32).
    blocks = chain(1, 40)
    recs = [record(blocks=blocks, prompt=768, received=0.0), record(blocks=blocks, prompt=768, received=1.0)]
    assert cache_signal(recs, None).available == pytest.approx(0.5)
    # A fleet cache of 700 tokens cannot keep all of it; parents survive, the tail is evicted.
    c = cache_signal(recs, 700)
    assert c.available is not None and 0.0 < c.available < 0.5


def test_the_itl_floor_and_the_big_prefills_come_from_the_window() -> None:
    from proxy.diagnose.signals import latency_signal

    # 9 fast decode steps and 1 step stuck behind a prefill, per request; one request in ten is a big prefill.
    records = [record(gaps=[0.01] * 9 + [0.2], prompt=4096 if i % 10 == 0 else 300, cached=0) for i in range(40)]
    lat = latency_signal(records)
    assert lat.itl_floor == pytest.approx(0.01)
    assert lat.itl.p95 == pytest.approx(0.2)
    assert lat.uncached_tokens_p95 == 4096


def test_the_shadow_replay_shows_what_a_prefix_policy_would_capture_on_round_robins_traffic() -> None:
    from proxy.diagnose.shadow import Replay, replay

    # 3 prompt groups (128 tokens each) on 2 workers whose KV share (300 tokens) holds two: round
    # robin's rotation sends every group to both and each cache thrashes; affinity keeps them.
    recs = [record(blocks=chain(i % 3, 8), worker=f"http://w{i % 2}", received=float(i), cached=0)
            for i in range(40)]
    results = {r.policy: r for r in replay(recs, ["http://w0", "http://w1"], 600).results}
    assert set(results) == {"ttft", "least_load", "round_robin"}
    assert results["ttft"].captured > results["round_robin"].captured + 0.1
    assert results["round_robin"].imbalance == pytest.approx(1.0)
    assert all(r.requests == 40 for r in results.values())
    assert replay([], ["http://w0"], None) == Replay()


def test_the_replay_estimates_what_the_same_prompts_take_on_idle_engines() -> None:
    from proxy.diagnose.shadow import replay
    from proxy.diagnose.shadow_ttft import Placed, TtftModel

    # Unique prompts of 64-192 tokens every 50 ms on one worker whose TTFT is mostly load: 0.08-0.15 s
    # alone, plus 0.1 s per request still running there and 0.2 ms per uncached token ahead.
    truth = TtftModel((0.05, 0.0005, 0.0002, 0.1))
    sizes = [4 + i % 9 for i in range(60)]  # blocks of 16 tokens
    placed = [Placed(0.05 * i, "http://w0", 16.0 * n, 0.3) for i, n in enumerate(sizes)]
    ttfts = truth.ttfts(placed)
    recs = [record(blocks=chain(i, n), received=p.at, prefill=t, gaps=(0.15, 0.15))
            for i, (n, p, t) in enumerate(zip(sizes, placed, ttfts, strict=True))]
    r = replay(recs, ["http://w0"], None)
    alone = sorted(0.05 + 0.0005 * p.uncached for p in placed)
    assert r.unloaded_ttft_p95 == pytest.approx(alone[int(0.95 * len(alone))], abs=0.01)
    measured = sorted(ttfts)[int(0.95 * len(ttfts))]
    assert measured > 4 * r.unloaded_ttft_p95
    # ...and nothing to estimate from without a fit
    assert replay(recs[:5], ["http://w0"], None).unloaded_ttft_p95 is None


def test_the_fastest_of_the_biggest_prompts_is_measured_on_their_own() -> None:
    from proxy.diagnose.signals import latency_signal

    # 45 small prompts answered in 50 ms; 5 of 4,000 uncached tokens in 2.5-2.9 s.
    small = [record(prompt=200, prefill=0.05) for _ in range(45)]
    big = [record(prompt=4000, prefill=2.5 + 0.1 * k) for k in range(5)]
    lat = latency_signal(small + big)
    assert lat.ttft_big_p10 == pytest.approx(2.5, abs=0.01)
    # at least five: with 4 big ones the fifth biggest is small, and every one as big counts
    assert latency_signal(small + big[:4]).ttft_big_p10 == pytest.approx(0.05)
    assert latency_signal(big[:4]).ttft_big_p10 is None  # fewer than five requests: no figure
    # prompts all of one size: all count, whatever their order (not the slowest or the first tenth)
    even = [record(prompt=1000, prefill=3.0 if k < 5 else 0.05) for k in range(50)]
    assert latency_signal(even).ttft_big_p10 == pytest.approx(0.05)


def fleet(at: float, generations: dict[str, int]) -> SnapshotSample:
    return SnapshotSample(at=at, workers=tuple(WorkerSnapshot(url=u, healthy=True, generation=g)
                                               for u, g in generations.items()))


def test_a_flush_of_every_worker_starts_the_cache_replay_over() -> None:
    # Without reports: a prompt twice on w0, the fleet's caches flushed between (a /flush_cache
    # through radixgate, or the scraper seeing them emptied: a new generation for each).
    recs = [record(blocks=chain(1, 4), worker="http://w0", received=t, cached=None) for t in (0.0, 2.0)]
    samples = [fleet(0.5, {"http://w0": 0, "http://w1": 0}), fleet(1.5, {"http://w0": 1, "http://w1": 1})]
    resets = cache_replay.cache_resets(samples)
    assert resets.fleet == 1.5 and resets.by_worker == {"http://w0": (1.5,), "http://w1": (1.5,)}
    assert cache_signal(recs, 10_000).captured == pytest.approx(64 / 128)  # as if nothing happened
    after = cache_signal(recs, 10_000, resets)
    assert after.reporting_requests == 1 and after.captured == after.available == 0.0
    # The same through compute_signals, which finds the resets in the window's snapshots.
    assert signals.compute_signals(recs, samples, with_shadow=False).cache.captured == 0.0


def test_one_workers_restart_empties_its_own_cache_model_only() -> None:
    recs = [record(blocks=chain(1, 4), worker="http://w0", received=t, cached=None) for t in (0.0, 2.0)]
    samples = [fleet(0.5, {"http://w0": 0, "http://w1": 0}), fleet(1.5, {"http://w0": 1, "http://w1": 0})]
    resets = cache_replay.cache_resets(samples)
    assert resets.fleet is None and resets.by_worker == {"http://w0": (1.5,)}
    c = cache_signal(recs, 10_000, resets)
    assert c.reporting_requests == 2
    assert c.captured == 0.0  # w0 restarted: its repeat found nothing
    assert c.available == pytest.approx(64 / 128)  # a fleet-wide cache (the others' share) still could


def test_a_window_whose_ttft_is_all_load_gives_no_idle_estimate_rather_than_zero() -> None:
    from proxy.diagnose.shadow import replay
    from proxy.diagnose.shadow_ttft import Placed, TtftModel

    # TTFT made only of what is ahead and decoding on the worker (the fit puts nothing on a
    # prompt's own tokens, as on the H100 fleet's knee in run 78): an idle engine's 0 s is no
    # estimate; the load rule then falls back on what the biggest prompts measured.
    truth = TtftModel((0.0, 0.0, 0.0004, 0.2))
    sizes = [4 + i % 9 for i in range(60)]
    placed = [Placed(0.05 * i, "http://w0", 16.0 * n, 0.5) for i, n in enumerate(sizes)]
    ttfts = truth.ttfts(placed)
    assert sorted(ttfts)[57] > 0.5  # loaded: the p95 is well above anything a prompt costs alone
    recs = [record(blocks=chain(i, n), received=p.at, prefill=t, gaps=(0.25, 0.25))  # decodes of 0.5 s
            for i, (n, p, t) in enumerate(zip(sizes, placed, ttfts, strict=True))]
    assert replay(recs, ["http://w0"], None).unloaded_ttft_p95 is None
