"""Mixed prompt text for benchmarks on a real BPE tokenizer: prose, code, numbers, CJK.

The routing benchmarks of earlier sessions used random three-letter words, one token each for the
simulated worker's tokenizer, so the proxy's characters-per-token heuristic (4.0) was exact by
construction. Real prompts are not like that: a BPE vocabulary spends ~4-5 characters per token
on English, fewer on code and digits, and one to three bytes' worth per CJK character. This module
writes text of four kinds, deterministic given a ``random.Random``, and cuts a prompt into
segments of several kinds so that one prompt mixes them:

* ``prose``    words drawn Zipf-like from a fixed list of common English words, in sentences;
* ``code``     Python-like lines: defs, assignments, calls, with generated identifiers;
* ``numbers``  CSV rows of integers and decimals;
* ``cjk``      common CJK ideographs (U+4E00..U+5FFF), Zipf-like, with full-width punctuation.

``mixed_text(rng, n_chars)`` is the one entry point the workloads use; ``corpus`` is what the BPE
tokenizer under ``loadtests/gpu/tokenizer/`` was trained on (``build_tokenizer.py``), with a seed
of its own so benchmark prompts are never training text.
"""

from __future__ import annotations

import itertools
import random

KINDS = ("prose", "code", "numbers", "cjk")
# Share of each kind in a mixed prompt (characters); prose dominates, as in real system prompts.
MIX = (0.55, 0.2, 0.1, 0.15)

_WORDS = (
    "the of and to in is it that for on with as was be at by this from or an are not but all can one has "
    "more will so out up into time data system model user request answer question context document "
    "should would could must may might first last next each every other which when where what who how "
    "because however therefore although while before after during between under over about against "
    "network server client cache memory token prefix latency throughput queue batch worker policy route "
    "report value number result error message field record table index search query response service "
    "support customer account order product price payment invoice shipping address contract policy "
    "please note following section describe explain summarize provide include ensure review update "
    "always never often sometimes usually important relevant specific general available required "
    "assistant instructions helpful accurate concise detailed language translate format output input"
).split()
_ZIPF = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(len(_WORDS))))
_IDENT = ("get", "set", "load", "parse", "build", "route", "cache", "item", "node", "value", "count",
          "index", "buffer", "worker", "token", "prefix", "config", "state", "result", "handle")
_CJK = [chr(c) for c in range(0x4E00, 0x6000)]
_CJK_ZIPF = list(itertools.accumulate(1.0 / (rank + 1) ** 0.8 for rank in range(len(_CJK))))


def prose(rng: random.Random, n_chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < n_chars:
        sentence = rng.choices(_WORDS, cum_weights=_ZIPF, k=rng.randint(6, 18))
        text = " ".join(sentence).capitalize() + rng.choice((". ", ". ", ", ", "? ", "; "))
        out.append(text)
        size += len(text)
    return "".join(out)[:n_chars]


def _ident(rng: random.Random) -> str:
    return "_".join(rng.sample(_IDENT, rng.randint(1, 3)))


def code(rng: random.Random, n_chars: int) -> str:
    lines: list[str] = []
    size = 0
    while size < n_chars:
        shape = rng.randrange(4)
        if shape == 0:
            line = f"def {_ident(rng)}({_ident(rng)}, {_ident(rng)}={rng.randint(0, 99)}):"
        elif shape == 1:
            line = f"    {_ident(rng)} = {_ident(rng)}[{rng.randint(0, 9)}] + {rng.randint(0, 999)}"
        elif shape == 2:
            line = f"    return self.{_ident(rng)}({_ident(rng)}, {rng.random():.3f})"
        else:
            line = f"    if {_ident(rng)} is not None and len({_ident(rng)}) > {rng.randint(1, 64)}:"
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)[:n_chars] + "\n"


def numbers(rng: random.Random, n_chars: int) -> str:
    rows: list[str] = []
    size = 0
    while size < n_chars:
        row = ",".join(
            str(rng.randint(0, 10**rng.randint(1, 7))) if rng.random() < 0.5 else f"{rng.uniform(-1e4, 1e4):.2f}"
            for _ in range(rng.randint(3, 8))
        )
        rows.append(row)
        size += len(row) + 1
    return "\n".join(rows)[:n_chars] + "\n"


def cjk(rng: random.Random, n_chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < n_chars:
        run = "".join(rng.choices(_CJK, cum_weights=_CJK_ZIPF, k=rng.randint(8, 30)))
        out.append(run + rng.choice("。，、？"))
        size += len(run) + 1
    return "".join(out)[:n_chars]


_WRITERS = {"prose": prose, "code": code, "numbers": numbers, "cjk": cjk}


def text_of(kind: str, rng: random.Random, n_chars: int) -> str:
    return _WRITERS[kind](rng, n_chars)


def mixed_text(rng: random.Random, n_chars: int, segment_chars: int = 600) -> str:
    """About ``n_chars`` characters of segments of random kinds (``MIX`` shares), each
    ~``segment_chars`` long and separated by a blank line."""
    parts: list[str] = []
    size = 0
    while size < n_chars:
        kind = rng.choices(KINDS, weights=MIX)[0]
        part = text_of(kind, rng, min(segment_chars, n_chars - size))
        parts.append(part)
        size += len(part) + 2
    return "\n\n".join(parts)


def corpus(n_chars: int, seed: int = 20261201) -> list[str]:
    """Training text for the benchmark tokenizer: documents of mixed kinds."""
    rng = random.Random(seed)
    docs: list[str] = []
    size = 0
    while size < n_chars:
        doc = mixed_text(rng, rng.randint(2000, 8000))
        docs.append(doc)
        size += len(doc)
    return docs
