"""JSON parsing that fails only with ``ValueError``, for bytes from clients and from workers (pure).

``json.loads`` lets more through, or out, than a proxy can afford:

* ``RecursionError`` (not a ``ValueError``) for deeply nested input — 100 kB of ``[`` is enough —
  which escaped every ``except ValueError`` and became aiohttp's bare 500 (or gRPC UNKNOWN);
* input nested just below the interpreter's limit parses, and then breaks whatever walks it next
  (``json.dumps`` of a rebuilt body, a recursive reader): nesting is capped at ``MAX_DEPTH``;
* UTF-16 / UTF-32 and a UTF-8 byte-order mark are auto-detected on bytes (RFC 8259 §8.1 requires
  UTF-8 without a BOM); a body read so, then forwarded with a ``rid`` spliced into its bytes,
  reached the worker corrupted. Only strict UTF-8 is accepted;
* ``NaN``, ``Infinity`` and ``-Infinity`` are not JSON (RFC 8259 §6) and are refused. A number
  out of float range (``1e999``) is grammatical JSON and parses to ``inf``: the readers of numbers
  (sampling checks, ``sse``, ``workers.scrape``) refuse non-finite values where they read them, so
  the common parse needs no per-number hook.
"""

from __future__ import annotations

import codecs
import json
from typing import Any

MAX_DEPTH = 64  # arrays / objects inside each other; OpenAI tool schemas stay far below


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads(data: bytes | str) -> Any:
    """The JSON value in ``data``; ``ValueError`` (with a short reason) for anything else."""
    if isinstance(data, bytes | bytearray):
        if data.startswith(codecs.BOM_UTF8):
            raise ValueError("JSON text must be UTF-8 without a byte-order mark")
        text = bytes(data).decode("utf-8")  # UnicodeDecodeError is a ValueError
    else:
        text = data
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError(f"JSON nested too deeply (more than {MAX_DEPTH} levels)") from None
    if (text.count("[") + text.count("{") > MAX_DEPTH and isinstance(value, list | dict)
            and depth_over(value, MAX_DEPTH)):
        raise ValueError(f"JSON nested too deeply (more than {MAX_DEPTH} levels)")
    return value


def depth_over(value: Any, limit: int) -> bool:
    """Whether arrays / objects in ``value`` nest more than ``limit`` deep (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, list | dict):
                stack.append((child, depth + 1))
    return False
