"""The metric catalogs follow the Prometheus naming conventions and never overlap."""

from inferctl.controller.metrics import CONTROLLER_METRICS, build_registry as build_controller
from inferctl.engine.metrics import ENGINE_METRICS, build_registry as build_engine


def test_engine_names_prefixed_and_counters_end_total():
    for spec in ENGINE_METRICS:
        assert spec["name"].startswith("inferctl_engine_"), spec["name"]
        assert (spec["type"] == "counter") == spec["name"].endswith("_total"), spec["name"]


def test_controller_names_prefixed_and_disjoint_from_engine():
    engine_names = {s["name"] for s in ENGINE_METRICS}
    for spec in CONTROLLER_METRICS:
        assert spec["name"].startswith("inferctl_"), spec["name"]
        assert spec["name"] not in engine_names
        assert (spec["type"] == "counter") == spec["name"].endswith("_total"), spec["name"]


def test_registries_build_every_metric():
    assert len(build_engine()[1]) == len(ENGINE_METRICS)
    assert len(build_controller()[1]) == len(CONTROLLER_METRICS)


def test_no_catalog_label_is_a_prometheus_target_label():
    """A label named job or instance would be renamed exported_* on scrape (honor_labels: false)."""
    for spec in ENGINE_METRICS + CONTROLLER_METRICS:
        assert not {"job", "instance"} & set(spec["labels"]), spec["name"]
