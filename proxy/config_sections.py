"""The config tree's sections: one frozen dataclass each, every field with its default and a
comment (``config.py`` loads, coerces and validates them; ``deploy/radixgate.example.yaml`` lists
them all)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    # Admin port (/metrics, /workers, /diagnosis): loopback by default, never the public host.
    admin_host: str = "127.0.0.1"
    admin_port: int = 8001
    # 0 disables the gRPC front; -1 binds any free port (tests; the bound port is App.grpc_port).
    grpc_port: int = 0
    # Seconds in-flight requests get to finish after SIGTERM.
    drain_grace_s: float = 30.0


@dataclass(frozen=True)
class WorkerEntry:
    url: str
    # Optional model served; empty = learned from /v1/models.
    model: str = ""
    # This worker's KV event endpoints, where they differ from the kv_events templates.
    kv_events: str = ""
    kv_events_replay: str = ""


@dataclass(frozen=True)
class WorkersConfig:
    static: tuple[WorkerEntry, ...] = ()
    # Most workers routed to at once: an addition on the admin port (POST /workers, /add_worker)
    # that would pass it is refused (409).
    max_workers: int = 1024


@dataclass(frozen=True)
class HealthConfig:
    interval_s: float = 2.0
    timeout_s: float = 2.0
    endpoint: str = "/health"
    fail_threshold: int = 2
    recover_threshold: int = 1
    # Passive ejection: consecutive connect errors / 5xx before a worker is ejected.
    eject_after_failures: int = 3
    # An ejected worker stays out at least this long; then one passing probe (or, with probes off,
    # the end of the cooldown) re-admits it.
    eject_cooldown_s: float = 5.0
    # Passive ejection takes out at most this fraction of the workers at once (always at least one):
    # requests that make every worker fail (a poison input) must not empty the fleet. Probes are not capped.
    max_ejected_fraction: float = 0.5


@dataclass(frozen=True)
class ScrapeConfig:
    # 0 turns the scrape loop off.
    interval_s: float = 0.5
    timeout_s: float = 1.0
    # A snapshot older than this counts as saturated.
    stale_after_s: float = 5.0


@dataclass(frozen=True)
class UpstreamConfig:
    connect_timeout_s: float = 2.0
    # Streams: until the first event. Non-stream answers: how often the worker's health is checked
    # while the answer is owed (a failing check is a timeout; a passing one waits on).
    first_byte_timeout_s: float = 60.0
    # Longest silence between two chunks of a stream.
    idle_timeout_s: float = 60.0
    total_timeout_s: float = 1800.0
    max_connections_per_worker: int = 256
    # Idle pooled connections are closed after this; keep it below the worker's own keep-alive
    # (uvicorn: 5 s) so a request never lands on a connection the worker is closing.
    keepalive_timeout_s: float = 4.0
    # Attempts on another worker while nothing has reached the client yet.
    max_retries: int = 2
    # Hard caps on what a worker can make the proxy hold (each breach is a 502, retried elsewhere
    # while nothing reached the client). A whole answer (non-stream body, error body):
    max_response_bytes: int = 64 * 1024 * 1024
    # One SSE event of a stream, up to its blank line (SGLang's cumulative chunks repeat the whole
    # text so far: a long answer's last event holds all of it).
    max_event_bytes: int = 8 * 1024 * 1024
    # A scrape or probe answer (/metrics, /v1/loads, /get_load, /get_server_info, /v1/models, /health);
    # over it, the scrape fails (the snapshot goes stale) or the probe fails.
    max_scrape_bytes: int = 8 * 1024 * 1024


@dataclass(frozen=True)
class RoutingConfig:
    # Default: estimated TTFT with prefix affinity (proxy/routing/ttft_cost.py); docs/routing.md and
    # docs/gpu-fleet.md have the measured comparison with the other policies.
    policy: str = "ttft"
    # Policy-specific parameters, validated by the policy registry at start-up.
    params: Mapping[str, Any] = field(default_factory=dict)
    # Characters per token when no tokenizer is available (prefix hashing estimate).
    chars_per_token: float = 4.0
    # The model's tokenizer.json (a file or its directory), for exact token counts and KV-event
    # matches of text prompts, and of chat prompts through the directory's chat template
    # (proxy/routing/tokenizer.py, chat_template.py; needs the "bpe" extra). "" = none.
    tokenizer: str = ""
    # Cap on blocks hashed per prompt.
    max_blocks: int = 2048
    session_header: str = "x-session-id"
    # Stored Responses ids remembered with the worker that holds each (GET / cancel and
    # previous_response_id go there); the oldest are forgotten first, then found by asking the workers.
    response_homes: int = 100_000
    # Other replicas' admin base URLs (http://host:admin_port): each decision is told to them and
    # theirs to us (proxy/peers.py), so replicas find prefixes the others placed. () = share nothing.
    peers: tuple[str, ...] = ()
    # Peers from DNS too: a headless Service over the replicas' pods (A/AAAA records, re-resolved
    # every peers_dns_interval_s), each address at peers_port (0 = our own server.admin_port). A
    # replica finds itself among them and skips itself.
    peers_dns: str = ""
    peers_dns_interval_s: float = 5.0
    peers_port: int = 0
    # Each peer gets one WebSocket; a message goes out as soon as there is something to send
    # (what is decided meanwhile goes in the same one); > 0 waits this long first, to batch more.
    peer_sync_interval_s: float = 0.0
    # Connecting to a peer (TCP + WebSocket handshake); a failed attempt is retried with backoff.
    peer_timeout_s: float = 0.5
    # Ping each peer this often; one that does not answer within half of it is reconnected. 0 = off.
    peer_heartbeat_s: float = 5.0
    # Environment variable holding a key shared by the replicas (sent and required as a Bearer
    # token on GET /peer/stream); "" = none.
    peer_key_env: str = ""
    # The longest a request is held at the proxy while the prefix it would reuse is still being
    # prefilled on its worker by an earlier request (the policy's "hold" branch, ttft's
    # hold_tokens); then it is routed whatever happened. 0 = never hold, the default: on the real
    # GPU fleet (FIFO engines, loadtests/results/gpu-fleet) a held request re-queued behind the
    # queue its holder had waited through, so holds cost followers seconds past the knee and saved
    # nothing measurable below it; the simulator's SGLang-like scheduler shows gains in bursts.
    hold_max_s: float = 0.0
    # Pin each request to one data-parallel rank of a worker that reports dp_size > 1 (SGLang
    # --dp-size, DP attention), by its prompt's leading tokens, so a shared prefix stays in one
    # rank's cache (proxy/routing/dp_rank.py; sends data_parallel_rank). Off: the worker's own
    # controller spreads requests over its ranks. On since GPU run 68 (2026-12-05): 4 engines as 2
    # workers of 2 ranks, TTFT p95 0.16x the policy without it at the knee, level with smg --dp-aware.
    dp_ranks: bool = True


@dataclass(frozen=True)
class AdmissionConfig:
    # Per-worker outstanding limit; 0 = derive from the worker's max_running_requests.
    per_worker_limit: int = 0
    # Derived limit = ceil(max_running_requests * limit_factor); > 1 lets a little queue form on the worker.
    limit_factor: float = 1.0
    # Limit for a worker whose max_running_requests is not known yet (before its first scrape).
    unknown_worker_limit: int = 256
    queue_size: int = 1024
    queue_timeout_s: float = 30.0
    priority_header: str = "x-priority"


@dataclass(frozen=True)
class LimitsConfig:
    # Public-port request limits; proxy/limits.py states each rule. 0 turns a count or rate limit off.
    max_body_bytes: int = 8 * 1024 * 1024
    max_prompt_chars: int = 2_000_000
    # Longest request line or single header field (bytes), and most header fields: 400 beyond.
    max_header_bytes: int = 8190
    max_headers: int = 128
    # Open client connections on the public port; one more is answered 503 and closed.
    max_connections: int = 4096
    # A client connection with no request in progress is closed after this (also bounds a client
    # that never finishes sending its headers). Above the usual 600 s load-balancer idle timeout,
    # so a balancer in front closes first and never writes into a connection we are closing.
    idle_timeout_s: float = 620.0
    # Reading the request body must finish within this: 408 beyond (a client trickling its body).
    body_timeout_s: float = 60.0
    # A TLS handshake must finish within this, else the connection is closed (a client that opens
    # connections and never says hello would otherwise hold each for asyncio's default 60 s, before
    # the connection limit counts it).
    tls_handshake_timeout_s: float = 10.0
    # Per-client token bucket on the generation endpoints: rate_limit_rps sustained, bursts of
    # rate_limit_burst; 429 with Retry-After beyond. 0 = off. Clients: API key, else peer address.
    rate_limit_rps: float = 0.0
    rate_limit_burst: int = 20
    # Bound on the clients tracked at once (least recently seen forgotten first).
    rate_limit_clients: int = 10_000


@dataclass(frozen=True)
class SecurityConfig:
    # API keys for the public HTTP and gRPC ports (Authorization: Bearer KEY, or x-api-key: KEY).
    # Keys come from a file (one per line, # comments) and/or the environment variable named here
    # (comma-separated); none found = no authentication. Keys never appear in the config or logs.
    api_keys_file: str = ""
    api_keys_env: str = "RADIXGATE_API_KEYS"
    # The key radixgate presents to workers started with SGLang's --api-key, read from this
    # environment variable. Unset: the caller's Authorization passes through, but only while
    # radixgate checks no keys of its own (a key meant for radixgate never reaches a worker).
    upstream_api_key_env: str = "RADIXGATE_UPSTREAM_API_KEY"
    # The key that adding and removing workers on the admin port needs (Authorization: Bearer KEY),
    # read from this environment variable. Unset: those changes are taken only while the admin
    # port listens on loopback (server.admin_host); on any other address they are refused (403).
    admin_key_env: str = "RADIXGATE_ADMIN_KEY"
    # How often api_keys_file and the tls files are checked for changes and re-read (proxy/rotation.py;
    # also on SIGHUP). 0 = on SIGHUP only.
    reload_interval_s: float = 10.0


@dataclass(frozen=True)
class TelemetryConfig:
    log_level: str = "info"
    # One JSON line per request; prompts are never logged unless this is true.
    log_requests: bool = True
    log_prompts: bool = False
    # OTLP/HTTP endpoint for each request's stage spans (proxy/telemetry/tracing.py; the otel extra),
    # e.g. http://otel-collector:4318/v1/traces. "" = no spans (the caller's trace context is still
    # passed on to the worker).
    otlp_traces_endpoint: str = ""
    # Share of requests without a caller's sampling decision that get spans.
    trace_sample_ratio: float = 1.0
    service_name: str = "radixgate"


@dataclass(frozen=True)
class DnsDiscoveryConfig:
    # Headless Service name (A/AAAA), e.g. "sglang.llm.svc.cluster.local"; with srv, the SRV name,
    # e.g. "_http._tcp.sglang.llm.svc.cluster.local" (ports then come from the records).
    name: str = ""
    srv: bool = False
    # "host" or "host:port" of the DNS server for SRV queries; empty = each nameserver of /etc/resolv.conf in turn.
    nameserver: str = ""
    timeout_s: float = 2.0


@dataclass(frozen=True)
class KubernetesDiscoveryConfig:
    # Empty = the pod's own namespace (service-account file), else "default".
    namespace: str = ""
    # "endpointslices" (discovery.k8s.io/v1) or "pods".
    resource: str = "endpointslices"
    # e.g. "kubernetes.io/service-name=sglang" (endpointslices) or "app=sglang" (pods).
    label_selector: str = ""
    # Named port on the slice / container (e.g. "http"); empty = discovery.port.
    port_name: str = ""
    api_server: str = "https://kubernetes.default.svc"
    token_file: str = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    ca_file: str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    # Server-side watch timeout; the client gives up on a silent stream a little after it.
    watch_timeout_s: int = 240
    # Reconnect backoff doubles from interval_s up to this cap (with jitter).
    backoff_max_s: float = 30.0


@dataclass(frozen=True)
class DiscoveryConfig:
    # Where the worker set comes from: static (workers.static) | dns | kubernetes.
    kind: str = "static"
    # Worker port when records name none (A/AAAA records; pods / slices without port_name).
    port: int = 30000
    scheme: str = "http"
    # DNS: re-resolve period; kubernetes: first reconnect backoff. 0 = resolve / list once.
    interval_s: float = 5.0
    dns: DnsDiscoveryConfig = field(default_factory=DnsDiscoveryConfig)
    kubernetes: KubernetesDiscoveryConfig = field(default_factory=KubernetesDiscoveryConfig)


@dataclass(frozen=True)
class TlsConfig:
    # PEM files; both empty = plaintext. When set, TLS covers the public HTTP port and the gRPC port
    # (the admin port stays plaintext on loopback).
    cert_file: str = ""
    key_file: str = ""
    # PEM bundle of CAs whose client certificates are accepted; set = mutual TLS (client cert required).
    client_ca_file: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file)


@dataclass(frozen=True)
class DiagnoseConfig:
    # Sliding window of finished requests: at most this many, none older than window_s (0 = no age bound).
    window_requests: int = 1000
    window_s: float = 300.0
    # The TTFT p95 target (seconds) the verdict judges against.
    slo_ttft_p95_s: float = 2.0
    # Price of one GPU-hour for the cost per stage (roughly an on-demand H100/H200 hour, in dollars).
    price_per_gpu_hour: float = 3.0
    gpus_per_worker: int = 1
    # Rule thresholds by name, overriding RuleParams defaults (proxy/diagnose/rules.py documents each).
    thresholds: Mapping[str, float] = field(default_factory=dict)
    # GPUs the NVML sampler reads (indices); empty = every visible GPU.
    gpu_indices: tuple[int, ...] = ()
    # NVML poll period, seconds; 0 turns GPU sampling off.
    nvml_interval_s: float = 1.0
    # A computed diagnosis is reused this long across /metrics and /diagnosis reads.
    refresh_s: float = 2.0
    # Behind several replicas (routing.peers / peers_dns): tell the peers every finished request and
    # take theirs, so each replica's /diagnosis reads the fleet's traffic; false = its own share only.
    fleet_view: bool = True


@dataclass(frozen=True)
class KvEventsConfig:
    # Each worker's KV cache event stream (SGLang and vLLM ``--kv-events-config
    # '{"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558"}'``), so
    # routing knows what every engine holds instead of guessing (proxy/workers/kv_subscriber.py).
    # "" = off. "{host}" is the worker URL's host: "tcp://{host}:5557". "auto" = each worker's own
    # --kv-events-config as its /get_server_info reports it ("*" read as the worker's host).
    endpoint: str = ""
    # Its replay socket, which fills gaps and a late join; "" = none (a gap then clears the table).
    replay_endpoint: str = ""
    topic: str = ""
    replay_timeout_s: float = 2.0
    # One message (one batch) at most this big; the transport drops larger ones.
    max_payload_bytes: int = 16 * 1024 * 1024
    # Blocks remembered per worker (a pool of N tokens in pages of P holds N / P).
    max_blocks_per_worker: int = 1 << 21
    # A prompt the engine prefilled (its first token came back) must show in the stream within
    # this long; a stream that shows under half of the recent ones is not trusted and routing
    # uses the approximate index (proxy/workers/kv_trust.py).
    confirm_grace_s: float = 2.0


@dataclass(frozen=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    workers: WorkersConfig = field(default_factory=WorkersConfig)
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    scrape: ScrapeConfig = field(default_factory=ScrapeConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    diagnose: DiagnoseConfig = field(default_factory=DiagnoseConfig)
    kv_events: KvEventsConfig = field(default_factory=KvEventsConfig)
