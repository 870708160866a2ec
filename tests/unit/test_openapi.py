"""The shared OpenAPI builder (contract/openapi.py) on small FastAPI apps: request bodies from the
validating model, responses and content types, no 422, the bearer scheme, the error envelopes
matching what the servers send, and the ``Allow`` value of a 405."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from inferctl.contract.errors import APIError
from inferctl.contract.openai import CompletionRequest, CompletionResponse
from inferctl.contract.openapi import (BEARER_SCHEME, PROMETHEUS_TEXT, ControllerErrorEnvelope, OpenAIErrorEnvelope,
                                       Param, allow_header, install_openapi, route_doc)


def _app() -> FastAPI:
    app = FastAPI(title="t", version="1")

    @app.post("/gen", **route_doc(request=CompletionRequest, response=CompletionResponse, errors=(404, 503),
                                  stream=True))
    async def gen(request: Request) -> Response:
        return JSONResponse({})

    @app.get("/metrics", **route_doc(metrics=True))
    async def metrics() -> Response:
        return Response("")

    @app.post("/admin", **route_doc(bearer=True, params=[Param("limit", {"type": "integer", "minimum": 1})]))
    async def admin() -> Response:
        return JSONResponse({})

    @app.get("/admin")
    async def admin_get(x: int = 0) -> Response:   # a FastAPI-validated parameter: FastAPI would add a 422
        return JSONResponse({})

    install_openapi(app)
    return app


def without_nulls(schema):
    """``schema`` without None-valued keys (FastAPI writes its documents with ``exclude_none``:
    ``"default": null`` is left out, which means the same)."""
    if isinstance(schema, dict):
        return {k: without_nulls(v) for k, v in schema.items() if v is not None}
    if isinstance(schema, list):
        return [without_nulls(v) for v in schema]
    return schema


def test_request_body_is_the_validating_models_schema_with_its_nested_models_as_components():
    spec = _app().openapi()
    body = spec["paths"]["/gen"]["post"]["requestBody"]
    assert body["required"] is True
    assert body["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/CompletionRequest"}
    expected = without_nulls(CompletionRequest.model_json_schema(ref_template="#/components/schemas/{model}"))
    defs = expected.pop("$defs")
    assert spec["components"]["schemas"]["CompletionRequest"] == expected
    assert spec["components"]["schemas"]["StreamOptions"] == defs["StreamOptions"]
    prompt = spec["components"]["schemas"]["CompletionRequest"]["properties"]["prompt"]
    assert {"type": "string", "minLength": 1} in prompt["anyOf"]   # the hand-validated field has its schema


def test_responses_content_types_and_error_statuses_are_documented_without_422():
    spec = _app().openapi()
    responses = spec["paths"]["/gen"]["post"]["responses"]
    assert sorted(responses) == ["200", "400", "404", "413", "415", "421", "503"]
    ok = responses["200"]["content"]
    assert ok["application/json"]["schema"] == {"$ref": "#/components/schemas/CompletionResponse"}
    assert ok["text/event-stream"]["schema"]["required"] == ["data"]
    assert responses["400"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/OpenAIErrorEnvelope"}
    assert "Retry-After" in responses["503"]["headers"]
    assert list(spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == [PROMETHEUS_TEXT]
    text = str(spec)
    assert "'422'" not in text and "HTTPValidationError" not in text   # also gone from the FastAPI-built GET
    assert "never FastAPI's default 422" in spec["info"]["description"]


def test_admin_routes_declare_the_bearer_scheme_and_401():
    spec = _app().openapi()
    op = spec["paths"]["/admin"]["post"]
    assert op["security"] == [{BEARER_SCHEME: []}]
    assert "WWW-Authenticate" in op["responses"]["401"]["headers"]
    assert spec["components"]["securitySchemes"][BEARER_SCHEME] == {
        "type": "http", "scheme": "bearer", "description": "The admin token (`Authorization: Bearer <token>`)."}
    assert op["parameters"][0]["name"] == "limit" and op["parameters"][0]["in"] == "query"
    assert "security" not in spec["paths"]["/gen"]["post"]


def test_the_openai_envelope_is_what_api_error_sends():
    body = APIError(503, "draining", param=None, code="engine_draining", err_type="service_unavailable_error").body()
    assert OpenAIErrorEnvelope.model_validate(body).error.code == "engine_draining"
    with pytest.raises(ValueError):
        OpenAIErrorEnvelope.model_validate({"error": {"message": "m", "code": "c", "field": None}})


def test_the_controller_envelope_is_what_the_controller_sends(tmp_path):
    from tests.controller_helpers import api_setup
    http, *_ = api_setup(tmp_path, "tok-openapi-unit-0123456789")
    r = http.post("/actions/drain", json={"engine": "nope"},
                  headers={"Authorization": "Bearer tok-openapi-unit-0123456789"})
    assert r.status_code == 404
    assert ControllerErrorEnvelope.model_validate(r.json()).error.field == "engine"


def test_allow_header_lists_the_methods_of_every_route_of_a_path():
    app = _app()
    assert allow_header(app, "/admin") == "GET, POST"
    assert allow_header(app, "/gen") == "POST"
    assert allow_header(app, "/nowhere") == ""
