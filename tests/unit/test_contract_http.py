"""inferctl.contract.http: the one bearer check and the one strict JSON body reader (no server)."""

from __future__ import annotations

import asyncio

import pytest

from inferctl.contract.http import (BodyRejected, Unauthorized, bearer_token, check_bearer, json_depth,
                                    parse_json, read_json_body)


class _Request:
    def __init__(self, body: bytes, headers: dict | None = None, chunk: int = 3) -> None:
        self.headers = {"content-type": "application/json", **(headers or {})}
        self._body, self._chunk = body, chunk

    async def stream(self):
        for i in range(0, len(self._body), self._chunk):
            yield self._body[i:i + self._chunk]


def _rejected(raw: bytes, **kw) -> BodyRejected:
    with pytest.raises(BodyRejected) as info:
        parse_json(raw, **kw)
    return info.value


@pytest.mark.parametrize("header, missing", [(None, True), ("", True), ("Bearer", True), ("Basic tok", True),
                                             ("Bearer wrong", False), ("Bearer tok2", False)])
def test_bearer_refusals_are_401_with_the_challenge(header, missing):
    with pytest.raises(Unauthorized) as info:
        check_bearer(header, "tok")
    assert info.value.status == 401 and info.value.missing is missing
    assert info.value.headers == {"WWW-Authenticate": "Bearer"}


def test_bearer_scheme_is_case_insensitive_and_token_stripped():
    check_bearer("bearer tok ", "tok")
    assert bearer_token("BEARER  tok") == "tok" and bearer_token("Token tok") is None
    with pytest.raises(ValueError, match="expected"):
        check_bearer("Bearer x", "")


@pytest.mark.parametrize("raw, reason", [
    (b"", "empty"), (b"\xff", "not_utf8"), (b'{"a": 1', "invalid_json"), (b'{"a": NaN}', "invalid_json"),
    (b'{"a": -Infinity}', "invalid_json"), (b"[1]", "not_object"), (b'{"a": "\\ud800"}', "invalid_unicode"),
    (b'{"a": ' + b"9" * 5000 + b"}", "invalid_json"),
])
def test_strict_defaults_refuse_with_a_reason(raw, reason):
    err = _rejected(raw)
    assert (err.status, err.reason) == (400, reason)


def test_options_relax_nan_and_objects_and_limit_depth():
    assert parse_json(b'{"a": NaN}', allow_nan=True)["a"] != 0
    assert parse_json(b"[1]", require_object=False) == [1]
    assert parse_json(b'{"a": 1, "a": 2}') == {"a": 2}   # duplicate keys: the last one wins
    err = _rejected(b'{"a": [[["]]]]]"]]]}', max_depth=3)
    assert (err.reason, err.limit) == ("too_deep", 3)
    assert json_depth(b'{"a": [[["]]]]]"]]]}') == 4


def test_surrogate_param_names_the_path():
    err = _rejected(b'{"messages": [{"content": "ok"}, {"content": "\\udfff"}]}')
    assert err.param == "messages[1].content" and err.message.startswith("messages[1].content: ")


def test_size_limit_from_the_header_then_while_streaming():
    with pytest.raises(BodyRejected) as declared:
        asyncio.run(read_json_body(_Request(b"{}", {"content-length": "5000"}), 100))
    assert (declared.value.status, declared.value.size, declared.value.limit) == (413, 5000, 100)
    with pytest.raises(BodyRejected) as streamed:
        asyncio.run(read_json_body(_Request(b'{"a": "' + b"x" * 200 + b'"}'), 100))
    assert (streamed.value.status, streamed.value.size, streamed.value.limit) == (413, None, 100)
    with pytest.raises(BodyRejected) as bad:
        asyncio.run(read_json_body(_Request(b"{}", {"content-length": "ten"}), 100))
    assert (bad.value.status, bad.value.reason) == (400, "bad_length")
    assert asyncio.run(read_json_body(_Request(b'{"a": 1}'), 100)) == {"a": 1}
