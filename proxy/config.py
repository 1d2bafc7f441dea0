"""One frozen config tree, loaded YAML → environment → CLI (each later source wins).

* YAML: ``radixgate serve --config FILE``; keys mirror the dataclass tree below.
* Environment: ``RADIXGATE_<SECTION>__<FIELD>=value`` (double underscore between levels),
  e.g. ``RADIXGATE_ROUTING__POLICY=least_load``; values are parsed as YAML scalars.
* CLI: the few flags of ``radixgate serve`` (see ``cli.py``) override last.

Every error names the path of the bad field, e.g. ``health.interval_s: expected a number, got 'x'``.
Sections are owned by the module that reads them; add a field there with a default and a comment.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml


class ConfigError(ValueError):
    """A config value is wrong; the message starts with the field's dotted path."""


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
    # matches of text prompts (proxy/routing/tokenizer.py; needs the "bpe" extra). "" = none.
    tokenizer: str = ""
    # Cap on blocks hashed per prompt.
    max_blocks: int = 2048
    session_header: str = "x-session-id"
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


@dataclass(frozen=True)
class TelemetryConfig:
    log_level: str = "info"
    # One JSON line per request; prompts are never logged unless this is true.
    log_requests: bool = True
    log_prompts: bool = False


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


@dataclass(frozen=True)
class KvEventsConfig:
    # Each worker's KV cache event stream (SGLang and vLLM ``--kv-events-config
    # '{"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558"}'``), so
    # routing knows what every engine holds instead of guessing (proxy/workers/kv_subscriber.py).
    # "" = off. "{host}" is the worker URL's host: "tcp://{host}:5557".
    endpoint: str = ""
    # Its replay socket, which fills gaps and a late join; "" = none (a gap then clears the table).
    replay_endpoint: str = ""
    topic: str = ""
    replay_timeout_s: float = 2.0
    # One message (one batch) at most this big; the transport drops larger ones.
    max_payload_bytes: int = 16 * 1024 * 1024
    # Blocks remembered per worker (a pool of N tokens in pages of P holds N / P).
    max_blocks_per_worker: int = 1 << 21


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


# -- loading -----------------------------------------------------------------------------------

T = TypeVar("T")
ENV_PREFIX = "RADIXGATE_"


def load(
    path: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Build the config: YAML file, then ``RADIXGATE_*`` env, then dotted-path ``overrides``."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"config file {path}: {e}") from e
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: the top level must be a mapping")
        raw = loaded
    for key, value in (os.environ if env is None else env).items():
        if key.startswith(ENV_PREFIX) and "__" in key:
            dotted = ".".join(p.lower() for p in key[len(ENV_PREFIX) :].split("__"))
            _set_path(raw, dotted, parse_scalar(value))
    for dotted, value in (overrides or {}).items():
        _set_path(raw, dotted, value)
    cfg = build(Config, raw, "")
    validate(cfg)
    return cfg


def parse_scalar(text: str) -> Any:
    """A YAML scalar from an environment variable or the command line (a string if not YAML)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _set_path(raw: dict[str, Any], dotted: str, value: Any) -> None:
    node = raw
    parts = dotted.split(".")
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{dotted}: {p} is not a section")
        node = nxt
    node[parts[-1]] = value


def build(cls: type[T], raw: Any, path: str) -> T:
    """Construct dataclass ``cls`` from a mapping, checking every field's type."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path or '<root>'}: expected a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = set(raw) - set(fields)
    if unknown:
        where = f"{path}." if path else ""
        raise ConfigError(f"{where}{sorted(unknown)[0]}: unknown field (known: {', '.join(sorted(fields))})")
    kwargs = {name: _coerce(hints[name], raw[name], _join(path, name)) for name in raw}
    return cls(**kwargs)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if isinstance(tp, type) and isinstance(value, str) and tp is WorkerEntry:
            return WorkerEntry(url=value)
        return build(tp, value, path)  # type: ignore[arg-type]
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(args[0], value, path)
    if origin is tuple:
        (item,) = typing.get_args(tp)[:1]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path}: expected a list, got {type(value).__name__}")
        return tuple(_coerce(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin in (Mapping, dict) or tp is Mapping:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected a mapping, got {type(value).__name__}")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return value
    return value


def validate(cfg: Config) -> None:
    """Cross-field and range checks; each message names the field."""
    checks: list[tuple[bool, str]] = [
        (0 <= cfg.server.port <= 65535, "server.port: must be 0..65535"),
        (0 <= cfg.server.admin_port <= 65535, "server.admin_port: must be 0..65535"),
        (-1 <= cfg.server.grpc_port <= 65535, "server.grpc_port: must be 0..65535 (0 = off), or -1 (any free port)"),
        (cfg.server.drain_grace_s >= 0, "server.drain_grace_s: must be >= 0"),
        (cfg.health.interval_s >= 0, "health.interval_s: must be >= 0 (0 turns checks off)"),
        (cfg.health.timeout_s > 0, "health.timeout_s: must be > 0"),
        (cfg.health.fail_threshold >= 1, "health.fail_threshold: must be >= 1"),
        (cfg.health.recover_threshold >= 1, "health.recover_threshold: must be >= 1"),
        (cfg.scrape.interval_s >= 0, "scrape.interval_s: must be >= 0 (0 turns scraping off)"),
        (cfg.upstream.max_retries >= 0, "upstream.max_retries: must be >= 0"),
        (cfg.upstream.connect_timeout_s > 0, "upstream.connect_timeout_s: must be > 0"),
        (cfg.upstream.max_response_bytes >= 1024, "upstream.max_response_bytes: must be >= 1024"),
        (cfg.upstream.max_event_bytes >= 1024, "upstream.max_event_bytes: must be >= 1024"),
        (cfg.upstream.max_scrape_bytes >= 1024, "upstream.max_scrape_bytes: must be >= 1024"),
        (cfg.routing.chars_per_token > 0, "routing.chars_per_token: must be > 0"),
        (cfg.routing.max_blocks >= 1, "routing.max_blocks: must be >= 1"),
        (cfg.routing.peer_sync_interval_s >= 0, "routing.peer_sync_interval_s: must be >= 0"),
        (cfg.routing.hold_max_s >= 0, "routing.hold_max_s: must be >= 0 (0 = never hold)"),
        (cfg.routing.peer_timeout_s > 0, "routing.peer_timeout_s: must be > 0"),
        (cfg.routing.peer_heartbeat_s >= 0, "routing.peer_heartbeat_s: must be >= 0 (0 = off)"),
        (cfg.routing.peers_dns_interval_s >= 0, "routing.peers_dns_interval_s: must be >= 0 (0 = resolve once)"),
        (0 <= cfg.routing.peers_port <= 65535, "routing.peers_port: must be 0..65535 (0 = server.admin_port)"),
        (cfg.admission.queue_size >= 0, "admission.queue_size: must be >= 0"),
        (cfg.admission.queue_timeout_s >= 0, "admission.queue_timeout_s: must be >= 0"),
        (cfg.admission.per_worker_limit >= 0, "admission.per_worker_limit: must be >= 0 (0 = derive)"),
        (cfg.admission.limit_factor > 0, "admission.limit_factor: must be > 0"),
        (cfg.admission.unknown_worker_limit >= 1, "admission.unknown_worker_limit: must be >= 1"),
        (cfg.health.eject_after_failures >= 1, "health.eject_after_failures: must be >= 1"),
        (cfg.health.eject_cooldown_s >= 0, "health.eject_cooldown_s: must be >= 0"),
        (0 < cfg.health.max_ejected_fraction <= 1, "health.max_ejected_fraction: must be in (0, 1]"),
        (cfg.limits.max_body_bytes > 0, "limits.max_body_bytes: must be > 0"),
        (cfg.limits.max_header_bytes >= 256, "limits.max_header_bytes: must be >= 256"),
        (cfg.limits.max_headers >= 8, "limits.max_headers: must be >= 8"),
        (cfg.limits.max_connections >= 0, "limits.max_connections: must be >= 0 (0 = no limit)"),
        (cfg.limits.idle_timeout_s > 0, "limits.idle_timeout_s: must be > 0"),
        (cfg.limits.tls_handshake_timeout_s > 0, "limits.tls_handshake_timeout_s: must be > 0"),
        (cfg.limits.body_timeout_s > 0, "limits.body_timeout_s: must be > 0"),
        (cfg.limits.rate_limit_rps >= 0, "limits.rate_limit_rps: must be >= 0 (0 = off)"),
        (cfg.limits.rate_limit_burst >= 1, "limits.rate_limit_burst: must be >= 1"),
        (cfg.limits.rate_limit_clients >= 1, "limits.rate_limit_clients: must be >= 1"),
        (cfg.telemetry.log_level in {"debug", "info", "warning", "error"},
         "telemetry.log_level: one of debug, info, warning, error"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    _validate_discovery(cfg)
    _validate_tls(cfg.tls)
    _validate_diagnose(cfg.diagnose)
    _validate_kv_events(cfg.kv_events)
    for i, w in enumerate(cfg.workers.static):
        if not w.url.startswith(("http://", "https://")):
            raise ConfigError(f"workers.static[{i}].url: must start with http:// or https://, got {w.url!r}")
        for name in ("kv_events", "kv_events_replay"):
            if getattr(w, name) and not getattr(w, name).startswith(("tcp://", "ipc://")):
                raise ConfigError(f"workers.static[{i}].{name}: must start with tcp:// or ipc://")
    for i, peer in enumerate(cfg.routing.peers):
        if not peer.startswith(("http://", "https://")):
            raise ConfigError(f"routing.peers[{i}]: must start with http:// or https://, got {peer!r}")


def _validate_discovery(cfg: Config) -> None:
    d = cfg.discovery
    checks: list[tuple[bool, str]] = [
        (d.kind in {"static", "dns", "kubernetes"}, "discovery.kind: one of static, dns, kubernetes"),
        (d.kind == "static" or not cfg.workers.static,
         "workers.static: must be empty when discovery.kind is not static (one source of workers)"),
        (0 < d.port <= 65535, "discovery.port: must be 1..65535"),
        (d.scheme in {"http", "https"}, "discovery.scheme: one of http, https"),
        (d.interval_s >= 0, "discovery.interval_s: must be >= 0 (0 = resolve once)"),
        (d.kind != "dns" or bool(d.dns.name), "discovery.dns.name: required when discovery.kind is dns"),
        (d.dns.timeout_s > 0, "discovery.dns.timeout_s: must be > 0"),
        (d.kubernetes.resource in {"endpointslices", "pods"},
         "discovery.kubernetes.resource: one of endpointslices, pods"),
        (d.kind != "kubernetes" or bool(d.kubernetes.label_selector),
         "discovery.kubernetes.label_selector: required when discovery.kind is kubernetes"),
        (d.kubernetes.api_server.startswith(("http://", "https://")),
         "discovery.kubernetes.api_server: must start with http:// or https://"),
        (d.kubernetes.watch_timeout_s >= 1, "discovery.kubernetes.watch_timeout_s: must be >= 1"),
        (d.kubernetes.backoff_max_s > 0, "discovery.kubernetes.backoff_max_s: must be > 0"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def _validate_kv_events(k: KvEventsConfig) -> None:
    schemes = ("tcp://", "ipc://")
    checks: list[tuple[bool, str]] = [
        (not k.endpoint or k.endpoint.startswith(schemes), "kv_events.endpoint: must start with tcp:// or ipc://"),
        (not k.replay_endpoint or k.replay_endpoint.startswith(schemes),
         "kv_events.replay_endpoint: must start with tcp:// or ipc://"),
        (k.replay_timeout_s > 0, "kv_events.replay_timeout_s: must be > 0"),
        (k.max_payload_bytes >= 1024, "kv_events.max_payload_bytes: must be >= 1024"),
        (k.max_blocks_per_worker >= 1, "kv_events.max_blocks_per_worker: must be >= 1"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def _validate_tls(tls: TlsConfig) -> None:
    if bool(tls.cert_file) != bool(tls.key_file):
        raise ConfigError("tls.key_file: tls.cert_file and tls.key_file are set together or not at all")
    if tls.client_ca_file and not tls.cert_file:
        raise ConfigError("tls.client_ca_file: needs tls.cert_file and tls.key_file (mutual TLS is TLS first)")
    for name in ("cert_file", "key_file", "client_ca_file"):
        path = getattr(tls, name)
        if path and not Path(path).is_file():
            raise ConfigError(f"tls.{name}: no such file {path!r}")


def _validate_diagnose(d: DiagnoseConfig) -> None:
    from proxy.diagnose.rules import RuleParams

    checks: list[tuple[bool, str]] = [
        (d.window_requests >= 1, "diagnose.window_requests: must be >= 1"),
        (d.window_s >= 0, "diagnose.window_s: must be >= 0 (0 = no age bound)"),
        (d.slo_ttft_p95_s > 0, "diagnose.slo_ttft_p95_s: must be > 0"),
        (d.price_per_gpu_hour >= 0, "diagnose.price_per_gpu_hour: must be >= 0"),
        (d.gpus_per_worker >= 1, "diagnose.gpus_per_worker: must be >= 1"),
        (all(i >= 0 for i in d.gpu_indices), "diagnose.gpu_indices: indices must be >= 0"),
        (d.nvml_interval_s >= 0, "diagnose.nvml_interval_s: must be >= 0 (0 turns GPU sampling off)"),
        (d.refresh_s >= 0, "diagnose.refresh_s: must be >= 0"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    for name, value in d.thresholds.items():
        try:
            RuleParams.from_mapping({name: value})
        except (TypeError, ValueError) as e:
            raise ConfigError(f"diagnose.thresholds.{name}: {e}") from e


def replace(cfg: Config, **sections: Any) -> Config:
    return dataclasses.replace(cfg, **sections)
