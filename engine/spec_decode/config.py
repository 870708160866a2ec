"""The engine's view of ``--speculative-config``: the parser and its settings live in
:mod:`inferctl.contract.speculative` (the controller validates an engine's launch key with the
same code); re-exported here for the engine's modules."""

from inferctl.contract.speculative import (METHOD_DRAFT_MODEL, METHOD_INT8_SELF, METHOD_NGRAM, METHODS,  # noqa: F401
                                           SpeculativeConfig, SpeculativeConfigError,
                                           parse_speculative_config)
