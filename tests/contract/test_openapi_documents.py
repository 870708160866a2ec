"""The three servers' OpenAPI documents and 405 answers, in-process (the engine on the demo model,
the router without replicas, the controller over a fake engine client): every body route
documents the model it validates with, no 422 anywhere, and a 405 lists the path's methods in
``Allow`` (RFC 9110 section 15.5.6)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from inferctl.contract.admin import AdminDrainRequest
from inferctl.contract.openai import ChatCompletionRequest, CompletionRequest
from inferctl.contract.tokenize import DetokenizeRequest, TokenizeRequest
from tests.controller_helpers import api_setup
from tests.server_helpers import demo_engine, make_app

TOKEN = "tok-openapi-contract-0123456789"


def without_nulls(schema):
    """``schema`` without None-valued keys (FastAPI writes its documents with ``exclude_none``)."""
    if isinstance(schema, dict):
        return {k: without_nulls(v) for k, v in schema.items() if v is not None}
    if isinstance(schema, list):
        return [without_nulls(v) for v in schema]
    return schema


def _apps(tmp_path):
    from inferctl.router.app import create_app
    from inferctl.router.config import EngineSpec, RouterConfig
    return {"engine": make_app({"main": demo_engine("main")}),
            "router": create_app(RouterConfig(engines=[EngineSpec("r0", "http://127.0.0.1:9")])),
            "controller": api_setup(tmp_path, TOKEN)[0].app}


def _body_schema(spec: dict, path: str) -> dict:
    ref = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    return spec["components"]["schemas"][ref.rsplit("/", 1)[1]]


def test_every_body_route_documents_the_model_it_validates_with(tmp_path):
    apps = _apps(tmp_path)
    engine, router, controller = (apps[k].openapi() for k in ("engine", "router", "controller"))
    for spec, path, model in ((engine, "/v1/completions", CompletionRequest),
                              (engine, "/v1/chat/completions", ChatCompletionRequest),
                              (engine, "/tokenize", TokenizeRequest), (engine, "/detokenize", DetokenizeRequest),
                              (engine, "/admin/drain", AdminDrainRequest),
                              (router, "/v1/completions", CompletionRequest),
                              (router, "/v1/chat/completions", ChatCompletionRequest)):
        expected = without_nulls(model.model_json_schema(ref_template="#/components/schemas/{model}"))
        expected.pop("$defs", None)
        assert _body_schema(spec, path) == expected, path
    assert _body_schema(controller, "/actions/reset-gpu")["required"] == ["gpu"]
    for spec in (engine, router, controller):
        for path, item in spec["paths"].items():
            for method, op in item.items():
                assert "422" not in op["responses"], (path, method)
                if method == "post" and path != "/openapi.json":
                    assert "requestBody" in op, path
                    assert {"400", "413", "415"} <= set(op["responses"]), path
    assert engine["paths"]["/admin/fault"]["post"]["security"] == [{"bearerAuth": []}]
    assert controller["paths"]["/actions/restart"]["post"]["security"] == [{"bearerAuth": []}]
    assert "security" not in controller["paths"]["/status"]["get"]
    assert "text/event-stream" in router["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    assert controller["paths"]["/actions/drain"]["post"]["responses"]["404"]["content"]["application/json"][
        "schema"] == {"$ref": "#/components/schemas/ControllerErrorEnvelope"}


@pytest.mark.parametrize(("server", "method", "path", "allow"), [
    ("engine", "DELETE", "/admin/route", "GET, POST"), ("engine", "GET", "/v1/completions", "POST"),
    ("router", "GET", "/v1/completions", "POST"), ("router", "POST", "/metrics", "GET"),
    ("controller", "POST", "/status", "GET"), ("controller", "GET", "/actions/drain", "POST")])
def test_405_answers_carry_allow_on_every_server(tmp_path, server, method, path, allow):
    """Regression: the three servers answered 405 without ``Allow``."""
    app = _apps(tmp_path)[server]

    async def call() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await c.request(method, path)

    r = asyncio.run(call())
    assert r.status_code == 405
    assert r.headers["allow"] == allow


def test_an_engine_with_an_api_key_documents_401_on_v1_only():
    """``--api-key`` guards ``/v1/*`` (engine/entrypoints/auth.py): that server's document says
    so (401 with the OpenAI envelope and ``WWW-Authenticate``, the ``apiKeyAuth`` scheme); the
    tokenizer, health and admin routes keep their own rules; without a key nothing changes."""
    keyed = make_app({"main": demo_engine("main")}, api_key="sk-test-key").openapi()
    for path, method in (("/v1/completions", "post"), ("/v1/chat/completions", "post"), ("/v1/models", "get")):
        op = keyed["paths"][path][method]
        assert op["security"] == [{"apiKeyAuth": []}], path
        assert op["responses"]["401"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/OpenAIErrorEnvelope"}, path
        assert "WWW-Authenticate" in op["responses"]["401"]["headers"]
    assert keyed["components"]["securitySchemes"]["apiKeyAuth"]["scheme"] == "bearer"
    assert "security" not in keyed["paths"]["/tokenize"]["post"]
    assert keyed["paths"]["/admin/fault"]["post"]["security"] == [{"bearerAuth": []}]
    plain = make_app({"main": demo_engine("main")}).openapi()
    assert "401" not in plain["paths"]["/v1/completions"]["post"]["responses"]
    assert "apiKeyAuth" not in plain.get("components", {}).get("securitySchemes", {})
