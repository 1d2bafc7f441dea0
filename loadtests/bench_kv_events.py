"""What following engines' KV events and tokenizing prompts cost the proxy: per block, per prompt.

    .venv/bin/python -m loadtests.bench_kv_events [--tokens 32768] [--block 32] [--reps 200]

Prints p50 / p99 of:
* decoding one engine batch (msgpack) and applying it to a worker's table, per block;
* ``chain_keys`` of a prompt (our key of each engine block: what matching a request costs once
  per decision) and one worker's match against a table holding it;
* encoding a prompt of that many tokens with the BPE of ``loadtests/gpu/tokenizer`` (the
  ``tokenizers`` library), for what ``routing.tokenizer`` would add to a decision, and the same
  prompt as chat through the directory's chat template (render, then render + encode).
One process, one core, on whatever machine runs it (the figures quoted in docs/routing.md say
which).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import msgpack

from proxy.routing.kv_index import EngineBlocks, chain_keys
from proxy.workers.kv_events import decode_batch

TOKENIZER = Path(__file__).parent / "gpu" / "tokenizer" / "tokenizer.json"


def timed(fn: Callable[[], object], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def pcts(xs: list[float], scale: float = 1.0) -> str:
    xs = sorted(x * scale for x in xs)
    return f"p50 {statistics.median(xs):.2f} us  p99 {xs[min(len(xs) - 1, int(0.99 * len(xs)))]:.2f} us"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=32_768)
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--reps", type=int, default=200)
    a = p.parse_args()
    rng = random.Random(1)
    ids = [rng.randrange(16_000) for _ in range(a.tokens)]
    n_blocks = a.tokens // a.block
    # One BlockStored per page, as SGLang's radix cache publishes them, in batches of 16 pages.
    payloads = []
    for start in range(0, n_blocks, 16):
        events = [["BlockStored", [start + i + 1], start + i if start + i else None,
                   ids[(start + i) * a.block:(start + i + 1) * a.block], a.block, None]
                  for i in range(min(16, n_blocks - start))]
        payloads.append(msgpack.packb([time.time(), events]))

    def apply_all() -> EngineBlocks:
        table = EngineBlocks()
        for payload in payloads:
            for event in decode_batch(payload).events:
                table.apply(event)
        return table

    table = apply_all()
    assert table.matched_tokens(ids) == n_blocks * a.block
    per_block = [t / n_blocks for t in timed(apply_all, max(5, a.reps // 10))]
    print(f"decode + apply, per block of {a.block} tokens: {pcts(per_block, 1e6)}")
    keys = timed(lambda: chain_keys(ids, a.block), a.reps)
    print(f"chain_keys of a {a.tokens}-token prompt: {pcts(keys, 1e6)}")
    ks = chain_keys(ids, a.block)
    match = timed(lambda: table.matched_blocks(ks), a.reps)
    print(f"one worker's match of it ({n_blocks} blocks held): {pcts(match, 1e6)}")
    if TOKENIZER.exists():
        from tokenizers import Tokenizer

        bpe = Tokenizer.from_file(str(TOKENIZER))
        text = bpe.decode(ids)
        n = len(bpe.encode(text).ids)
        enc = timed(lambda: bpe.encode(text), max(5, a.reps // 10))
        print(f"BPE encode of a {len(text):,}-character prompt ({n:,} tokens): {pcts(enc, 1e6)}")
        from proxy.routing.tokenizer import PromptTokenizer

        tok = PromptTokenizer(str(TOKENIZER.parent))
        template = tok.chat
        if template is not None:  # the same prompt as a system turn and a short user turn
            chat = [{"role": "system", "content": text}, {"role": "user", "content": "Summarize it."}]
            render = timed(lambda: template.render(chat), a.reps)
            print(f"chat template render of it: {pcts(render, 1e6)}")
            whole = timed(lambda: tok.encode_chat(chat), max(5, a.reps // 10))
            print(f"encode_chat of it (render + encode): {pcts(whole, 1e6)}")


if __name__ == "__main__":
    main()
