"""The ``ttft`` policy's KV-wait term: how long a request would wait on a worker for room in its
KV pool, from the proxy's own books (pure; ``ttft_cost.py`` uses it).

Why: an engine runs only as many requests at once as their KV fits. Past that a new request,
cache hit or not, waits until running ones end, and a running request holds its context for its
whole decode, seconds on a loaded GPU. On the GPU fleet (4 transformers engines sharing one H200,
48k-token pools, ~3,000-token prompts, 32 output tokens, token ids, 6 req/s; run 38) each
phase's TTFT p95 came from one engine that had drawn 16-18 requests at once: 4-6 more waited
there 4-5 s while another engine ran 12 with none waiting. Nothing linear in the queue predicts
that step: below the pool's size a waiting hit costs ~0, above it a decode's length.

Estimate, per worker w with a known pool of C tokens (``max_total_tokens``, which SGLang and the
GPU fleet's engine report in ``/get_server_info`` whatever else they withhold):
    held_w = sum over requests in flight on w (ours; our peers' counted at our mean size) of
             their prompt tokens + the mean output length: the KV each reads by its end
    over   = held_w + (this request's prompt + mean output) - C
    wait_w = 0 if over <= 0, else mean_decode_s x over / C
a full pool frees its size once per decode's length (what runs ends, what waited takes its
place), so ``over`` tokens drain in that share of a decode; capped at a few decodes. Contexts are counted whole, a shared prefix once per request: what
transformers' scheduler budgets (a step reads at most the pool's size of its requests' KV,
``proxy/sim/scheduler.py``). SGLang stores a shared prefix once, so there this over-counts; the
term enters the TTFT fit as a feature with its own coefficient (prior 1), which an engine that
does not wait at that point drives down.

The output length and the decode's length are learned from completions (EWMA); until the first
one the wait is 0 (no evidence, no term).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# EWMA weight of one completion in the mean output length and the mean decode time.
_ALPHA = 0.05
# A wait above this many decodes says the estimate is off more than the queue is long.
_MAX_DECODES = 4.0


@dataclass
class KvReads:
    mean_output_tokens: float = 0.0
    mean_decode_s: float = 0.0
    _seen: bool = False

    def observe(self, output_tokens: int | None, decode_s: float | None) -> None:
        """One finished request: its output length and how long it decoded."""
        if output_tokens is None or decode_s is None or decode_s < 0:
            return
        if not self._seen:
            self.mean_output_tokens, self.mean_decode_s, self._seen = float(output_tokens), decode_s, True
            return
        self.mean_output_tokens += _ALPHA * (output_tokens - self.mean_output_tokens)
        self.mean_decode_s += _ALPHA * (decode_s - self.mean_decode_s)

    def context(self, prompt_tokens: int) -> float:
        """The KV one request reads by its end."""
        return prompt_tokens + self.mean_output_tokens

    def held(self, prompt_tokens_in_flight: int, requests_in_flight: int) -> float:
        return prompt_tokens_in_flight + requests_in_flight * self.mean_output_tokens

    def fleet_fits(self, pools: Iterable[tuple[float, int | None]], own: float) -> bool:
        """Whether ``own`` tokens more fit the workers' pools taken together, each pool given as
        (tokens held, capacity); a pool of unknown size counts as room (no evidence, no gate)."""
        held = capacity = 0.0
        for h, c in pools:
            if c is None or c <= 0:
                return True
            held, capacity = held + h, capacity + c
        return held + own <= capacity

    def wait(self, held: float, own: float, capacity: int | None) -> float:
        """Seconds a request reading ``own`` tokens waits for room where ``held`` are taken of a
        ``capacity``-token pool (None: unknown, no wait)."""
        if not self._seen or capacity is None or capacity <= 0:
            return 0.0
        over = held + own - capacity
        if over <= 0:
            return 0.0
        return self.mean_decode_s * min(over / capacity, _MAX_DECODES)
