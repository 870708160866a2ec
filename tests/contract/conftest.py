"""Fixtures shared by the contract tests.

``bundle``: the real stories260K model and tokenizer (``load_llama2c``), loaded once per module;
a module that needs another model defines its own ``bundle``, which overrides this one.
``_precision_restored`` (autouse): a test that uses a ``bundle`` (this one or a module's own) and
switches its model's precision (int8) gets it switched back after the test, so the engines of
later tests in the module see the precision the model had; tests that use no ``bundle`` do
not load one.
``engine``: a stories260K engine (``tests.server_helpers.stories_engine``, defaults) running its
step loop, once per module; a module that needs another configuration defines its own ``engine``.
"""

from __future__ import annotations

import pytest

from inferctl.engine.loader import load_llama2c


@pytest.fixture(scope="module")
def bundle(stories_dir):
    return load_llama2c(stories_dir / "stories260K.bin", stories_dir / "tok512.bin")


@pytest.fixture(scope="module")
def engine(stories_dir):
    from tests.server_helpers import engines_running, stories_engine

    eng = stories_engine(stories_dir)
    with engines_running(eng):
        yield eng


@pytest.fixture(autouse=True)
def _precision_restored(request):
    if "bundle" not in request.fixturenames:
        yield
        return
    model = getattr(request.getfixturevalue("bundle"), "model", None)
    before = getattr(model, "precision", None)
    yield
    if before is not None and model.precision != before:
        model.set_precision(before)
