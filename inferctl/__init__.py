"""inferctl: an operations control plane for LLM inference on NVIDIA GPUs, with its own engine.

Installed, every part lives under this one namespace: ``inferctl.contract`` (what engine and
controller agree on), ``inferctl.engine`` (the bundled inference engine),
``inferctl.controller`` (the control plane), ``inferctl.dashboards`` (observability as code),
``inferctl.tools`` (harnesses that drive the product from outside: the OOM drill, long-text
processing); ``inferctl.cli`` is the front door that composes the ``inferctl`` command. This
module itself imports nothing, so importing any part stays cheap.
"""

__version__ = "0.1.0"
