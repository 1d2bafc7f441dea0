"""Policy registry: a policy name → its parameter dataclass and its factory.

``build_policy(cfg.routing, rng=...)`` is called once at start-up. An unknown policy name or a bad
parameter fails there with a ``ConfigError`` naming the field (``routing.policy`` or
``routing.params.<field>``), never at the first request.

Each policy module exports ``SPEC = PolicySpec(name, params_type, factory)``. To add a policy, add
its module to ``POLICY_MODULES``; modules are imported only when their policy is built or listed.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from proxy.config import ConfigError, RoutingConfig, build
from proxy.routing.base import Policy

POLICY_MODULES: tuple[str, ...] = (
    "proxy.routing.round_robin",
    "proxy.routing.least_load",
    "proxy.routing.consistent_hash",
    "proxy.routing.cache_aware",
    "proxy.routing.ttft_cost",
)


@dataclass(frozen=True)
class PolicySpec:
    name: str
    # A frozen dataclass; every field has a default (documented in the policy module's docstring).
    params_type: type[Any]
    # (validated params, seeded random source) → a fresh policy instance.
    factory: Callable[[Any, random.Random], Policy]


def available() -> dict[str, PolicySpec]:
    """Every registered policy, by name."""
    specs: dict[str, PolicySpec] = {}
    for module_name in POLICY_MODULES:
        spec = importlib.import_module(module_name).SPEC
        if not isinstance(spec, PolicySpec):
            raise TypeError(f"{module_name}.SPEC is not a PolicySpec")
        specs[spec.name] = spec
    return specs


def build_policy(cfg: RoutingConfig, *, rng: random.Random) -> Policy:
    """Validate ``routing.policy`` / ``routing.params`` and build the policy."""
    return build_named(cfg.policy, cfg.params, rng=rng)


def build_named(name: str, params: Mapping[str, Any], *, rng: random.Random) -> Policy:
    specs = available()
    spec = specs.get(name)
    if spec is None:
        raise ConfigError(f"routing.policy: unknown policy {name!r} (known: {', '.join(sorted(specs))})")
    validated = build(spec.params_type, dict(params), "routing.params")
    check = getattr(validated, "validate", None)
    if callable(check):
        check()  # raises ConfigError naming routing.params.<field>
    return spec.factory(validated, rng)
