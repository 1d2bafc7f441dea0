"""SimConfig: every knob of one simulated SGLang worker, with SGLang's defaults.

Field names follow SGLang's server arguments (``--max-running-requests`` -> ``max_running_requests``)
so a SimConfig reads like an SGLang launch. ``None`` means "auto": resolved from the performance
profile (KV pool size, chunked prefill size, batch cap), as SGLang resolves them from GPU memory.

Fault fields (``fault_*``) can be changed at runtime through ``Worker.set_faults``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy.sim.perf import Profile

DEFAULT_MODEL_NAME = "meta-llama/Llama-3.1-8B-Instruct"
SCHEDULE_POLICIES = ("fcfs", "lpm")
KV_EVENTS_AT = ("prefill", "schedule")


@dataclass
class SimConfig:
    host: str = "127.0.0.1"
    port: int = 0
    # Performance profile from perf.PROFILES: model x GPU x engine constants.
    profile: str = "llama-3.1-8b-h100"
    # FIELD=VALUE over the profile's constants (perf.overridden), e.g. a machine's own step costs
    # as loadtests/fit_steps.py fits them from its engine's batch log.
    profile_set: tuple[str, ...] = ()
    # The worker runs time_scale times faster than real time; reported latencies are real wall seconds.
    time_scale: float = 1.0
    served_model_name: str = DEFAULT_MODEL_NAME
    # Names the worker in the x-simworker-id header; None -> "simworker-<port>".
    worker_id: str | None = None
    # As SGLang's --api-key: generation endpoints then need "Authorization: Bearer <key>" (else 401).
    api_key: str | None = None
    enable_metrics: bool = False  # as SGLang: /metrics and meta_info timing fields need it
    enable_cache_report: bool = False
    # What an engine without cache or load reports gives: no cached_tokens in any answer, no
    # /v1/loads or /get_load (404), whatever enable_metrics says of /metrics.
    minimal_reports: bool = False
    # A Hugging Face tokenizer.json (file or directory); None = the deterministic tokenizer.
    tokenizer: str | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None  # KV pool in tokens
    page_size: int = 1
    # As SGLang's --kv-events-config: publish KV cache events (proxy/sim/kv_publish.py), e.g.
    # '{"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'
    # (port 0 = any free one: GET /get_server_info names the ones taken). None = off.
    kv_events_config: str | None = None
    # When a prompt's blocks are stored: "prefill" once its prefill ran (SGLang's radix cache),
    # "schedule" when the scheduler admits it, before the forward (vLLM v1's allocate_slots).
    kv_events_at: str = "prefill"
    schedule_policy: str = "fcfs"
    chunked_prefill_size: int | None = None  # -1 turns chunking off
    max_prefill_tokens: int = 16384
    max_queued_requests: int | None = None
    prefill_max_requests: int | None = None  # None: the profile's default (SGLang: no cap)
    stream_interval: int = 1
    incremental_streaming_output: bool = False
    enable_mixed_chunk: bool = False
    # As SGLang's --dp-size: this many schedulers behind the one server, each its own engine with its
    # own radix cache and KV pool (a replica per GPU set). A request naming its rank
    # (data_parallel_rank, routed_dp_rank) goes there; any other, round robin (SGLang's controller
    # does not look at prefixes). Its /metrics covers rank 0 only; /v1/loads has every rank.
    dp_size: int = 1
    context_length: int | None = None
    seed: int = 0  # seeds the fault-injection random.Random
    # Responses (POST /v1/responses with store) kept for previous_response_id and GET; the
    # least recently stored goes first. SGLang keeps them all (an unbounded dict); a bound keeps a
    # long load test's worker from growing without end.
    responses_store_max: int = 1024
    # Faults (runtime-settable).
    fault_die_after_tokens: int | None = None  # drop every connection once this many tokens were generated
    fault_hang_before_first_token: bool = False
    fault_error_rate: float = 0.0  # probability that a generate request answers 500
    fault_slow_start: float = 0.0  # simulated seconds of "starting" (health 503) after start
    fault_fail_health: bool = False

    def validate(self) -> None:
        if self.time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        if self.page_size < 1:
            raise ValueError("page_size must be >= 1")
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule_policy must be one of {SCHEDULE_POLICIES}")
        if self.stream_interval < 1:
            raise ValueError("stream_interval must be >= 1")
        if self.kv_events_at not in KV_EVENTS_AT:
            raise ValueError(f"kv_events_at must be one of {KV_EVENTS_AT}")
        if self.kv_events_config:
            from proxy.sim.kv_publish import KvEventsSettings

            try:
                KvEventsSettings.parse(self.kv_events_config)
            except (ValueError, TypeError) as e:
                raise ValueError(f"kv_events_config: {e}") from None
        if not 0.0 <= self.fault_error_rate <= 1.0:
            raise ValueError("fault_error_rate must be within [0, 1]")
        if not 1 <= self.dp_size <= 64:
            raise ValueError("dp_size must be within [1, 64]")
        if self.responses_store_max < 1:
            raise ValueError("responses_store_max must be >= 1")
        for name in ("max_running_requests", "max_total_tokens", "max_queued_requests", "prefill_max_requests"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1")
        from proxy.sim.perf import PROFILES

        if self.profile not in PROFILES:
            raise ValueError(f"unknown profile {self.profile!r}; known: {sorted(PROFILES)}")
        self.resolved_profile()

    def resolved_profile(self) -> Profile:
        """The profile by name with ``profile_set`` applied (ValueError naming a bad field)."""
        from proxy.sim.perf import PROFILES, overridden

        return overridden(PROFILES[self.profile], self.profile_set)


def base_url(host: str, port: int) -> str:
    """``http://host:port``, with IPv6 literals bracketed."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


FAULT_FIELDS = tuple(f.name for f in dataclasses.fields(SimConfig) if f.name.startswith("fault_"))


def fault_updates(**knobs: Any) -> dict[str, Any]:
    """Normalise ``set_faults`` keywords: ``die_after_tokens=`` and ``fault_die_after_tokens=`` both work."""
    updates: dict[str, Any] = {}
    for key, value in knobs.items():
        name = key if key.startswith("fault_") else f"fault_{key}"
        if name not in FAULT_FIELDS:
            raise TypeError(f"unknown fault knob {key!r}; known: {FAULT_FIELDS}")
        updates[name] = value
    return updates
