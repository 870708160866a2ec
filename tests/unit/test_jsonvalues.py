"""contract/jsonvalues.json_integer: the one rule for "an integer in decoded JSON" (plan, loader, request models)."""

import json

import pytest

from inferctl.contract.jsonvalues import json_integer


@pytest.mark.parametrize("text, expected", [
    ("20", 20), ("20.0", 20), ("1e12", 10 ** 12), ("-3", -3), ("0", 0),
    ("123456789012345678901234567890", 123456789012345678901234567890),
])
def test_integers_and_integral_floats_are_integers(text, expected):
    got = json_integer(json.loads(text))
    assert got == expected and type(got) is int


@pytest.mark.parametrize("text", ["true", "false", '"20"', "20.5", "null", "[20]", '{"n": 20}', "1e400", "-1e400",
                                  "NaN", "Infinity"])
def test_everything_else_is_none(text):
    assert json_integer(json.loads(text)) is None


def test_the_request_models_and_the_planner_agree_with_it(tmp_path):
    """The same value is an integer to the request models (JsonInt) and to ``inferctl plan``'s config reader."""
    from pydantic import TypeAdapter, ValidationError

    from inferctl.contract.jsontypes import JsonInt
    from inferctl.tools.plan_model import PlanError, read_model

    adapter = TypeAdapter(JsonInt)
    base = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
            "vocab_size": 100}
    for value, ok in ((64, True), (64.0, True), (64.5, False), (True, False), ("64", False)):
        try:
            adapter.validate_python(value)
            model_ok = True
        except ValidationError:
            model_ok = False
        (tmp_path / "config.json").write_text(json.dumps({**base, "hidden_size": value}))
        try:
            read_model(str(tmp_path))
            plan_ok = True
        except PlanError:
            plan_ok = False
        assert model_ok == plan_ok == ok, (value, model_ok, plan_ok)
