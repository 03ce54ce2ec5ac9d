"""The chat page in a real browser: headless chromium through selenium and chromedriver (Debian's
`chromium` and `chromium-driver`; scripts/test.sh installs them where it can), against a live
server whose toy target answers a fixed text and whose engine drafts from the request's prediction.

The test asks the API for the answer first, pastes it into the page's prediction box, sends a
prompt and waits for the streamed answer: the text is the API's, its token spans say the
prediction wrote some of it, the stats are in data-stats, and every request the browser made went
to the server's origin. A screenshot is kept in test-artifacts/ at the repository root (or in
$DRAFTWISE_TEST_ARTIFACTS); docs/img/chat-page.png is one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest

from draftwise.backends.toy import DEFAULT_ALPHABET, CharTokenizer, ToyBackend
from draftwise.drafters.prediction import PredictionDrafter
from draftwise.engine import Engine
from draftwise.types import SpeculationConfig
from tests.server.conftest import API_KEY, MODEL, LiveServer

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs chromium and chromedriver on PATH (Debian: apt-get install chromium chromium-driver)",
)

ARTIFACTS = Path(os.environ.get("DRAFTWISE_TEST_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts"))
ANSWER = (
    "Tea reached Europe in the early 1600s, first as a costly medicine sold by apothecaries. "
    "Within a century it was the everyday drink of kitchens from London to Lisbon.\n"
)
PROMPT = "When did tea come to Europe?"
MAX_TOKENS = 200


def scripted_target() -> ToyBackend:
    """A toy target that answers ANSWER to any prompt (one character a token), then EOS; EOS too
    wherever the text after the last "a:" of the toy chat format is no start of ANSWER."""
    tokenizer = CharTokenizer(len(DEFAULT_ALPHABET) + 1)  # EOS and the whole alphabet

    def logits(context) -> np.ndarray:
        text = tokenizer.decode(context)
        start = text.rfind("\na:")
        written = text[start + 3 :] if start >= 0 else None
        row = np.zeros(tokenizer.vocab_size)
        if written is not None and ANSWER.startswith(written) and len(written) < len(ANSWER):
            row[tokenizer.encode(ANSWER[len(written)])[0]] = 12.0
        else:
            row[0] = 12.0  # EOS
        return row

    return ToyBackend(logits_fn=logits, vocab_size=tokenizer.vocab_size, tokenizer=tokenizer)


def scripted_engine() -> Engine:
    return Engine(
        scripted_target(), [PredictionDrafter()], speculation=SpeculationConfig(policy="fixed", max_draft_tokens=6)
    )


@pytest.fixture
def live():
    with LiveServer(scripted_engine()) as server:
        yield server


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",  # root in a container has no user namespace for the sandbox
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,860",
        "--no-first-run",
        "--disable-background-networking",  # chromium's own requests (updates, safe browsing): not the page's
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def requested_urls(driver) -> list[str]:
    """Every URL the page asked for: the network requests in chromium's performance log and the
    page's own resource timing entries."""
    urls = []
    for entry in driver.get_log("performance"):
        event = json.loads(entry["message"])["message"]
        if event["method"] == "Network.requestWillBeSent":
            urls.append(event["params"]["request"]["url"])
    urls += driver.execute_script("return performance.getEntriesByType('resource').map((e) => e.name)")
    return urls


def test_the_page_shows_which_drafter_wrote_each_token(live, browser):
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "temperature": 0}
    plain = httpx.post(f"{live.url}/v1/chat/completions", json={**body, "max_tokens": MAX_TOKENS}, timeout=30)
    expected = plain.json()["choices"][0]["message"]["content"]
    assert expected == ANSWER

    browser.get_log("performance")  # read and drop what earlier pages asked for and said
    browser.get_log("browser")
    browser.get(f"{live.url}/")
    wait = WebDriverWait(browser, 20)
    wait.until(lambda d: d.find_element(By.ID, "model").text == MODEL)
    prediction = browser.find_element(By.ID, "prediction")
    browser.execute_script("arguments[0].value = arguments[1]", prediction, expected)  # a paste
    max_tokens = browser.find_element(By.ID, "max_tokens")
    max_tokens.clear()
    max_tokens.send_keys(str(MAX_TOKENS))
    browser.find_element(By.CSS_SELECTOR, "textarea[name=prompt]").send_keys(PROMPT)
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()

    answer = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "[data-role=assistant][data-stats]"))
    text = browser.execute_script("return arguments[0].querySelector('.text').textContent", answer)
    assert text == expected
    spans = answer.find_elements(By.CSS_SELECTOR, ".token[data-source]")
    sources = [span.get_attribute("data-source") for span in spans]
    assert "".join(browser.execute_script("return arguments[0].map((s) => s.textContent)", spans)) == expected
    assert "prediction" in sources and set(sources) <= {"prediction", "target"}
    drafted = spans[sources.index("prediction")].get_attribute("title")
    assert drafted.startswith("prediction · step ") and "drafted" in drafted and "accepted" in drafted
    stats = json.loads(answer.get_attribute("data-stats"))
    assert stats["tokens_by_source"]["prediction"] == sources.count("prediction")
    assert stats["acceptance_rate"] > 0 and stats["tokens_per_step"] > 1 and stats["tokens_per_second"] > 0
    assert "tokens/s" in answer.find_element(By.CLASS_NAME, "stats").text

    # the same again with speculation off and logprobs on: every token the target's, its probability on hover
    browser.find_element(By.ID, "speculation").click()
    browser.find_element(By.ID, "logprobs").click()
    browser.find_element(By.CSS_SELECTOR, "textarea[name=prompt]").send_keys("Once more, please.")
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    again = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "[data-role=assistant][data-stats]")[1:])[0]
    plain_spans = again.find_elements(By.CSS_SELECTOR, ".token")
    assert {span.get_attribute("data-source") for span in plain_spans} == {"target"}
    assert " · p = 0.99" in plain_spans[0].get_attribute("title")  # the scripted target's margin: e^12 : 98 others
    assert json.loads(again.get_attribute("data-stats"))["tokens_by_source"] == {"target": len(ANSWER)}

    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#live [data-metric=slots]").text != "–")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "chat-page.png"))
    urls = requested_urls(browser)
    assert f"{live.url}/v1/chat/completions" in urls and f"{live.url}/ui/app.js" in urls
    strays = [url for url in urls if not (url.startswith(f"{live.url}/") or url.startswith("data:"))]
    assert strays == []
    # no script error, no request the page's Content-Security-Policy refused
    assert [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"] == []


def test_the_key_typed_into_the_page_is_its_auth(browser):
    with LiveServer(scripted_engine(), api_key=API_KEY) as keyed:
        browser.get(f"{keyed.url}/")  # the page itself needs no key
        wait = WebDriverWait(browser, 20)
        wait.until(lambda d: d.find_element(By.ID, "model").text == "needs an API key")
        wait.until(lambda d: "needs the operator key" in d.find_element(By.ID, "live-note").text)
        key = browser.find_element(By.ID, "api-key")
        key.send_keys(API_KEY, Keys.TAB)  # a change event: kept, then used
        wait.until(lambda d: d.find_element(By.ID, "model").text == MODEL)
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#live [data-metric=slots]").text == "0 / 1")
        assert browser.find_element(By.ID, "live-note").text == ""
        assert browser.execute_script("return localStorage.getItem('draftwise.apiKey')") == API_KEY
        browser.find_element(By.CSS_SELECTOR, "textarea[name=prompt]").send_keys(PROMPT, Keys.ENTER)
        answer = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "[data-role=assistant][data-stats]"))
        assert browser.execute_script("return arguments[0].querySelector('.text').textContent", answer) == ANSWER
        browser.refresh()  # the key outlives the page
        wait.until(lambda d: d.find_element(By.ID, "model").text == MODEL)


ATTACK_PAGE = """<!doctype html><title>elsewhere</title><script>
const target = new URLSearchParams(location.search).get("target");
const body = JSON.stringify({model: "MODEL", prompt: "Hi", stream: false, options: {num_predict: 2}});
// a "simple" request (no preflight): the browser sends it whatever the answer
fetch(target + "/api/generate", {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body})
  .catch(() => null)  // an opaque answer either way: the page cannot tell
  .then(() => fetch(target + "/api/generate", {method: "POST", headers: {"Content-Type": "application/json"}, body}))
  .then((r) => r.json()).then((j) => { document.title = "read:" + j.response; })
  .catch((e) => { document.title = "blocked:" + e.name; });
</script>""".replace("MODEL", MODEL)


@pytest.fixture
def elsewhere():
    """Another origin (another port of 127.0.0.1) serving ATTACK_PAGE."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Page(BaseHTTPRequestHandler):
        def do_GET(self):
            data = ATTACK_PAGE.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_page_of_another_origin_cannot_drive_the_server(browser, elsewhere):
    """In a real browser: another site's page neither starts a generation (its no-cors text/plain
    POST gets 403) nor reads an answer; the same page, once its origin is allowed, reads one."""
    from draftwise.server import create_app
    from draftwise.server.access import Access

    def generations(live) -> int:
        counter = live.app.state.server.metrics.requests
        return sum(int(s.value) for m in counter.collect() for s in m.samples if s.name.endswith("_total"))

    wait = WebDriverWait(browser, 20)
    with LiveServer(scripted_engine()) as live:
        browser.get(f"{elsewhere}/?target={live.url}")
        wait.until(lambda d: d.title.startswith(("read:", "blocked:")))
        assert browser.title == "blocked:TypeError"  # the CORS fetch failed: 403 without CORS headers
        assert generations(live) == 0  # and the no-cors POST ran nothing
    engine = scripted_engine()
    allowed = create_app(engine, MODEL, access=Access(allowed_origins=(elsewhere,)))
    with LiveServer(engine, app=allowed) as live:
        browser.get(f"{elsewhere}/?target={live.url}")
        wait.until(lambda d: d.title.startswith(("read:", "blocked:")))
        assert browser.title.startswith("read:")  # preflight answered, the answer readable
        assert generations(live) == 1  # the text/plain POST is still refused (415): JSON only


def test_the_model_picker_chooses_the_model_that_answers(browser):
    """serve --models: the page lists the server's models; the one picked answers (loaded then)."""
    from draftwise.server.app import create_pool_app
    from draftwise.server.pool import ModelSource

    sources = [ModelSource("first", scripted_engine), ModelSource("second", scripted_engine)]
    with LiveServer(None, app=create_pool_app(sources)) as live:
        browser.get(f"{live.url}/")
        wait = WebDriverWait(browser, 20)
        wait.until(lambda d: d.find_element(By.ID, "model").text == "first")
        picker = browser.find_element(By.ID, "model-picker")
        assert picker.is_displayed()
        assert [o.text for o in picker.find_elements(By.TAG_NAME, "option")] == ["first", "second"]
        picker.find_element(By.CSS_SELECTOR, "option[value=second]").click()
        wait.until(lambda d: d.find_element(By.ID, "model").text == "second")
        browser.find_element(By.CSS_SELECTOR, "textarea[name=prompt]").send_keys(PROMPT, Keys.ENTER)
        answer = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "[data-role=assistant][data-stats]"))
        assert browser.execute_script("return arguments[0].querySelector('.text').textContent", answer) == ANSWER
        pool = live.app.state.pool
        assert [m.name for m in pool.loaded()] == ["second"]  # the first was never asked for
        # the panel reads the picked model's series
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#live [data-metric=slots]").text == "0 / 1")
