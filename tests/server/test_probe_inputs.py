"""What an outside probe of every route found (issue 60), each defect as a request: numbers JSON
cannot carry (`1e400`, `NaN`, `Infinity`) and integers beyond 64 bits, lone surrogates in fields
an answer reflects, JSON-schema bounds the grammar cannot enforce exactly, fields the real APIs
refuse, errors naming the wrong field, and the chat page's stale server panel.

Each asserts the status, the protocol's own error shape (Ollama `{"error": "field: ..."}`,
Anthropic `{"type": "error", "error": {...}}`, OpenAI `{"error": {message, type, param, code}}`),
the field it names, and that the server then answers a normal request. Bodies are sent as raw
JSON text, so that `1e400` and an escaped `"\\ud800"` reach the server as a client writes them.
"""

from __future__ import annotations

import json
import math
import random

import httpx
import jsonschema
import pytest

from draftwise.constraints import EXACT_DIGITS, EXACT_INTEGER, JSON_OVERRIDES, lltokenizer_from_pieces, schema_fault
from draftwise.server.llama_protocol import InfillRequest
from tests.server.conftest import MODEL, LiveServer
from tests.server.test_infill import fim_engine, fim_server  # noqa: F401 (fixtures)
from tests.server.test_server import metric
from tests.server.test_tools import tool_server  # noqa: F401 (fixture)

NON_FINITE = ("1e400", "-1e400", "NaN", "Infinity", "-Infinity")
BEYOND_64_BITS = (str(2**63), str(-(2**63) - 1), "1e30")
SURROGATE = "\ud800x"
SLOT = "__value__"  # where a raw JSON value goes in a body


def post(url: str, path: str, body: dict, raw: str | None = None, **kwargs) -> httpx.Response:
    """POST body as JSON text (a lone surrogate escaped as \\ud800), with raw JSON text in
    place of the string SLOT where the body holds it."""
    text = json.dumps(body)
    if raw is not None:
        text = text.replace(json.dumps(SLOT), raw)
    return httpx.post(
        f"{url}{path}", content=text.encode(), headers={"content-type": "application/json"}, timeout=60, **kwargs
    )


def ollama_error(r: httpx.Response, field: str) -> str:
    assert r.status_code == 400, r.text
    body = r.json()
    assert list(body) == ["error"] and isinstance(body["error"], str), body
    assert body["error"].startswith(f"{field}: "), body
    return body["error"]


def openai_error(r: httpx.Response, field: str) -> str:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error", error
    assert error["param"] == field, error
    return error["message"]


def anthropic_error(r: httpx.Response, field: str) -> str:
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    assert body["error"]["message"].startswith(f"{field}: "), body
    return body["error"]["message"]


def answers_normally(url: str) -> None:
    """A greedy request (a sampled one may draw the end token first and answer nothing) answers
    with the tokens it always does."""
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "temperature": 0}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text


HI = [{"role": "user", "content": "hi"}]
GENERATE = {"model": MODEL, "prompt": "Hi", "stream": False}
OLLAMA_CHAT = {"model": MODEL, "messages": HI, "stream": False}
INTEGER_OPTIONS = ("num_predict", "num_ctx", "top_k", "seed", "repeat_last_n", "num_keep", "num_batch", "mirostat")


# ---------------------------------------------------------------------- item 2: Ollama's integer options
@pytest.mark.parametrize("value", NON_FINITE + BEYOND_64_BITS)
@pytest.mark.parametrize("option", INTEGER_OPTIONS)
def test_an_ollama_integer_option_not_finite_or_beyond_64_bits_is_a_400(server, option, value):
    r = post(server.url, "/api/generate", {**GENERATE, "options": {option: SLOT}}, value)
    message = ollama_error(r, f"options.{option}")
    assert ("finite" in message) if value in NON_FINITE else ("64 bits" in message)
    answers_normally(server.url)


@pytest.mark.parametrize("value", ["1e400", "NaN", str(2**64)])
@pytest.mark.parametrize("option", ["num_predict", "num_ctx", "top_k", "seed", "repeat_last_n"])
def test_the_same_on_ollama_chat(server, option, value):
    ollama_error(post(server.url, "/api/chat", {**OLLAMA_CHAT, "options": {option: SLOT}}, value), f"options.{option}")
    answers_normally(server.url)


@pytest.mark.parametrize(
    "option, value",
    [
        ("temperature", "NaN"),
        ("temperature", "-1"),
        ("temperature", "1e400"),
        ("top_p", "5"),
        ("top_p", "NaN"),
        ("top_p", "-0.1"),
        ("min_p", "2"),
        ("repeat_penalty", "NaN"),
        ("presence_penalty", "Infinity"),
        ("frequency_penalty", "-Infinity"),
    ],
)
@pytest.mark.parametrize("path, body", [("/api/generate", GENERATE), ("/api/chat", OLLAMA_CHAT)])
def test_an_ollama_float_option_out_of_range_is_a_400_not_a_silent_sampler(server, path, body, option, value):
    ollama_error(post(server.url, path, {**body, "options": {option: SLOT}}, value), f"options.{option}")
    answers_normally(server.url)


def test_ollama_options_within_range_still_answer(server):
    options = {"temperature": 0, "top_p": 1, "min_p": 0, "num_predict": 3, "seed": 2**63 - 1, "top_k": -1}
    r = post(server.url, "/api/generate", {**GENERATE, "options": options})
    assert r.status_code == 200 and r.json()["eval_count"] == 3, r.text


# ---------------------------------------------------------------------- item 3: /infill's numbers
INFILL = {"input_prefix": "def f(", "input_suffix": "\n", "n_predict": 4}
INFILL_FLOATS = sorted(name for name, field in InfillRequest.model_fields.items() if field.annotation is float)


def test_every_infill_float_field_is_covered():
    assert {"temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty"} <= set(INFILL_FLOATS)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("value", ["1e400", "-1e400", "NaN", "Infinity"])
@pytest.mark.parametrize("field", INFILL_FLOATS)
def test_an_infill_float_that_is_not_finite_is_a_400_before_anything_runs(fim_server, field, value, stream):  # noqa: F811
    generated = metric(fim_server.url, "draftwise_generated_tokens_total")
    r = post(fim_server.url, "/infill", {**INFILL, "stream": stream, field: SLOT}, value)
    assert "finite" in openai_error(r, field)
    assert metric(fim_server.url, "draftwise_generated_tokens_total") == generated  # nothing ran
    answers_normally(fim_server.url)


@pytest.mark.parametrize(
    "field, raw, param",
    [
        ("logit_bias", "[[15, 1e400]]", "logit_bias.0.1"),
        ("logit_bias", '{"15": NaN}', "logit_bias.15"),
        ("n_predict", str(2**63), "n_predict"),
        ("seed", str(-(2**63) - 1), "seed"),
        ("top_k", str(2**64), "top_k"),
    ],
)
def test_infill_logit_bias_and_integers_are_checked_too(fim_server, field, raw, param):  # noqa: F811
    openai_error(post(fim_server.url, "/infill", {**INFILL, field: SLOT}, raw), param)
    answers_normally(fim_server.url)


def test_a_finite_infill_request_still_answers(fim_server):  # noqa: F811
    r = post(fim_server.url, "/infill", {**INFILL, "temperature": 0, "seed": 2**63 - 1})
    assert r.status_code == 200 and math.isfinite(r.json()["generation_settings"]["temperature"]), r.text


# ---------------------------------------------------------------------- item 4: lone surrogates
RESPONSES = {"model": MODEL, "input": "hi", "max_output_tokens": 3}
SURROGATES = [
    ("/api/show", {"model": SURROGATE}, ollama_error, "model"),
    ("/api/show", {"name": SURROGATE}, ollama_error, "name"),
    ("/api/chat", {**OLLAMA_CHAT, "model": SURROGATE}, ollama_error, "model"),
    ("/api/pull", {"model": SURROGATE}, ollama_error, "model"),
    ("/api/generate", {**GENERATE, "options": {"stop": [SURROGATE]}}, ollama_error, "options.stop.0"),
    ("/tokenize", {"content": SURROGATE}, openai_error, "content"),
    ("/tokenize", {"prompt": SURROGATE}, openai_error, "prompt"),
    ("/v1/responses", {**RESPONSES, "metadata": {"k": SURROGATE}}, openai_error, "metadata.k"),
    ("/v1/responses", {**RESPONSES, "metadata": {SURROGATE: "v"}}, openai_error, "metadata"),
    ("/v1/responses", {**RESPONSES, "user": SURROGATE}, openai_error, "user"),
    ("/v1/responses", {**RESPONSES, "instructions": SURROGATE}, openai_error, "instructions"),
    (
        "/v1/responses",
        {**RESPONSES, "input": [{"role": "user", "content": SURROGATE}]},
        openai_error,
        "input.0.content",
    ),
    ("/v1/responses", {**RESPONSES, "previous_response_id": SURROGATE}, openai_error, "previous_response_id"),
    ("/v1/chat/completions", {"model": MODEL, "messages": HI, "user": SURROGATE}, openai_error, "user"),
    ("/v1/messages", {"model": SURROGATE, "max_tokens": 3, "messages": HI}, anthropic_error, "model"),
    (
        "/v1/messages",
        {"model": MODEL, "max_tokens": 3, "messages": HI, "metadata": {"user_id": SURROGATE}},
        anthropic_error,
        "metadata.user_id",
    ),
]


@pytest.mark.parametrize("path, body, shape, field", SURROGATES)
def test_a_lone_surrogate_is_a_400_naming_its_field(server, path, body, shape, field):
    message = shape(post(server.url, path, body), field)
    # pydantic refuses it first in a string field with a length rule ("not a unicode string")
    assert ("lone surrogate" in message and "U+D800" in message) or "unicode string" in message
    answers_normally(server.url)


@pytest.mark.parametrize("field, value", [("user", SURROGATE), ("metadata", {"k": SURROGATE})])
def test_a_streamed_response_refuses_a_surrogate_before_its_stream_starts(server, field, value):
    r = post(server.url, "/v1/responses", {**RESPONSES, "stream": True, field: value})
    openai_error(r, "user" if field == "user" else "metadata.k")
    assert r.headers["content-type"].startswith("application/json")  # no event stream began
    answers_normally(server.url)


def test_the_llama_tokenizer_never_sees_a_surrogate(fim_server):  # noqa: F811
    openai_error(post(fim_server.url, "/tokenize", {"content": SURROGATE}), "content")
    assert post(fim_server.url, "/tokenize", {"content": "x"}).json()["tokens"]
    answers_normally(fim_server.url)


# ---------------------------------------------------------------------- item 5: schemas kept exactly
INEXACT_SCHEMAS = [
    {"type": "integer", "minimum": 10**20, "maximum": 2 * 10**20},  # was answered 2**63 - 1
    {"type": "integer", "minimum": -(2 * 10**20), "maximum": -(10**20)},
    {"type": "object", "properties": {"n": {"type": "number", "maximum": 2**62}}, "required": ["n"]},
    {"type": "object", "properties": {"n": {"type": "number", "maximum": 972121617984.1307}}, "required": ["n"]},
    {"type": "integer", "minimum": -(2**63 - 1), "maximum": -(2**63 - 1)},  # crashed llguidance (the process)
]


def schema_requests(schema: dict) -> list[tuple[str, dict, object, str]]:
    """(path, body, error shape, field) of each way a schema reaches the grammar on the toy server."""
    json_schema = {"name": "n", "schema": schema}
    return [
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": HI, "response_format": {"type": "json_schema", "json_schema": json_schema}},
            openai_error,
            "response_format",
        ),
        (
            "/v1/completions",
            {"model": MODEL, "prompt": "hi", "response_format": {"type": "json_schema", "json_schema": json_schema}},
            openai_error,
            "response_format",
        ),
        (
            "/v1/completions",
            {"model": MODEL, "prompt": "hi", "grammar": f"start: %json {json.dumps(schema)}"},
            openai_error,
            "grammar",
        ),
        ("/api/generate", {**GENERATE, "format": schema}, ollama_error, "format"),
        ("/api/chat", {**OLLAMA_CHAT, "format": schema}, ollama_error, "format"),
        (
            "/v1/messages",
            {
                "model": MODEL,
                "max_tokens": 8,
                "messages": HI,
                "output_config": {"format": {"type": "json_schema", "schema": schema}},
            },
            anthropic_error,
            "output_config.format",
        ),
        (
            "/v1/responses",
            {**RESPONSES, "text": {"format": {"type": "json_schema", "name": "n", "schema": schema}}},
            openai_error,
            "text.format",
        ),
    ]


def tool_requests(schema: dict) -> list[tuple[str, dict, object, str]]:
    """The same schema as a tool's parameters, on the server whose template knows tools."""
    function = {"name": "f", "parameters": {"type": "object", "properties": {"n": schema}}}
    return [
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": HI, "tools": [{"type": "function", "function": function}]},
            openai_error,
            "tools[0].function.parameters",
        ),
        (
            "/api/chat",
            {**OLLAMA_CHAT, "tools": [{"type": "function", "function": function}]},
            ollama_error,
            "tools[0].function.parameters",
        ),
        (
            "/v1/messages",
            {
                "model": MODEL,
                "max_tokens": 8,
                "messages": HI,
                "tools": [{"name": "f", "input_schema": function["parameters"]}],
            },
            anthropic_error,
            "tools.0.input_schema",
        ),
        (
            "/v1/responses",
            {**RESPONSES, "tools": [{"type": "function", **function}]},
            openai_error,
            "tools[0].parameters",
        ),
    ]


@pytest.mark.parametrize("schema", INEXACT_SCHEMAS)
def test_a_schema_bound_the_grammar_cannot_enforce_exactly_is_refused_by_name(server, tool_server, schema):  # noqa: F811
    for live, requests in ((server, schema_requests(schema)), (tool_server, tool_requests(schema))):
        for path, body, shape, field in requests:
            message = shape(post(live.url, path, body), field)
            assert "maximum" in message or "minimum" in message, (path, message)
        answers_normally(live.url)


def test_a_bound_within_reach_is_kept_and_the_answer_follows_the_schema(server):
    schema = {"type": "integer", "minimum": 10**15, "maximum": 2**53}
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 40, "temperature": 0}
    body["response_format"] = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    r = post(server.url, "/v1/completions", body)
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["choices"][0]["text"]), schema)


def _byte_matcher(schema: dict):
    """llguidance's matcher for schema over a vocabulary of the 256 bytes (and EOS)."""
    import llguidance

    tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]
    tokenizer = lltokenizer_from_pieces(tokens, eos_token_id=256, special_token_ids=[256], encode=list, n_vocab=257)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=JSON_OVERRIDES)
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher


def _accepts(schema: dict, text: str) -> bool:
    matcher = _byte_matcher(schema)
    return matcher.consume_tokens(list(text.encode())) and matcher.is_accepting()


def test_the_bounds_schema_fault_lets_through_are_enforced_exactly():
    """The limits constraints.schema_fault draws hold for this llguidance: at +-2**53 and for
    fractions of 15 significant digits the bound is allowed and the next value beyond it is not;
    one past either limit is refused before it reaches llguidance."""
    edge = [
        (kind, key, sign * EXACT_INTEGER)
        for kind in ("integer", "number")
        for key, sign in (("maximum", 1), ("minimum", -1))
    ]
    for kind, key, bound in edge:
        beyond = bound + (1 if key == "maximum" else -1)
        assert schema_fault({"type": kind, key: bound}) is None
        assert _accepts({"type": kind, key: bound}, str(bound)) and not _accepts(
            {"type": kind, key: bound}, str(beyond)
        )
        assert schema_fault({"type": kind, key: beyond}) is not None
    rng = random.Random(0)
    for _ in range(40):
        digits = f"{rng.randrange(10 ** (EXACT_DIGITS - 1), 10**EXACT_DIGITS)}"
        point = rng.randrange(1, EXACT_DIGITS)
        bound = float(f"{digits[:point]}.{digits[point:]}")
        outside = math.nextafter(bound, math.inf)
        assert schema_fault({"type": "number", "maximum": bound}) is None
        assert _accepts({"type": "number", "maximum": bound}, repr(bound))
        assert not _accepts({"type": "number", "maximum": bound}, repr(outside)), bound
    assert schema_fault({"type": "number", "maximum": 972121617984.1307}) is not None  # 16 digits


# ---------------------------------------------------------------------- item 7: what the real APIs refuse
MESSAGES = {"model": MODEL, "max_tokens": 3, "messages": HI}


@pytest.mark.parametrize(
    "body, raw, field",
    [
        ({**MESSAGES, "max_tokens": True}, None, "max_tokens"),
        ({**MESSAGES, "max_tokens": 2**63}, None, "max_tokens"),
        ({**MESSAGES, "temperature": SLOT}, "NaN", "temperature"),
        ({**MESSAGES, "top_p": SLOT}, "1e400", "top_p"),
        ({**MESSAGES, "messages": []}, None, "messages"),
        (
            {**MESSAGES, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
            None,
            "messages.0.content.0.text",
        ),
        ({**MESSAGES, "system": [{"type": "text"}]}, None, "system.0.text"),
    ],
)
def test_messages_refuses_what_anthropic_refuses(server, body, raw, field):
    anthropic_error(post(server.url, "/v1/messages", body, raw), field)
    answers_normally(server.url)


def test_messages_tool_needs_input_schema_and_errors_name_their_field(tool_server):  # noqa: F811
    url = tool_server.url
    anthropic_error(post(url, "/v1/messages", {**MESSAGES, "tools": [{"name": "f"}]}), "tools.0.input_schema")
    bad_format = {"format": {"type": "json_schema", "schema": {"type": "nonsense"}}}
    anthropic_error(post(url, "/v1/messages", {**MESSAGES, "output_config": bad_format}), "output_config.format")
    bad_tool = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "nonsense"}}}},
    }
    assert "format" not in ollama_error(post(url, "/api/chat", {**OLLAMA_CHAT, "tools": [bad_tool]}), "tools")
    answers_normally(url)


# ---------------------------------------------------------------------- item 7: the page's server panel
def test_the_page_server_panel_counts_an_answer_as_it_ends():
    """Timers are stopped in the page, so the panel moves only on its own: it reads no rate on a
    fresh server, and the answer's tokens/s as soon as the answer ends (it read 0.0 until the next
    3-second tick)."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.server.test_page_browser import CHROMEDRIVER, CHROMIUM, PROMPT, scripted_engine

    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("needs chromium and chromedriver on PATH")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    try:
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": "window.setInterval = () => 0;"})
        with LiveServer(scripted_engine()) as live:
            driver.get(f"{live.url}/")
            wait = WebDriverWait(driver, 20)
            tps = lambda d: d.find_element(By.CSS_SELECTOR, "#live [data-metric=tps]").text  # noqa: E731
            wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#live [data-metric=slots]").text == "0 / 1")
            assert tps(driver) == "–"  # nothing generated yet: no rate, not 0.0
            driver.find_element(By.CSS_SELECTOR, "textarea[name=prompt]").send_keys(PROMPT)
            driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
            wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "[data-role=assistant][data-stats]"))
            expected = f"{metric(live.url, 'draftwise_tokens_per_second'):.1f}"
            WebDriverWait(driver, 5).until(lambda d: tps(d) == expected)
            assert float(expected) > 0
    finally:
        driver.quit()
