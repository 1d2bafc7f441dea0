"""Tune rules about the prefix cache: routing that loses reuse, a KV pool too small for the working
set, mixed page sizes, one hot prefix on too few workers (``rules.py`` lists every rule)."""

from __future__ import annotations

import math

from proxy.diagnose.findings import PREFIX_BLIND_POLICIES, TUNE, Evidence, Finding, Lever, RuleParams, ev
from proxy.diagnose.rule_common import data_weight, strength
from proxy.diagnose.shadow import ShadowResult
from proxy.diagnose.signals import Signals


def rule_cache_routing(s: Signals, p: RuleParams) -> Finding | None:
    c = s.cache
    if c.captured is None or c.available is None or c.reporting_requests < p.min_cache_reports:
        return None
    gap = c.available - c.captured
    evidence = [
        ev("cache.available", c.available, ">=", p.min_available),
        ev("cache.available - cache.captured", gap, ">=", p.capture_gap),
        ev("cache.captured / cache.available", c.captured / c.available if c.available else None,
           "<=", p.capture_ratio),
    ]
    if not all(e.holds for e in evidence):
        return None
    mismatched = [ps for ps in s.page_sizes if ps > 1 and any(bt % ps for bt in s.block_tokens)]
    blind = [pol for pol in s.policies if pol in PREFIX_BLIND_POLICIES]
    kv_full = ev("occupancy.token_usage_mean", s.occupancy.token_usage_mean, ">=", p.saturation)
    # workers of several DP ranks, their ranks not named: each rank a cache of its own, found by chance
    dp_spread = s.dp_workers > 0 and not s.dp_ranks
    if dp_spread:
        evidence.append(Evidence("workers with DP ranks (dp_size > 1)", float(s.dp_workers), ">", 0.0, True,
                                 "routing.dp_ranks off"))
    evidence.append(kv_full)
    head = f"workers captured {c.captured:.0%} of prompt tokens from cache against {c.available:.0%} available"
    if c.estimated:
        head += " (estimated by the proxy: the workers report no cached tokens)"
    levers: list[Lever] = []
    if blind or not s.policies:
        cause = "routing"
        summary = (f"{head}: the routing policy ({', '.join(blind) or 'unknown'}) spreads shared prefixes "
                   "over every worker, so each cache holds every prefix and keeps none")
        levers.append(Lever("routing.policy", "radixgate",
                            "switch to a prefix-affinity policy (cache_aware or the cost-based policy)"))
        if dp_spread:
            levers.append(Lever("routing.dp_ranks", "radixgate",
                                f"true as well: {s.dp_workers} workers run data-parallel ranks, each with its own cache"))
    elif mismatched:
        cause = "page_size_mismatch"
        summary = f"{head}: the worker page size does not line up with radixgate's hash block"
    elif dp_spread:
        cause = "dp_ranks"
        summary = (f"{head} with affinity routing ({', '.join(s.policies)}): {s.dp_workers} of {s.workers} "
                   "workers run data-parallel ranks, each rank with its own cache, and the worker's own "
                   "controller spreads a prefix's requests over its ranks")
        levers.append(Lever("routing.dp_ranks", "radixgate",
                            "true: name each request's rank, so a prefix's followers go to the rank holding it"))
    elif kv_full.holds:
        cause = "cache_eviction"
        summary = f"{head} with affinity routing on and KV usage high: worker caches evict under memory pressure"
        levers.append(Lever("--mem-fraction-static / --max-total-tokens", "sglang",
                            "raise the KV pool so routed prefixes survive until reuse"))
    else:
        cause = "routing"
        summary = (f"{head} with affinity routing ({', '.join(s.policies)}): it balances away from the "
                   "worker that holds the prefix")
        levers.append(Lever("routing.params (load-balance threshold, prefix index size)", "radixgate",
                            "let affinity win more often; size the prefix index to the worker KV pool"))
    if mismatched:
        levers.append(Lever("--page-size / radixgate hash block size", "sglang",
                            f"make the hash block ({', '.join(map(str, s.block_tokens))} tokens) a multiple "
                            f"of the worker page size ({', '.join(map(str, mismatched))})"))
        evidence.append(Evidence("worker page_size", float(mismatched[0]), "does not divide",
                                 float(s.block_tokens[0]), True, "hash block tokens"))
    conf = data_weight(s, p) * strength(c.captured / c.available, p.capture_ratio, above=False)
    best = _best_shadow(s)
    if best is not None and cause == "routing":
        current = max((r.captured for r in s.shadow if r.policy in s.policies), default=None)
        # Replayed on this window's traffic (shadow.py): the alternative to switch to, and by how much.
        summary += (f"; replayed on this traffic, {best.policy} would capture {best.captured:.0%}"
                    + (f" against {current:.0%} for {', '.join(s.policies)}" if current is not None else ""))
        evidence.append(ev(f"shadow[{best.policy}].captured", best.captured, ">", current))
        gain = ""
        if best.ttft_p95 is not None and best.as_placed_ttft_p95:
            # the same model on this window's own placements is the baseline: its error cancels
            ratio = best.ttft_p95 / best.as_placed_ttft_p95
            gain = f", TTFT p95 predicted {ratio:.2f}x this window's"
            evidence.append(ev(f"shadow[{best.policy}].ttft_p95{PREDICTED_GAIN}", ratio, "<", 1.0))
        levers.insert(0, Lever("routing.policy", "radixgate",
                               f"{best.policy}: it captured {best.captured:.0%} in the shadow replay of this window{gain}"))
        if best.captured > 0:
            # A replay of this very traffic through the better policy is positive evidence: the
            # larger the share of its reuse the current policy misses, the surer the finding (on
            # the GPU fleet, round robin's 33% against ttft's 65% replayed ranked only level with
            # a stall finding whose lever did not apply, while routing cost 8x in TTFT p95).
            missed = 1.0 - (c.captured if current is None else current) / best.captured
            conf += (1.0 - conf) * data_weight(s, p) * max(0.0, missed)
        if best.ttft_p95 is not None and best.as_placed_ttft_p95:
            # ...and so is the TTFT it predicts: a switch predicted to cut the tail comes before
            # buying capacity for it (the GPU harness on simulated engines, round robin at 6/s:
            # overload 0.85 ranked above routing 0.83 while ttft's p95 was a quarter of its).
            conf += (1.0 - conf) * data_weight(s, p) * max(0.0, 1.0 - best.ttft_p95 / best.as_placed_ttft_p95)
    return Finding("cache_routing", TUNE, cause, summary, conf, tuple(evidence), tuple(levers))


PREDICTED_GAIN = " / as placed"


def predicts_gain(f: Finding) -> bool:
    """A routing finding whose shadow replay predicts a lower TTFT p95 for the policy it names."""
    return f.rule == "cache_routing" and any(e.signal.endswith(PREDICTED_GAIN) and e.holds for e in f.evidence)


def _best_shadow(s: Signals) -> ShadowResult | None:
    """The shadow policy that captured most, if it is not the one in use."""
    if not s.shadow:
        return None
    best = max(s.shadow, key=lambda r: r.captured)
    return None if best.policy in s.policies else best


def rule_cache_capacity(s: Signals, p: RuleParams) -> Finding | None:
    c = s.cache
    if c.capacity_tokens is None or c.available is None or c.reuse_ceiling is None:
        return None
    if c.reporting_requests < p.min_cache_reports:
        return None
    evidence = [
        ev("cache.reuse_ceiling", c.reuse_ceiling, ">=", p.min_available),
        ev("cache.reuse_ceiling - cache.available", c.reuse_ceiling - c.available, ">=", p.capacity_gap,
           note=f"fleet KV capacity {c.capacity_tokens} tokens"),
    ]
    if not all(e.holds for e in evidence):
        return None
    summary = (f"the workload reuses {c.reuse_ceiling:.0%} of its prompt tokens but a fleet cache of "
               f"{c.capacity_tokens} tokens can hold only enough for {c.available:.0%}: the KV pool is "
               "too small for the working set")
    levers = (
        Lever("--mem-fraction-static", "sglang", "raise it (more GPU memory for the KV pool)"),
        Lever("--max-total-tokens", "sglang", "remove or raise the cap on the KV pool"),
        Lever("replicas", "fleet", "add workers: with affinity routing total cache grows with the fleet"),
    )
    conf = data_weight(s, p) * strength(c.reuse_ceiling - c.available, p.capacity_gap)
    return Finding("cache_capacity", TUNE, "cache_capacity", summary, conf, tuple(evidence), levers)


def rule_hot_prefix(s: Signals, p: RuleParams) -> Finding | None:
    """One shared prefix (a global system prompt) carries more requests than one worker can
    prefill, but affinity keeps it on too few workers: its own requests queue there."""
    hot, n = s.hot_prefix, s.workers
    if hot is None or n < 2 or hot.workers < 1:
        return None
    needed = math.ceil(hot.share * n)
    share = ev("hot_prefix.share x workers", hot.share * n, ">=", p.hot_prefix_share)
    # Judged per worker that served it, not by a count short of ``needed``: the ttft policy on the
    # hot-prefix scenario (40 clients, time_scale 4) kept 80% of requests on 3 of 4 workers, 1.07
    # workers' share each, and its TTFT was then the fleet's capacity, not the prefix's placement;
    # cache_aware on 1 of 4 puts 3.2 on that one.
    spread = ev("hot_prefix.share x workers / hot_prefix.workers", hot.share * n / hot.workers, ">=",
                p.hot_prefix_share)
    slow = ev("hot_prefix.ttft_p95_s", hot.ttft_p95, ">", p.slo_ttft_p95_s)
    if not (share.holds and spread.holds and slow.holds):
        return None
    summary = (f"one shared prefix carries {hot.share:.0%} of requests (about {needed} workers' share) but ran on "
               f"{hot.workers}: its requests queue there (their TTFT p95 {hot.ttft_p95:.2f}s)")
    levers = (*_spill_levers(s.policies), Lever("replicas", "fleet", "more workers for the prefix that needs them"))
    # The TTFT miss alone says how slow, not why; the further its spread falls short of what its
    # share needs, the surer the why (cache_aware pinning 80% of requests on 1 of 4 workers:
    # shortfall 0.75, its TTFT p95 1.5x the SLO, the other three all but idle).
    conf = strength(hot.ttft_p95, p.slo_ttft_p95_s)
    conf = data_weight(s, p) * (conf + (1.0 - conf) * (1.0 - hot.workers / needed))
    return Finding("hot_prefix", TUNE, "hot_prefix", summary, conf, (share, spread, slow), levers)


def _spill_levers(policies: tuple[str, ...]) -> tuple[Lever, ...]:
    """The setting that lets the policy in use put a hot prefix on more workers (its replication)."""
    levers: list[Lever] = []
    if "cache_aware" in policies:
        # A hit goes to the prefix's holder unless max - min in-flight > balance_abs_threshold
        # (64, the sglang-router default) and max > min x balance_rel_threshold: one proxy's
        # clients rarely put 64 more in flight on one worker, so the hot prefix never spills.
        levers.append(Lever("routing.params.balance_abs_threshold (cache_aware)", "radixgate",
                            "lower it (64 by default) to a few requests, so the least-loaded worker takes "
                            "the hot prefix's overflow and caches it too"))
    if "ttft" in policies or not policies:
        levers.append(Lever("routing.params (work_weight, tie_rel)", "radixgate",
                            "let the hot prefix spill to more workers sooner; its prefill is cheaper than the queue"))
    if policies and "ttft" not in policies:
        levers.append(Lever("routing.policy", "radixgate",
                            "ttft: it spills a prefix once its holder's queue costs more than a recomputed prefill"))
    return tuple(levers)


def rule_mixed_page_sizes(s: Signals, p: RuleParams) -> Finding | None:
    """Workers of one pool with different KV page sizes: radixgate's hash block must be a multiple
    of all of them (their least common multiple), so prefix matches are only as fine as the coarsest
    combination, and the same prompt pages differently on each worker."""
    sizes = sorted({ps for ps in s.page_sizes if ps > 0})
    if len(sizes) < 2:
        return None
    evidence = (Evidence("distinct worker page sizes", float(len(sizes)), ">=", 2.0, True,
                         ", ".join(map(str, sizes))),)
    levers = (Lever("--page-size", "sglang", f"one page size across the pool (now {', '.join(map(str, sizes))})"),)
    summary = f"the workers run different KV page sizes ({', '.join(map(str, sizes))}): one pool, one --page-size"
    return Finding("mixed_page_sizes", TUNE, "page_size_mismatch", summary, 0.9 * data_weight(s, p), evidence, levers)
