"""ttft (default): send each request where its estimated time to first token is smallest.

Model, per healthy worker w, for a request of P prompt tokens (fitted online: ``ttft_model``):
    cached_w   = tokens of the longest prefix w probably holds (``PrefixIndex``), at most P
    uncached_w = P - cached_w
    unseen_w   = uncached tokens of our requests (and our peers') on w still without a first token:
                 from our books, which know when each has one (``own_exact``; else only ours sent
                 since its scraped state last changed, the older ones left to the scrape)
    queued_w   = the other senders' queued tokens: the last scrape's ``waiting_uncached_tokens``
                 (else ``queued`` x the mean uncached size of our requests) less ours it counted
    running_w  = its batch: the scrape's less ours it counted, plus ours in flight there (before
                 any scrape, ours and our peers' in flight there: ``on_peer_load``)
    waiting_w  = requests there without a first token: the others' in the scrape's queue and ours
                 (``waiting_requests``)
    kv_wait_w  = seconds it would wait there for room in the KV pool, from the contexts we (and
                 our peers) have in flight there against its ``max_total_tokens`` (``ttft_kv.py``;
                 counted whole, or a shared prefix once with ``kv_wait_counts`` "blocks"; 0 unless
                 ``kv_wait``, off by default: even with the rule without it on the GPU)
    ttft_w     = f_w x (c0 + c1 x uncached_w + c2 x unseen_w + c3 x queued_w + c4 x running_w
                        + c5 x waiting_w + c6 x kv_wait_w)
                 c0..c6 fitted fleet-wide from every observed TTFT; f_w per worker (1 unless
                 ``factor_alpha`` > 0: a fleet of unequal GPUs)
    score_w    = ttft_w + ``work_weight`` x c1 x f_w x uncached_w
The second term charges the prefill this request adds to the worker, which delays every later
request there: greedy TTFT alone would send a follow-up of a prefix still being prefilled on its
holder to an idle worker and pay that prefix twice. With it, reuse wins unless the holder's queue
and decode batch cost more than recomputing the prefix elsewhere (``work_weight`` 0 = greedy).
Pick the smallest score among workers that are not saturated; scores within
``max(tie_abs_s, tie_rel x best)`` of the best count as tied, and among those the longest prefix
match wins (affinity). Then (``tie_break`` "rendezvous", the default):
* among workers holding more than ``cold_blocks`` blocks of it: the fewest recent picks, then the
  least recently picked, so a hot prefix held by several workers shares their load;
* otherwise the rendezvous (highest-random-weight) order of the hash of the prompt's first
  ``key_blocks`` blocks, which every proxy computes alike: independent proxies that share
  nothing send a new group, and a spilled group's overflow, to the same worker;
* for a cold prompt (no worker holds more than ``cold_blocks`` blocks; scores within
  ``cold_tie_prefills`` of its own prefill time count as tied): the worker with the fewest
  requests outstanding (ours, and what our peers last said they have there), then the first in that order whose count of recent cold placements (ours
  and our peers') is within ``cold_slack`` of the fewest. Load first: on the real GPU fleet
  (4 engines, 32 groups, 4.5 req/s), placing new groups where fewer requests were outstanding gave
  TTFT p95 1.3-1.5 s (cache_aware, smg) against 2.6-3.2 s for an even count of groups per worker
  (the static oracle, and this rule before): a phase's groups differ in popularity, and a worker
  that drew popular ones is busy. Cold placements break the remaining ties, so new groups and
  unique prompts spread evenly even at concurrency 1 (never "first in the list"). With
  ``popularity`` (the default; GPU runs 33-35: TTFT p95 0.74-1.03x the rule without it) the
  worker whose placed groups have brought the least traffic comes first, then the fewest
  outstanding (``ttft_popularity.py``).
  ``cold_choices`` > 0 looks only at the first that many in hash order: proxies that share
  nothing then still agree more often, at the price of a less even spread.
Hold: when the chosen worker's match is, for at least ``hold_tokens`` tokens, a prefix that a
streamed request sent there earlier (ours, or a peer's) is still prefilling, nothing is sent: the
decision is branch ``hold`` with ``after`` naming that request, and the proxy selects again once
its first token arrives, or after ``hold_s`` or ``routing.hold_max_s``, whichever comes first.
``hold_s`` is what the model says recomputing that unconfirmed part costs on the worker, plus the
prefill queued ahead there (the holder's included), which the request would wait for anyway if
sent now: a hold never costs more than recomputing the prefix. Sent at once, it would reach the
engine before the prefix is cached; SGLang's default FCFS scheduler then batches the two prompts
together and computes their shared prefix twice. In a burst of new groups, that duplicated
prefill was a third of all prefill work (64 groups x 16 @128, 32 seeds: p95 0.143 s without holds,
0.110 with). A hold that times out calls ``on_peer_prefilled`` for its key: nobody waits for it again.
Behind several proxies, each can tell the others its decisions (``on_peer_decision``, fed by
``proxy/peers.py``): they land in its index as its own would, count in its cold spread, and their
uncached tokens count as ``unseen`` on their worker until the peer reports the first token
(``on_peer_prefilled``) or a newer scrape covers them.
"recent" breaks every tie by recent picks (one proxy's exact rotation; replicas disagree), "hash"
by the hash alone. Saturated: stale snapshot, ``token_usage >= token_usage_limit``, every running
slot taken with a queue behind it, or our own ``in_flight >= max_in_flight`` (0 = off; admission
normally bounds it). If every worker is saturated the smallest score among all wins.

Branches: ``affinity`` (chose the longest match, > 0), ``spill`` (a worker holding more of the
prefix was passed over for load or saturation), ``balance`` (no worker holds any of it),
``saturated`` (every worker saturated), ``only`` (one healthy worker), ``hold`` (wait, above).

The routed prompt is recorded in the chosen worker's index; its first token (``on_first_token``,
streamed answers) or else its completion confirms it there and corrects the index by the reported
``cached_tokens``; ``on_complete`` feeds the model. The policy keeps our
in-flight requests per worker, so the pipeline must call ``on_complete`` once per ``select``
(``ok=False`` on failure); a per-worker cap bounds the table if it does not.

Complexity: per decision O(W log B) index lookups + O(B) to record the prompt (B = blocks of
the prompt, 128 for 32k tokens) + O(W + requests sent since the last scrape) for pending work.

When to choose it: the default. Shared prefixes of any size, uneven prompt lengths, bursts.
Params and their defaults: ``ttft_params.py``. The per-worker inputs (pending prefill, saturation)
are kept by ``ttft_estimate.py``, the tie orders by ``ttft_ties.py``.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Mapping, Sequence

from proxy.routing.base import (
    Completion,
    Decision,
    FirstToken,
    NoWorkerAvailable,
    RouteRequest,
    WorkerSnapshot,
    healthy,
    past_mean,
)
from proxy.routing.consistent_hash import routing_key
from proxy.routing.prefix_index import PrefixIndex
from proxy.routing.prefix_key import blocks_within, uncached_tokens
from proxy.routing.registry import PolicySpec
from proxy.routing.ttft_estimate import Estimate, InFlight, PendingWork, saturated, signature
from proxy.routing.ttft_kv import KvReads
from proxy.routing.ttft_model import Features, TtftModel, TtftPrior
from proxy.routing.ttft_params import TtftParams
from proxy.routing.ttft_popularity import Popularity
from proxy.routing.ttft_ties import PickHistory


class TtftCost:
    name = "ttft"

    def __init__(self, params: TtftParams) -> None:
        self.params = params
        self.index = PrefixIndex(params.default_capacity_tokens)
        self.model = TtftModel(
            TtftPrior(params.prior_base_s, params.prior_prefill_tokens_per_s, params.prior_decode_s_per_running),
            forgetting=params.forgetting,
            factor_alpha=params.factor_alpha,
            own_at_least_ahead=params.own_at_least_ahead,
        )
        # Prefill the scraped state cannot show yet (ours in flight, our peers'), and tie-break counts.
        self.pending = PendingWork(params.max_tracked_per_worker, params.own_exact,
                                   count_blocks=params.kv_wait and params.kv_wait_counts == "blocks")
        self.picks = PickHistory(params)
        self.popularity = Popularity()
        self.kv_reads = KvReads()

    # -- model inputs --------------------------------------------------------------------------

    def pending_prefill(self, worker: WorkerSnapshot) -> tuple[int, int]:
        """(unseen, queued): our tokens sent since the last scrape (and our peers'), and that
        scrape's queue."""
        return self.pending.pending_prefill(worker)

    def running(self, worker: WorkerSnapshot) -> int:
        return self.pending.running(worker)

    def saturated(self, worker: WorkerSnapshot) -> bool:
        return saturated(worker, self.params)

    def cold_placements(self, url: str) -> float:
        return self.picks.cold_placements(url)

    def recent_picks(self, url: str) -> float:
        return self.picks.recent_picks(url)

    def model_terms(self) -> dict[str, float]:
        """The learned TTFT model (``ExplainsModel``: ``radixgate_routing_ttft_model``)."""
        return self.model.terms()

    def estimate(self, request: RouteRequest, worker: WorkerSnapshot) -> Estimate:
        matched = in_index = self.index.held(worker.url, request.block_hashes)
        tokens = None
        if worker.kv is not None and request.prompt_ids and not request.cache_scoped:
            # The engine's own events, where it publishes them: they raise the match (what others
            # sent there too) and lower it on a reported removal, never for a block they have not
            # mentioned yet (ours, still prefilling, or stored before its event came).
            exact = worker.kv.match(request.prompt_ids)
            if exact is not None:
                blocks = blocks_within(exact.tokens, request.block_tokens, len(request.block_hashes))
                if blocks >= matched or exact.evicted:
                    matched, tokens = blocks, min(exact.tokens, request.prompt_tokens)
        unseen, queued, waiting = self.pending.ahead(worker)
        uncached = request.prompt_tokens - tokens if tokens is not None else uncached_tokens(request, matched)
        x = Features(uncached, unseen, queued, self.running(worker),
                     waiting if self.params.waiting_requests else 0, self.kv_wait(request, worker))
        ttft = self.model.predict(worker.url, x)
        p = self.params
        score = ttft + p.work_weight * x.uncached * self.model.seconds_per_token(worker.url) + p.decode_balance_s * x.running
        return Estimate(worker.url, ttft, score, matched, x, self.saturated(worker), tokens, in_index)

    def _fleet_has_room(self, request: RouteRequest, workers: Sequence[WorkerSnapshot]) -> bool:
        """Whether the contexts in flight on the healthy workers, and this request's, fit their KV
        pools taken together (``KvReads.fleet_fits``)."""
        pools = [(self._kv_held(w.url), w.max_total_tokens) for w in healthy(workers)]
        return self.kv_reads.fleet_fits(pools, self.kv_reads.context(request.prompt_tokens))

    def kv_wait(self, request: RouteRequest, worker: WorkerSnapshot) -> float:
        """Seconds ``request`` would wait on ``worker`` for room in its KV pool (``ttft_kv.py``)."""
        if not self.params.kv_wait:
            return 0.0
        own = request.prompt_tokens
        if self.params.kv_wait_counts == "blocks":  # what it shares with requests there is stored once
            own = self.pending.new_tokens(worker.url, request)
        return self.kv_reads.wait(self._kv_held(worker.url), self.kv_reads.context(own), worker.max_total_tokens)

    def _kv_held(self, url: str) -> float:
        """The KV the requests in flight on ``url`` hold by their ends (``kv_wait_counts``)."""
        if self.params.kv_wait_counts == "blocks":
            return self.kv_reads.held(*self.pending.distinct_in_flight(url))
        return self.kv_reads.held(*self.pending.prompts_in_flight(url))

    # -- Policy --------------------------------------------------------------------------------

    def select(self, request: RouteRequest, workers: Sequence[WorkerSnapshot]) -> Decision:
        candidates = healthy(workers)
        if not candidates:
            raise NoWorkerAvailable("no healthy worker")
        self.index.sync(workers)
        if self.params.popularity:
            self.popularity.sync(workers)
        exact = [self.estimate(request, w) for w in candidates]
        estimates = self._evicted_homes(exact) if self.params.evicted_home else exact
        pool = [e for e in estimates if not e.saturated] or estimates
        best = min(e.score for e in pool)
        longest = max(e.matched_blocks for e in estimates)
        cold = self.params.tie_break == "rendezvous" and longest <= self.params.cold_blocks
        margin = max(self.params.tie_abs_s, self.params.tie_rel * best)
        if cold and self.params.cold_tie_prefills:
            margin = max(margin, self.params.cold_tie_prefills * min(
                e.features.uncached * self.model.seconds_per_token(e.url) for e in pool))
        tied = [e for e in pool if e.score <= best + margin]
        load = self.popularity.load if self.params.popularity else None
        chosen = min(tied, key=self.picks.cold_order(request, tied, self.pending.outstanding, load) if cold
                     else self.picks.tie_order(request))
        chosen = self._guard_spill(chosen, pool, longest, request, candidates)
        chosen = self._over_mean(chosen, pool, longest, request, candidates)
        if cold:
            self.picks.count_cold(chosen.url)
        if len(candidates) == 1:
            branch = "only"
        elif all(e.saturated for e in estimates):
            branch = "saturated"
        elif longest == 0:
            branch = "balance"
        elif chosen.matched_blocks == longest:
            branch = "affinity"
        else:
            branch = "spill"
        # what the engine holds, whatever placed it (the peers' and the metrics' cached tokens)
        chosen = next(e for e in exact if e.url == chosen.url)
        held = self._prefilling(request, chosen)
        if held is not None:
            holder, saved = held
            return Decision(chosen.url, "hold", matched_blocks=chosen.matched_blocks, after=holder,
                            hold_s=self.hold_worth(chosen, saved), reason="its prefix is being prefilled there")
        worker = next(w for w in candidates if w.url == chosen.url)
        self._remember(request, chosen, signature(worker))
        self._count_traffic(request, chosen.url, longest <= self.params.cold_blocks)
        reason = (f"ttft={chosen.ttft_s * 1e3:.1f}ms pending={chosen.pending} uncached={chosen.uncached} "
                  f"f={self.model.factor(chosen.url):.2f}")
        if branch == "spill":
            # Why a follower left its prefix's holder, in the request log (a GPU run's evidence).
            holder = max(estimates, key=lambda e: e.matched_blocks)
            reason += (f" holder={holder.url} holder_score={holder.score * 1e3:.1f}ms "
                       f"chosen_score={chosen.score * 1e3:.1f}ms holder_f={self.model.factor(holder.url):.2f}"
                       f"{' holder_saturated' if holder.saturated else ''}")
        return Decision(chosen.url, branch, matched_blocks=chosen.matched_blocks, reason=reason,
                        matched_tokens=chosen.matched_tokens)

    def _evicted_homes(self, estimates: list[Estimate]) -> list[Estimate]:
        """Where no worker's events hold more of the prompt than a cold one's, the workers our index
        placed its prefix on count as its holders again, for placement alone (its cost stays the
        recompute, exact): the group's home. Evicted everywhere, the prompt costs its prefill
        wherever it goes; placed anew by load it splits its group over the fleet, and a pool too
        small for the groups then holds more of them on every worker and evicts more. In the
        simulator (``bench_routing`` shared_prefix at 64 req/s, 4 workers, seeds 0-3) one proxy on
        the events read 1.18x the approximate index's TTFT p95 at 40k tokens a worker and 1.12x at
        48k; with their homes 1.01x at both. On the GPU fleet (runs 121-122, 24k-token pools) the
        events read 1.06x, with their homes 0.96x: inside a router's own spread."""
        if max(e.matched_blocks for e in estimates) > self.params.cold_blocks:
            return estimates
        return [e._replace(matched_blocks=e.index_blocks)
                if e.index_blocks is not None and e.index_blocks > max(self.params.cold_blocks, e.matched_blocks) else e
                for e in estimates]

    def _count_traffic(self, request: RouteRequest, url: str, cold: bool) -> None:
        """``popularity``: one request of its prompt key sent to ``url``, which a cold one places it on."""
        if not self.params.popularity or not (request.block_hashes or request.session_key):
            return
        key = routing_key(request, self.params.key_blocks)
        if cold:
            self.popularity.place(key, url, request.prompt_tokens)
        self.popularity.seen(key)

    def _guard_spill(self, chosen: Estimate, pool: Sequence[Estimate], longest: int, request: RouteRequest,
                     workers: Sequence[WorkerSnapshot]) -> Estimate:
        """With ``spill_guard`` g > 0: leave the prefix's holder only for a worker whose pending
        prefill plus running batch is under (1 - g) of the holder's. On the GPU fleet past its
        capacity (7.5 req/s) the cost model moved followers between equally loaded engines and
        spread 20 of 31 groups over 2-3 engines (reuse 51% against 74% for cache_aware, which
        never moved them): recomputing a prefix elsewhere adds work for everyone when every
        engine is busy, and it only pays when the other worker is clearly less loaded, and has
        room for it (``_has_room``)."""
        g = self.params.spill_guard
        if g <= 0 or chosen.matched_blocks >= longest:
            return chosen
        holders = [e for e in pool if e.matched_blocks == longest]
        if not holders:
            return chosen
        holder = min(holders, key=lambda e: e.score)
        if holder.features.kv_wait > chosen.ttft_s and chosen.features.kv_wait == 0 and self._fleet_has_room(request, workers):
            # The holder has no room for it and this worker has: waiting there alone costs more
            # than the whole first token here, recompute included (the GPU fleet's tail,
            # ``ttft_kv.py``). Only while the pools together hold what is in flight: past that a
            # move recomputes a prefix to fill another pool in turn (GPU runs 40-42, past the
            # knee: 12-19 such spills a cell, reuse 2-4 points lower, p95 even). Between workers
            # both short of room, the guard below stands.
            return chosen

        def load(e: Estimate) -> float:
            return e.features.unseen + e.features.queued + e.features.running * self.pending.mean_uncached

        return chosen if load(chosen) < (1.0 - g) * load(holder) and self._has_room(chosen.url, request, workers) \
            else holder

    def _over_mean(self, chosen: Estimate, pool: Sequence[Estimate], longest: int, request: RouteRequest,
                   workers: Sequence[WorkerSnapshot]) -> Estimate:
        """With ``spill_over_mean`` r > 0: a follower on its prefix's holder goes instead to the
        best-scored worker at or under the mean outstanding when the holder's outstanding passes
        the mean by max(4, 2 sqrt(mean)) and by r x mean (smg 1.13.0's spill gate), if that
        worker has room for it (``_has_room``)."""
        r = self.params.spill_over_mean
        if r <= 0 or longest <= self.params.cold_blocks or chosen.matched_blocks < longest or len(pool) < 2:
            return chosen
        counts = {e.url: self.pending.outstanding(e.url) for e in pool}
        if not past_mean(counts[chosen.url], list(counts.values()), r):
            return chosen
        mean = sum(counts.values()) / len(counts)
        target = min((e for e in pool if counts[e.url] <= mean), key=lambda e: e.score, default=chosen)
        return target if self._has_room(target.url, request, workers) else chosen

    def _has_room(self, url: str, request: RouteRequest, workers: Sequence[WorkerSnapshot]) -> bool:
        """Whether ``url``'s KV pool holds this prompt beside the prefixes placed there that are still
        requested (``spill_room`` of it; ``ttft_popularity.hot_tokens``). Why: where it does not, the
        prefix a spill recomputes there evicts one of them, whose next request recomputes it in turn:
        past capacity on pools that hold four groups each, the spills fed on themselves. With the
        check on both spills (routing simulator, 2 or 4 workers, 12k-token pools, 2,400-token
        groups): TTFT p95 0.39-0.70x where they fired, 1.00-1.03x where they did not, reuse 88-93%
        against 70-87%; roomy pools never bind it (docs/gpu-fleet.md, "Room for the spilled prefix")."""
        room = self.params.spill_room
        if room <= 0 or not self.params.popularity:
            return True
        worker = next((w for w in workers if w.url == url), None)
        capacity = (worker.max_total_tokens if worker is not None else None) or self.params.default_capacity_tokens
        return self.popularity.hot_tokens(url) + request.prompt_tokens <= room * capacity

    def _prefilling(self, request: RouteRequest, chosen: Estimate) -> tuple[Hashable, int] | None:
        """The key of a streamed request (ours, or a peer's) sent to the chosen worker and still
        without its first token whose prompt covers the part of ``request``'s match there that no
        first token confirmed yet, if that part is at least ``hold_tokens``; and that part's
        tokens (what the hold saves, see ``hold_worth``). Sent now, the engine would batch both
        prompts together and compute their shared prefix twice (SGLang's default FCFS schedule
        does not hold back a request whose prefix is being computed)."""
        p = self.params
        matched = chosen.matched_blocks if chosen.index_blocks is None else chosen.index_blocks
        if not p.hold_tokens or request.held or matched == 0:
            return None
        confirmed = self.index.confirmed(chosen.url, request.block_hashes, matched)
        saved = uncached_tokens(request, confirmed) - uncached_tokens(request, matched)
        if saved < p.hold_tokens:
            return None
        last = request.block_hashes[matched - 1]

        def covers(other: RouteRequest) -> bool:
            hashes = other.block_hashes
            return other.stream and len(hashes) >= matched and hashes[matched - 1] == last

        holder = self.pending.prefilling(chosen.url, covers)
        return None if holder is None else (holder, saved)

    def hold_worth(self, chosen: Estimate, saved: int) -> float:
        """The longest a hold on ``chosen`` is worth (``Decision.hold_s``): recomputing the ``saved``
        tokens there, plus the prefill queued ahead of it there (the holder's among it), which
        it would wait for anyway if sent now. Past that, waiting costs more than computing the
        prefix again."""
        _, per_uncached, per_unseen, per_queued, _, per_waiting, _ = self.model.coefficients()
        x = chosen.features
        ahead = per_unseen * x.unseen + per_queued * x.queued + per_waiting * x.waiting
        return self.model.factor(chosen.url) * (per_uncached * saved + ahead)

    def _remember(self, request: RouteRequest, chosen: Estimate, scraped: tuple[object, ...]) -> None:
        self.picks.picked(chosen.url)
        held = chosen.matched_blocks if chosen.index_blocks is None else chosen.index_blocks
        confirmed = self.index.confirmed(chosen.url, request.block_hashes, held)
        touches = self.index.last_touches(chosen.url, request.block_hashes[:confirmed])
        self.index.record(chosen.url, request.block_hashes, request.block_tokens, held=held)
        self.pending.add(chosen.url, InFlight(request, chosen.features, touches, scraped))

    def on_first_token(self, first: FirstToken) -> None:
        """Confirm the prompt in the worker's index as soon as its prefill is done, not an answer's
        whole decode later: in a cold burst, followers of a group then see its holder at once.
        (The TTFT fit still learns at completion: fed first tokens during a burst, it took queueing
        for prefill cost and p95 worsened, 0.101 -> 0.155 s on shared_prefix @128.)"""
        entry = self.pending.get(first.worker, first.request)
        if entry is None or entry.prefilled:
            return
        self.pending.mark_prefilled(first.worker, entry)
        self._confirm(first.worker, first.request, entry, first.prompt_tokens, first.cached_tokens)

    def on_complete(self, completion: Completion) -> None:
        entry = self.pending.pop(completion.worker, completion.request)
        if entry is None or not completion.ok:
            return
        self.kv_reads.observe(completion.completion_tokens, completion.decode_s)
        request = completion.request
        if not entry.prefilled:
            self._confirm(completion.worker, request, entry, completion.prompt_tokens, completion.cached_tokens)
        x = entry.features
        if completion.cached_tokens is not None and completion.prompt_tokens:
            # What the worker actually computed, rescaled to our token estimate of the prompt.
            share = 1.0 - min(completion.cached_tokens, completion.prompt_tokens) / completion.prompt_tokens
            x = x._replace(uncached=round(request.prompt_tokens * share))
        self.pending.mean_uncached += 0.05 * (x.uncached - self.pending.mean_uncached)
        if completion.ttft is not None:
            self.model.learn(completion.worker, x, completion.ttft)

    def _confirm(self, url: str, request: RouteRequest, entry: InFlight,
                 prompt_tokens: int | None, cached_tokens: int | None) -> None:
        self.index.complete(url, request.block_hashes, request.block_tokens, touches=entry.touches,
                            cached_tokens=self._reported_cached(request, prompt_tokens, cached_tokens))

    @staticmethod
    def _reported_cached(request: RouteRequest, prompt_tokens: int | None, cached_tokens: int | None) -> int | None:
        """Reported cached tokens, rescaled to our token estimate of the prompt."""
        if cached_tokens is None:
            return None
        if not prompt_tokens:
            return cached_tokens
        return round(cached_tokens * request.prompt_tokens / prompt_tokens)

    def on_peer_decision(self, worker: str, request: RouteRequest, uncached: int = 0, key: Hashable = None) -> None:
        """Another proxy sent ``request`` to ``worker`` (``peers``): its prompt will be cached there;
        if it was new to us too, it counts towards the spread of new prompts as ours would; and its
        ``uncached`` tokens are prefill ahead of ours there until the peer reports its first token
        (``on_peer_prefilled(worker, key)``) or a newer scrape counts it."""
        if worker not in self.index:
            return
        cold = all(self.index.held(url, request.block_hashes) <= self.params.cold_blocks for url in self.index.urls())
        if cold:
            self.picks.count_cold(worker)
        self._count_traffic(request, worker, cold)
        self.index.record(worker, request.block_hashes, request.block_tokens)
        if key is not None:
            self.pending.add_peer(worker, key, request, uncached)

    def on_peer_prefilled(self, worker: str, key: Hashable) -> None:
        self.pending.peer_prefilled(worker, key)

    def on_peer_load(self, peer: str, in_flight: Mapping[str, int]) -> None:
        """A peer's requests in flight per worker: they count in each worker's outstanding requests
        (the cold placement's first order) and, unscraped, its decode batch, as ours do."""
        self.pending.set_peer_load(peer, in_flight)

    def on_worker_change(self, workers: Sequence[WorkerSnapshot]) -> None:
        self.index.sync(workers, drop_missing=True)
        present = {w.url for w in workers}
        self.pending.forget(present)
        self.picks.forget(present)
        for url in [u for u in self.model.known() if u not in present]:
            self.model.forget(url)
        self.popularity.keep(present)


def _factory(params: TtftParams, rng: random.Random) -> TtftCost:
    return TtftCost(params)


SPEC = PolicySpec("ttft", TtftParams, _factory)
