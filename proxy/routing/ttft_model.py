"""The TTFT model behind the ``ttft`` policy, learned online from observed first-token times.

    ttft(w) = f_w x (c0 + c1 x uncached + c2 x unseen + c3 x queued + c4 x running + c5 x waiting
                     + c6 x kv_wait)

* ``uncached``: this request's own prompt tokens not in the worker's cache; ``unseen``: uncached
  tokens of our requests sent there since its last scrape; ``queued``: the waiting uncached
  tokens that scrape reported (which may have drained since: a scrape is up to an interval old,
  which is why it has its own coefficient); ``running``: requests in its decode batch, whose
  decode steps the prefill is interleaved with; ``waiting``: requests ahead of it there still
  without a first token, whatever their size. SGLang batches many prefills into one step, so its
  ``c5`` stays near its prior of 0; on the GPU fleet's engines each waiting request cost time
  whatever its size (median TTFT 0.49 s with none waiting, 0.87 s with 2, 3.8 s with 5, most of
  them cache hits of ~100 new tokens; a fit on those traces gave ~0.37 s per waiting request and
  no weight to their tokens), which only this term can learn. Why, found later in transformers'
  scheduler: a step reads at most the pool's size of its requests' resident KV, so a hit waits
  for running requests to finish while memory is half free (proxy/sim/README.md).
* ``kv_wait``: seconds this request would wait there for room in the KV pool, estimated from our
  own requests in flight (``ttft_kv.py``): the step that ``waiting`` can only average over. Its
  coefficient starts at 1 (the estimate taken at its word) and is fitted like the others, so an
  engine that does not wait where the estimate says it would drives it down.
* ``c0 .. c6``: one fleet-wide fit by recursive least squares with forgetting (token features in
  thousands, running and waiting in tens, so one prior strength suits all), fed every finished request with
  its features at decision time and its observed TTFT. Coefficients start at a prior (``c1`` =
  ``c2`` = 1 / prior prefill rate, ``c3`` half that) and are clamped at >= 0 when used, ``c1``
  at >= a quarter of its prior: 1 / c1 is the learned prefill rate, and an uncached token is never
  free (under overload the fit can put all of TTFT on the queue terms; a c1 of 0 would then make
  recomputing a prefix elsewhere look free and scatter prefixes over the fleet). With
  ``own_at_least_ahead`` (``TtftParams``, on by default) also at >= ``c2``: a
  request's own uncached token costs at least what an unseen token ahead of it does, as FCFS
  prefill has it.
* ``f_w``: the worker's own speed factor, an EWMA of observed / fleet-predicted TTFT clamped to
  [1/4, 4] with the fleet mean kept at 1, so a slower GPU or a worker also fed by other proxies
  is charged accordingly.
* An observation is clipped to 10x the prediction first: one request stuck behind a stall must not
  swing the fit.

Cost: O(1) per prediction; a 7x7 update per finished request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

# Feature scales: tokens in thousands, running requests in tens.
_TOKENS = 1000.0
_RUNNING = 10.0
_FACTOR_BOUNDS = (0.25, 4.0)


class Features(NamedTuple):
    uncached: float
    unseen: float
    queued: float
    running: float
    waiting: float = 0.0
    kv_wait: float = 0.0  # seconds

    def vector(self) -> list[float]:
        return [1.0, self.uncached / _TOKENS, self.unseen / _TOKENS, self.queued / _TOKENS, self.running / _RUNNING,
                self.waiting / _RUNNING, self.kv_wait]


class OnlineLinear:
    """Recursive least squares, y ~ theta . x, with exponential forgetting."""

    def __init__(self, prior: list[float], prior_variance: float, forgetting: float) -> None:
        n = len(prior)
        self.theta = list(prior)
        self._p = [[prior_variance if i == j else 0.0 for j in range(n)] for i in range(n)]
        self._lambda = forgetting
        self._variance_cap = prior_variance * 100

    def predict(self, x: list[float]) -> float:
        return sum(t * v for t, v in zip(self.theta, x, strict=True))

    def update(self, x: list[float], y: float) -> None:
        p, lam = self._p, self._lambda
        n = len(x)
        px = [sum(p[i][j] * x[j] for j in range(n)) for i in range(n)]
        denom = lam + sum(x[i] * px[i] for i in range(n))
        gain = [v / denom for v in px]
        error = y - self.predict(x)
        self.theta = [t + g * error for t, g in zip(self.theta, gain, strict=True)]
        xp = [sum(x[i] * p[i][j] for i in range(n)) for j in range(n)]
        self._p = [[(p[i][j] - gain[i] * xp[j]) / lam for j in range(n)] for i in range(n)]
        # Forgetting with features that do not vary lets P grow without bound; cap it.
        for i in range(n):
            if self._p[i][i] > self._variance_cap:
                scale = self._variance_cap / self._p[i][i]
                self._p[i] = [v * scale for v in self._p[i]]


@dataclass(frozen=True)
class TtftPrior:
    base_s: float = 0.02
    prefill_tokens_per_s: float = 12_000.0
    decode_s_per_running: float = 0.0003


class TtftModel:
    def __init__(self, prior: TtftPrior, *, forgetting: float = 0.995, factor_alpha: float = 0.05,
                 own_at_least_ahead: bool = False) -> None:
        per_k = _TOKENS / prior.prefill_tokens_per_s
        self._fit = OnlineLinear(
            [prior.base_s, per_k, per_k, per_k / 2, _RUNNING * prior.decode_s_per_running, 0.0, 1.0],
            prior_variance=0.01,
            forgetting=forgetting,
        )
        self._factor: dict[str, float] = {}
        self._factor_alpha = factor_alpha
        self._min_c1 = per_k / 4
        self._own_at_least_ahead = own_at_least_ahead
        self._coefficients = self._clamped()

    def _clamped(self) -> tuple[float, float, float, float, float, float, float]:
        c = [max(0.0, t) for t in self._fit.theta]
        c[1] = max(c[1], self._min_c1, c[2] if self._own_at_least_ahead else 0.0)
        return (c[0], c[1] / _TOKENS, c[2] / _TOKENS, c[3] / _TOKENS, c[4] / _RUNNING, c[5] / _RUNNING, c[6])

    def coefficients(self) -> tuple[float, ...]:
        """(base s, s per uncached token, s per unseen token, s per queued token, s per running,
        s per waiting request, s per estimated second of KV wait)."""
        return self._coefficients

    def terms(self) -> dict[str, float]:
        """The coefficients by name, as predictions use them, and the fit's own cost of an
        uncached token before its floors (``uncached_token_fit``): where the two differ, a floor
        binds (on the GPU fleet, the question whether ``own_at_least_ahead`` acts at all)."""
        names = ("base", "uncached_token", "unseen_token", "queued_token", "running", "waiting", "kv_wait")
        return {**dict(zip(names, self._coefficients, strict=True)),
                "uncached_token_fit": max(0.0, self._fit.theta[1]) / _TOKENS}

    def seconds_per_token(self, url: str) -> float:
        """This worker's prefill cost of one more uncached token of the request itself."""
        return self._coefficients[1] * self.factor(url)

    def factor(self, url: str) -> float:
        return self._factor.get(url, 1.0)

    def fleet_predict(self, x: Features) -> float:
        # Spelled out: it runs once per worker per decision, and a generator over zip() cost ~5 µs.
        c0, c1, c2, c3, c4, c5, c6 = self._coefficients
        return c0 + c1 * x.uncached + c2 * x.unseen + c3 * x.queued + c4 * x.running + c5 * x.waiting + c6 * x.kv_wait

    def predict(self, url: str, x: Features) -> float:
        return self.factor(url) * self.fleet_predict(x)

    def learn(self, url: str, x: Features, ttft: float) -> None:
        fleet = max(self.fleet_predict(x), 1e-4)
        observed = min(ttft, 10 * fleet * self.factor(url))
        own = self.factor(url)
        ratio = min(max(observed / fleet, _FACTOR_BOUNDS[0]), _FACTOR_BOUNDS[1])
        self._factor[url] = own + self._factor_alpha * (ratio - own)
        # Factors are relative speeds: keep their mean at 1 so the fleet fit carries the scale.
        mean = sum(self._factor.values()) / len(self._factor)
        if mean > 0:
            for key in self._factor:
                self._factor[key] /= mean
        # The fleet fit sees the observation with this worker's own speed taken out.
        self._fit.update(x.vector(), observed / self._factor[url])
        self._coefficients = self._clamped()

    def known(self) -> list[str]:
        return list(self._factor)

    def forget(self, url: str) -> None:
        self._factor.pop(url, None)
