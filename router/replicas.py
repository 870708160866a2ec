"""What the router knows of each replica: readiness, load, models, the controller's view.

A replica is *routable* when its last probe said ready (``GET /ready`` 200, or ``/health``
not draining on an engine without ``/ready``), no request since saw it refuse a connection,
and the controller (``--controller``) does not report it draining, isolated, restarting or
down. One :class:`ReplicaSet` per router app; the event loop is its only writer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferctl.router.balancer import ReplicaLoad
from inferctl.router.config import EngineSpec


@dataclass
class Replica:
    """One replica's state.

    ``ready``: the last probe's answer (False until the first probe); ``reason``: why not
    ready (``unknown`` before the first probe, ``down`` for a refused connection, the engine's
    ``reason``, ``draining``...); ``blocked``: the controller's reason to keep traffic away
    (None: none); ``outstanding``: requests in flight through this router; ``waiting`` and
    ``kv_usage_ratio``: from the last ``/stats`` (None = no reading); ``models``: served model
    names from ``/v1/models`` (None = not known yet).
    """

    name: str
    url: str
    ready: bool = False
    reason: str | None = "unknown"
    blocked: str | None = None
    outstanding: int = 0
    waiting: int | None = None
    kv_usage_ratio: float | None = None
    models: frozenset[str] | None = None
    last_probe: float | None = None

    @property
    def routable(self) -> bool:
        """Ready and not kept away by the controller."""
        return self.ready and self.blocked is None

    def serves(self, model: str | None) -> bool:
        """True when ``model`` is None, the model list is not known yet, or it lists ``model``."""
        return model is None or self.models is None or model in self.models

    def load(self) -> ReplicaLoad:
        """The balancer's view of this replica."""
        return ReplicaLoad(self.name, self.outstanding, self.waiting, self.kv_usage_ratio)


@dataclass
class ReplicaSet:
    """Every configured replica by name (configuration order)."""

    replicas: dict[str, Replica] = field(default_factory=dict)

    @classmethod
    def from_specs(cls, specs: tuple[EngineSpec, ...]) -> "ReplicaSet":
        """One not-yet-probed :class:`Replica` per spec."""
        return cls({s.name: Replica(s.name, s.url) for s in specs})

    def __getitem__(self, name: str) -> Replica:
        return self.replicas[name]

    def __iter__(self):
        return iter(self.replicas.values())

    def routable(self) -> list[Replica]:
        """The replicas a request may go to now."""
        return [r for r in self.replicas.values() if r.routable]

    def candidates(self, model: str | None, exclude: set[str]) -> list[Replica]:
        """Routable replicas not in ``exclude`` that serve ``model``; when none of them lists
        ``model``, every routable one not excluded (the engine then answers its own 404)."""
        live = [r for r in self.routable() if r.name not in exclude]
        serving = [r for r in live if r.serves(model)]
        return serving or live

    def models(self) -> list[str]:
        """The union of the routable replicas' served models, sorted."""
        names: set[str] = set()
        for r in self.routable():
            names |= set(r.models or ())
        return sorted(names)
