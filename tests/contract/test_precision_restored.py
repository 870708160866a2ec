"""The contract tier's shared ``bundle`` fixture (tests/contract/conftest.py): a test that switches
the module's model to int8 does not leak that into the next test (tests run in file order)."""

from __future__ import annotations

from inferctl.engine.config import EngineConfig
from inferctl.engine.engine import LLMEngine


def test_a_test_switches_the_shared_model_to_int8(bundle):
    engine = LLMEngine(bundle, EngineConfig())
    engine.request_precision("int8")
    assert bundle.model.precision == "int8"


def test_the_next_test_sees_it_in_full_precision_again(bundle):
    assert bundle.model.precision == "full"
    assert LLMEngine(bundle, EngineConfig()).precision == "full"
