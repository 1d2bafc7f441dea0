"""Continuous-batching scheduler, step by step, as SGLang's Scheduler + PrefillAdder (pure, no I/O).

Each call to ``next_step`` forms one forward step:
1. Prefill first (SGLang's default): the chunked request in progress continues, then waiting
   requests are admitted in policy order (``fcfs``: arrival; ``lpm``: longest cached prefix first,
   falling back to fcfs above 128 waiting, as SGLang's WAITING_QUEUE_PREFIX_MATCH_MAX) while
   - running + admitted < ``max_running_requests``,
   - the new prompt tokens fit the step's budget: ``chunked_prefill_size`` per step (the request
     that overflows it is chunked: it takes what is left and continues next step) and
     ``max_prefill_tokens`` (the first request always fits),
   - at most ``prefill_max_requests`` new requests per step (when set),
   - KV: free + evictable tokens, minus the output tokens every admitted request may still
     generate, cover the new prompt tokens plus this request's ``max_new_tokens``.
   Admission stops at the first request that does not fit (head-of-line, as SGLang).
2. Otherwise, or also with ``enable_mixed_chunk``, one decode token for every running request.

``kind="hf_fifo"`` forms steps as Hugging Face transformers' continuous batching FIFO scheduler
does (``generation/continuous_batching/scheduler.py``, 5.13-5.24; the GPU fleet's engine):
decoding requests first, then prompts being prefilled, then waiting ones in arrival order, one
step budget for all of them (``chunked_prefill_size`` query tokens, a decode takes 1; a prompt is
split at any token), at most ``max_running_requests`` requests per step (not admitted: scheduled),
and a **KV-read budget**: the tokens already in KV of every request in the step (a decode: its
context; a cache hit: its matched prefix) add up to at most ``kv_read_budget``; a request over it
is skipped for this step, the next one tried (no head-of-line). So at ~3,000-token contexts a
48k-token pool runs ~15 requests a step, whatever memory is free: a hit waits while the batch
stays small. Below ``safety_margin`` free KV only decodes run, or one prefill when nothing decodes (the
engine stops at the first request not decoding once anything is scheduled; free KV is looked at
before each request, so the step's own admissions count). Admission keeps
this module's output reservation (the real engine allocates as it goes and preempts the newest
when an allocation fails; the reservation leaves that out).

``finish_step`` applies the step: prefill chunks advance (with ``cache_chunks`` a split prompt's
computed pages are cached after each); a finished prompt is cached (the radix tree, or the block
cache of ``blocks.py``) and yields the first output token; decodes yield one token each; requests end on
``max_new_tokens`` or a stop string and are cached (prompt + output) and unlocked. The matched
prefix is limited to len(prompt) - 1 so at least one token is computed, as SGLang does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from proxy.sim import tokenizer
from proxy.sim.blocks import BlockCache
from proxy.sim.perf import PrefillChunk, StepWork
from proxy.sim.radix import RadixCache

LPM_MAX_WAITING = 128
QUEUE_FULL_MESSAGE = "The request queue is full."


class QueueFull(Exception):
    """The waiting queue is at max_queued_requests (SGLang aborts with 503)."""


class InvalidRequest(ValueError):
    """The request can never run on this worker (answered with 400)."""


@dataclass(eq=False)
class SimRequest:
    rid: str
    input_ids: list[int]
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    arrival: float = 0.0
    output_ids: list[int] = field(default_factory=list)
    output_text: str = ""
    state: str = "new"  # new | waiting | prefilling | running | finished
    finish_reason: dict[str, Any] | None = None
    cached_tokens: int = 0
    prefilled: int = 0  # prompt tokens whose KV exists
    covered: int = 0  # leading tokens held (locked) in the radix tree
    private: int = 0  # KV tokens held outside the tree
    lock_node: Any = None  # the cache's handle on what it holds (Match.node)
    announced: list[int] = field(default_factory=list)  # blocks stored at admission (Scheduler.store_at_schedule)
    admitted_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    listener: Callable[[SimRequest], None] | None = None
    seed: int = 0
    dp_rank: int | None = None  # the data-parallel rank the request named (SimConfig.dp_size)

    def __post_init__(self) -> None:
        self.seed = tokenizer.output_seed(self.input_ids)

    @property
    def finished(self) -> bool:
        return self.state == "finished"

    @property
    def remaining_output(self) -> int:
        return self.max_new_tokens - len(self.output_ids)


@dataclass
class Step:
    prefill: list[tuple[SimRequest, int]]
    decode: list[SimRequest]
    work: StepWork


@dataclass
class SchedulerLimits:
    max_running_requests: int
    chunked_prefill_size: int  # <= 0: no chunking
    max_prefill_tokens: int
    max_queued_requests: int | None
    schedule_policy: str = "fcfs"
    enable_mixed_chunk: bool = False
    prefill_max_requests: int | None = None  # new requests admitted per prefill step
    context_length: int = 131072
    kind: str = "sglang"  # "sglang" | "hf_fifo" (see the module docstring)
    kv_read_budget: int | None = None  # hf_fifo: KV tokens a step may read (None = the pool's size)
    safety_margin: float = 0.0  # hf_fifo: below this share of KV free, decodes only (one prefill if none)
    # A split prompt's computed pages cached after each chunk, so a request admitted meanwhile finds
    # them (SGLang's cache_unfinished_req; transformers marks a split prefill's complete blocks).
    cache_chunks: bool = False


class Scheduler:
    def __init__(self, cache: RadixCache | BlockCache, limits: SchedulerLimits) -> None:
        self.cache = cache
        self.limits = limits
        self.waiting: list[SimRequest] = []
        self.prefilling: list[SimRequest] = []  # admitted, prompt not fully computed
        self.running: list[SimRequest] = []  # decoding
        self.steps_run = 0
        self.last_batch_hit_rate = 0.0
        self.generated_tokens = 0
        # KV events as vLLM times them: a prompt's blocks stored when admitted, before its prefill
        # ran; off, as SGLang: once the prefill ended (``RadixCache.announce``).
        self.store_at_schedule = False

    # -- intake ---------------------------------------------------------------------------------
    def submit(self, req: SimRequest, now: float) -> None:
        prompt = len(req.input_ids)
        if prompt == 0:
            raise InvalidRequest("The input is empty.")
        if req.max_new_tokens < 0:
            raise InvalidRequest("max_new_tokens must be >= 0")
        if prompt >= self.limits.context_length:
            raise InvalidRequest(
                f"The input ({prompt} tokens) is longer than the model's context length "
                f"({self.limits.context_length} tokens)."
            )
        if prompt + req.max_new_tokens > self.cache.capacity:
            raise InvalidRequest(
                f"The request needs {prompt + req.max_new_tokens} KV tokens; the pool holds {self.cache.capacity}."
            )
        cap = self.limits.max_queued_requests
        if cap is not None and len(self.waiting) + 1 > cap:
            raise QueueFull(QUEUE_FULL_MESSAGE)
        req.arrival = now
        req.state = "waiting"
        self.waiting.append(req)

    @property
    def num_running(self) -> int:
        return len(self.running) + len(self.prefilling)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    # -- forming a step -------------------------------------------------------------------------
    def next_step(self, now: float) -> Step | None:
        if self.limits.kind == "hf_fifo":
            prefill, decode = self._form_hf_step(now)
        else:
            prefill = self._form_prefill(now)
            decode = list(self.running) if (not prefill or self.limits.enable_mixed_chunk) else []
        if not prefill and not decode:
            return None
        work = StepWork(
            prefill=[PrefillChunk(n, req.prefilled) for req, n in prefill],
            decode_contexts=[len(r.input_ids) + len(r.output_ids) for r in decode],
            first_step=self.steps_run == 0,
        )
        self.steps_run += 1
        return Step(prefill, decode, work)

    def _order(self) -> list[SimRequest]:
        if self.limits.schedule_policy == "lpm" and len(self.waiting) <= LPM_MAX_WAITING:
            lengths = {id(r): self.cache.peek_prefix_len(r.input_ids[:-1]) for r in self.waiting}
            return sorted(self.waiting, key=lambda r: -lengths[id(r)])
        return list(self.waiting)

    def _form_prefill(self, now: float) -> list[tuple[SimRequest, int]]:
        lim, ps = self.limits, self.cache.page_size
        chunk_left = lim.chunked_prefill_size if lim.chunked_prefill_size > 0 else 1 << 62
        input_left = lim.max_prefill_tokens
        entries: list[tuple[SimRequest, int]] = []
        for req in self.prefilling:  # the chunked request in progress goes first
            n = self._chunk(req, chunk_left)
            if n > 0:
                entries.append((req, n))
                chunk_left -= n
                input_left -= n
        if any(n < len(r.input_ids) - r.prefilled for r, n in entries):
            return entries  # still chunking: the budget is spent
        reserved = sum(r.remaining_output for r in self.running) + sum(
            r.remaining_output for r in self.prefilling
        )
        hit = new = admitted = 0
        for req in self._order():
            if self.num_running >= lim.max_running_requests or chunk_left < ps:
                break
            if lim.prefill_max_requests is not None and admitted >= lim.prefill_max_requests:
                break
            if entries and input_left <= 0:
                break
            match = self.cache.match_prefix(req.input_ids[:-1])
            self.cache.inc_lock(match.node)
            extend = len(req.input_ids) - match.length
            headroom = self.cache.available_tokens + self.cache.evictable_tokens - reserved
            if extend + req.max_new_tokens > headroom or (entries and extend > input_left):
                self.cache.dec_lock(match.node)
                break
            self._admit(req, match.node, match.length, now)
            reserved += req.max_new_tokens
            n = self._chunk(req, chunk_left)
            entries.append((req, n))
            chunk_left -= n
            input_left -= n
            hit, new, admitted = hit + match.length, new + extend, admitted + 1
            if n < extend:
                break  # this request is the chunked one
        if hit + new:
            self.last_batch_hit_rate = hit / (hit + new)
        return entries

    def _form_hf_step(self, now: float) -> tuple[list[tuple[SimRequest, int]], list[SimRequest]]:
        lim, cache = self.limits, self.cache
        read_left = lim.kv_read_budget if lim.kv_read_budget is not None else cache.capacity
        tokens_left = lim.chunked_prefill_size if lim.chunked_prefill_size > 0 else 1 << 62
        slots = lim.max_running_requests
        margin = lim.safety_margin * cache.capacity
        reserved = sum(r.remaining_output for r in self.running) + sum(r.remaining_output for r in self.prefilling)
        prefill: list[tuple[SimRequest, int]] = []
        decode: list[SimRequest] = []
        hit = new = 0
        for req in [*self.running, *self.prefilling, *self.waiting]:
            if slots <= 0 or tokens_left <= 0:
                break
            # Short of memory: decodes only, or one prefill when nothing decodes. Checked before each
            # request against what is free now, after this step's earlier admissions (as the engine
            # does): a burst of prompts stops at the margin instead of all entering on one look.
            low = cache.available_tokens + cache.evictable_tokens < margin
            if req.state != "running" and low and (prefill or decode):
                break
            if req.state == "waiting":
                match = cache.match_prefix(req.input_ids[:-1])
                cache.inc_lock(match.node)
                extend = len(req.input_ids) - match.length
                if extend + req.max_new_tokens > cache.available_tokens + cache.evictable_tokens - reserved:
                    cache.dec_lock(match.node)
                    continue
                self._admit(req, match.node, match.length, now)
                reserved += req.max_new_tokens
                hit, new = hit + match.length, new + extend
            if req.state == "running":
                read, n = len(req.input_ids) + len(req.output_ids) - 1, 1
            else:
                read, n = req.prefilled, min(len(req.input_ids) - req.prefilled, tokens_left)
            if read > read_left:
                continue  # its KV does not fit this step's reads: it waits a step, the next is tried
            if req.state == "running":
                decode.append(req)
            else:
                prefill.append((req, n))
            read_left, tokens_left, slots = read_left - read, tokens_left - n, slots - 1
        if hit + new:
            self.last_batch_hit_rate = hit / (hit + new)
        return prefill, decode

    def _admit(self, req: SimRequest, node: Any, matched: int, now: float) -> None:
        """``req`` leaves the queue holding its matched prefix (locked) and KV for the rest."""
        extend = len(req.input_ids) - matched
        self.cache.alloc(extend)
        self.waiting.remove(req)
        req.state, req.admitted_at, req.lock_node = "prefilling", now, node
        req.cached_tokens = req.prefilled = req.covered = matched
        req.private = extend
        self.prefilling.append(req)
        if self.store_at_schedule:
            req.announced = self.cache.announce(req.input_ids, node, matched)

    def _chunk(self, req: SimRequest, chunk_left: int) -> int:
        todo = len(req.input_ids) - req.prefilled
        if todo <= chunk_left:
            return todo
        return chunk_left - chunk_left % self.cache.page_size

    # -- applying a step ------------------------------------------------------------------------
    def finish_step(self, step: Step, now: float) -> list[SimRequest]:
        touched: list[SimRequest] = []
        for req, n in step.prefill:
            if req.finished:
                continue  # aborted while the step ran
            req.prefilled += n
            if req.prefilled < len(req.input_ids) and self.limits.cache_chunks:
                self._cache_prompt(req, req.prefilled)
            if req.prefilled >= len(req.input_ids):
                self.prefilling.remove(req)
                self._cache_prompt(req)
                req.state = "running"
                self.running.append(req)
                self._emit(req, now)
                touched.append(req)
        for req in step.decode:
            if req.state == "running":
                self._emit(req, now)
                touched.append(req)
        return touched

    def _cache_prompt(self, req: SimRequest, upto: int | None = None) -> None:
        """Cache the prompt's computed whole pages (all of it by default: its prefill ended)."""
        upto = len(req.input_ids) if upto is None else upto
        if upto == len(req.input_ids):
            req.announced = []  # its prefill ended: what was announced is the tree's now
        ps = self.cache.page_size
        aligned = upto - upto % ps
        held = aligned - req.covered
        if held <= 0:
            return
        self.cache.insert(req.input_ids[:aligned], held)
        req.private -= held
        node = self.cache.match_prefix(req.input_ids[:aligned]).node
        self.cache.inc_lock(node)
        assert req.lock_node is not None
        self.cache.dec_lock(req.lock_node)
        req.lock_node, req.covered = node, aligned

    def _emit(self, req: SimRequest, now: float) -> None:
        if req.max_new_tokens == 0:
            self._finish(req, {"type": "length", "length": 0}, now)
            return
        self.cache.alloc(1)
        req.private += 1
        token, word = tokenizer.output_token(req.seed, len(req.output_ids))
        before = len(req.output_text)
        req.output_ids.append(token)
        req.output_text = f"{req.output_text} {word}" if req.output_text else word
        self.generated_tokens += 1
        if req.first_token_at is None:
            req.first_token_at = now
        req.last_token_at = now
        for stop in req.stop:
            at = req.output_text.find(stop, max(0, before - len(stop)))
            if stop and at >= 0:
                req.output_text = req.output_text[:at]
                self._finish(req, {"type": "stop", "matched": stop}, now)
                return
        if len(req.output_ids) >= req.max_new_tokens:
            self._finish(req, {"type": "length", "length": len(req.output_ids)}, now)

    # -- ending ---------------------------------------------------------------------------------
    def _finish(self, req: SimRequest, reason: dict[str, Any], now: float) -> None:
        if req.state in ("running", "prefilling"):
            (self.running if req.state == "running" else self.prefilling).remove(req)
            seq: list[int] = []
            held = 0
            if reason["type"] != "abort":
                seq = req.input_ids + req.output_ids
                seq = seq[: len(seq) - len(seq) % self.cache.page_size]
                held = max(0, len(seq) - req.covered)
                req.private -= held
            if req.announced and reason["type"] == "abort":
                self.cache.withdraw(req.input_ids, req.announced)  # announced, never computed
            # cache what it computed and let go of what it held (the order is the cache's)
            self.cache.release(req.lock_node, seq, held)
            self.cache.free(req.private)
            req.private = 0
            req.lock_node = None
        elif req.state == "waiting":
            self.waiting.remove(req)
        req.state, req.finish_reason, req.finished_at = "finished", reason, now

    def abort(self, req: SimRequest, now: float, message: str = "Aborted by request.", status: int | None = None) -> bool:
        if req.finished:
            return False
        reason: dict[str, Any] = {"type": "abort", "message": message, "status_code": status, "err_type": None}
        self._finish(req, reason, now)
        return True

    def all_requests(self) -> list[SimRequest]:
        return [*self.waiting, *self.prefilling, *self.running]

    def waiting_uncached_tokens(self) -> int:
        return sum(len(r.input_ids) - self.cache.peek_prefix_len(r.input_ids[:-1]) for r in self.waiting)

    def flush_cache(self) -> bool:
        if self.has_work():
            return False
        self.cache.reset()
        return True
