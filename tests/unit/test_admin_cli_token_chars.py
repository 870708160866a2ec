"""The admin CLI refuses a token no HTTP header can carry, naming where it came from.

Before: ``inferctl drain --token 'ééé…'`` died with httpx's UnicodeEncodeError traceback, and a
token with a trailing newline ($INFERCTL_ADMIN_TOKEN from a file read as is) with h11's
``LocalProtocolError: Illegal header value``; ``inferctl up --token 'é'*16`` started a controller
whose admin API no client could use. Nothing is sent: the URL is never reached.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from inferctl.cli import app
from inferctl.contract.http import check_admin_token

URL = "http://127.0.0.1:9"   # discard port: never reached, the token is refused first


@pytest.mark.parametrize("token", ["é" * 20, "good-token-0123456789\n", "good token 0123456789",
                                   "tab\ttoken-0123456789"])
def test_a_token_a_header_cannot_carry_is_a_clear_error(token, monkeypatch, tmp_path):
    runner = CliRunner()
    monkeypatch.delenv("INFERCTL_ADMIN_TOKEN", raising=False)
    r = runner.invoke(app, ["drain", "--url", URL, "--engine", "main", "--token", token])
    assert r.exit_code == 1, (r.output, r.exception)
    assert "error: --token: the admin token holds whitespace, control or non-ASCII characters" in r.output
    monkeypatch.setenv("INFERCTL_ADMIN_TOKEN", token)
    r = runner.invoke(app, ["degrade", "--url", URL, "--engine", "main"])
    assert r.exit_code == 1 and "error: $INFERCTL_ADMIN_TOKEN: the admin token holds" in r.output


def test_a_token_file_with_non_ascii_is_a_clear_error(monkeypatch, tmp_path):
    f = tmp_path / "token"
    f.write_text("ü" * 20 + "\n", encoding="utf-8")
    monkeypatch.delenv("INFERCTL_ADMIN_TOKEN", raising=False)
    r = CliRunner().invoke(app, ["reset-gpu", "0", "--yes", "--url", URL, "--token-file", str(f)])
    assert r.exit_code == 1 and "error: --token-file: the admin token holds" in r.output


def test_a_short_ascii_token_still_goes_to_the_server():
    """The client checks only what a header can carry: length stays the server's 401."""
    r = CliRunner().invoke(app, ["drain", "--url", URL, "--engine", "main", "--token", "x"])
    assert r.exit_code == 1 and "admin token holds" not in r.output and "not reachable" in r.output


def test_the_server_side_token_rule_refuses_non_ascii():
    with pytest.raises(ValueError, match="non-ASCII"):
        check_admin_token("é" * 16, "--token")
    assert check_admin_token("A-z_0.9~!" * 2, "--token") == "A-z_0.9~!" * 2
