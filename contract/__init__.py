"""The shared contract: what the engine and the controller must agree on, written once.

Precision modes and the degrade/rollback mapping (``precision``), the OpenAI request and
response models (``openai``, ``tokenize``), admin request shapes (``admin``), the error envelope
(``errors``), bearer auth and strict JSON reading (``http``), the ``/stats`` document's schema,
finish reasons and fault kinds (``stats``), OOM-text parsing (``oom``), sizes and units
(``units``), the output-quality measures (``quality``), the metric-spec type and the registry
builder (``metrics``), the Xid vocabulary (``xid``) and the one configuration of thresholds
(``thresholds``). It imports no other part of inferctl; the engine, the controller, the
dashboards, the router and the tools import it (tests/unit/test_boundaries.py).
"""
