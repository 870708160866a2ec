"""Grafana dashboard JSON, built with grafana-foundation-sdk from the panel specs.

The six dashboards are declared as data in :mod:`dashboards.panels` (:class:`PanelSpec`);
:func:`build_dashboard` turns one into SDK builders and :func:`render_dashboards` serialises
them with the SDK's own ``JSONEncoder`` (sorted keys, 2-space indent, trailing newline) so the
committed JSON is byte-stable.

Every panel reads the ``datasource`` template variable (type ``prometheus``). Controller
events are annotations read from Prometheus only (``inferctl_events_total``,
``inferctl_precision_switches_total``) over Grafana's ``$__interval``.

Pinned SDK build: grafana-foundation-sdk ``1769699379!11.6.0`` (Grafana 11.6 schema,
``schemaVersion`` 41). Unlike the 10.1 build it omits ``options`` for panels without
options instead of writing ``"options": null``; a test checks no panel carries a null.
"""

from __future__ import annotations

import json

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as pb
from grafana_foundation_sdk.builders import stat, statetimeline, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

from inferctl.contract.thresholds import THRESHOLDS, Thresholds
from inferctl.dashboards import promql as q
from inferctl.dashboards.panels import DashboardSpec, PanelSpec, dashboard_specs

__all__ = ["DATASOURCE", "SDK_BUILD", "annotation_queries", "build_dashboard", "dashboard_specs",
           "panel_queries", "render_dashboards", "to_json"]

#: Annotation range: Grafana's per-pixel ``$__interval``, so each event marks one point.
ANNOTATION_WINDOW = "$__interval"
#: Dashboard refresh period and default time range (display choices, not thresholds).
REFRESH = "30s"
TIME_FROM, TIME_TO = "now-3h", "now"
#: Height of every panel, in Grafana grid units.
PANEL_HEIGHT = 8
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
SDK_BUILD = "1769699379!11.6.0"


def _annotations() -> list[db.AnnotationQuery]:
    return [
        db.AnnotationQuery().name("Controller events").datasource(DATASOURCE).enable(True).icon_color("orange")
        .expr(q.counter_increased("inferctl_events_total", ("kind",), ANNOTATION_WINDOW,
                                  'kind=~"transition|action|escalation|refusal|error"')),
        db.AnnotationQuery().name("Precision switches").datasource(DATASOURCE).enable(True).icon_color("red")
        .expr(q.counter_increased("inferctl_precision_switches_total", ("engine", "to"), ANNOTATION_WINDOW)),
    ]


def _bottom_list_legend() -> cb.VizLegendOptions:
    """The legend of time series and state timelines: a list below the graph."""
    return (cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST).placement(cm.LegendPlacement.BOTTOM)
            .show_legend(True))


def _panel_builder(p: PanelSpec, panel_id: int):
    if p.kind == "timeseries":
        b = (timeseries.Panel().line_width(1).fill_opacity(10).span_nulls(False)
             .legend(_bottom_list_legend())
             .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING)))
    elif p.kind == "stat":
        b = (stat.Panel().graph_mode(cm.BigValueGraphMode.AREA).color_mode(cm.BigValueColorMode.VALUE)
             .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    elif p.kind == "state":
        b = (statetimeline.Panel().show_value(cm.VisibilityMode.AUTO).merge_values(True).row_height(0.9)
             .fill_opacity(70).line_width(0)
             .legend(_bottom_list_legend())
             .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.SINGLE).sort(cm.SortOrder.NONE)))
    else:
        raise ValueError(f"kind: panel {p.title!r} has unknown kind {p.kind!r} (timeseries, stat, state)")
    b = (b.id(panel_id).title(p.title).description(p.description).datasource(DATASOURCE).unit(p.unit)
         .span(p.width).height(PANEL_HEIGHT))
    if p.min is not None:
        b = b.min(p.min)
    if p.max is not None:
        b = b.max(p.max)
    steps = [dm.Threshold(value=None, color="green")]
    if p.threshold is not None:
        steps.append(dm.Threshold(value=p.threshold, color="red"))
        if p.kind == "timeseries":
            b = b.thresholds_style(cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.LINE))
    b = b.thresholds(db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps))
    for i, t in enumerate(p.targets):
        b = b.with_target(pb.Dataquery().expr(t.expr).legend_format(t.legend).ref_id(chr(ord("A") + i)).range())
    return b


def build_dashboard(spec: DashboardSpec) -> dm.Dashboard:
    """The SDK model of one dashboard (panel ids are 1.. in layout order, stable)."""
    d = (db.Dashboard(spec.title).uid(spec.uid).description(spec.description).tags(list(spec.tags))
         .editable().tooltip(dm.DashboardCursorSync.CROSSHAIR).refresh(REFRESH).time(TIME_FROM, TIME_TO)
         .timezone("browser")
         .with_variable(db.DatasourceVariable("datasource").label("Data source").type("prometheus"))
         .link(db.DashboardLink("inferctl dashboards").type(dm.DashboardLinkType.DASHBOARDS).tags(["inferctl"])
               .as_dropdown(True).keep_time(True)))
    for ann in _annotations():
        d = d.annotation(ann)
    next_id = 1
    for row_title, panels in spec.rows:
        d = d.with_row(db.Row(row_title).id(next_id))
        next_id += 1
        for p in panels:
            d = d.with_panel(_panel_builder(p, next_id))
            next_id += 1
    return d.build()


def to_json(model: dm.Dashboard) -> str:
    """Serialise with the SDK's encoder: sorted keys, 2-space indent, trailing newline."""
    return json.dumps(model, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def render_dashboards(thresholds: Thresholds = THRESHOLDS) -> dict[str, str]:
    """``{file name: JSON text}`` for every dashboard (file name ``<uid>.json``); threshold
    lines, quantiles and job names from ``thresholds``."""
    return {f"{s.uid}.json": to_json(build_dashboard(s)) for s in dashboard_specs(thresholds)}


def panel_queries(dashboard_json: dict) -> list[tuple[str, str, str]]:
    """``(panel title, refId, expr)`` of every target in a dashboard JSON document."""
    out = []
    for panel in dashboard_json.get("panels", []):
        for target in panel.get("targets", []) or []:
            out.append((panel.get("title", ""), target.get("refId", ""), target["expr"]))
    return out


def annotation_queries(dashboard_json: dict) -> list[tuple[str, str]]:
    """``(annotation name, expr)`` of every Prometheus annotation in a dashboard JSON document."""
    return [(a["name"], a["expr"]) for a in dashboard_json.get("annotations", {}).get("list", []) if a.get("expr")]
