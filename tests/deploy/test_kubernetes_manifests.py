"""deploy/kubernetes: every manifest is valid against the Kubernetes OpenAPI schemas
(offline, with the schemas kubernetes-validate ships; strict, so an unknown or misspelt
field fails), and has the properties that keep the planes apart: the nodes never see the
database URL or the admin key, only they are privileged, every container is bounded and
probed on the port its settings listen on, and the network is closed but for the paths
the planes need."""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError, all_versions
from pydantic import ValidationError

from app.settings import Settings
from node.settings import NodeSettings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBE = DEPLOY / "kubernetes"
#: The oldest Kubernetes release the manifests are checked against, and the newest one
#: kubernetes-validate knows.
OLDEST = "1.29"
VERSIONS = (OLDEST, kubernetes_validate.latest_version())
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}
PROJECT_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


# --- loading ---------------------------------------------------------------------------------
def manifest_files() -> list[Path]:
    return sorted(p for p in KUBE.glob("*.yaml") if p.name != "kustomization.yaml")


def load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def resources(*, secrets: bool = False) -> list[dict[str, Any]]:
    """Every resource the kustomization applies (and the example Secrets, if asked)."""
    docs = [doc for path in manifest_files() for doc in load(path)]
    return [d for d in docs if secrets or d["kind"] != "Secret"]


def one(kind: str, name: str) -> dict[str, Any]:
    found = [r for r in resources(secrets=True) if r["kind"] == kind]
    matches = [r for r in found if r["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def containers(spec: dict[str, Any], *, init: bool = True) -> list[dict[str, Any]]:
    return [*(spec.get("initContainers", []) if init else []), *spec["containers"]]


def workloads() -> Iterator[dict[str, Any]]:
    yield from (r for r in resources() if r["kind"] in WORKLOADS)


def every_container() -> Iterator[tuple[str, dict[str, Any]]]:
    for workload in workloads():
        for container in containers(pod_spec(workload)):
            yield (
                f"{workload['kind']}/{workload['metadata']['name']}/{container['name']}",
                container,
            )


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container.get("env", [])}


def literal(container: dict[str, Any], name: str) -> str:
    return str(env_of(container)[name]["value"])


# --- schemas ---------------------------------------------------------------------------------
def test_the_schemas_are_offline_and_cover_the_versions_checked() -> None:
    versions = all_versions()
    assert any(v.startswith(OLDEST + ".") for v in versions)
    # They are package data: nothing is fetched (this machine reaches no schema host).
    assert Path(kubernetes_validate.__file__).parent.joinpath("kubernetes-json-schema").is_dir()


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.name)
def test_every_manifest_is_valid(path: Path, version: str) -> None:
    docs = load(path)
    assert docs, f"{path.name} holds no resource"
    for doc in docs:
        assert doc["metadata"].get("namespace", "corral") == "corral" or doc["kind"] == "Namespace"
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize(
    ("what", "break_it"),
    [
        ("a misspelt field", lambda g: pod_spec(g)["containers"][0].update(readinesProbe={})),
        ("a wrong type", lambda g: g["spec"].update(replicas="two")),
        ("a missing required field", lambda g: pod_spec(g)["containers"][0].pop("name")),
        ("a string for a list", lambda g: pod_spec(g)["containers"][0].update(args="gateway")),
        ("a string port", lambda g: pod_spec(g)["containers"][0]["ports"][0].update(hostPort="x")),
    ],
)
def test_validation_is_not_vacuous(what: str, break_it: Any) -> None:
    gateway = copy.deepcopy(one("Deployment", "corral-gateway"))
    kubernetes_validate.validate(gateway, VERSIONS[-1], strict=True)
    break_it(gateway)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(gateway, VERSIONS[-1], strict=True)


def test_an_unknown_kind_is_not_silently_accepted() -> None:
    bogus = {"apiVersion": "apps/v1", "kind": "Deploymnet", "metadata": {"name": "x"}}
    with pytest.raises(SchemaNotFoundError):
        kubernetes_validate.validate(bogus, VERSIONS[-1], strict=True)


def test_the_kustomization_lists_every_manifest_but_the_example_secrets() -> None:
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    assert kustomization["namespace"] == "corral"
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in manifest_files()} - {"secrets.example.yaml"}
    images = {c["image"].rsplit(":", 1)[0] for _, c in every_container()}
    for entry in kustomization["images"]:
        assert entry["name"] in images
        assert entry["newTag"] == PROJECT_VERSION


# --- the planes apart ------------------------------------------------------------------------
FORBIDDEN_ON_NODES = {"CORRAL_DATABASE_URL", "CORRAL_ADMIN_KEY"}


def setting_names(model: type[Any]) -> set[str]:
    return {f"CORRAL_{name.upper()}" for name in model.model_fields}


def test_node_pods_get_no_database_url_and_no_admin_key() -> None:
    node = one("DaemonSet", "corral-node")
    spec = pod_spec(node)
    for container in containers(spec):
        assert "envFrom" not in container  # every variable is named, none slips in
        env = env_of(container)
        assert not FORBIDDEN_ON_NODES & set(env)
        secret_refs = {
            (item["valueFrom"]["secretKeyRef"]["name"], item["valueFrom"]["secretKeyRef"]["key"])
            for item in env.values()
            if "secretKeyRef" in item.get("valueFrom", {})
        }
        assert secret_refs == {("corral-node", "CORRAL_REDIS_URL")}
        assert literal(container, "CORRAL_NODE_HOST") == "0.0.0.0"
    assert not [v for v in spec["volumes"] if "secret" in v or "projected" in v]
    assert spec["automountServiceAccountToken"] is False
    # The node's Secret holds the Redis URL and nothing else.
    assert set(one("Secret", "corral-node")["stringData"]) == {"CORRAL_REDIS_URL"}


def test_every_corral_variable_is_a_setting_of_the_process_that_gets_it() -> None:
    """A misspelt variable would be ignored silently (extra="ignore")."""
    for name, container in every_container():
        names = {n for n in env_of(container) if n.startswith("CORRAL_")}
        model = NodeSettings if "/corral-node/" in name else Settings
        assert names <= setting_names(model), name


def test_no_service_links_reach_the_settings() -> None:
    """A Service named corral-x would inject CORRAL_X_PORT=tcp://... into every pod of the
    namespace, and the settings read every CORRAL_* variable."""
    for workload in workloads():
        assert pod_spec(workload)["enableServiceLinks"] is False, workload["metadata"]["name"]
        assert pod_spec(workload)["automountServiceAccountToken"] is False


def test_only_the_node_is_privileged() -> None:
    for name, container in every_container():
        context = container.get("securityContext", {})
        if name.startswith("DaemonSet/corral-node/"):
            assert context["privileged"] is True and context["runAsUser"] == 0
        else:
            assert context.get("privileged", False) is False, name
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["capabilities"]["drop"] == ["ALL"], name
    node = pod_spec(one("DaemonSet", "corral-node"))
    assert not node["hostNetwork"] and not node["hostPID"] and not node["hostIPC"]
    mounts = {m["mountPath"]: m["name"] for m in node["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in node["volumes"]}
    assert volumes[mounts["/sys/fs/cgroup"]]["hostPath"]["path"] == "/sys/fs/cgroup"
    hostpaths = [v for v in node["volumes"] if "hostPath" in v]
    assert len(hostpaths) == 1, "the cgroup tree is the only host path a node mounts"
    # The reasons are written down where the privilege is given.
    text = (KUBE / "node.yaml").read_text()
    for reason in ("Namespaces", "Mounts", "Cgroups"):
        assert re.search(rf"#\s+- {reason}:", text), reason


def test_gateways_run_unprivileged_on_a_read_only_root() -> None:
    gateway = one("Deployment", "corral-gateway")
    assert gateway["spec"]["replicas"] == 2
    spec = pod_spec(gateway)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    volumes = {v["name"]: v for v in spec["volumes"]}
    for container in containers(spec):
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        data_dir = literal(container, "CORRAL_DATA_DIR")
        assert "emptyDir" in volumes[mounts[data_dir]]
        secret_refs = {
            item["valueFrom"]["secretKeyRef"]["name"]
            for item in env_of(container).values()
            if "secretKeyRef" in item.get("valueFrom", {})
        }
        assert secret_refs == {"corral-gateway"}
    main = spec["containers"][0]
    assert main["args"] == ["corral", "gateway"]
    assert literal(main, "CORRAL_HOST") == "0.0.0.0"
    assert set(env_of(main)) >= {"CORRAL_ADMIN_KEY", "CORRAL_DATABASE_URL", "CORRAL_REDIS_URL"}


def test_migrations_run_in_a_job_and_not_in_the_gateways() -> None:
    job = one("Job", "corral-migrate")
    assert [c["args"] for c in containers(pod_spec(job))] == [["corral", "db", "upgrade"]]
    # It is told where the database is, and nothing else secret.
    assert set(env_of(containers(pod_spec(job))[0])) == {"CORRAL_DATA_DIR", "CORRAL_DATABASE_URL"}
    gateway = pod_spec(one("Deployment", "corral-gateway"))
    assert literal(gateway["containers"][0], "CORRAL_RUN_MIGRATIONS") == "false"
    (init,) = gateway["initContainers"]
    assert "/opt/corral/wait_for_schema.py" in init["args"]
    assert "COPY deploy/wait_for_schema.py /opt/corral/wait_for_schema.py" in (
        (DEPLOY / "Containerfile").read_text()
    )


def test_the_node_runs_the_data_plane_entry_point_and_drains_before_it_is_killed() -> None:
    node = one("DaemonSet", "corral-node")
    (container,) = containers(pod_spec(node))
    assert container["args"] in (["python", "-m", "node.agent"], ["corral", "node"])
    drain = float(literal(container, "CORRAL_DRAIN_SECONDS"))
    assert pod_spec(node)["terminationGracePeriodSeconds"] > drain + 10
    # One agent per host name at a time: no surge.
    assert node["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 0
    assert env_of(container)["CORRAL_NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "spec.nodeName"
    )
    text = (KUBE / "node.yaml").read_text()
    assert "# nodeSelector:" in text and "# tolerations:" in text


# --- bounded, probed, pinned -----------------------------------------------------------------
def test_every_container_has_resource_limits() -> None:
    for name, container in every_container():
        resources_ = container["resources"]
        assert {"cpu", "memory"} <= set(resources_["limits"]), name
        assert {"cpu", "memory"} <= set(resources_["requests"]), name


def test_every_long_running_container_has_probes() -> None:
    for name, container in every_container():
        if name.startswith("Job/") or "/wait-for-schema" in name:
            continue
        assert "readinessProbe" in container and "livenessProbe" in container, name


def test_no_image_is_latest_or_untagged() -> None:
    for name, container in every_container():
        image = container["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag, f"{name}: {image} has no tag"
        assert tag != "latest", name
        if repository.endswith("/corral"):
            assert tag == PROJECT_VERSION, name


def _port(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return int(number)


def _http_probe_ports(container: dict[str, Any]) -> set[int]:
    probes = [container.get(k) for k in ("startupProbe", "readinessProbe", "livenessProbe")]
    return {_port(container, p["httpGet"]["port"]) for p in probes if p and "httpGet" in p}


def _settings_from_env(
    model: type[Any], container: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> Any:
    """The container's settings, as its process would read them from its environment."""
    import os

    secrets = {
        "CORRAL_ADMIN_KEY": "k" * 32,
        "CORRAL_DATABASE_URL": "postgresql://corral:pw@postgres:5432/corral",
        "CORRAL_REDIS_URL": "redis://:pw@redis:6379/0",
    }
    with monkeypatch.context() as patch:
        for name in [n for n in os.environ if n.startswith("CORRAL_")]:
            patch.delenv(name)
        for name, item in env_of(container).items():
            if "value" in item:
                patch.setenv(name, str(item["value"]))
            elif "secretKeyRef" in item["valueFrom"]:
                patch.setenv(name, secrets[item["valueFrom"]["secretKeyRef"]["key"]])
            else:
                patch.setenv(name, "host-1")  # fieldRef: spec.nodeName
        return model()


def test_the_probes_use_the_ports_the_settings_listen_on(monkeypatch: pytest.MonkeyPatch) -> None:
    gateway = pod_spec(one("Deployment", "corral-gateway"))["containers"][0]
    settings = _settings_from_env(Settings, gateway, monkeypatch)
    assert settings.host == "0.0.0.0" and settings.run_migrations is False
    assert _http_probe_ports(gateway) == {settings.port}
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/healthz"

    node = pod_spec(one("DaemonSet", "corral-node"))["containers"][0]
    node_settings = _settings_from_env(NodeSettings, node, monkeypatch)
    assert node_settings.node_host == "0.0.0.0" and node_settings.node_id == "host-1"
    assert _http_probe_ports(node) == {node_settings.node_port}
    assert node["readinessProbe"]["httpGet"]["path"] == "/readyz"  # Redis answers too
    assert node["livenessProbe"]["httpGet"]["path"] == "/healthz"  # a Redis outage: alive
    memory_limit_mb = int(node["resources"]["limits"]["memory"].removesuffix("Gi")) * 1024
    assert node_settings.node_memory_mb < memory_limit_mb

    # The Service and the Prometheus annotations point at the same ports.
    service = one("Service", "corral-gateway")
    assert _port(gateway, service["spec"]["ports"][0]["targetPort"]) == settings.port
    for kind, name, port in (
        ("Deployment", "corral-gateway", settings.port),
        ("DaemonSet", "corral-node", node_settings.node_port),
    ):
        annotations = one(kind, name)["spec"]["template"]["metadata"]["annotations"]
        assert int(annotations["prometheus.io/port"]) == port


def test_services_select_pods_that_serve_their_target_port() -> None:
    for service in [r for r in resources() if r["kind"] == "Service"]:
        selector = service["spec"]["selector"]
        targets = [
            w
            for w in workloads()
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(targets) == 1, service["metadata"]["name"]
        container = pod_spec(targets[0])["containers"][0]
        for port in service["spec"]["ports"]:
            assert _port(container, port["targetPort"]) == port["port"]


def test_workload_selectors_match_their_templates() -> None:
    for workload in workloads():
        if workload["kind"] == "Job":
            continue
        selector = workload["spec"]["selector"]["matchLabels"]
        assert selector.items() <= workload["spec"]["template"]["metadata"]["labels"].items()


# --- Secrets and stand-in services -----------------------------------------------------------
def test_example_secrets_are_placeholders_the_gateway_refuses() -> None:
    secrets = [r for r in resources(secrets=True) if r["kind"] == "Secret"]
    assert {s["metadata"]["name"] for s in secrets} == {
        "corral-gateway",
        "corral-node",
        "corral-postgres",
        "corral-redis",
    }
    for secret in secrets:
        assert "data" not in secret
        for key, value in secret["stringData"].items():
            assert "REPLACE-ME" in value, f"{secret['metadata']['name']}.{key}"
    # Every Secret a container names exists, with that key.
    keys = {(s["metadata"]["name"], k) for s in secrets for k in s["stringData"]}
    for name, container in every_container():
        for item in env_of(container).values():
            ref = item.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert (ref["name"], ref["key"]) in keys, name
    admin_key = one("Secret", "corral-gateway")["stringData"]["CORRAL_ADMIN_KEY"]
    with pytest.raises(ValidationError, match="CORRAL_ADMIN_KEY"):
        Settings(admin_key=admin_key)


@pytest.mark.parametrize("path", ["postgres.yaml", "redis.yaml"])
def test_in_cluster_postgres_and_redis_say_they_are_stand_ins(path: str) -> None:
    text = (KUBE / path).read_text()
    assert "replace with a managed" in text.lower()
    assert "Nothing else changes" in text


# --- the network -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Peer:
    """One end of a connection: a pod (namespace and labels), or an address outside."""

    namespace: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    outside: bool = False

    @property
    def namespace_labels(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace}


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "this check knows matchLabels only"
    return selector.get("matchLabels", {}).items() <= labels.items()


def _peer_matches(rule_peer: Mapping[str, Any], peer: Peer, namespace: str) -> bool:
    if "ipBlock" in rule_peer:
        return peer.outside
    if peer.outside:
        return False
    if "namespaceSelector" in rule_peer:
        in_namespace = _selects(rule_peer["namespaceSelector"], peer.namespace_labels)
    else:
        in_namespace = peer.namespace == namespace
    return in_namespace and _selects(rule_peer.get("podSelector", {}), peer.labels)


def _port_matches(rule: Mapping[str, Any], port: int, protocol: str) -> bool:
    ports = rule.get("ports")
    return ports is None or any(
        p["port"] == port and p.get("protocol", "TCP") == protocol for p in ports
    )


def _direction_allows(
    policies: list[dict[str, Any]], pod: Peer, other: Peer, port: int, protocol: str, kind: str
) -> bool:
    if pod.outside or pod.namespace != "corral":
        return True  # only the corral namespace has policies
    selecting = [
        p
        for p in policies
        if kind in p["spec"]["policyTypes"] and _selects(p["spec"]["podSelector"], pod.labels)
    ]
    if not selecting:
        return True
    key, peers_key = ("egress", "to") if kind == "Egress" else ("ingress", "from")
    return any(
        _port_matches(rule, port, protocol)
        and (
            peers_key not in rule or any(_peer_matches(x, other, "corral") for x in rule[peers_key])
        )
        for policy in selecting
        for rule in policy["spec"].get(key, [])
    )


def allowed(src: Peer, dst: Peer, port: int, protocol: str = "TCP") -> bool:
    policies = [r for r in resources() if r["kind"] == "NetworkPolicy"]
    return _direction_allows(policies, src, dst, port, protocol, "Egress") and _direction_allows(
        policies, dst, src, port, protocol, "Ingress"
    )


def _pod(component: str) -> Peer:
    (labels,) = {
        tuple(sorted(w["spec"]["template"]["metadata"]["labels"].items()))
        for w in workloads()
        if w["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component")
        == component
    }
    return Peer("corral", dict(labels))


def test_the_network_is_closed_but_for_what_the_planes_need() -> None:
    gateway, node, migrate = _pod("gateway"), _pod("node"), _pod("migrate")
    postgres, redis = _pod("postgres"), _pod("redis")
    client = Peer("ingress-nginx", {"app": "ingress-nginx"})
    internet = Peer(outside=True)
    dns = Peer("kube-system", {"k8s-app": "kube-dns"})
    prometheus = Peer("monitoring", {"app": "prometheus"})

    # From outside: only the gateways.
    assert allowed(client, gateway, 8080) and allowed(internet, gateway, 8080)
    for target, port in ((node, 8081), (postgres, 5432), (redis, 6379)):
        assert not allowed(client, target, port) and not allowed(internet, target, port)
    assert allowed(prometheus, node, 8081)
    # Nodes: Redis and DNS, nothing else.
    assert allowed(node, redis, 6379)
    assert allowed(node, dns, 53, "UDP") and allowed(node, dns, 53, "TCP")
    assert not allowed(node, postgres, 5432)
    assert not allowed(node, gateway, 8080)
    assert not allowed(node, internet, 443)
    assert not allowed(node, Peer("default", {"app": "anything"}), 80)
    # Gateways: PostgreSQL and Redis; the migration Job: PostgreSQL.
    assert allowed(gateway, postgres, 5432) and allowed(gateway, redis, 6379)
    assert not allowed(gateway, node, 8081) and not allowed(gateway, internet, 443)
    assert allowed(migrate, postgres, 5432)
    assert not allowed(migrate, redis, 6379)
    # The data stores reach nothing and are reached only by their clients.
    assert not allowed(postgres, internet, 443) and not allowed(redis, internet, 443)
    assert not allowed(Peer("corral", {"app.kubernetes.io/component": "other"}), redis, 6379)


def test_every_policy_selects_a_workload() -> None:
    labels = [w["spec"]["template"]["metadata"]["labels"] for w in workloads()]
    for policy in [r for r in resources() if r["kind"] == "NetworkPolicy"]:
        selector = policy["spec"]["podSelector"]
        assert any(_selects(selector, pod) for pod in labels), policy["metadata"]["name"]


# --- the image -------------------------------------------------------------------------------
def _bash_array(script: Path, name: str) -> list[str]:
    match = re.search(rf"^{name}=\(([^)]*)\)", script.read_text(), re.MULTILINE)
    assert match, f"{script.name} has no {name}=(...)"
    return match.group(1).split()


def test_the_containerfile_installs_what_the_setup_scripts_install() -> None:
    text = (DEPLOY / "Containerfile").read_text()
    (base,) = re.findall(r"^FROM\s+(\S+)", text, re.MULTILINE)
    assert base.startswith("python:3.12") and "bookworm" in base and "latest" not in base
    install = re.search(r"apt-get install[^&]*", text)
    assert install
    apt_packages = set(install.group(0).replace("\\", " ").split())
    for script in ("setup-nsjail.sh", "setup-wasm.sh"):
        packages = _bash_array(ROOT / "scripts" / script, "PACKAGES")
        assert packages and set(packages) <= apt_packages, script
    assert "pip install ." in text
    assert "scripts/setup-wasm.sh" in text
    assert re.search(r'^ENTRYPOINT \["tini", "--"\]', text, re.MULTILINE)
    # Not claimed to be built here.
    assert "not been built" in text
    assert "cannot be built" in (DEPLOY / "README.md").read_text().lower()
