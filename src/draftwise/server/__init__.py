"""OpenAI-compatible HTTP server over an Engine: `create_app(engine, model_name, api_key)`.

protocol.py holds the wire schemas, serving.py the queue and worker that feed the engine,
metrics.py the Prometheus metrics, errors.py the error JSON and auth, app.py the routes.
"""

from draftwise.server.app import create_app

__all__ = ["create_app"]
