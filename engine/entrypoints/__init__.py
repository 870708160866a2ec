"""The engine's HTTP entrypoints: the OpenAI-compatible API, the tokenizer, admin and
observability routes, one module per route family; :func:`inferctl.engine.entrypoints.app.create_app`
wires them (see that module for the map)."""
