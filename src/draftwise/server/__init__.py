"""OpenAI-compatible HTTP server over an Engine: `create_app(engine, model_name, api_key)`.

protocol.py holds the wire schemas, serving.py the queue and worker that feed the engine,
metrics.py the Prometheus metrics, errors.py the error JSON and auth, app.py the routes.
"""

__all__ = ["create_app"]


def __getattr__(name: str):
    # NOTE: app.py (FastAPI, about 0.5 s to import) loads on first use of create_app, so that
    # importing serving.py's constants (the CLI's help) does not load it.
    if name == "create_app":
        from draftwise.server.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
