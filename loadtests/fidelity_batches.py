"""The simulator's steps against the real engine's, batch by batch, on phases replayed as placed.

    .venv/bin/python -m loadtests.fidelity_batches --results loadtests/results/gpu-fleet-batches-1 [--set F=V]

The GPU shim logs every batch its engine's scheduler formed (``loadtests/gpu/batch_log.py``); the
replay (``fidelity_placed``: each request on the engine it reached, when it reached it) logs the
simulated engine's the same way. Per phase and engine this prints, real / simulated, what decides
how fast a queue drains near capacity: steps a second and what they cost, decodes per step, the
share of steps that took in a prompt, prompts finished a second, and the steps that took none
while prompts waited (with the free KV then): the admission rule the model may lack shows there.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtests.fidelity_machine import own_step_profile
from loadtests.fidelity_replay import mean_of, placed_phases, simulate
from loadtests.gpu.batch_log import FIELDS
from loadtests.gpu.fleet import TOKENIZER
from proxy.sim import perf
from proxy.sim.tokenizer import Encoder

F = {name: k for k, name in enumerate(FIELDS)}
COLUMNS = ["steps/s", "decode ms", "prefill ms", "decodes/step", "prefill share", "prompts/s",
           "blocked share", "free blocks blocked", "waiting"]


def summarize(batches: Sequence[Sequence[Any]]) -> dict[str, float]:
    """What a run of steps of one engine amounts to (``COLUMNS``); nan where nothing counts.
    A step is *blocked* when prompts waited after it and it took in none."""
    done = [b for b in batches if b[F["end"]] is not None]
    if len(done) < 2:
        return dict.fromkeys(COLUMNS, math.nan)
    span = done[-1][F["end"]] - done[0][F["t"]]

    dur = [b[F["end"]] - b[F["t"]] for b in done]
    prefill = [b[F["prefills"]] > 0 for b in done]
    blocked = [b for b in done if b[F["waiting"]] > 0 and b[F["prefills"]] == 0]
    return {
        "steps/s": len(done) / span if span > 0 else math.nan,
        "decode ms": 1000 * mean_of([d for d, p in zip(dur, prefill, strict=True) if not p]),
        "prefill ms": 1000 * mean_of([d for d, p in zip(dur, prefill, strict=True) if p]),
        "decodes/step": mean_of([b[F["decodes"]] for b in done]),
        "prefill share": mean_of([float(p) for p in prefill]),
        "prompts/s": sum(b[F["first_tokens"]] for b in done) / span if span > 0 else math.nan,
        "blocked share": len(blocked) / len(done),
        "free blocks blocked": mean_of([b[F["free_blocks"]] for b in blocked]),
        "waiting": mean_of([b[F["waiting"]] for b in done]),
    }


def _cell(real: float, sim: float) -> str:
    fmt = "{:.2f}" if max(abs(real), abs(sim)) < 10 else "{:.0f}"
    return f"{fmt.format(real)} / {fmt.format(sim)}"


def report(results: Sequence[Path], profile: perf.Profile, own_steps: bool = False) -> str:
    encoder = Encoder(str(TOKENIZER))
    cache: dict[Any, list[list[int]]] = {}
    lines = ["| run | router | rate /s | phase | engine | " + " | ".join(COLUMNS) + " |",
             "|---|---|---|---|---|" + "---|" * len(COLUMNS)]
    for path in results:
        for p in placed_phases(path):
            if not any(p.batches):
                continue
            got: list[tuple[int, list[Any]]] = []
            simulate(p, own_step_profile(p, profile) if own_steps else profile, encoder, cache, batches_into=got)
            for e, real in enumerate(p.batches):
                if not real:
                    continue
                r, s = summarize(real), summarize([b for k, b in got if k == e])
                lines.append(f"| {path.name} | {p.router} | {p.rate:g} | {p.phase} | {e} | "
                             + " | ".join(_cell(r[c], s[c]) for c in COLUMNS) + " |")
    return f"profile {profile.name}; each cell real / simulated\n" + "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, nargs="+", required=True)
    p.add_argument("--profile", default=perf.GPU_FLEET_PROFILE)
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a profile field")
    p.add_argument("--own-steps", action="store_true",
                   help="each phase at the fixed cost of its own step clock (fidelity_machine.own_step_profile)")
    a = p.parse_args()
    profile = perf.overridden(perf.PROFILES[a.profile], a.set)
    print(report(a.results, profile, a.own_steps))


if __name__ == "__main__":
    main()
