"""Request shapes for routing benchmarks and demos (issue 4, "Measure").

Every generator is deterministic given its seed (``random.Random``) and returns a list of
``RequestSpec`` in the order they should be sent:

* ``shared_prefix``   G groups x P prompts: a per-group system prompt + a per-prompt question
                      (sglang ``generated-shared-prefix``; issue defaults 64x16, 2048/128/256;
                      ``shared_prefix_large`` = GIE's 150x5, 6000/1200/1000). Shuffled, as the
                      sglang generator does.
* ``multi_turn_chat`` S sessions x T turns of chat messages whose history grows turn by turn.
                      The assistant turns in the history are synthetic (known in advance), so a
                      follow-up shares the previous turn's prompt with the worker's cache but not
                      the answer the worker actually generated. Sent round by round (turn 0 of
                      every session, then turn 1, ...).
* ``unique_prompts``  N long prompts that share nothing (affinity must not hurt).

Text is made of random three-letter words, so one word = one token for the simulated worker's
tokenizer and a prompt of n tokens is ~4n characters: radixgate's default ``chars_per_token`` of
4.0 is then exact. ``scale`` multiplies every token length (for quick runs); counts are
parameters of their own.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_LETTERS = string.ascii_lowercase


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: exactly one of ``text`` / ``messages`` is set."""

    group: str
    max_new_tokens: int
    text: str | None = None
    messages: list[dict[str, Any]] | None = field(default=None, hash=False)
    # Nominal prompt length in tokens (the simulated tokenizer counts the same, plus BOS).
    prompt_tokens: int = 0
    turn: int = 0


def words(rng: random.Random, n_tokens: int) -> str:
    """``n_tokens`` random three-letter words (one simulated token each), space separated."""
    if n_tokens <= 0:
        return ""
    letters = rng.choices(_LETTERS, k=3 * n_tokens)
    return " ".join("".join(letters[i : i + 3]) for i in range(0, 3 * n_tokens, 3))


def _scaled(tokens: int, scale: float) -> int:
    return max(1, round(tokens * scale))


def shared_prefix(
    groups: int = 64,
    prompts_per_group: int = 16,
    system_tokens: int = 2048,
    question_tokens: int = 128,
    output_tokens: int = 256,
    *,
    seed: int = 0,
    scale: float = 1.0,
    shuffle: bool = True,
) -> list[RequestSpec]:
    rng = random.Random(seed)
    sys_len, q_len = _scaled(system_tokens, scale), _scaled(question_tokens, scale)
    out_len = _scaled(output_tokens, scale)
    specs: list[RequestSpec] = []
    for g in range(groups):
        system = words(rng, sys_len)
        for _ in range(prompts_per_group):
            text = f"{system} {words(rng, q_len)}"
            specs.append(RequestSpec(f"g{g}", out_len, text=text, prompt_tokens=sys_len + q_len))
    if shuffle:
        rng.shuffle(specs)
    return specs


def shared_prefix_large(*, seed: int = 0, scale: float = 1.0, groups: int = 150, prompts_per_group: int = 5) -> list[RequestSpec]:
    """GIE / llm-d "short questions, many prompts": 150 x 5, 6000 / 1200 / 1000."""
    return shared_prefix(groups, prompts_per_group, 6000, 1200, 1000, seed=seed, scale=scale)


def multi_turn_chat(
    sessions: int = 16,
    turns: int = 5,
    system_tokens: int = 1000,
    user_tokens: int = 200,
    output_tokens: int = 200,
    *,
    seed: int = 0,
    scale: float = 1.0,
) -> list[RequestSpec]:
    rng = random.Random(seed)
    sys_len, user_len, out_len = (_scaled(t, scale) for t in (system_tokens, user_tokens, output_tokens))
    histories: list[list[dict[str, Any]]] = [[{"role": "system", "content": words(rng, sys_len)}] for _ in range(sessions)]
    specs: list[RequestSpec] = []
    for turn in range(turns):
        for s, history in enumerate(histories):
            history.append({"role": "user", "content": words(rng, user_len)})
            prompt_tokens = sys_len + turn * (user_len + out_len) + user_len
            specs.append(RequestSpec(f"s{s}", out_len, messages=[dict(m) for m in history], prompt_tokens=prompt_tokens, turn=turn))
            history.append({"role": "assistant", "content": words(rng, out_len)})
    return specs


def unique_prompts(
    count: int = 64, prompt_tokens: int = 4000, output_tokens: int = 128, *, seed: int = 0, scale: float = 1.0
) -> list[RequestSpec]:
    rng = random.Random(seed)
    p_len, out_len = _scaled(prompt_tokens, scale), _scaled(output_tokens, scale)
    return [RequestSpec(f"u{i}", out_len, text=words(rng, p_len), prompt_tokens=p_len) for i in range(count)]


# By name, for the benchmarks' --workload: each takes its own sizes and the shared ``seed`` and
# ``scale`` as keywords.
WORKLOADS: dict[str, Callable[..., list[RequestSpec]]] = {
    "shared_prefix": shared_prefix,
    "shared_prefix_large": shared_prefix_large,
    "multi_turn_chat": multi_turn_chat,
    "unique_prompts": unique_prompts,
}
