"""``inferctl router``: an OpenAI-compatible HTTP router in front of engine replicas.

Imports only :mod:`inferctl.contract`; it reaches the engines and the controller over HTTP.
Modules: ``config`` (RouterConfig, ``--engine NAME=URL``), ``ring`` (consistent hashing with
bounded loads), ``balancer`` (the routing rule), ``replicas`` (per-replica state), ``probe``
(readiness, ``/stats`` and the controller's view), ``proxy`` (forwarding, retries, streaming),
``app`` (the FastAPI app), ``metrics`` (the catalog), ``keys`` (request ids; the JSON logs are
:mod:`inferctl.contract.logs`), ``cli`` (``register(app)``). See docs/router.md.
"""
