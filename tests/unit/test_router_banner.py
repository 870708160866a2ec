"""``inferctl router``'s start line: ``routing URL -> NAME=URL, ...`` on stderr. Not ``router: URL``:
under ``inferctl up --replicas N`` it follows up's own ``router: URL`` line, and two ``router:`` lines
read as the URL printed twice. The server itself is not started (uvicorn's ``Server.run`` replaced)."""

from __future__ import annotations

import uvicorn
from typer.testing import CliRunner

from inferctl.cli import app


def test_the_router_says_where_it_routes_under_its_own_label(monkeypatch):
    served = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, *a, **k: (served.append(self.config.port),
                                                                       setattr(self, "started", True)))
    res = CliRunner().invoke(app, ["router", "--port", "18999", "--engine", "main-0=http://127.0.0.1:9",
                                   "--engine", "main-1=http://127.0.0.1:10"])
    assert res.exit_code == 0, res.output
    assert served == [18999]
    lines = res.stderr.splitlines()
    assert "routing http://127.0.0.1:18999 -> main-0=http://127.0.0.1:9, main-1=http://127.0.0.1:10" in lines
    assert not any(line.startswith("router:") for line in res.output.splitlines())
