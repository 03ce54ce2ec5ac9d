// The draftwise chat page: streams /v1/chat/completions (server-sent events read with fetch and a
// ReadableStream), asking for the `speculation.sources` extension, so every chunk says which
// drafter (or the target itself) wrote each piece of its text; shows each piece as a
// <span data-source> and the answer's usage.speculative under it; polls /metrics for the panel.
// Every request goes to this page's own origin, with the API key typed into the page.
"use strict";

const KEY_STORE = "draftwise.apiKey";
const POLL_MS = 3000;
const $ = (selector) => document.querySelector(selector);

const chat = { model: null, history: [], abort: null };

function headers(json) {
  const out = {};
  const key = $("#api-key").value.trim();
  if (key) out.Authorization = `Bearer ${key}`;
  if (json) out["Content-Type"] = "application/json";
  return out;
}

// An error answer in OpenAI's shape ({"error": {"message"}}), or whatever text it has.
async function errorText(response) {
  const text = await response.text();
  try {
    const message = JSON.parse(text).error.message;
    if (message) return `${response.status}: ${message}`;
  } catch (_) {
    // not OpenAI's error JSON: the text as it came
  }
  return `${response.status}: ${text.slice(0, 300)}`;
}

async function loadModel() {
  const response = await fetch("/v1/models", { headers: headers(false) });
  if (!response.ok) {
    chat.model = null;
    $("#model").textContent = response.status === 401 ? "needs an API key" : await errorText(response);
    return;
  }
  const ids = (await response.json()).data.map((card) => card.id);
  if (!ids.includes(chat.model)) chat.model = ids[0];
  $("#model").textContent = chat.model;
  // a server of several models (serve --models): pick one; it loads when first asked for
  const picker = $("#model-picker");
  picker.hidden = ids.length < 2;
  picker.replaceChildren(...ids.map((id) => new Option(id, id, false, id === chat.model)));
}

function pickModel() {
  chat.model = $("#model-picker").value;
  $("#model").textContent = chat.model;
  poll();
}

function numberField(body, id, parse) {
  const value = parse($(`#${id}`).value);
  if (Number.isFinite(value)) body[id] = value;
}

function requestBody(prompt) {
  const messages = [];
  const system = $("#system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...chat.history, { role: "user", content: prompt });
  const body = {
    model: chat.model,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    speculation: { sources: true },
  };
  numberField(body, "temperature", parseFloat);
  numberField(body, "top_p", parseFloat);
  numberField(body, "max_tokens", (text) => parseInt(text, 10));
  if (!$("#speculation").checked) body.speculation.enabled = false;
  if ($("#logprobs").checked) body.logprobs = true;
  const prediction = $("#prediction").value;
  if (prediction) body.prediction = { type: "content", content: prediction };
  return body;
}

// The JSON payloads of a server-sent event stream, up to its "[DONE]".
async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let match;
    while ((match = /\r?\n\r?\n/.exec(buffer))) {
      const block = buffer.slice(0, match.index);
      buffer = buffer.slice(match.index + match[0].length);
      const data = block
        .split(/\r?\n/)
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      if (data === "[DONE]") return;
      if (data) yield JSON.parse(data);
    }
  }
}

function message(role, text) {
  const article = document.createElement("article");
  article.className = "message";
  article.dataset.role = role;
  const body = document.createElement("div");
  body.className = "text";
  body.textContent = text;
  article.append(body);
  $("#messages").append(article);
  article.scrollIntoView({ block: "end" });
  return article;
}

function tokenSpan(piece) {
  const span = document.createElement("span");
  span.className = "token";
  span.dataset.source = piece.source;
  span.dataset.step = piece.step;
  span.textContent = piece.text;
  let title = `${piece.source} · step ${piece.step}: ${piece.drafted} drafted, ${piece.accepted} accepted`;
  if (piece.logprob !== undefined) title += ` · p = ${Math.exp(piece.logprob).toFixed(4)}`;
  span.title = title;
  return span;
}

const fixed = (x, digits) => (Number.isFinite(x) ? x.toFixed(digits) : "–");

function showStats(answer, usage) {
  const s = usage.speculative || {};
  const stats = {
    tokens_per_second: s.tokens_per_second,
    drafted: s.num_drafted,
    acceptance_rate: s.acceptance_rate,
    tokens_per_step: s.tokens_per_step,
    estimated_speedup: s.estimated_speedup,
    tokens_by_source: s.tokens_by_source || {},
    completion_tokens: usage.completion_tokens,
  };
  answer.dataset.stats = JSON.stringify(stats);
  // 0: the server has no calibrated cost curve to estimate plain decoding's time from
  const speedup = stats.estimated_speedup
    ? `${fixed(stats.estimated_speedup, 2)}× estimated speedup`
    : "speedup not estimated (no calibrated costs)";
  const sources = Object.entries(stats.tokens_by_source)
    .map(([source, n]) => `${source} ${n}`)
    .join(", ");
  const line = document.createElement("p");
  line.className = "stats";
  const acceptance = stats.drafted ? `acceptance ${fixed(100 * stats.acceptance_rate, 0)}%` : "nothing drafted";
  line.textContent =
    `${fixed(stats.tokens_per_second, 1)} tokens/s · ${acceptance} · ` +
    `${fixed(stats.tokens_per_step, 2)} tokens per forward · ${speedup} · ${sources}`;
  answer.append(line);
}

function showError(answer, text) {
  const line = document.createElement("p");
  line.className = "error";
  line.textContent = text;
  answer.append(line);
}

// Stream one answer into `answer`; returns its text (empty when it failed).
async function stream(body, answer, signal) {
  const response = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: headers(true),
    body: JSON.stringify(body),
    signal,
  });
  if (!response.ok) {
    showError(answer, await errorText(response));
    return "";
  }
  const text = answer.querySelector(".text");
  let written = "";
  for await (const chunk of events(response)) {
    if (chunk.error) {
      showError(answer, chunk.error.message || JSON.stringify(chunk.error));
      return "";
    }
    for (const choice of chunk.choices || []) {
      const content = (choice.delta && choice.delta.content) || "";
      if (choice.token_sources) text.append(...choice.token_sources.map(tokenSpan));
      else if (content) text.append(content);
      written += content;
    }
    if (chunk.usage) showStats(answer, chunk.usage);
    answer.scrollIntoView({ block: "end" });
  }
  return written;
}

async function send(event) {
  event.preventDefault();
  const form = event.target;
  const prompt = form.prompt.value;
  if (!prompt.trim() || chat.abort) return;
  if (!chat.model) await loadModel();
  message("user", prompt);
  const answer = message("assistant", "");
  form.prompt.value = "";
  chat.abort = new AbortController();
  form.querySelector("button[type=submit]").disabled = true;
  $("#stop").disabled = false;
  try {
    const text = await stream(requestBody(prompt), answer, chat.abort.signal);
    if (text) chat.history.push({ role: "user", content: prompt }, { role: "assistant", content: text });
  } catch (error) {
    showError(answer, error.name === "AbortError" ? "stopped" : String(error));
  } finally {
    chat.abort = null;
    form.querySelector("button[type=submit]").disabled = false;
    $("#stop").disabled = true;
    poll(); // the panel counts this answer now, not at the next tick
  }
}

// Prometheus text: the samples without labels, by name.
// The unlabelled series, and on a server of several models the chosen model's (served_model label).
function parseMetrics(text, model) {
  const values = {};
  for (const line of text.split("\n")) {
    const match = /^([a-zA-Z_:][\w:]*)(?:\{([^}]*)\})? (\S+)$/.exec(line);
    if (!match || (match[2] && match[2] !== `served_model="${model}"`)) continue;
    values[match[1]] = Number(match[3]);
  }
  return values;
}

function showLive(values, note) {
  for (const [name, value] of Object.entries(values)) $(`#live [data-metric=${name}]`).textContent = value;
  $("#live-note").textContent = note;
}

async function poll() {
  const blank = { slots: "–", queue: "–", rows: "–", tps: "–" };
  try {
    const response = await fetch("/metrics", { headers: headers(false) });
    if (response.status === 401 || response.status === 403) {
      showLive(blank, "/metrics needs the operator key (serve --metrics-key, or the API key of a one-key server).");
      return;
    }
    if (!response.ok) {
      showLive(blank, await errorText(response));
      return;
    }
    const m = parseMetrics(await response.text(), chat.model);
    showLive(
      {
        slots: `${m.draftwise_requests_running} / ${m.draftwise_slots}`,
        queue: m.draftwise_queue_length,
        rows: m.draftwise_last_batch_rows,
        // nothing generated yet: no rate to show (the gauge reads 0 then)
        tps: m.draftwise_generated_tokens_total > 0 ? fixed(m.draftwise_tokens_per_second, 1) : "–",
      },
      "",
    );
  } catch (error) {
    showLive(blank, `the server did not answer: ${error}`);
  }
}

function start() {
  const key = $("#api-key");
  key.value = localStorage.getItem(KEY_STORE) || "";
  key.addEventListener("change", () => {
    localStorage.setItem(KEY_STORE, key.value.trim());
    loadModel();
    poll();
  });
  const form = $("#composer");
  form.addEventListener("submit", send);
  form.prompt.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  $("#stop").addEventListener("click", () => chat.abort && chat.abort.abort());
  $("#model-picker").addEventListener("change", pickModel);
  $("#new-chat").addEventListener("click", () => {
    chat.history = [];
    $("#messages").replaceChildren();
  });
  loadModel();
  poll();
  setInterval(poll, POLL_MS);
}

start();
