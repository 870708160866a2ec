"""deploy/ agrees with the product: container args parse with the real ``inferctl`` CLI, probes
and ports match the flags, the drain fits the termination grace, the controller's config loads,
scrape jobs are the alerts' jobs, autoscalers read real engine gauges, the images run the
console script as a non-root user, and the PrometheusRule is the generated one."""

from __future__ import annotations

import json
import re
import tomllib

import pytest
import yaml

from inferctl.contract.thresholds import THRESHOLDS
from inferctl.controller.config import parse_config
from inferctl.engine.metrics import ENGINE_METRICS
from tests.deploy_helpers import (AUTOSCALING, BASE, DOCKER, IMAGE, REPO, CliUsageError, base_docs, find,
                                  gpu_reset_docs, inferctl_containers, load_docs, parse_cli)

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
DOCS = base_docs()
ROUTER_JOB = "inferctl-router"


def _container(kind: str, name: str) -> dict:
    return find(DOCS, kind, name)["spec"]["template"]["spec"]["containers"][0]


def _port(container: dict, name: str) -> int:
    return next(p["containerPort"] for p in container["ports"] if p["name"] == name)


def _probe_port(container: dict, probe: str) -> int:
    port = container[probe]["httpGet"]["port"]
    return _port(container, port) if isinstance(port, str) else port


# --------------------------------------------------------------------------- the CLI
CONTAINERS = inferctl_containers(DOCS) + [(w, c) for w, c in inferctl_containers(gpu_reset_docs())
                                          if w["kind"] == "DaemonSet"]


@pytest.mark.parametrize("workload,container", CONTAINERS,
                         ids=[f"{w['kind']}/{c['name']}" for w, c in CONTAINERS])
def test_container_args_parse_with_the_real_cli(workload, container):
    assert "command" not in container, "the image's ENTRYPOINT is inferctl: give args only"
    path, params = parse_cli(container["args"])
    assert path == {"StatefulSet": ["engine", "serve"], "DaemonSet": ["controller", "run"],
                    "Deployment": ["router"]}[workload["kind"]]
    assert params.get("host", "0.0.0.0") == "0.0.0.0"


@pytest.mark.parametrize("args,needle", [
    (["engine", "serve", "--port", "80000"], "less than or equal to 65535"),
    (["engine", "serve", "--shutdown-grace", "30"], "No such option: --shutdown-grace"),
    (["controller", "start", "--config", "x.yaml"], "No such command 'start'"),
    (["router", "--port", "8080", "--enigne", "a=http://a:1"], "No such option: --enigne"),
    (["router", "--engine", "a=http://a:1", "--port", "x"], "valid integer"),
])
def test_the_cli_parser_used_here_refuses_bad_args(args, needle):
    with pytest.raises(CliUsageError, match=needle):
        parse_cli(args)


def test_engine_probes_ports_and_drain():
    sts = find(DOCS, "StatefulSet", "inferctl-engine")
    pod = sts["spec"]["template"]["spec"]
    c = _container("StatefulSet", "inferctl-engine")
    _, params = parse_cli(c["args"])
    assert _port(c, "http") == params["port"] == 8000
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["startupProbe"]["httpGet"]["path"] == "/health"
    assert {_probe_port(c, p) for p in ("livenessProbe", "readinessProbe", "startupProbe")} == {params["port"]}
    # the kubelet's SIGKILL comes after preStop + the engine's own drain grace
    pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > pre_stop + params["shutdown_grace_seconds"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert any(m["mountPath"] == "/models" and m["readOnly"] for m in c["volumeMounts"])
    assert next(a for a in c["args"] if a.startswith("/models/"))


def test_engine_services_address_the_pods():
    sts = find(DOCS, "StatefulSet", "inferctl-engine")
    labels = sts["spec"]["template"]["metadata"]["labels"]
    headless = find(DOCS, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    local = find(DOCS, "Service", "inferctl-engine-local")
    assert local["spec"]["internalTrafficPolicy"] == "Local"
    for svc in (headless, local):
        assert svc["spec"]["selector"].items() <= labels.items()
        assert svc["spec"]["publishNotReadyAddresses"] is True     # a draining engine stays reachable


def test_router_lists_the_engine_pods_up_to_the_autoscalers_maximum():
    c = _container("Deployment", "inferctl-router")
    _, params = parse_cli(c["args"])
    sts = find(DOCS, "StatefulSet", "inferctl-engine")
    keda = load_docs(AUTOSCALING / "keda-scaledobject.yaml")[0]
    hpa = load_docs(AUTOSCALING / "hpa.yaml")[0]
    most = keda["spec"]["maxReplicaCount"]
    assert hpa["spec"]["maxReplicas"] == most
    assert sts["spec"]["replicas"] <= most
    engine_port = parse_cli(_container("StatefulSet", "inferctl-engine")["args"])[1]["port"]
    expected = [f"inferctl-engine-{i}=http://inferctl-engine-{i}.{sts['spec']['serviceName']}:{engine_port}"
                for i in range(most)]
    assert list(params["engine"]) == expected
    assert _port(c, "http") == params["port"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    svc = find(DOCS, "Service", "inferctl-router")
    assert svc["spec"]["ports"][0]["targetPort"] == "http"


def test_controller_config_loads_and_only_the_reset_variant_may_reset():
    base_cm = find(DOCS, "ConfigMap", "inferctl-controller")
    reset_cm = find(gpu_reset_docs(), "ConfigMap", "inferctl-controller")
    ds = find(DOCS, "DaemonSet", "inferctl-controller")
    c = ds["spec"]["template"]["spec"]["containers"][0]
    _, params = parse_cli(c["args"])
    mount = next(m for m in c["volumeMounts"] if params["config"].startswith(m["mountPath"] + "/"))
    volume = next(v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == base_cm["metadata"]["name"]
    key = params["config"].rsplit("/", 1)[1]
    base = parse_config(yaml.safe_load(base_cm["data"][key]))
    reset = parse_config(yaml.safe_load(reset_cm["data"][key]))
    assert base.rails.dry_run is True and reset.rails.dry_run is False
    reset.rails.dry_run = True
    assert reset.model_dump() == base.model_dump()      # the overlay changes nothing else
    assert base.listen.port == _port(c, "http") == _probe_port(c, "livenessProbe")
    assert [e.url for e in base.engines] == ["http://inferctl-engine-local:8000"]
    assert base.gpu.kind == "nvml"


# --------------------------------------------------------------------------- security
def _pod_specs(docs):
    return [(d["metadata"]["name"], d["spec"]["template"]["spec"]) for d in docs
            if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")]


def test_every_base_pod_is_non_root_without_added_privileges():
    uid = _dockerfile_uid("Dockerfile.cpu")
    for name, pod in _pod_specs(DOCS):
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] == uid, name
        assert pod["automountServiceAccountToken"] is False, name
        assert not pod.get("hostPID") and not pod.get("hostNetwork") and not pod.get("hostIPC"), name
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and not sc.get("privileged"), name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert sc["readOnlyRootFilesystem"] is True, name
    # no RBAC: no part of inferctl calls the Kubernetes API
    assert not [d for d in DOCS if d["apiVersion"].startswith("rbac.authorization.k8s.io")]
    namespace = find(DOCS, "Namespace", "inferctl")["metadata"]["labels"]
    assert namespace["pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_gpu_reset_variant_adds_exactly_its_documented_privileges():
    base = {(d["kind"], d["metadata"]["name"]): d for d in DOCS}
    reset = {(d["kind"], d["metadata"]["name"]): d for d in gpu_reset_docs()}
    assert base.keys() == reset.keys()
    changed = {k for k in base if base[k] != reset[k]}
    assert changed == {("DaemonSet", "inferctl-controller"), ("ConfigMap", "inferctl-controller"),
                       ("Namespace", "inferctl")}
    b = base[("DaemonSet", "inferctl-controller")]["spec"]["template"]["spec"]
    r = reset[("DaemonSet", "inferctl-controller")]["spec"]["template"]["spec"]
    assert r["hostPID"] is True and not r.get("hostNetwork")
    assert r["securityContext"]["runAsUser"] == 0
    sc = r["containers"][0]["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert not sc.get("privileged") and sc["allowPrivilegeEscalation"] is False
    # everything else of the pod is the base's
    strip = [("hostPID",), ("securityContext",), ("containers", 0, "securityContext", "capabilities")]
    for spec in (b, r):
        for path in strip:
            node = spec
            for p in path[:-1]:
                node = node[p]
            node.pop(path[-1], None)
    assert b == r


def test_the_controller_runs_on_gpu_nodes_with_nvml_and_claims_no_gpu():
    pod = find(DOCS, "DaemonSet", "inferctl-controller")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["runtimeClassName"] == "nvidia"
    c = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert "nvidia.com/gpu" not in str(c["resources"])


# --------------------------------------------------------------------------- monitoring
def test_each_service_monitor_scrapes_one_service_as_the_alerts_job():
    jobs = {"engine": THRESHOLDS.engine_job, "controller": THRESHOLDS.controller_job, "router": ROUTER_JOB}
    services = [d for d in DOCS if d["kind"] == "Service"]
    for component, job in jobs.items():
        sm = find(DOCS, "ServiceMonitor", job)
        selected = [s for s in services if sm["spec"]["selector"]["matchLabels"].items()
                    <= s["metadata"]["labels"].items()]
        assert [s["metadata"]["name"] for s in selected] == [job], component      # scraped once
        endpoint = sm["spec"]["endpoints"][0]
        assert endpoint["port"] in {p["name"] for p in selected[0]["spec"]["ports"]}
        assert {"action": "replace", "targetLabel": "job", "replacement": job} in endpoint["relabelings"]


def test_the_prometheus_rule_is_the_generated_one():
    deployed = (BASE / "prometheusrule.yaml").read_text(encoding="utf-8")
    assert deployed == (REPO / "alerts" / "prometheusrule.yaml").read_text(encoding="utf-8"), \
        "run `inferctl dashboards build`"
    assert any(p.name == "prometheusrule.yaml" for p in (BASE / r for r in
               load_docs(BASE / "kustomization.yaml")[0]["resources"]) if isinstance(p.name, str))


# --------------------------------------------------------------------------- autoscaling
def _gauges() -> set[str]:
    return {m["name"] for m in ENGINE_METRICS if m["type"] == "gauge"}


def test_autoscalers_scale_the_engines_on_real_engine_gauges():
    keda = load_docs(AUTOSCALING / "keda-scaledobject.yaml")[0]
    hpa, adapter = load_docs(AUTOSCALING / "hpa.yaml")
    sts = find(DOCS, "StatefulSet", "inferctl-engine")
    target = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts["metadata"]["name"]}
    assert keda["spec"]["scaleTargetRef"] == target == hpa["spec"]["scaleTargetRef"]
    queries = [t["metadata"]["query"] for t in keda["spec"]["triggers"]]
    keda_metrics = {m for q in queries for m in re.findall(r"inferctl_engine_\w+", q)}
    hpa_metrics = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
    assert keda_metrics == hpa_metrics == {"inferctl_engine_num_requests_waiting",
                                           "inferctl_engine_kv_cache_usage_ratio"}
    assert keda_metrics <= _gauges()
    assert all(f'job="{THRESHOLDS.engine_job}"' in q for q in queries)
    rules = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    assert {r["name"]["as"] for r in rules} == hpa_metrics
    assert all(f'job="{THRESHOLDS.engine_job}"' in r["metricsQuery"] for r in rules)
    assert keda["spec"]["minReplicaCount"] == hpa["spec"]["minReplicas"] >= 2
    assert [t["metadata"]["threshold"] for t in keda["spec"]["triggers"]] == ["4", "0.75"]
    assert [m["pods"]["target"]["averageValue"] for m in hpa["spec"]["metrics"]] == ["4", "750m"]


# --------------------------------------------------------------------------- the images
def _instructions(name: str) -> list[tuple[str, str]]:
    text = (DOCKER / name).read_text(encoding="utf-8").replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _dockerfile_uid(name: str) -> int:
    user = [rest for word, rest in _instructions(name) if word == "USER"][-1]
    return int(user.split(":")[0])


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.cuda"])
def test_the_image_runs_the_console_script_as_non_root(name):
    ins = _instructions(name)
    entry = [rest for word, rest in ins if word == "ENTRYPOINT"]
    assert len(entry) == 1 and json.loads(entry[0]) == ["inferctl"]
    assert PYPROJECT["project"]["scripts"]["inferctl"] == "inferctl.cli:main"
    assert _dockerfile_uid(name) > 0
    torch_pin = next(d for d in PYPROJECT["project"]["dependencies"] if d.startswith("torch"))
    runs = " ".join(rest for word, rest in ins if word == "RUN")
    assert re.search(rf"pip install .*\b{re.escape(torch_pin)}(\s|$)", runs)
    cpu_index = "--index-url https://download.pytorch.org/whl/cpu"
    assert (cpu_index in runs) == (name == "Dockerfile.cpu")
    assert "pip install /src" in runs
    assert ins[0][0] == "FROM" and "slim" in ins[0][1]


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.cuda"])
def test_the_build_context_keeps_every_package(name):
    ignored = {line.strip().rstrip("/") for line in
               (DOCKER / f"{name}.dockerignore").read_text(encoding="utf-8").splitlines()
               if line.strip() and not line.startswith("#")}
    needed = set(PYPROJECT["tool"]["setuptools"]["package-dir"].values()) | {"pyproject.toml", "README.md"}
    assert not needed & ignored
    assert not any(p.startswith("!") for p in ignored)


def test_manifest_images_are_this_version_and_the_right_variant():
    version = PYPROJECT["project"]["version"]
    variants = {"StatefulSet": "cuda", "DaemonSet": "cpu", "Deployment": "cpu"}
    for workload, c in inferctl_containers(DOCS):
        assert c["image"] == f"{IMAGE}:{version}-{variants[workload['kind']]}", workload["metadata"]["name"]


def test_the_router_image_carries_haproxy_for_the_haproxy_data_plane():
    """The router runs the CPU image (the Deployment's variant above); --data-plane haproxy needs the binary
    where find_haproxy looks for it (Debian installs /usr/sbin/haproxy)."""
    from inferctl.router.dataplane import DEBIAN_PATH

    runs = " ".join(rest for word, rest in _instructions("Dockerfile.cpu") if word == "RUN")
    assert re.search(r"apt-get install -y --no-install-recommends haproxy(\s|$)", runs)
    assert DEBIAN_PATH == "/usr/sbin/haproxy"
