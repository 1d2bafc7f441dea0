"""The sampling values both frontends accept: one table, checked once per request (pure).

HTTP forwards the caller's ``sampling_params`` (SGLang native) or body fields (OpenAI) as they
came; gRPC builds the same dicts from typed fields and ``extra_json``. Either way the dict goes
through ``check_sampling`` before it is routed, so a value no worker accepts (``max_new_tokens``
``1e999`` or ``"many"``, a NaN temperature, a negative stop token id) is a 400 / INVALID_ARGUMENT
naming the field, on both fronts alike, instead of a worker error (or a worker crash) later.

Only the names in ``RULES`` are checked; any other key passes through untouched (SGLang grows new
sampling parameters faster than this table, and the worker is their judge). ``None`` means
"unset" (OpenAI clients send ``"max_tokens": null``) and is not checked.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from proxy.errors import BadRequest

MAX_INT32 = 2**31 - 1
MAX_INT64 = 2**63 - 1


def _number(v: Any) -> float | None:
    """``v`` as a finite float; None when it is not a finite JSON number (bools are not numbers)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        f = float(v)
    except OverflowError:  # an integer beyond float range
        return None
    return f if math.isfinite(f) else None


def _integer(v: Any, lo: int, hi: int) -> str | None:
    f = _number(v)
    if f is None or not f.is_integer() or not lo <= f <= hi:
        return f"must be an integer in [{lo}, {hi}]"
    return None


def _count(v: Any) -> str | None:
    return _integer(v, 0, MAX_INT32)


def _between(lo: float, hi: float, *, open_lo: bool = False) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        f = _number(v)
        if f is None or not (lo < f if open_lo else lo <= f) or not f <= hi:
            return f"must be a number in {'(' if open_lo else '['}{lo:g}, {hi:g}]"
        return None
    return check


def _at_least_zero(v: Any) -> str | None:
    f = _number(v)
    return None if f is not None and f >= 0 else "must be a finite number >= 0"


def _top_k(v: Any) -> str | None:
    f = _number(v)
    if f is None or not f.is_integer() or not (f == -1 or 1 <= f <= MAX_INT32):
        return "must be -1 (off) or an integer >= 1"
    return None


def _seed(v: Any) -> str | None:
    return _integer(v, -MAX_INT64 - 1, MAX_INT64)


def _n(v: Any) -> str | None:
    return _integer(v, 1, 1024)


def _bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else "must be true or false"


def _stop(v: Any) -> str | None:
    if isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v)):
        return None
    return "must be a string or a list of strings"


def _token_ids(v: Any) -> str | None:
    if isinstance(v, list) and all(type(i) is int and 0 <= i <= MAX_INT32 for i in v):
        return None
    return f"must be a list of token ids (integers in [0, {MAX_INT32}])"


# Native (SGLang sampling_params) and OpenAI names share one table: where both exist they mean the same.
RULES: dict[str, Callable[[Any], str | None]] = {
    "max_new_tokens": _count, "max_tokens": _count, "max_completion_tokens": _count,
    "max_output_tokens": _count,
    "min_new_tokens": _count, "min_tokens": _count,
    "temperature": _at_least_zero,
    "top_p": _between(0.0, 1.0, open_lo=True),
    "top_k": _top_k,
    "min_p": _between(0.0, 1.0),
    "frequency_penalty": _between(-2.0, 2.0),
    "presence_penalty": _between(-2.0, 2.0),
    "repetition_penalty": _between(0.0, 2.0, open_lo=True),
    "seed": _seed, "sampling_seed": _seed,
    "n": _n,
    "ignore_eos": _bool, "skip_special_tokens": _bool,
    "stop": _stop,
    "stop_token_ids": _token_ids,
}


def check_sampling(params: Mapping[str, Any], where: str, *, names: Mapping[str, str] | None = None) -> None:
    """``BadRequest`` naming ``where`` + the field for the first value in ``params`` a rule refuses.

    ``names`` maps a key to the name the caller wrote (gRPC's typed ``seed`` became ``sampling_seed``)."""
    for key, value in params.items():
        rule = RULES.get(key)
        if rule is None or value is None:
            continue
        problem = rule(value)
        if problem is not None:
            shown = repr(value)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise BadRequest(f"{where}{(names or {}).get(key, key)}: {problem}, got {shown}")
