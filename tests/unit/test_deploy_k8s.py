"""The Kubernetes manifests: render each kustomization, validate every object against the Kubernetes
JSON schemas (kubernetes-validate, offline), and check that the pieces agree with each other and
with radixgate's real config (ports, probes, drain time, discovery selector, RBAC, HPA, PDB).

The renderer below implements the subset of kustomize these bases use (resources, namespace,
images, configMapGenerator without hash suffix, strategic-merge patches incl. ``$patch: delete``);
it refuses anything else, so a base that starts using more fails here instead of rendering wrong.
Cross-checked against ``kubectl kustomize`` (see the README "Deploy" section).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from proxy.config import Config, load

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
TARGETS = ["sidecar", "gateway", "overlays/gateway-dns", "overlays/gateway-production"]
K8S_VERSIONS = ["1.29", "1.32"]
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
MERGE_KEYS = {"containers": "name", "initContainers": "name", "volumes": "name", "env": "name",
              "volumeMounts": "mountPath"}
SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "images", "patches", "configMapGenerator",
             "generatorOptions"}

Obj = dict[str, Any]


# -- a small kustomize ----------------------------------------------------------------------------

def render(directory: Path) -> list[Obj]:
    k = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(k) - SUPPORTED
    assert not unknown, f"{directory}: the test renderer does not support {unknown}"
    objects: list[Obj] = []
    for entry in k.get("resources", []):
        path = directory / entry
        if path.is_dir():
            objects += render(path)
        else:
            objects += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for gen in k.get("configMapGenerator", []):
        assert k.get("generatorOptions", {}).get("disableNameSuffixHash") is True, "hash suffixes unsupported"
        assert set(gen) <= {"name", "files", "behavior"}, gen
        data = {Path(f).name: (directory / f).read_text() for f in gen.get("files", [])}
        existing = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == gen["name"]]
        if gen.get("behavior", "create") == "replace":
            assert len(existing) == 1, f"nothing to replace for {gen['name']}"
            existing[0]["data"] = data
        else:
            assert not existing, f"duplicate ConfigMap {gen['name']}"
            objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data})
    for patch in k.get("patches", []):
        assert set(patch) == {"path"}, f"only file patches are supported: {patch}"
        for doc in yaml.safe_load_all((directory / patch["path"]).read_text()):
            target = _find(objects, doc["kind"], doc["metadata"]["name"])
            if doc.get("$patch") == "delete":
                objects.remove(target)
            else:
                objects[objects.index(target)] = merge(target, doc)
    for image in k.get("images", []):
        for obj in objects:
            for c in _containers(obj):
                name, _, tag = c["image"].partition(":")
                if name == image["name"]:
                    c["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"
    if "namespace" in k:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = k["namespace"]
            for subject in obj.get("subjects", []):
                if subject.get("kind") == "ServiceAccount":
                    subject["namespace"] = k["namespace"]
    return objects


def merge(base: Any, patch: Any, key: str = "") -> Any:
    """Strategic merge for the shapes we patch: maps merge, keyed lists merge by key, others replace."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for k, v in patch.items():
            out[k] = merge(out[k], v, k) if k in out else copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS:
        # Like kustomize: the patch's items (merged into their base item) first, then the rest.
        merge_key = MERGE_KEYS[key]
        by_key = {b.get(merge_key): b for b in base}
        patched = [merge(by_key[i.get(merge_key)], i) if i.get(merge_key) in by_key else copy.deepcopy(i)
                   for i in patch]
        named = {i.get(merge_key) for i in patch}
        return patched + [copy.deepcopy(b) for b in base if b.get(merge_key) not in named]
    return copy.deepcopy(patch)


def _find(objects: list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} matches"
    return found[0]


def _pod_spec(obj: Obj) -> Obj | None:
    if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        spec: Obj = obj["spec"]["template"]["spec"]
        return spec
    return None


def _containers(obj: Obj) -> list[Obj]:
    spec = _pod_spec(obj)
    return (spec.get("containers", []) + spec.get("initContainers", [])) if spec else []


def rendered(target: str) -> list[Obj]:
    return render(K8S / target)


def radixgate_config(objects: list[Obj], tmp_path: Path) -> tuple[Obj, Config]:
    """The radixgate container, and the Config its mounted ConfigMap really loads to."""
    for obj in objects:
        for c in _containers(obj):
            if c["name"] == "radixgate":
                spec = _pod_spec(obj)
                assert spec is not None
                mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/etc/radixgate")
                volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
                cm = _find(objects, "ConfigMap", volume["configMap"]["name"])
                config_path = c["args"][c["args"].index("--config") + 1]
                assert config_path.startswith("/etc/radixgate/")
                (tmp_path / "radixgate.yaml").write_text(cm["data"][Path(config_path).name])
                return obj, load(tmp_path / "radixgate.yaml", env={})
    raise AssertionError("no radixgate container")


def container(obj: Obj, name: str) -> Obj:
    return next(c for c in _containers(obj) if c["name"] == name)


def port_number(c: Obj, port: int | str) -> int:
    if isinstance(port, int):
        return port
    return int(next(p["containerPort"] for p in c["ports"] if p["name"] == port))


# -- tests ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_rendered_manifest_validates_against_the_kubernetes_schema(target: str, version: str) -> None:
    objects = rendered(target)
    assert objects
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("target", TARGETS)
def test_radixgate_ports_and_probes_match_its_config(target: str, tmp_path: Path) -> None:
    workload, cfg = radixgate_config(rendered(target), tmp_path)
    c = container(workload, "radixgate")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": cfg.server.port, "admin": cfg.server.admin_port, "grpc": cfg.server.grpc_port}
    assert cfg.server.host == cfg.server.admin_host == "0.0.0.0"
    # Start-up and liveness never depend on workers (/health); readiness is gRPC health, which is
    # SERVING exactly when /ready is (tests/integration/test_discovery_proxy.py shows both).
    for probe in ("startupProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health"
        assert port_number(c, c[probe]["httpGet"]["port"]) == cfg.server.port
    assert c["readinessProbe"]["grpc"]["port"] == cfg.server.grpc_port
    assert c["readinessProbe"]["grpc"].get("service", "") == ""
    assert "cpu" in c["resources"]["requests"] and "memory" in c["resources"]["limits"]


@pytest.mark.parametrize("target", TARGETS)
def test_termination_grace_covers_pre_stop_plus_the_drain_period(target: str, tmp_path: Path) -> None:
    workload, cfg = radixgate_config(rendered(target), tmp_path)
    c = container(workload, "radixgate")
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    grace = workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert pre_stop + cfg.server.drain_grace_s <= grace
    if target != "sidecar":  # the gateway's grace is radixgate's alone: match it, don't pad it
        assert grace <= pre_stop + cfg.server.drain_grace_s + 10


@pytest.mark.parametrize("target", TARGETS)
def test_every_service_selects_a_pod_template_and_names_real_container_ports(target: str) -> None:
    objects = rendered(target)
    workloads = [o for o in objects if _pod_spec(o)]
    for svc in (o for o in objects if o["kind"] == "Service"):
        selector = svc["spec"]["selector"]
        pods = [w for w in workloads if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(pods) == 1, f"Service {svc['metadata']['name']} selects {len(pods)} workloads"
        names = {p["name"] for c in _containers(pods[0]) for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in names, (svc["metadata"]["name"], port)


@pytest.mark.parametrize("target", ["gateway", "overlays/gateway-production", "overlays/gateway-dns"])
def test_gateway_discovery_finds_the_sglang_service_on_its_named_port(target: str, tmp_path: Path) -> None:
    objects = rendered(target)
    _, cfg = radixgate_config(objects, tmp_path)
    sglang = _find(objects, "Service", "sglang")
    assert sglang["spec"]["clusterIP"] == "None"  # headless: one record per pod
    port = next(p for p in sglang["spec"]["ports"] if p["name"] == "http")
    statefulset = _find(objects, "StatefulSet", "sglang")
    assert statefulset["spec"]["serviceName"] == "sglang"
    assert port_number(container(statefulset, "sglang"), port["targetPort"]) == port["port"]
    if cfg.discovery.kind == "kubernetes":
        assert cfg.discovery.kubernetes.label_selector == "kubernetes.io/service-name=sglang"
        assert cfg.discovery.kubernetes.port_name == "http"
    else:
        assert cfg.discovery.kind == "dns" and cfg.discovery.dns.srv
        assert cfg.discovery.dns.name == "_http._tcp.sglang"


@pytest.mark.parametrize("target", ["gateway", "overlays/gateway-production", "overlays/gateway-dns"])
def test_gateway_replicas_find_each_other_on_their_admin_port(target: str, tmp_path: Path) -> None:
    objects = rendered(target)
    deployment, cfg = radixgate_config(objects, tmp_path)
    assert cfg.routing.peers_dns == "radixgate-peers" and cfg.server.admin_host == "0.0.0.0"
    peers = _find(objects, "Service", "radixgate-peers")
    assert peers["spec"]["clusterIP"] == "None"  # headless: every replica's own address
    assert peers["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    (port,) = peers["spec"]["ports"]
    # DNS gives addresses only: the port the peers dial is peers_port, or our own admin port.
    assert port_number(container(deployment, "radixgate"), port["targetPort"]) == (
        cfg.routing.peers_port or cfg.server.admin_port)


@pytest.mark.parametrize("target", ["gateway", "overlays/gateway-production"])
def test_kubernetes_discovery_may_list_and_watch_endpointslices_as_the_pods_service_account(target: str) -> None:
    objects = rendered(target)
    deployment = _find(objects, "Deployment", "radixgate")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    _find(objects, "ServiceAccount", account)
    binding = _find(objects, "RoleBinding", "radixgate-discovery")
    namespace = deployment["metadata"].get("namespace")
    assert {"kind": "ServiceAccount", "name": account, **({"namespace": namespace} if namespace else {})} in binding["subjects"]
    role = _find(objects, binding["roleRef"]["kind"], binding["roleRef"]["name"])
    rule = next(r for r in role["rules"] if "endpointslices" in r["resources"])
    assert rule["apiGroups"] == ["discovery.k8s.io"]
    assert {"list", "watch"} <= set(rule["verbs"])
    assert not any(verb in r["verbs"] for r in role["rules"] for verb in ("create", "update", "patch", "delete"))


def test_dns_overlay_drops_api_access_entirely() -> None:
    objects = rendered("overlays/gateway-dns")
    kinds = {o["kind"] for o in objects}
    assert not kinds & {"Role", "RoleBinding"}
    deployment = _find(objects, "Deployment", "radixgate")
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize("target", ["gateway", "overlays/gateway-production"])
def test_hpa_scales_the_radixgate_deployment_on_cpu_and_the_pdb_keeps_one_up(target: str) -> None:
    objects = rendered(target)
    deployment = _find(objects, "Deployment", "radixgate")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    hpa = _find(objects, "HorizontalPodAutoscaler", "radixgate")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "radixgate"}
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu" and metric["resource"]["target"]["type"] == "Utilization"
    assert "cpu" in container(deployment, "radixgate")["resources"]["requests"]  # utilisation needs a request
    assert hpa["spec"]["minReplicas"] >= 2
    pdb = _find(objects, "PodDisruptionBudget", "radixgate")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]  # a node drain can still proceed


def test_sidecar_fronts_exactly_the_workers_in_its_own_pod(tmp_path: Path) -> None:
    objects = rendered("sidecar")
    workload, cfg = radixgate_config(objects, tmp_path)
    workers = [c for c in _containers(workload) if c["name"].startswith("sglang-")]
    assert len(workers) >= 2
    worker_ports = {p["containerPort"] for c in workers for p in c["ports"]}
    assert {w.url for w in cfg.workers.static} == {f"http://127.0.0.1:{p}" for p in worker_ports}
    for c in workers:
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert "--enable-metrics" in c["args"] and "--enable-cache-report" in c["args"]
        (port,) = c["ports"]
        assert f"--port={port['containerPort']}" in c["args"]
    assert cfg.discovery.kind == "static"


def test_production_replicas_take_their_peer_key_from_a_secret(tmp_path: Path) -> None:
    objects = rendered("overlays/gateway-production")
    deployment, _ = radixgate_config(objects, tmp_path)
    env = {e["name"]: e for e in container(deployment, "radixgate")["env"]}
    named = env["RADIXGATE_ROUTING__PEER_KEY_ENV"]["value"]  # overrides the ConfigMap (YAML → env → CLI)
    assert env[named]["valueFrom"]["secretKeyRef"] == {"name": "radixgate-peer-key", "key": "key"}
    config_map = next(o for o in objects if o["kind"] == "ConfigMap")
    with_env = load(tmp_path / "radixgate.yaml", env={"RADIXGATE_ROUTING__PEER_KEY_ENV": named})
    assert with_env.routing.peer_key_env == named and "radixgate-peers" in config_map["data"]["radixgate.yaml"]


def test_production_overlay_pins_images_and_moves_everything_into_its_namespace() -> None:
    objects = rendered("overlays/gateway-production")
    images = {c["image"] for o in objects for c in _containers(o)}
    assert all(":" in i and not i.endswith(":latest") and not i.endswith(":dev") for i in images), images
    assert all(o["metadata"].get("namespace") == "llm" for o in objects if o["kind"] != "Namespace")
    statefulset = _find(objects, "StatefulSet", "sglang")
    sglang = container(statefulset, "sglang")
    assert statefulset["spec"]["replicas"] == 4
    assert {m["name"] for m in sglang["volumeMounts"]} == {"shm", "models"}  # merged, not replaced
