"""deploy/compose.yaml and deploy/Dockerfile, checked by reading (Docker does not run here): every
flag they pass is one the real CLIs accept, every mounted file exists, and the ports, service
names and paths agree across compose, the radixgate config, Prometheus and Grafana."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.config import Config, load
from proxy.sim.__main__ import parse_args as simworker_args

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
REPO = DEPLOY.parent


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return doc


@pytest.fixture(scope="module")
def serve_flags() -> set[str]:
    """Flags ``radixgate serve`` really accepts, read from its own --help."""
    out = subprocess.run([sys.executable, "-m", "proxy", "serve", "--help"], capture_output=True, text=True,
                         cwd=REPO, timeout=60, check=True).stdout
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", out))


def host_path(volume: str) -> tuple[Path, str]:
    source, target = volume.split(":")[:2]
    return (DEPLOY / source).resolve(), target


def radixgate_config(compose: dict[str, Any]) -> Config:
    service = compose["services"]["radixgate"]
    command = service["command"]
    mounted = dict(reversed(host_path(v)) for v in service["volumes"])
    source = mounted[command[command.index("--config") + 1]]
    return load(source, env={})


def published(service: dict[str, Any]) -> dict[int, int]:
    """container port → host port."""
    pairs = (p.split(":") for p in service.get("ports", []))
    return {int(container): int(host) for host, container in pairs}


def test_compose_runs_the_proxy_a_simulated_fleet_prometheus_and_grafana(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"radixgate", "worker", "prometheus", "grafana"}
    build = compose["services"]["radixgate"]["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"


def test_every_mounted_file_exists(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source, _ = host_path(volume)
            assert source.exists(), f"{name}: {source} is missing"


def test_the_proxy_command_uses_real_serve_flags_and_a_valid_config(
    compose: dict[str, Any], serve_flags: set[str]
) -> None:
    command = compose["services"]["radixgate"]["command"]
    flags = {a.split("=")[0] for a in command if a.startswith("--")}
    assert flags <= serve_flags, flags - serve_flags
    cfg = radixgate_config(compose)
    assert published(compose["services"]["radixgate"]) == {
        cfg.server.port: cfg.server.port, cfg.server.admin_port: cfg.server.admin_port,
        cfg.server.grpc_port: cfg.server.grpc_port,
    }
    assert cfg.server.host == cfg.server.admin_host == "0.0.0.0"


def test_the_simulated_workers_parse_with_the_real_simworker_cli_and_are_found_over_dns(
    compose: dict[str, Any],
) -> None:
    worker = compose["services"]["worker"]
    assert worker["entrypoint"] == ["python", "-m", "proxy.sim"]
    sim = simworker_args(worker["command"])  # raises on an unknown flag or a bad value
    assert sim.host == "0.0.0.0" and sim.enable_metrics and sim.enable_cache_report
    cfg = radixgate_config(compose)
    assert cfg.discovery.kind == "dns"
    assert cfg.discovery.dns.name == "worker"  # compose DNS: one A record per replica
    assert cfg.discovery.port == sim.port
    assert f"127.0.0.1:{sim.port}/health" in " ".join(worker["healthcheck"]["test"])
    assert worker["deploy"]["replicas"] >= 2


def test_prometheus_scrapes_the_proxy_admin_port_and_loads_the_rules(compose: dict[str, Any]) -> None:
    service = compose["services"]["prometheus"]
    mounts = {target: source for source, target in map(host_path, service["volumes"])}
    prometheus = yaml.safe_load(mounts["/etc/prometheus/prometheus.yml"].read_text())
    cfg = radixgate_config(compose)
    jobs = {j["job_name"]: j for j in prometheus["scrape_configs"]}
    assert jobs["radixgate"]["static_configs"][0]["targets"] == [f"radixgate:{cfg.server.admin_port}"]
    (dns_sd,) = jobs["sglang"]["dns_sd_configs"]
    assert dns_sd["names"] == ["worker"] and dns_sd["port"] == cfg.discovery.port
    (rule_glob,) = prometheus["rule_files"]
    rules_dir = mounts[str(Path(rule_glob).parent)]
    assert sorted(rules_dir.glob(Path(rule_glob).name)), "the rule glob matches no file"


def test_grafana_is_provisioned_with_the_prometheus_service_and_the_dashboard(compose: dict[str, Any]) -> None:
    service = compose["services"]["grafana"]
    mounts = {target: source for source, target in map(host_path, service["volumes"])}
    provisioning = mounts["/etc/grafana/provisioning"]
    (datasource,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"]
    assert datasource["url"] == "http://prometheus:9090"
    assert 9090 in published(compose["services"]["prometheus"])
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "radixgate.yaml").read_text())["providers"]
    dashboards = [t for t in mounts if t.startswith(provider["options"]["path"] + "/")]
    assert [mounts[t].name for t in dashboards] == ["radixgate.json"]
    assert service["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] in dashboards


def test_dockerfile_is_small_non_root_with_a_healthcheck_and_its_baked_config_is_valid() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    froms = re.findall(r"^FROM (\S+)", text, re.M)
    assert froms and all(f == "python:3.11-slim" for f in froms)
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and user[-1] not in ("root", "0")
    copies = dict(re.findall(r"^COPY (deploy/\S+) (\S+)$", text, re.M))
    assert copies["deploy/radixgate.container.yaml"] == "/etc/radixgate/radixgate.yaml"
    cfg = load(DEPLOY / "radixgate.container.yaml", env={})
    assert cfg.server.host == cfg.server.admin_host == "0.0.0.0"
    exposed = {int(p) for p in re.findall(r"^EXPOSE (.+)$", text, re.M)[0].split()}
    assert {cfg.server.port, cfg.server.admin_port} <= exposed
    health = re.findall(r"^HEALTHCHECK .*\n(?:.*\n)*?.*CMD (.+)$", text, re.M)[0]
    assert f"127.0.0.1:{cfg.server.port}/health" in health
    assert '"radixgate", "serve"' in text and '"--config", "/etc/radixgate/radixgate.yaml"' in text
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text()
    assert "!deploy/radixgate.container.yaml" in ignore
