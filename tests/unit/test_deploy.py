"""deploy/kubernetes validates: built-in kinds with kubernetes-validate --strict, custom resources
(ServiceMonitor, PrometheusRule, ScaledObject) against their CRDs' published OpenAPI schemas
(tests/data/crds/), the gpu-reset overlay as rendered; and a misspelled field fails."""

from __future__ import annotations

import copy
import shutil
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy_helpers import (AUTOSCALING, BASE, CUSTOM_KINDS, K8S, K8S_VERSION, base_docs, base_files, find,
                                  gpu_reset_docs, load_docs, validate)


def _all_manifests() -> list[tuple[str, dict]]:
    out = [(f"base/{d['kind']}/{d['metadata']['name']}", d) for d in base_docs()]
    out += [(f"gpu-reset/{d['kind']}/{d['metadata']['name']}", d) for d in gpu_reset_docs()]
    for path in sorted(AUTOSCALING.glob("*.yaml")):
        out += [(f"autoscaling/{d['kind']}/{d['metadata']['name']}", d) for d in load_docs(path)]
    return out


MANIFESTS = _all_manifests()


@pytest.mark.parametrize("doc", [d for _, d in MANIFESTS], ids=[i for i, _ in MANIFESTS])
def test_every_manifest_validates(doc):
    validate(doc)


def test_the_manifests_cover_every_part_and_every_custom_kind():
    kinds = {(d["kind"], d["metadata"]["name"]) for _, d in MANIFESTS}
    for expected in [("StatefulSet", "inferctl-engine"), ("DaemonSet", "inferctl-controller"),
                     ("Deployment", "inferctl-router"), ("Service", "inferctl-router"),
                     ("Service", "inferctl-engine"), ("ServiceMonitor", "inferctl-engine"),
                     ("ServiceMonitor", "inferctl-controller"), ("ServiceMonitor", "inferctl-router"),
                     ("PrometheusRule", "inferctl"), ("ScaledObject", "inferctl-engine"),
                     ("HorizontalPodAutoscaler", "inferctl-engine")]:
        assert expected in kinds
    assert {k for _, d in MANIFESTS for k in [(d["apiVersion"], d["kind"])] if k in CUSTOM_KINDS} == set(CUSTOM_KINDS)


def test_every_base_file_is_listed_in_the_kustomization():
    listed = {p.name for p in base_files()}
    on_disk = {p.name for p in BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk
    # nothing else under deploy/kubernetes escapes validation
    covered = set(BASE.glob("*.yaml")) | set(AUTOSCALING.glob("*.yaml")) | set((K8S / "gpu-reset").glob("*.yaml"))
    assert set(K8S.rglob("*.yaml")) == covered


# --------------------------------------------------------------------------- strictness
def test_a_misspelled_field_of_a_built_in_kind_fails_strict_validation():
    sts = copy.deepcopy(find(base_docs(), "StatefulSet", "inferctl-engine"))
    validate(sts)
    container = sts["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")       # the typo
    with pytest.raises(jsonschema.ValidationError, match="readinesProbe"):
        validate(sts)
    kubernetes_validate.validate(sts, K8S_VERSION, strict=False)        # only --strict catches it


def test_a_wrong_type_in_a_built_in_kind_fails():
    sts = copy.deepcopy(find(base_docs(), "StatefulSet", "inferctl-engine"))
    sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "45s"
    with pytest.raises(jsonschema.ValidationError):
        validate(sts)


@pytest.mark.parametrize("kind,name,mutate,needle", [
    ("ServiceMonitor", "inferctl-engine",
     lambda d: d["spec"]["endpoints"][0].__setitem__("intervall", "15s"), "intervall"),
    ("ServiceMonitor", "inferctl-controller",
     lambda d: d["spec"]["endpoints"][0]["relabelings"][0].__setitem__("action", "rename"), "rename"),
    ("PrometheusRule", "inferctl",
     lambda d: d["spec"]["groups"][0]["rules"][0].__setitem__("expresion", "up"), "expresion"),
    ("ServiceMonitor", "inferctl-router",
     lambda d: d["metadata"].__setitem__("lables", {}), "lables"),
])
def test_a_broken_custom_resource_fails(kind, name, mutate, needle):
    doc = copy.deepcopy(find(base_docs(), kind, name))
    validate(doc)
    mutate(doc)
    with pytest.raises(jsonschema.ValidationError, match=needle):
        validate(doc)


def test_a_broken_scaled_object_fails():
    doc = copy.deepcopy(load_docs(AUTOSCALING / "keda-scaledobject.yaml")[0])
    doc["spec"]["triggers"][0]["metadata"]["threshold"] = 4        # KEDA wants strings
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)
    doc = copy.deepcopy(load_docs(AUTOSCALING / "keda-scaledobject.yaml")[0])
    doc["spec"]["scaleTargetRef"]["kindd"] = "StatefulSet"
    with pytest.raises(jsonschema.ValidationError, match="kindd"):
        validate(doc)


def test_an_unknown_kind_never_passes_silently():
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        validate({"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": {"name": "x"}})


# --------------------------------------------------------------------------- the rendered overlay
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with its built-in kustomize) is not installed")
@pytest.mark.parametrize("folder,expected", [("base", base_docs), ("gpu-reset", gpu_reset_docs)])
def test_kustomize_renders_what_the_tests_validate(folder, expected):
    out = subprocess.run(["kubectl", "kustomize", str(K8S / folder)], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    rendered = sorted((d for d in yaml.safe_load_all(out) if d), key=lambda d: (d["kind"], d["metadata"]["name"]))
    mine = sorted(expected(), key=lambda d: (d["kind"], d["metadata"]["name"]))
    assert rendered == mine
