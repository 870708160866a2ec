"""The tools wing: harnesses that drive the product from outside (over HTTP, or in process).

- :mod:`inferctl.tools.drill` — ``inferctl drill oom``, the OOM → int8 → rollback game day.
- :mod:`inferctl.tools.longtext` — ``inferctl longtext BOOK``, a book in overlapping chunks:
  perplexity by position and repetition of the outputs.

Tools may import any part of the product (contract, engine, controller, dashboards); nothing
in the product imports them, and they never import the front door (``inferctl.cli``), which
attaches their commands.
"""
