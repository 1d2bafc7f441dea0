"""Roofline time model: how long one forward step of a continuous-batching engine takes.

A step runs some prefill chunks (new tokens on top of a cached/earlier context) and/or one decode
token for each running sequence. Its time is

    t = max(FLOPs / (peak_flops * mfu), bytes / (hbm_bw * bw_eff))
        + step_overhead + seq_overhead * sequences_in_step (+ warmup on the engine's first step)

FLOPs: 2 * (params - embedding params) per new token through the transformer blocks, plus the
LM head (2 * vocab * hidden) once per sequence (a prefill only needs logits for its last token),
plus attention, 4 * layers * q_dim per (query, key) pair: a prefill chunk of n tokens over a
context of c earlier tokens attends to n*c + n*(n+1)/2 pairs, a decode token to its whole
context. Cached prefix tokens therefore cost no linear FLOPs but are still attended. Bytes: the
weights once per step (the input embedding is a row gather, not a full read), plus the KV of every
context the step reads (decode and prefill alike), plus the KV it writes. Long prefill is
compute-bound, decode memory-bound; a mixed step sums the work and pays one roofline. Every term
grows with tokens and batch, so step time is monotonic in both. Constants and sources:
proxy/sim/README.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

TFLOPS = 1e12
TB = 1e12


@dataclass(frozen=True)
class ModelShape:
    name: str
    params: float  # parameter count (all weights read each step)
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context_length: int
    dtype_bytes: int = 2  # bf16
    tied_embeddings: bool = False

    @property
    def embedding_params(self) -> float:
        return float(self.vocab * self.hidden)

    @property
    def block_params(self) -> float:
        """Parameters of the transformer blocks (everything but input embedding and LM head)."""
        heads = 1 if self.tied_embeddings else 2
        return self.params - heads * self.embedding_params

    @property
    def weight_bytes(self) -> float:
        """Bytes a forward step reads: all weights except the input-embedding table."""
        read = self.params - (0 if self.tied_embeddings else self.embedding_params)
        return read * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def attn_flops_per_pair(self) -> float:
        # QK^T and PV: 2 matmuls x 2 FLOPs per MAC x (heads * head_dim) per layer.
        return 4.0 * self.layers * self.heads * self.head_dim


@dataclass(frozen=True)
class GPU:
    name: str
    peak_bf16_flops: float  # dense
    hbm_bytes_per_s: float
    memory_bytes: float


@dataclass(frozen=True)
class Profile:
    name: str
    model: ModelShape
    gpu: GPU
    mfu: float  # achieved fraction of peak FLOPs in compute-bound steps
    bw_eff: float  # achieved fraction of HBM bandwidth in memory-bound steps
    step_overhead_s: float  # scheduling + launch cost per forward step
    seq_overhead_s: float = 0.0  # per sequence in the step (engines without CUDA graphs)
    # per context token the step's attention reads (paged attention gathering its KV blocks)
    ctx_overhead_s: float = 0.0
    # The share of the per-sequence and per-context-token costs that is GPU work (small kernels
    # per sequence), which engines sharing a GPU queue for (SharedGpu); the rest is host time.
    seq_gpu_share: float = 0.0
    warmup_s: float = 0.0  # extra cost of the very first step (kernel compilation, autotuning)
    mem_fraction_static: float = 0.88
    graph_reserve_bytes: float = 4e9  # activations + CUDA graphs, left out of the KV pool
    chunked_prefill_size: int = 8192
    max_running_requests: int = 1024
    enable_mixed_chunk: bool = False
    prefill_max_requests: int | None = None
    # Share of host time a step holds a shared GPU (SharedGpu.exclusive; 0 = only its kernels).
    gpu_exclusive_host: float = 0.0
    # How engine processes on one GPU share it: "fcfs" (SharedGpu: whole steps, first come first
    # served), "slices" (gpu_share.TimeSlicedGpu: a share each, as the driver time-slices
    # contexts, weighted by gpu_share_exponent), "quanta" (turns of gpu_quantum_s, round robin)
    # or "slices-overlap" (and a step's host time beside its own GPU work); the virtual-time
    # loops and the HTTP simulator's --shared-gpu (gpu_realtime) alike. Weighted slices match
    # the GPU's step clock (h200-transformers-7b-slices), the others measured worse than fcfs
    # (proxy/sim/README.md).
    gpu_sharing: str = "fcfs"
    gpu_quantum_s: float = 0.05  # "quanta": the longest a step holds the GPU before the next in turn
    # "slices": a step's share weighs (its GPU seconds) ** this (0: equal shares)
    gpu_share_exponent: float = 0.0
    # The prefix cache evicts the most recently used unreferenced blocks first (else LRU).
    evict_most_recent: bool = False
    # The prefix cache as transformers' block manager keeps it (proxy/sim/blocks.py: hash-chained
    # blocks released in sequence order, the most recently released evicted first, a prefix's
    # blocks before the tails that hang from it) instead of a radix tree.
    kv_blocks: bool = False
    # A split prompt's computed pages cached after each chunk (scheduler.SchedulerLimits.cache_chunks),
    # as both engines do (SGLang's cache_unfinished_req; transformers marks a split prefill's blocks).
    cache_chunks: bool = True
    # How steps are formed (scheduler.py): "sglang", or "hf_fifo" (transformers' FIFO scheduler,
    # with its per-step KV-read budget: None = the KV pool's size, as the engine sets it).
    scheduler: str = "sglang"
    kv_read_budget: int | None = None
    safety_margin: float = 0.0  # hf_fifo: below this free share of KV, decodes only (one prefill if none)
    # The step's attention as one dense product of every query token of the step against every key
    # it reads (transformers' `paged|sdpa`: the batch's queries packed, its KV gathered, a 4-D mask
    # keeping each sequence to its own), at ``attn_eff`` of peak; else per sequence, at ``mfu``.
    # Its batch logs show it: a prompt token costs 2.5x more beside 8+ decodes than alone.
    dense_attention: bool = False
    attn_eff: float = 0.0  # dense_attention: achieved fraction of peak FLOPs in it

    @property
    def kv_pool_tokens(self) -> int:
        usable = self.gpu.memory_bytes * self.mem_fraction_static - self.model.weight_bytes
        usable -= self.graph_reserve_bytes
        return max(1, int(usable // self.model.kv_bytes_per_token))


@dataclass(frozen=True)
class PrefillChunk:
    new_tokens: int
    context_before: int  # tokens already in KV before this chunk (cached prefix + earlier chunks)


@dataclass(frozen=True)
class StepWork:
    prefill: Sequence[PrefillChunk] = ()
    decode_contexts: Sequence[int] = ()  # context length of each decoding sequence
    first_step: bool = False


def step_seconds(profile: Profile, work: StepWork) -> float:
    host, device = step_parts(profile, work)
    return host + device


def step_parts(profile: Profile, work: StepWork) -> tuple[float, float]:
    """(host, device) seconds of one step: the engine's own overhead (scheduling, kernel
    launches; warm-up included) and the roofline time of its GPU work."""
    if profile.mfu <= 0:  # the `zero` profile: no physics, overhead benchmarks only
        return 0.0, 0.0
    if not work.prefill and not work.decode_contexts:
        return 0.0, 0.0
    m = profile.model
    new_tokens = sum(c.new_tokens for c in work.prefill) + len(work.decode_contexts)
    sequences = len(work.prefill) + len(work.decode_contexts)
    pairs = sum(c.new_tokens * c.context_before + c.new_tokens * (c.new_tokens + 1) / 2 for c in work.prefill)
    pairs += sum(work.decode_contexts)
    flops = 2.0 * m.block_params * new_tokens + 2.0 * m.embedding_params * sequences
    kv_read = sum(c.context_before for c in work.prefill) + sum(work.decode_contexts)
    if profile.dense_attention:
        attention_s = m.attn_flops_per_pair * new_tokens * (kv_read + new_tokens) / (
            profile.gpu.peak_bf16_flops * profile.attn_eff)
    else:
        flops += m.attn_flops_per_pair * pairs
        attention_s = 0.0
    bytes_moved = m.weight_bytes + m.kv_bytes_per_token * (kv_read + new_tokens)
    compute_s = flops / (profile.gpu.peak_bf16_flops * profile.mfu) + attention_s
    memory_s = bytes_moved / (profile.gpu.hbm_bytes_per_s * profile.bw_eff)
    per_seq = profile.seq_overhead_s * sequences + profile.ctx_overhead_s * kv_read
    host = profile.step_overhead_s + (1.0 - profile.seq_gpu_share) * per_seq
    device = max(compute_s, memory_s) + profile.seq_gpu_share * per_seq
    return host + (profile.warmup_s if work.first_step else 0.0), device


class SharedGpu:
    """One GPU that several engine processes share (no MPS: the driver time-slices contexts).

    A step of ``host`` + ``device`` seconds holds the GPU for ``device`` plus the share
    ``exclusive`` of its host time: an engine launching kernels one by one keeps its context
    resident between them, so another process's kernels wait through part of those gaps too.
    Steps take the GPU first come, first served; the rest of the host time overlaps other
    engines' GPU work. Alone on the GPU a step takes ``host + device`` whatever ``exclusive`` is.
    """

    def __init__(self, exclusive: float = 0.0) -> None:
        if not 0.0 <= exclusive <= 1.0:
            raise ValueError("exclusive must be within [0, 1]")
        self.exclusive = exclusive
        self.free_at = float("-inf")

    def reserve(self, now: float, host: float, device: float) -> float:
        """The end of a step issued at ``now``; the GPU is busy with it until then."""
        held = self.exclusive * host + device
        start = max(now + host - self.exclusive * host, self.free_at)
        self.free_at = start + held
        return self.free_at


# -- constants (sources in README.md) ---------------------------------------------------------
LLAMA_31_8B = ModelShape(
    "meta-llama/Llama-3.1-8B-Instruct", params=8.03e9, layers=32, hidden=4096, heads=32,
    kv_heads=8, head_dim=128, vocab=128256, context_length=131072,
)
# The calibration engine's model: Llama-3.1-8B shape with a 32,000-token vocabulary (7.24 B).
LLAMA_SHAPE_7B = ModelShape(
    "llama-3.1-8b-shape-vocab32k", params=7.24e9, layers=32, hidden=4096, heads=32,
    kv_heads=8, head_dim=128, vocab=32000, context_length=131072,
)
H100_SXM = GPU("NVIDIA H100 SXM5 80GB", peak_bf16_flops=989.4 * TFLOPS, hbm_bytes_per_s=3.35 * TB,
               memory_bytes=80e9)
H200_SXM = GPU("NVIDIA H200 SXM 141GB", peak_bf16_flops=989.4 * TFLOPS, hbm_bytes_per_s=4.8 * TB,
               memory_bytes=141e9)

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        # SGLang with CUDA graphs + FlashInfer: decode near the bandwidth roofline.
        Profile("llama-3.1-8b-h100", LLAMA_31_8B, H100_SXM, mfu=0.62, bw_eff=0.75,
                step_overhead_s=0.0012),
        Profile("llama-3.1-8b-h200", LLAMA_31_8B, H200_SXM, mfu=0.62, bw_eff=0.75,
                step_overhead_s=0.0012),
        # HF transformers ContinuousBatchingManager behind the HTTP shim (loadtests/gpu/engine_server.py),
        # no CUDA graphs. Its scheduler as the engine's code has it (scheduler.py "hf_fifo": the
        # shim's max_batch_tokens 8192 and max_requests_per_batch 64, the KV-read budget of the
        # pool's size, the 0.15 safety margin); the costs fitted under load (loadtests/fidelity.py
        # --sweep) to the runs with the engines' caches flushed between phases: one engine alone at
        # 1-4 req/s (gpu-fleet-calibrate-2) and 4 engine processes sharing the H200 (SharedGpu) at
        # 3-6 req/s (it, gpu-fleet-compare-3..5). 80% of the per-sequence cost is GPU work that the
        # processes queue for, the rest host time; a fifth of a step's host time holds the GPU from
        # the other processes (no MPS: their contexts time-slice it). Its prefix cache is the engine's
        # block manager (kv_blocks, since 2026-12-07; before, a radix tree evicting the newest leaves).
        Profile("h200-transformers-7b", LLAMA_SHAPE_7B, H200_SXM, mfu=0.22, bw_eff=0.70,
                step_overhead_s=0.06, seq_overhead_s=0.002, ctx_overhead_s=1e-6, seq_gpu_share=0.8,
                gpu_exclusive_host=0.2, evict_most_recent=True, kv_blocks=True, warmup_s=1.5,
                scheduler="hf_fifo", chunked_prefill_size=8192, max_running_requests=64, safety_margin=0.15),
        # The same engine driven through its Python API one request at a time (gpu-calibration.md),
        # fitted by loadtests/calibrate_sim.py. Faster than the served engine under load by 30-70%:
        # the single-request points miss the HTTP shim, tokenization and per-context-token costs.
        Profile("h200-transformers-7b-engine-only", LLAMA_SHAPE_7B, H200_SXM, mfu=0.44, bw_eff=0.70,
                step_overhead_s=0.033, seq_overhead_s=0.003, warmup_s=1.5,
                chunked_prefill_size=16384, max_running_requests=256, enable_mixed_chunk=True,
                prefill_max_requests=1),
        # No delays at all: measures the harness and proxy, not the physics.
        Profile("zero", LLAMA_31_8B, H100_SXM, mfu=0.0, bw_eff=0.0, step_overhead_s=0.0),
    )
}

# The served engine above with the GPU shared as its engines' step clock shows it (gpu-fleet-steps-1/2,
# `fidelity_placed --steps`): beside three busy engines a step's fixed host cost stays what it is
# alone, while its per-request and per-prefill-token costs grow 2.7-3.7x; time slices (shares
# weighted by each step's GPU seconds ** 0.3, all per-sequence cost GPU work, no host time holding
# the GPU) reproduce that, where whole steps turn the sharing into a fixed wait. Alone it is the
# profile above. The GPU-fleet tools' default before the dense attention below.
PROFILES["h200-transformers-7b-slices"] = dataclasses.replace(
    PROFILES["h200-transformers-7b"], name="h200-transformers-7b-slices", gpu_sharing="slices",
    gpu_exclusive_host=0.0, seq_gpu_share=1.0, gpu_share_exponent=0.3)


# The served engine as its own batch logs show it (runs 57-59, `loadtests/fit_steps.py`): its
# `paged|sdpa` attention is one dense product of the step's query tokens against every key the step
# gathers, 1.5-1.6 ns a (query, key) pair on all three machines measured (0.35 of peak), so a
# prompt token costs 2.5x more beside 8+ decodes than alone, while its GEMMs run at 0.55 of peak
# (22-25 us a token). The host's own cost (step_overhead_s) is the machine's: 53-58 ms on two
# machines, 87 on a third; 70 ms here, the best over the 48 lone-engine points of every committed
# run. Four engines on the GPU: time slices, every step holding it for its GPU work and 27% of its
# host time (an engine launching kernels one by one keeps its context busy), equal shares. The
# fleet's split between a step's fixed host cost (65 ms), its per-sequence GPU work (2 ms a
# sequence, stretched by the sharing) and the host time that holds the GPU (15%) is refitted
# (2026-12-05) so that its steps cost what the engines' step clock shows at every number of busy
# neighbours (c0 58-79 ms, 5.8-18.2 ms a decoding request against the real 59-73 and 5.1-17.8):
# with 70 ms, 1 ms and 27% the routed rounds' tails came out narrower than the engine's (log-log
# slope of sim on real TTFT p95 0.83; light rounds 1.16x slow, heavy ones 0.83x fast), now 0.95
# (proxy/sim/README.md "The tail"). The GPU-fleet tools' default (GPU_FLEET_PROFILE).
PROFILES["h200-transformers-7b-dense"] = dataclasses.replace(
    PROFILES["h200-transformers-7b-slices"], name="h200-transformers-7b-dense", dense_attention=True, mfu=0.55,
    attn_eff=0.35, step_overhead_s=0.065, seq_overhead_s=0.002, ctx_overhead_s=8e-7, gpu_exclusive_host=0.15,
    gpu_share_exponent=0.0)
GPU_FLEET_PROFILE = "h200-transformers-7b-dense"

# The same engine cut to 16 layers, its steps to 4,096 tokens, on an H100 (`engine_server.py --layers
# 16 --max-batch-tokens 4096`): the fleet's 4 engines of 32 layers reach 28-36 GiB each after load,
# over an H100's 80 together, and a step's transient memory grows with its tokens. A prediction,
# not a fit: the model's shape carries the GPU work (half the weights, prefill and attention FLOPs,
# KV bytes; the H100's bandwidth); the step's host cost and per-sequence work stay the 32-layer
# engine's, an assumption the engine's batch log on an H100 checks (`loadtests/fit_steps.py`).
LLAMA_SHAPE_7B_16L = dataclasses.replace(
    LLAMA_SHAPE_7B, name="llama-3.1-8b-shape-vocab32k-16-layers",
    params=LLAMA_SHAPE_7B.params - 16 * (LLAMA_SHAPE_7B.block_params / LLAMA_SHAPE_7B.layers), layers=16)
PROFILES["h100-transformers-16l-dense"] = dataclasses.replace(
    PROFILES["h200-transformers-7b-dense"], name="h100-transformers-16l-dense", model=LLAMA_SHAPE_7B_16L,
    gpu=H100_SXM, chunked_prefill_size=4096)
# What runs 73-74 showed instead (`gpu-fleet-h100-1/2`): beside three busy neighbours the 16-layer
# engine's steps took 0.57-0.65x the 32-layer one's at the same batch (decodes 100-109 ms against
# 154-159, prefill steps 125-144 against 221-253), so most of a step's "host" cost is per layer (an
# eager engine launching each layer's kernels, without CUDA graphs). Scaled after the run, not
# predicted: the step's three fitted costs (fixed, per sequence, per context token) halved with the
# layers. Replayed on the runs' traces it brackets the engine with the version halving only the first
# two: 6 of 10 phases within ±30% but the knee's 0.18-0.64x (fast), against 4 of 10 and 1.5-3.0x (slow).
_16L = PROFILES["h100-transformers-16l-dense"]
PROFILES["h100-transformers-16l-dense-scaled"] = dataclasses.replace(
    _16L, name="h100-transformers-16l-dense-scaled",
    **{k: getattr(_16L, k) / 2 for k in ("step_overhead_s", "seq_overhead_s", "ctx_overhead_s")})
# Fitted to runs 73-74 on the engines' own placement (`fidelity_placed --grid`, 16 points): the
# step's fixed host cost stays near the 32-layer engine's (60 ms against 65: the HTTP shim, the
# scheduler and the sampling do not scale with depth) while its per-sequence and per-context-token
# costs halve with the layers (the per-layer kernel launches). 10 of 10 of those phases within ±30%
# (the scaled profile above: 0); on runs 75-78, not seen by the fit, 21 of 25 (scaled: 1 of 22).
PROFILES["h100-transformers-16l-dense-fit"] = dataclasses.replace(
    PROFILES["h100-transformers-16l-dense-scaled"], name="h100-transformers-16l-dense-fit", step_overhead_s=0.06)
# The whole 32-layer engine alone on an H100 (one fits; four do not): the H200's profile with the
# H100's memory bandwidth, every fitted cost kept. A prediction from the card's sheet, not a fit:
# run 130 (`gpu-fleet-alone-7`) is the only run of this shape, and it came after (an H200 asked for).
PROFILES["h100-transformers-7b-dense"] = dataclasses.replace(
    PROFILES["h200-transformers-7b-dense"], name="h100-transformers-7b-dense", gpu=H100_SXM)


def overridden(profile: Profile, settings: Sequence[str]) -> Profile:
    """``profile`` with ``FIELD=VALUE`` settings applied, each value read as the field's type (a
    field that is None takes a number): how a machine's own constants (``loadtests.fit_steps``)
    reach the simulator. A bad setting raises ValueError naming the field."""
    for item in settings:
        key, sep, text = item.partition("=")
        if not sep or key in ("name", "model", "gpu") or key not in Profile.__dataclass_fields__:
            raise ValueError(f"profile setting {item!r}: not FIELD=VALUE of a profile's constants")
        current = getattr(profile, key)
        try:
            value: Any
            if isinstance(current, bool):
                if text not in ("True", "False", "true", "false"):
                    raise ValueError("not a boolean")
                value = text in ("True", "true")
            elif isinstance(current, str):
                value = text
            elif text == "None":
                value = None
            else:
                number = float(text)
                value = int(number) if isinstance(current, int) or (current is None and number.is_integer()) else number
        except ValueError as e:
            raise ValueError(f"profile setting {key}: {text!r} is {e}") from None
        profile = dataclasses.replace(profile, **{key: value})
    return profile
