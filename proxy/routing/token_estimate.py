"""UTF-8 bytes per token, learned per model from the prompt tokens engines report.

Rule: a text prompt's tokens are estimated as ``bytes / bytes_per_token(model)``. Until a model's
first report, ``bytes_per_token`` is the prior (``routing.chars_per_token``). Each completed text
request whose engine reported ``prompt_tokens`` adds one observation (canonical prompt bytes,
reported tokens); the estimate is the ratio of the sums, both decayed by ``FORGETTING`` per
observation (memory ~ 1 / (1 - ``FORGETTING``) = 100 requests, long prompts weighing more, as
they should: their token counts are what the prefix index and the TTFT model weigh).
Ignored: absent or zero reports, prompts under ``MIN_PROMPT_BYTES`` (a chat template's or a BOS's
few tokens dominate them), and observations whose own ratio lies outside ``BOUNDS``
(a truncated prompt, a misreporting engine). The estimate itself stays within ``BOUNDS``.

The hashing unit does not depend on the estimate: text blocks stay fixed byte spans cut for the
prior, so hashes never move; only token accounting (``RouteRequest.prompt_tokens`` and the
tokens per unit block, ``block_tokens``) follows the estimate (``prefix_key.build_route_request``).
Token-id prompts are counted exactly and never feed it.

Complexity: O(1) per observation and per read; memory bounded by ``MAX_MODELS`` (the least
recently reported model is dropped first). Pure: no clock, no I/O; the caller exports it
(``radixgate_prompt_bytes_per_token``).
"""

from __future__ import annotations

from dataclasses import dataclass

# Plausible UTF-8 bytes per token for any real tokenizer (byte fallback ~1; long English
# words / code on a large vocabulary ~12).
BOUNDS = (1.0, 32.0)
FORGETTING = 0.99
MIN_PROMPT_BYTES = 64
MAX_MODELS = 64


@dataclass(frozen=True, slots=True)
class ModelEstimate:
    bytes_per_token: float
    # Observations counted so far (before forgetting).
    reports: int


class TokenEstimate:
    def __init__(self, prior: float) -> None:
        if not prior > 0:
            raise ValueError(f"prior must be > 0, got {prior}")
        self.prior = prior
        # model -> (decayed bytes, decayed tokens, reports), in order of last report
        self._sums: dict[str, tuple[float, float, int]] = {}

    def bytes_per_token(self, model: str) -> float | None:
        """The learned estimate for ``model``; None until its first accepted report (use the prior)."""
        found = self._sums.get(model)
        if found is None:
            return None
        return _clamp(found[0] / found[1])

    def observe(self, model: str, prompt_bytes: int, prompt_tokens: int | None) -> bool:
        """Learn from one completed text request; False when the report was ignored."""
        if not prompt_tokens or prompt_tokens <= 0 or prompt_bytes < MIN_PROMPT_BYTES:
            return False
        if not BOUNDS[0] <= prompt_bytes / prompt_tokens <= BOUNDS[1]:
            return False
        b, t, n = self._sums.pop(model, (0.0, 0.0, 0))
        self._sums[model] = (b * FORGETTING + prompt_bytes, t * FORGETTING + prompt_tokens, n + 1)
        if len(self._sums) > MAX_MODELS:
            del self._sums[next(iter(self._sums))]
        return True

    def snapshot(self) -> dict[str, ModelEstimate]:
        """Every model with a learned estimate."""
        return {m: ModelEstimate(_clamp(b / t), n) for m, (b, t, n) in self._sums.items()}


def _clamp(value: float) -> float:
    return min(max(value, BOUNDS[0]), BOUNDS[1])
