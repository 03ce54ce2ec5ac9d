"""Serving load benchmark: C concurrent streaming clients against an OpenAI-compatible server.

`run_bench` times every streamed chat request (first token, end, tokens) at each concurrency
level and `summarize_level` turns a level into throughput and percentiles (load_report.py
defines them and writes the report); `run_soak` keeps C clients sending for a fixed time while
`RssSampler` samples the server's memory, and `rss_verdict` says whether it stayed flat once warm.
`serve_process.ServeProcess` runs `draftwise serve` for a benchmark.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone

import httpx
import numpy as np

from draftwise.types import ConfigError

FORMAT = "draftwise-bench-serve/1"
WARMUP_TOKENS = 8
FLAT_TOLERANCE_PCT = 5.0  # a soak's RSS is flat when every sample after the warm-up is within this of the first

# A prompt to send: its text, or (text, max_tokens) where the prompt sets its own (None: the run's).
LoadPrompt = str | tuple[str, int | None]


class LoadError(ConfigError):
    """The server could not be reached, started or used; the message says why."""


@dataclass(frozen=True)
class RequestRecord:
    """One request; times in seconds from sending it. Level summaries count successful requests only."""

    concurrency: int
    index: int  # order of issue within the level
    ok: bool
    status: int | None  # HTTP status; None when no response came
    error: str | None
    ttft_s: float | None  # None when no content arrived
    latency_s: float
    num_tokens: int
    tokens_from_usage: bool  # False: counted as content deltas
    num_drafted: int | None  # from usage.speculative, where the server reports it
    num_accepted: int | None
    started_s: float | None = None  # soak: when it was sent, seconds from the soak's start
    prompt: int | None = None  # soak: the index of its prompt in the prompt list


SSE_DONE = "[DONE]"


def sse_data(line: str) -> dict | str | None:
    """One line of an OpenAI stream: its chunk's JSON, SSE_DONE at the end, None for what carries
    no data (blank separators, comments). 'data: {"a": 1}' -> {"a": 1}; 'data: [DONE]' -> SSE_DONE."""
    if not line.startswith("data:"):
        return None
    data = line[len("data:") :].strip()
    return SSE_DONE if data == SSE_DONE else json.loads(data)


def _error_message(raw: bytes | str) -> str:
    """An OpenAI error body's message, else the start of the text. b'{"error": {"message": "busy"}}' -> 'busy'."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    try:
        error = json.loads(text)["error"]
        return str(error.get("message", error) if isinstance(error, dict) else error)
    except (ValueError, KeyError, TypeError):
        return text.strip()[:200] or "(empty body)"


async def stream_chat(client: httpx.AsyncClient, body: dict, concurrency: int, index: int) -> RequestRecord:
    """POST one streaming chat completion and time it; failures become records, never exceptions."""
    start = time.perf_counter()
    status, error, ttft_s, num_deltas, usage, done = None, None, None, 0, None, False
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            status = response.status_code
            if status != 200:
                error = _error_message(await response.aread())
            else:
                async for line in response.aiter_lines():
                    chunk = sse_data(line)
                    if chunk is None:
                        continue
                    if chunk == SSE_DONE:
                        done = True
                        break
                    if "error" in chunk:
                        error = _error_message(json.dumps(chunk))
                        break
                    for choice in chunk.get("choices") or ():
                        if (choice.get("delta") or {}).get("content"):
                            num_deltas += 1
                            ttft_s = ttft_s if ttft_s is not None else time.perf_counter() - start
                    usage = chunk.get("usage") or usage
                if error is None and not done:
                    error = "the stream ended before [DONE]"
    except (httpx.HTTPError, ValueError) as exc:  # ValueError: a data line that is not JSON
        error = f"{type(exc).__name__}: {exc}"
    latency_s = time.perf_counter() - start
    usage = usage or {}
    speculative = usage.get("speculative") or {}
    num_tokens = usage.get("completion_tokens", num_deltas)
    return RequestRecord(
        concurrency,
        index,
        error is None,
        status,
        error,
        ttft_s,
        latency_s,
        num_tokens,
        "completion_tokens" in usage,
        speculative.get("num_drafted"),
        speculative.get("num_accepted"),
    )


def chat_request(body: dict, prompt: LoadPrompt) -> dict:
    """body with prompt as its one user message, and the prompt's own max_tokens where it has one.

    Example: chat_request({"max_tokens": 128}, ("Hi", 16)) -> {"max_tokens": 16, "messages": [{"role": "user",
    "content": "Hi"}]}.
    """
    text, max_tokens = (prompt, None) if isinstance(prompt, str) else prompt
    return {
        **body,
        **({"max_tokens": max_tokens} if max_tokens else {}),
        "messages": [{"role": "user", "content": text}],
    }


async def run_level(
    client: httpx.AsyncClient, prompts: Sequence[LoadPrompt], body: dict, concurrency: int, num_requests: int
) -> tuple[list[RequestRecord], float]:
    """`concurrency` clients share a queue of num_requests prompts; returns the records (in issue order) and wall s."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(num_requests):
        queue.put_nowait(i)
    records: list[RequestRecord] = []

    async def one_client() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            records.append(await stream_chat(client, chat_request(body, prompts[i % len(prompts)]), concurrency, i))

    start = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(concurrency)))
    return sorted(records, key=lambda r: r.index), time.perf_counter() - start


def _percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolation percentile, None for no values. [1.0, 2.0, 3.0], 50 -> 2.0."""
    return float(np.percentile(values, q)) if len(values) else None


def summarize_level(concurrency: int, records: Sequence[RequestRecord], wall_s: float) -> dict:
    """One level's throughput, percentiles and errors (load_report.HOW_MEASURED defines them)."""
    ok = [r for r in records if r.ok]
    num_tokens = sum(r.num_tokens for r in ok)
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    latencies = [r.latency_s for r in ok]
    drafted = [r.num_drafted for r in ok if r.num_drafted is not None]
    accepted = [r.num_accepted for r in ok if r.num_accepted is not None]
    errors: dict[str, int] = {}
    for r in records:
        if not r.ok:
            key = f"{r.status}: {r.error}" if r.status is not None else str(r.error)
            errors[key] = errors.get(key, 0) + 1
    return {
        "concurrency": concurrency,
        "num_requests": len(records),
        "num_errors": len(records) - len(ok),
        "num_tokens": num_tokens,
        "wall_s": wall_s,
        "tokens_per_second": num_tokens / wall_s if wall_s > 0 else None,
        "request_tokens_per_second_p50": _percentile([r.num_tokens / r.latency_s for r in ok if r.latency_s > 0], 50),
        "ttft_p50_s": _percentile(ttfts, 50),
        "ttft_p95_s": _percentile(ttfts, 95),
        "latency_p50_s": _percentile(latencies, 50),
        "latency_p95_s": _percentile(latencies, 95),
        "latency_max_s": max(latencies) if latencies else None,
        "num_drafted": sum(drafted) if drafted else None,
        "num_accepted": sum(accepted) if accepted else None,
        "errors": errors,
    }


def describe_server(url: str, headers: dict[str, str]) -> dict:
    """What is being measured: the ids /v1/models lists and /health's answer, where there is one.

    Raises LoadError when the server cannot be reached or does not answer like an OpenAI API.
    """
    try:
        answer = httpx.get(f"{url}/v1/models", headers=headers, timeout=10)
        health = httpx.get(f"{url}/health", headers=headers, timeout=10)
    except httpx.HTTPError as exc:
        raise LoadError(f"cannot reach {url}: {exc}") from None
    if answer.status_code != 200:
        raise LoadError(f"{url}/v1/models answered {answer.status_code}: {_error_message(answer.content)}")
    try:
        models = [m["id"] for m in answer.json()["data"]]
    except (ValueError, KeyError, TypeError):
        raise LoadError(f"{url}/v1/models did not answer with an OpenAI model list") from None
    try:
        health_body = health.json() if health.status_code == 200 else None
    except ValueError:
        health_body = None
    return {"url": url, "models": models, "health": health_body}


def _connect(url: str, api_key: str | None, model: str | None, max_tokens: int) -> tuple[str, dict, dict, dict]:
    """(base url, headers, describe_server's answer, the requests' common body) for a run against url."""
    url = url.rstrip("/").removesuffix("/v1")  # NOTE: clients' base_url often ends in /v1; the routes add it
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    server = describe_server(url, headers)
    model = model or (server["models"][0] if server["models"] else None)
    body = {
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream_options": {"include_usage": True},
        **({"model": model} if model else {}),
    }
    return url, headers, server, body


def _run_meta(meta: dict | None, server: dict, body: dict, num_requests: int, num_prompts: int) -> dict:
    """A results file's meta: the caller's, the server described, the requests' model and max_tokens."""
    return {
        **(meta or {}),
        "server": server,
        "model": body.get("model"),
        "max_tokens": body["max_tokens"],
        "num_requests": num_requests,
        "num_prompts": num_prompts,
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


async def _warm_up(client: httpx.AsyncClient, body: dict, prompt: LoadPrompt) -> None:
    # NOTE: the first request pays one-off costs (lazy allocation, cold caches) that belong to no level.
    warm = await stream_chat(client, {**chat_request(body, prompt), "max_tokens": WARMUP_TOKENS}, 0, 0)
    if not warm.ok:
        raise LoadError(f"the warm-up request failed ({warm.status}): {warm.error}")


def _client(url: str, headers: dict, connections: int, timeout_s: float) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=httpx.Timeout(timeout_s, connect=10))


def run_bench(
    url: str,
    prompts: Sequence[LoadPrompt],
    levels: Sequence[int],
    *,
    num_requests: int = 16,
    max_tokens: int = 128,
    model: str | None = None,
    api_key: str | None = None,
    timeout_s: float = 600.0,
    meta: dict | None = None,
    progress: Callable[[dict], None] | None = None,
) -> dict:
    """Every level in turn against the server at url; returns results (format FORMAT) for load_report.

    model defaults to the first id /v1/models lists (draftwise refuses any other name).
    Example: run_bench("http://127.0.0.1:8000", ["Hi"], [1, 4], num_requests=8)["levels"][1]["concurrency"] -> 4.
    """
    if not prompts:
        raise ConfigError("no prompts to send")
    if not levels or any(c < 1 for c in levels) or num_requests < 1:
        raise ConfigError(f"concurrency levels and requests must be >= 1, got {list(levels)} and {num_requests}")
    url, headers, server, body = _connect(url, api_key, model, max_tokens)

    async def run_all() -> list[tuple[list[RequestRecord], float]]:
        async with _client(url, headers, max(levels), timeout_s) as client:
            await _warm_up(client, body, prompts[0])
            runs = []
            for c in levels:
                runs.append(await run_level(client, prompts, body, c, num_requests))
                if progress is not None:
                    progress(summarize_level(c, *runs[-1]))
            return runs

    runs = asyncio.run(run_all())
    return {
        "format": FORMAT,
        "meta": _run_meta(meta, server, body, num_requests, len(prompts)),
        "levels": [summarize_level(c, records, wall_s) for c, (records, wall_s) in zip(levels, runs)],
        "records": [asdict(r) for records, _ in runs for r in records],
    }


def process_rss_mb(pid: int) -> float:
    """Resident memory of process pid and all its descendants, in MiB. Raises psutil.NoSuchProcess when gone."""
    import psutil

    proc = psutil.Process(pid)
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:  # a child that ended between the listing and the reading
            pass
    return total / 2**20


class RssSampler:
    """Samples process pid's RSS (children included) every every_s seconds from a daemon thread while in a
    with block; `samples` is [(seconds from entering, MiB)], with one sample on entering and one on leaving.

    A process that ends stops the sampling; `error` then says so.
    """

    def __init__(self, pid: int, every_s: float) -> None:
        if every_s <= 0:
            raise ConfigError(f"the RSS sampling interval must be > 0 s, got {every_s}")
        self.pid, self.every_s = pid, every_s
        self.samples: list[tuple[float, float]] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def sample(self) -> None:
        import psutil

        if self.error is not None:
            return
        try:
            mb = process_rss_mb(self.pid)
        except psutil.Error as exc:
            self.error = f"process {self.pid} could not be read: {type(exc).__name__}"
            return
        with self._lock:
            self.samples.append((round(time.perf_counter() - self.start, 3), round(mb, 2)))

    def latest_mb(self) -> float | None:
        with self._lock:
            return self.samples[-1][1] if self.samples else None

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def __enter__(self) -> RssSampler:
        self.start = time.perf_counter()
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def rss_verdict(samples: Sequence[Sequence[float]], warm_s: float, tolerance_pct: float = FLAT_TOLERANCE_PCT) -> dict:
    """Whether RSS stayed flat once warm: every sample from warm_s on within tolerance_pct of the first of them.

    rss_warm_mb is that first sample (at rss_warm_t_s), rss_end_mb the last; the deviations are the largest and
    smallest sample after warm_s against rss_warm_mb, in %. flat is None with fewer than two samples from warm_s on.
    Example: [(0, 900), (300, 1000), (600, 1030), (900, 1020)], warm_s=300 -> rss_warm_mb 1000, rss_max_dev_pct 3.0,
    rss_min_dev_pct 0.0, flat True.
    """
    after = [(float(t), float(mb)) for t, mb in samples if t >= warm_s]
    out = {
        "warm_s": warm_s,
        "tolerance_pct": tolerance_pct,
        "num_samples": len(samples),
        "num_samples_after_warm": len(after),
        "rss_warm_t_s": None,
        "rss_warm_mb": None,
        "rss_end_mb": float(samples[-1][1]) if samples else None,
        "rss_max_dev_pct": None,
        "rss_min_dev_pct": None,
        "flat": None,
    }
    if not after:
        return out
    (t0, ref), devs = after[0], [100.0 * (mb - after[0][1]) / after[0][1] for _, mb in after]
    out.update(rss_warm_t_s=t0, rss_warm_mb=ref, rss_max_dev_pct=max(devs), rss_min_dev_pct=min(devs))
    if len(after) >= 2:
        out["flat"] = max(abs(d) for d in devs) <= tolerance_pct
    return out


def soak_summary(records: Sequence[RequestRecord], samples: Sequence[Sequence[float]], warm_s: float) -> dict:
    """The soak's verdict: requests done and failed, the RSS figures of rss_verdict, and passed (flat RSS and no
    failed request; None when RSS was not judged and nothing failed)."""
    num_errors = sum(not r.ok for r in records)
    verdict = rss_verdict(samples, warm_s)
    passed = False if num_errors or verdict["flat"] is False else verdict["flat"]
    return {
        "num_requests": len(records),
        "num_ok": len(records) - num_errors,
        "num_errors": num_errors,
        **verdict,
        "passed": passed,
    }


async def soak_clients(
    client: httpx.AsyncClient,
    prompts: Sequence[LoadPrompt],
    body: dict,
    concurrency: int,
    duration_s: float,
    *,
    seed: int = 0,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> tuple[list[RequestRecord], float]:
    """concurrency clients send requests one after another until duration_s has passed (a request in flight
    then finishes); each goes through the prompts in its own seeded shuffled order, reshuffled every round.
    Returns the records (in issue order; index = issue order, prompt = the prompt's index) and wall s."""
    records: list[RequestRecord] = []
    start = time.perf_counter()
    deadline = start + duration_s
    issued = 0

    async def one_client(k: int) -> None:
        nonlocal issued
        rng = random.Random(seed * 1_000_003 + k)
        order: list[int] = []
        while time.perf_counter() < deadline:
            if not order:
                order = list(range(len(prompts)))
                rng.shuffle(order)
            p = order.pop()
            index, issued = issued, issued + 1
            sent = time.perf_counter() - start
            record = await stream_chat(client, chat_request(body, prompts[p]), concurrency, index)
            record = replace(record, started_s=round(sent, 3), prompt=p)
            records.append(record)
            if on_record is not None:
                on_record(record)

    await asyncio.gather(*(one_client(k) for k in range(concurrency)))
    return sorted(records, key=lambda r: r.index), time.perf_counter() - start


def run_soak(
    url: str,
    prompts: Sequence[LoadPrompt],
    concurrency: int,
    duration_s: float,
    *,
    server_pid: int | None = None,
    rss_every_s: float = 10.0,
    warm_s: float = 300.0,
    seed: int = 0,
    max_tokens: int = 128,
    model: str | None = None,
    api_key: str | None = None,
    timeout_s: float = 600.0,
    meta: dict | None = None,
    progress: Callable[[RequestRecord, float, float | None], None] | None = None,
) -> dict:
    """A soak: concurrency clients send for duration_s while the RSS of server_pid (if given) is sampled every
    rss_every_s; results (format FORMAT) hold the one level, the records and a "soak" section (samples and
    soak_summary). progress(record, seconds since the start, latest RSS MiB or None) follows every request.

    Example: run_soak(url, ["Hi", ("Write a sort", 256)], 2, 1800, server_pid=pid)["soak"]["summary"]["flat"].
    """
    if not prompts:
        raise ConfigError("no prompts to send")
    if concurrency < 1 or duration_s <= 0 or warm_s < 0:
        raise ConfigError(
            f"a soak needs concurrency >= 1, a duration > 0 and a warm-up >= 0, got {concurrency}, "
            f"{duration_s} s and {warm_s} s"
        )
    url, headers, server, body = _connect(url, api_key, model, max_tokens)
    sampler = RssSampler(server_pid, rss_every_s) if server_pid is not None else None
    if server_pid is not None:
        import psutil

        try:
            process_rss_mb(server_pid)
        except psutil.Error as exc:
            raise LoadError(f"cannot read the memory of process {server_pid}: {type(exc).__name__}") from None

    async def soak() -> tuple[list[RequestRecord], float]:
        async with _client(url, headers, concurrency, timeout_s) as client:
            await _warm_up(client, body, prompts[0])
            with sampler if sampler is not None else contextlib.nullcontext():
                t0 = time.perf_counter()

                def on_record(record: RequestRecord) -> None:
                    if progress is not None:
                        progress(record, time.perf_counter() - t0, sampler.latest_mb() if sampler else None)

                return await soak_clients(
                    client, prompts, body, concurrency, duration_s, seed=seed, on_record=on_record
                )

    records, wall_s = asyncio.run(soak())
    samples = [list(s) for s in sampler.samples] if sampler else []
    return {
        "format": FORMAT,
        "meta": _run_meta(meta, server, body, len(records), len(prompts)),
        "levels": [summarize_level(concurrency, records, wall_s)],
        "records": [asdict(r) for r in records],
        "soak": {
            "duration_s": duration_s,
            "concurrency": concurrency,
            "seed": seed,
            "server_pid": server_pid,
            "rss_every_s": rss_every_s if sampler else None,
            "rss_error": sampler.error if sampler else None,
            "samples": samples,
            "summary": soak_summary(records, samples, warm_s),
        },
    }
