"""One frozen config tree, loaded YAML → environment → CLI (each later source wins).

* YAML: ``radixgate serve --config FILE``; keys mirror the dataclass tree of ``config_sections.py``.
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
from pathlib import Path
from typing import Any, TypeVar

import yaml

from proxy.config_sections import (
    AdmissionConfig,
    Config,
    DiagnoseConfig,
    DiscoveryConfig,
    DnsDiscoveryConfig,
    HealthConfig,
    KubernetesDiscoveryConfig,
    KvEventsConfig,
    LimitsConfig,
    RoutingConfig,
    ScrapeConfig,
    SecurityConfig,
    ServerConfig,
    TelemetryConfig,
    TlsConfig,
    UpstreamConfig,
    WorkerEntry,
    WorkersConfig,
)

# The sections live in config_sections.py; every importer reads them from here.
__all__ = [
    "AdmissionConfig",
    "Config",
    "ConfigError",
    "DiagnoseConfig",
    "DiscoveryConfig",
    "DnsDiscoveryConfig",
    "HealthConfig",
    "KubernetesDiscoveryConfig",
    "KvEventsConfig",
    "LimitsConfig",
    "RoutingConfig",
    "ScrapeConfig",
    "SecurityConfig",
    "ServerConfig",
    "TelemetryConfig",
    "TlsConfig",
    "UpstreamConfig",
    "WorkerEntry",
    "WorkersConfig",
    "build",
    "load",
    "parse_scalar",
    "replace",
    "validate",
]


class ConfigError(ValueError):
    """A config value is wrong; the message starts with the field's dotted path."""


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
        (cfg.routing.response_homes >= 1, "routing.response_homes: must be >= 1"),
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
        (cfg.workers.max_workers >= 1, "workers.max_workers: must be >= 1"),
        (cfg.security.reload_interval_s >= 0, "security.reload_interval_s: must be >= 0 (0 = on SIGHUP only)"),
        (not cfg.telemetry.otlp_traces_endpoint or cfg.telemetry.otlp_traces_endpoint.startswith(("http://", "https://")),
         "telemetry.otlp_traces_endpoint: must start with http:// or https:// (OTLP/HTTP), or be empty"),
        (0.0 <= cfg.telemetry.trace_sample_ratio <= 1.0, "telemetry.trace_sample_ratio: must be in [0, 1]"),
        (bool(cfg.telemetry.service_name), "telemetry.service_name: must not be empty"),
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
        (not k.endpoint or k.endpoint == "auto" or k.endpoint.startswith(schemes),
         "kv_events.endpoint: must start with tcp:// or ipc://, or be auto"),
        (not k.replay_endpoint or k.replay_endpoint.startswith(schemes),
         "kv_events.replay_endpoint: must start with tcp:// or ipc://"),
        (k.replay_timeout_s > 0, "kv_events.replay_timeout_s: must be > 0"),
        (k.max_payload_bytes >= 1024, "kv_events.max_payload_bytes: must be >= 1024"),
        (k.max_blocks_per_worker >= 1, "kv_events.max_blocks_per_worker: must be >= 1"),
        (k.confirm_grace_s > 0, "kv_events.confirm_grace_s: must be > 0"),
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
