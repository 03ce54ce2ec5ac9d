"""The chat page's routes (server/page_routes.py): GET / with text/html in Accept is the page, any
other request for / is Ollama's "Ollama is running"; the page's assets come with their content
types and a policy that lets them load and fetch from the server's origin only; the page names no
other origin; the page needs no key while the API routes keep theirs; the live panel's gauges exist.
"""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient

from draftwise.server import create_app
from draftwise.server.page_routes import ASSETS
from tests.server.conftest import API_KEY, MODEL, make_engine

BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(make_engine(draft_model=False), MODEL), base_url="http://localhost") as client:
        yield client


@pytest.fixture(scope="module")
def keyed():
    with TestClient(
        create_app(make_engine(draft_model=False), MODEL, api_key=API_KEY), base_url="http://localhost"
    ) as client:
        yield client


class Links(HTMLParser):
    """Every URL an HTML document names (href, src, action, ...) and the tags it holds."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        for name in ("href", "src", "action", "formaction", "poster", "data"):
            if attributes.get(name):
                self.urls.append(attributes[name])


def parse(html: str) -> Links:
    links = Links()
    links.feed(html)
    return links


def test_a_browser_gets_the_page_and_everyone_else_ollamas_text(client):
    page = client.get("/", headers={"Accept": BROWSER_ACCEPT})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "Accept" in page.headers["vary"]
    tags = parse(page.text).tags
    assert any(tag == "textarea" and a.get("name") == "prompt" for tag, a in tags)
    assert any(tag == "button" and a.get("type") == "submit" for tag, a in tags)
    for headers in ({}, {"Accept": "*/*"}, {"Accept": "application/json"}):
        plain = client.get("/", headers=headers)
        assert plain.status_code == 200 and plain.text == "Ollama is running"
    head = client.head("/", headers={"Accept": BROWSER_ACCEPT})
    assert head.status_code == 200 and head.headers["content-type"].startswith("text/plain")


def test_assets_come_with_their_content_types(client):
    for name, kind in ASSETS.items():
        response = client.get(f"/ui/{name}")
        assert response.status_code == 200 and response.headers["content-type"] == kind
        assert response.headers["x-content-type-options"] == "nosniff" and response.content
    missing = client.get("/ui/../errors.py")
    assert missing.status_code == 404
    assert client.get("/ui/secrets.txt").status_code == 404


def test_the_page_loads_and_fetches_from_its_own_origin_only(client):
    page = client.get("/", headers={"Accept": BROWSER_ACCEPT})
    script = client.get("/ui/app.js").text
    style = client.get("/ui/style.css").text
    policy = dict(part.strip().split(" ", 1) for part in page.headers["content-security-policy"].split(";"))
    assert policy["default-src"] == "'none'" and policy["connect-src"] == "'self'"
    assert policy["script-src"] == "'self'" and policy["style-src"] == "'self'"
    urls = parse(page.text).urls
    assert "/ui/app.js" in urls and "/ui/style.css" in urls
    for url in urls:
        parts = urlsplit(url)
        assert not parts.netloc and parts.scheme in ("", "data"), url
    for text in (page.text, script, style):
        assert "http://" not in text and "https://" not in text and "//cdn" not in text
        assert "@import" not in text and "url(" not in text  # no fonts or images fetched by the style
    assert 'fetch("/v1/chat/completions"' in script and 'fetch("/metrics"' in script


def test_keys_guard_the_api_but_not_the_page(keyed):
    assert keyed.get("/", headers={"Accept": BROWSER_ACCEPT}).status_code == 200
    for name in ASSETS:
        assert keyed.get(f"/ui/{name}").status_code == 200
    assert keyed.get("/").status_code == 401  # Ollama's probe keeps the key it needed
    assert keyed.get("/ui/unknown.js").status_code == 401  # nothing but the assets is open
    body = {"model": MODEL, "messages": [{"role": "user", "content": "abc"}], "max_tokens": 2}
    refused = keyed.post("/v1/chat/completions", json=body, headers={"Accept": BROWSER_ACCEPT})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert keyed.get("/v1/models", headers={"Accept": BROWSER_ACCEPT}).status_code == 401
    assert keyed.get("/metrics", headers={"Accept": BROWSER_ACCEPT}).status_code == 401
    auth = {"Authorization": f"Bearer {API_KEY}"}
    assert keyed.post("/v1/chat/completions", json=body, headers=auth).status_code == 200
    assert keyed.get("/metrics", headers=auth).status_code == 200


def test_metrics_have_what_the_live_panel_shows(client):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "abc abc"}], "max_tokens": 5}
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    text = client.get("/metrics").text
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    for name in (
        "draftwise_requests_running",
        "draftwise_slots",
        "draftwise_queue_length",
        "draftwise_tokens_per_second",
    ):
        assert name in samples
    assert float(samples["draftwise_last_batch_rows"]) >= 1  # the answer's last forward had a row at least


def test_the_page_ships_in_the_package():
    """pyproject.toml's package-data names every file of server/web/ (a wheel holds only those)."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")
    root = Path(__file__).parents[2]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["draftwise"]
    package = root / "src" / "draftwise"
    shipped = {path for pattern in patterns for path in package.glob(pattern)}
    web = set((package / "server" / "web").iterdir())
    assert {path.name for path in web} >= {"index.html", *ASSETS} and web <= shipped
