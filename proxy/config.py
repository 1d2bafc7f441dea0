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
    # 0 disables the gRPC front.
    grpc_port: int = 0
    # Seconds in-flight requests get to finish after SIGTERM.
    drain_grace_s: float = 30.0


@dataclass(frozen=True)
class WorkerEntry:
    url: str
    # Optional model served; empty = learned from /v1/models.
    model: str = ""


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
    # Until response headers / first byte arrive.
    first_byte_timeout_s: float = 60.0
    # Longest silence between two chunks of a stream.
    idle_timeout_s: float = 60.0
    total_timeout_s: float = 1800.0
    max_connections_per_worker: int = 256
    # Attempts on another worker while nothing has reached the client yet.
    max_retries: int = 2


@dataclass(frozen=True)
class RoutingConfig:
    policy: str = "round_robin"
    # Policy-specific parameters, validated by the policy registry at start-up.
    params: Mapping[str, Any] = field(default_factory=dict)
    # Characters per token when no tokenizer is available (prefix hashing estimate).
    chars_per_token: float = 4.0
    # Cap on blocks hashed per prompt.
    max_blocks: int = 2048
    session_header: str = "x-session-id"


@dataclass(frozen=True)
class AdmissionConfig:
    # Per-worker outstanding limit; 0 = derive from the worker's max_running_requests.
    per_worker_limit: int = 0
    queue_size: int = 1024
    queue_timeout_s: float = 30.0
    priority_header: str = "x-priority"


@dataclass(frozen=True)
class LimitsConfig:
    max_body_bytes: int = 8 * 1024 * 1024
    max_prompt_chars: int = 2_000_000


@dataclass(frozen=True)
class TelemetryConfig:
    log_level: str = "info"
    # One JSON line per request; prompts are never logged unless this is true.
    log_requests: bool = True
    log_prompts: bool = False


@dataclass(frozen=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    workers: WorkersConfig = field(default_factory=WorkersConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    scrape: ScrapeConfig = field(default_factory=ScrapeConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)


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
            _set_path(raw, dotted, _parse_scalar(value))
    for dotted, value in (overrides or {}).items():
        _set_path(raw, dotted, value)
    cfg = build(Config, raw, "")
    validate(cfg)
    return cfg


def _parse_scalar(text: str) -> Any:
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
        (0 <= cfg.server.grpc_port <= 65535, "server.grpc_port: must be 0..65535"),
        (cfg.server.drain_grace_s >= 0, "server.drain_grace_s: must be >= 0"),
        (cfg.health.interval_s >= 0, "health.interval_s: must be >= 0 (0 turns checks off)"),
        (cfg.health.timeout_s > 0, "health.timeout_s: must be > 0"),
        (cfg.health.fail_threshold >= 1, "health.fail_threshold: must be >= 1"),
        (cfg.health.recover_threshold >= 1, "health.recover_threshold: must be >= 1"),
        (cfg.scrape.interval_s >= 0, "scrape.interval_s: must be >= 0 (0 turns scraping off)"),
        (cfg.upstream.max_retries >= 0, "upstream.max_retries: must be >= 0"),
        (cfg.upstream.connect_timeout_s > 0, "upstream.connect_timeout_s: must be > 0"),
        (cfg.routing.chars_per_token > 0, "routing.chars_per_token: must be > 0"),
        (cfg.routing.max_blocks >= 1, "routing.max_blocks: must be >= 1"),
        (cfg.admission.queue_size >= 0, "admission.queue_size: must be >= 0"),
        (cfg.admission.queue_timeout_s >= 0, "admission.queue_timeout_s: must be >= 0"),
        (cfg.limits.max_body_bytes > 0, "limits.max_body_bytes: must be > 0"),
        (cfg.telemetry.log_level in {"debug", "info", "warning", "error"},
         "telemetry.log_level: one of debug, info, warning, error"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    for i, w in enumerate(cfg.workers.static):
        if not w.url.startswith(("http://", "https://")):
            raise ConfigError(f"workers.static[{i}].url: must start with http:// or https://, got {w.url!r}")


def replace(cfg: Config, **sections: Any) -> Config:
    return dataclasses.replace(cfg, **sections)
