"""The streaming client that replays a workload: one request, timed from send to last token.

``send`` posts one ``RequestSpec`` (native ``/generate`` for text, ``/v1/chat/completions`` for
messages), always streamed with ``ignore_eos`` so output length is what the spec asks, and returns
a ``Sample`` of client-side marks (``time.perf_counter``): first token, last token, per-token gaps,
and the prompt / cached token counts the server reported. A failed request is a ``Sample`` with
``ok=False``, never an exception, so a run's accounting (sent = ok + failed) always adds up.
``flush`` empties the prefix caches of SGLang-protocol workers between runs.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from proxy.loadgen.workloads import RequestSpec

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass
class Sample:
    """One request as the client saw it; marks are ``time.perf_counter`` seconds."""

    group: str
    sent: float
    first: float | None = None
    done: float | None = None
    gaps: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ok: bool = False


async def send(session: aiohttp.ClientSession, base: str, spec: RequestSpec, rid: str, interval: int) -> Sample:
    s = Sample(spec.group, time.perf_counter())
    if spec.messages is not None:
        url, body = f"{base}/v1/chat/completions", {
            "model": MODEL, "messages": spec.messages, "max_tokens": spec.max_new_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True, "rid": rid}
    else:
        url, body = f"{base}/generate", {
            "text": spec.text, "stream": True, "rid": rid,
            "sampling_params": {"max_new_tokens": spec.max_new_tokens, "ignore_eos": True}}
    last_at, last_tokens = 0.0, 0
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                await resp.read()
                return s
            async for line in resp.content:
                if not line.startswith(b"data:") or line.startswith(b"data: [DONE]"):
                    continue
                now = time.perf_counter()
                event = json.loads(line[5:])
                tokens = _tokens_so_far(event, last_tokens, interval)
                if tokens > last_tokens:
                    if s.first is None:
                        s.first = now
                    else:
                        s.gaps.append((now - last_at) / (tokens - last_tokens))
                    last_at, last_tokens = now, tokens
                usage = event.get("usage") or event.get("meta_info") or {}
                if usage.get("prompt_tokens"):
                    s.prompt_tokens = usage["prompt_tokens"]
                    details = usage.get("prompt_tokens_details") or {}
                    s.cached_tokens = usage.get("cached_tokens", details.get("cached_tokens", 0)) or 0
        s.done, s.ok = time.perf_counter(), s.first is not None
    except (aiohttp.ClientError, TimeoutError):
        pass
    return s


def _tokens_so_far(event: dict[str, Any], before: int, interval: int) -> int:
    meta = event.get("meta_info")
    if meta is not None:
        return int(meta.get("completion_tokens", before))
    choices = event.get("choices") or []
    if choices and (choices[0].get("delta") or {}).get("content"):
        return before + interval  # chat chunks carry no count: the worker's stream interval
    return before


async def flush(session: aiohttp.ClientSession, urls: list[str]) -> None:
    """``POST /flush_cache`` on each worker; SGLang refuses while requests run, so retry a while."""
    for url in urls:
        for _ in range(100):
            async with session.post(f"{url}/flush_cache") as resp:
                await resp.read()
                if resp.status == 200:
                    break
            await asyncio.sleep(0.1)
