"""Pick the worker source named by ``discovery.kind``: static list, DNS, or the Kubernetes API.

Every source satisfies the registry's WorkerSource protocol: ``watch()`` is an async iterator that
yields the full set of worker URLs first and then on every change. Sources are imported lazily so
a static deployment never loads the DNS or Kubernetes code.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from proxy.config import Config
    from proxy.workers.registry import WorkerSource


def worker_url(scheme: str, host: str, port: int) -> str:
    """``scheme://host:port``, with an IPv6 address in brackets."""
    try:
        if isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address):
            host = f"[{host}]"
    except ValueError:
        pass  # a hostname
    return f"{scheme}://{host}:{port}"


def build_discovery_source(cfg: Config) -> WorkerSource | None:
    """The dynamic source for ``cfg.discovery.kind``, or None for ``static`` (use ``workers.static``)."""
    kind = cfg.discovery.kind
    if kind == "dns":
        from proxy.workers.discovery_dns import DnsSource

        return DnsSource.from_config(cfg.discovery)
    if kind == "kubernetes":
        from proxy.workers.discovery_k8s import KubernetesSource

        return KubernetesSource.from_config(cfg.discovery)
    if kind == "static":
        return None
    raise ValueError(f"discovery.kind: unknown source {kind!r}")
