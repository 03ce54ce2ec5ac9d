"""OpenAI-compatible HTTP server over an Engine: `create_app(engine, model_name, api_key)`.

app.py builds the app; state.py holds what its routes share; openai_routes.py, infill.py and
tokenizer_routes.py are the routes; translate.py turns each protocol's request, once, into the
engine's request and a reply description (prepared.py) and answers.py the engine's events into
each protocol's answer, which streams.py carries to the client; serving.py is the queue and worker that feed the engine,
protocol.py and llama_protocol.py the wire schemas, errors.py the error JSON and auth,
metrics.py the Prometheus metrics.
"""

__all__ = ["create_app"]


def __getattr__(name: str):
    # NOTE: app.py (FastAPI, about 0.5 s to import) loads on first use of create_app, so that
    # importing serving.py's constants (the CLI's help) does not load it.
    if name == "create_app":
        from draftwise.server.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
