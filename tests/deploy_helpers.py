"""Helpers for the deploy/ tests: load the Kubernetes manifests, apply the gpu-reset overlay,
validate built-in kinds with kubernetes-validate (strict) and custom resources against their
CRDs' OpenAPI schemas (tests/data/crds/, see its README), and parse container args with the
real ``inferctl`` CLI."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import click
import jsonschema
import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "kubernetes"
BASE = K8S / "base"
GPU_RESET = K8S / "gpu-reset"
AUTOSCALING = K8S / "autoscaling"
DOCKER = DEPLOY / "docker"
CRDS = REPO / "tests" / "data" / "crds"

#: The Kubernetes version the manifests are validated against (the oldest one they target:
#: preStop ``sleep`` needs 1.30 or later).
K8S_VERSION = "1.31"

#: (apiVersion, kind) of each custom resource -> its CRD file under tests/data/crds/.
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "monitoring.coreos.com_prometheusrules.yaml",
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_scaledobjects.yaml",
}
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet")
IMAGE = "ghcr.io/inferctl/inferctl"


def load_docs(path: Path) -> list[dict]:
    """The non-empty YAML documents of one file."""
    with path.open(encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def base_files() -> list[Path]:
    """The resource files the base kustomization lists, in its order."""
    kust = load_docs(BASE / "kustomization.yaml")[0]
    return [BASE / r for r in kust["resources"]]


def base_docs() -> list[dict]:
    """Every object of the base, with the kustomization's namespace set (as kustomize does)."""
    namespace = load_docs(BASE / "kustomization.yaml")[0]["namespace"]
    docs = []
    for path in base_files():
        for doc in load_docs(path):
            if doc["kind"] != "Namespace":
                doc["metadata"].setdefault("namespace", namespace)
            docs.append(doc)
    return docs


def find(docs: list[dict], kind: str, name: str) -> dict:
    """The one object of ``kind`` named ``name``; KeyError when there is none."""
    hits = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    if len(hits) != 1:
        raise KeyError(f"{kind}/{name}: {len(hits)} objects")
    return hits[0]


def strategic_merge(target: Any, patch: Any) -> Any:
    """A strategic-merge patch as kustomize applies this repository's patches: maps merge key by
    key, lists of maps with a ``name`` merge item by name, any other value is replaced."""
    if isinstance(target, dict) and isinstance(patch, dict):
        out = dict(target)
        for key, value in patch.items():
            out[key] = strategic_merge(target[key], value) if key in target else copy.deepcopy(value)
        return out
    if (isinstance(target, list) and isinstance(patch, list)
            and all(isinstance(x, dict) and "name" in x for x in target + patch)):
        out = [copy.deepcopy(x) for x in target]
        for item in patch:
            idx = next((i for i, x in enumerate(out) if x["name"] == item["name"]), None)
            if idx is None:
                out.append(copy.deepcopy(item))
            else:
                out[idx] = strategic_merge(out[idx], item)
        return out
    return copy.deepcopy(patch)


def gpu_reset_docs() -> list[dict]:
    """The base with the gpu-reset overlay's patches applied (what ``kubectl kustomize
    deploy/kubernetes/gpu-reset`` renders)."""
    kust = load_docs(GPU_RESET / "kustomization.yaml")[0]
    assert kust["resources"] == ["../base"], kust["resources"]
    docs = base_docs()
    for entry in kust["patches"]:
        for patch in load_docs(GPU_RESET / entry["path"]):
            i = next(i for i, d in enumerate(docs)
                     if d["kind"] == patch["kind"] and d["metadata"]["name"] == patch["metadata"]["name"])
            docs[i] = strategic_merge(docs[i], patch)
    return docs


# --------------------------------------------------------------------------- schema validation
def _close(schema: Any) -> Any:
    """The CRD schema as the API server's strict field validation reads it: objects with
    ``properties`` reject unknown fields unless they preserve them; int-or-string and nullable
    become JSON Schema types."""
    if isinstance(schema, list):
        return [_close(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _close(v) for k, v in schema.items()}
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if out.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@functools.lru_cache(maxsize=None)
def crd_validator(api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    """A validator for the custom resource ``kind`` from its CRD's served version's schema."""
    crd = load_docs(CRDS / CUSTOM_KINDS[(api_version, kind)])[0]
    group, version = api_version.split("/")
    if crd["spec"]["group"] != group or crd["spec"]["names"]["kind"] != kind:
        raise ValueError(f"{CUSTOM_KINDS[(api_version, kind)]} does not define {api_version} {kind}")
    versions = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    if not versions:
        raise ValueError(f"{kind}: the CRD serves no version {version}")
    schema = _close(versions[0]["schema"]["openAPIV3Schema"])
    schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind", "metadata"})
    return jsonschema.Draft202012Validator(schema)


def validate(doc: dict) -> None:
    """Validate one object: custom kinds against their CRD (metadata against Kubernetes'
    ObjectMeta), built-in kinds with kubernetes-validate --strict for :data:`K8S_VERSION`.

    Raises:
        jsonschema.ValidationError: the object does not validate.
        kubernetes_validate.SchemaNotFoundError: a kind known to neither (never passes silently).
    """
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in CUSTOM_KINDS:
        crd_validator(*key).validate(doc)
        # ObjectMeta, strictly, through a kind whose schema has nothing else required
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]},
                                     K8S_VERSION, strict=True)
        return
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


# --------------------------------------------------------------------------- CLI parsing
class CliUsageError(ValueError):
    """The ``inferctl`` CLI refuses the arguments (what it would exit 2 for)."""


def _is_usage_error(exc: BaseException) -> bool:
    # typer >= 0.20 carries its own copy of click (typer._click), whose UsageError is a
    # typer.TyperException; older typer uses click's. Both exit with status 2.
    return isinstance(exc, click.UsageError) or getattr(exc, "exit_code", None) == 2


def parse_cli(args: list[str]) -> tuple[list[str], dict]:
    """Parse ``inferctl ARGS`` with the real CLI (no command runs): ``(command path, params of
    the last command)``.

    Raises:
        CliUsageError: anything the CLI would refuse: an unknown command or option, a bad
            value, a value out of range.
    """
    from typer.main import get_command

    from inferctl.cli import build_app

    cmd = get_command(build_app())
    path: list[str] = []
    try:
        ctx = cmd.make_context("inferctl", list(args))
        while hasattr(cmd, "resolve_command"):          # a group: descend into the subcommand
            # the subcommand's name is kept apart from its arguments (``_protected_args`` since
            # click 8.2, the deprecated ``protected_args`` before)
            protected = getattr(ctx, "_protected_args", None)
            rest = [*(ctx.protected_args if protected is None else protected), *ctx.args]
            if not rest:
                raise CliUsageError(f"{' '.join(['inferctl', *path])}: a subcommand is missing")
            name, sub, rest = cmd.resolve_command(ctx, rest)
            path.append(name)
            ctx = sub.make_context(name, rest, parent=ctx)
            cmd = sub
    except CliUsageError:
        raise
    except Exception as exc:
        if _is_usage_error(exc):
            raise CliUsageError(f"inferctl {' '.join(args)}: {exc}") from exc
        raise
    return path, ctx.params


def inferctl_containers(docs: list[dict]) -> list[tuple[dict, dict]]:
    """``(workload, container)`` for every container running the inferctl image."""
    out = []
    for doc in docs:
        if doc["kind"] in WORKLOAD_KINDS:
            for c in doc["spec"]["template"]["spec"]["containers"]:
                if c["image"].split(":")[0] == IMAGE:
                    out.append((doc, c))
    return out
