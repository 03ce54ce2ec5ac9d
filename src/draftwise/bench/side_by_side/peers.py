"""Servers side by side: the same prompts through several OpenAI-compatible servers, one request at a time.

`run_peers` sends each prompt of each `PeerSuite` to every server in turn, the servers' order rotated
from one prompt to the next, as a streamed greedy chat completion, and keeps per request the decode
speed from the first content to the last (`PeerRecord`), the prompt's token count as each server
counted it and the CPU share other processes took meanwhile; peers_report.py turns the records into
ratios to one server. peer_servers.py starts the servers a run names by kind.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from types import SimpleNamespace

import httpx

from draftwise.bench.record.timing import CompetingLoad, host_info
from draftwise.bench.serving.load import SSE_DONE, WARMUP_TOKENS, LoadError, _error_message, describe_server, sse_data
from draftwise.types import ConfigError

FORMAT = "draftwise-bench-peers/1"
SUITE_KEYS = ("max_tokens", "per_category", "limit")


@dataclass(frozen=True)
class PeerSuite:
    """A set of prompts measured as one row: a shipped suite's name or a JSONL file, each prompt's first
    turn answered in at most max_tokens (a prompt's own max_tokens wins), per_category prompts of each
    category and then the first `limit` of them, where given."""

    name: str
    source: str
    max_tokens: int
    per_category: int | None = None
    limit: int | None = None

    @classmethod
    def parse(cls, spec: str, default_max_tokens: int) -> PeerSuite:
        """NAME=SOURCE[,max_tokens=N][,per_category=N][,limit=N].

        Example: parse("edits=code_edit_long,max_tokens=512,limit=6", 128) -> PeerSuite("edits",
        "code_edit_long", 512, None, 6).
        """
        head, *options = spec.split(",")
        name, sep, source = head.partition("=")
        if not sep or not name.strip() or not source.strip():
            raise ConfigError(f"a suite is NAME=SOURCE[,max_tokens=N][,per_category=N][,limit=N], got {spec!r}")
        values: dict[str, int] = {}
        for option in options:
            key, sep, value = option.partition("=")
            if key.strip() not in SUITE_KEYS or not sep or not value.strip().isdigit() or int(value) < 1:
                raise ConfigError(
                    f"suite {name!r}: {option!r} is not one of {', '.join(k + '=N' for k in SUITE_KEYS)} (N >= 1)"
                )
            values[key.strip()] = int(value)
        return cls(name.strip(), source.strip(), values.pop("max_tokens", default_max_tokens), **values)

    def prompts(self) -> list:
        """The suite's chat prompts (bench.suites.prompts.Prompt), chosen as the fields say."""
        from pathlib import Path

        from draftwise.bench.suites.prompts import available_suites, load_prompts, load_suite, take_per_category

        chosen = load_suite(self.source) if self.source in available_suites() else load_prompts(Path(self.source))
        # Chat prompts only: a fill-in-the-middle cut (suffix) or a tool prompt is another request shape.
        chosen = [p for p in chosen if p.suffix is None and not p.tools]
        if self.per_category:
            chosen = take_per_category(chosen, self.per_category)
        chosen = chosen[: self.limit] if self.limit else chosen
        if not chosen:
            raise ConfigError(f"suite {self.name!r}: no chat prompts in {self.source}")
        return chosen


@dataclass(frozen=True)
class PeerRecord:
    """One prompt on one server. Times in seconds from sending; decode_s runs from the first content to the
    last, over completion_tokens - 1 tokens. position: the server's place in this prompt's order, from 0."""

    suite: str
    category: str
    question_id: int
    server: str
    position: int
    ok: bool
    status: int | None
    error: str | None
    prompt_tokens: int | None
    completion_tokens: int
    ttft_s: float | None
    decode_s: float | None
    latency_s: float
    num_drafted: int | None  # usage.speculative (draftwise) or timings.draft_n (llama-server)
    num_accepted: int | None
    text_sha1: str  # the answer's text, to count answers identical to the baseline's
    other_cpu_share: float | None = None  # of the whole prompt's span, every server's request
    # The server's own timings (llama-server's, which draftwise serve reports too): predicted_n
    # sampled tokens in predicted_ms from its first decode step to its last.
    server_predicted_n: int | None = None
    server_predicted_ms: float | None = None

    @property
    def client_decode_tokens_per_second(self) -> float | None:
        """(completion_tokens - 1) / decode_s, from the first content the client saw to the last;
        None with fewer than two tokens or no time between them. A short answer whose tokens came
        in one or two chunks (a draft accepted whole) reads as thousands of tokens a second."""
        if not self.ok or self.completion_tokens < 2 or not self.decode_s:
            return None
        return (self.completion_tokens - 1) / self.decode_s

    @property
    def decode_tokens_per_second(self) -> float | None:
        """The server's timings' predicted_n / predicted_ms where it reports them (the same
        definition on llama-server and draftwise serve, whatever the chunking), else the client's."""
        if self.ok and self.server_predicted_n and self.server_predicted_ms:
            return 1000.0 * self.server_predicted_n / self.server_predicted_ms
        return self.client_decode_tokens_per_second


def rotated(names: Sequence[str], index: int) -> list[str]:
    """The servers' order for prompt `index`: rotated by one a prompt. ["a", "b", "c"], 4 -> ["b", "c", "a"]."""
    shift = index % len(names)
    return [*names[shift:], *names[:shift]]


def _drafted(usage: dict, timings: dict) -> tuple[int | None, int | None]:
    """(drafted, accepted) from draftwise's usage.speculative or llama-server's timings, None where neither."""
    speculative = usage.get("speculative") or {}
    if "num_drafted" in speculative:
        return speculative.get("num_drafted"), speculative.get("num_accepted")
    if "draft_n" in timings:
        return timings.get("draft_n"), timings.get("draft_n_accepted")
    return None, None


def stream_request(client: httpx.Client, body: dict) -> dict:
    """POST one streamed chat completion; what PeerRecord keeps of it (failures as fields, never raised)."""
    start = time.perf_counter()
    status, error, first_s, last_s, num_deltas, done = None, None, None, None, 0, False
    usage, timings, text = {}, {}, []
    try:
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            status = response.status_code
            if status != 200:
                error = _error_message(response.read())
            else:
                for line in response.iter_lines():
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
                        if content := (choice.get("delta") or {}).get("content"):
                            last_s = time.perf_counter() - start
                            first_s = first_s if first_s is not None else last_s
                            num_deltas += 1
                            text.append(content)
                    usage = chunk.get("usage") or usage
                    timings = chunk.get("timings") or timings
                if error is None and not done:
                    error = "the stream ended before [DONE]"
    except (httpx.HTTPError, ValueError) as exc:  # ValueError: a data line that is not JSON
        error = f"{type(exc).__name__}: {exc}"
    num_drafted, num_accepted = _drafted(usage, timings)
    return {
        "ok": error is None,
        "status": status,
        "error": error,
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens", num_deltas),
        "ttft_s": first_s,
        "decode_s": last_s - first_s if first_s is not None else None,
        "latency_s": time.perf_counter() - start,
        "num_drafted": num_drafted,
        "num_accepted": num_accepted,
        "text_sha1": hashlib.sha1("".join(text).encode()).hexdigest(),
        "server_predicted_n": timings.get("predicted_n"),
        "server_predicted_ms": timings.get("predicted_ms"),
    }


@dataclass(frozen=True)
class Contender:
    """A server in the comparison: its name, base URL, the model id its requests name, and what it is
    (describe_server's answer, the command that started it where the run started it)."""

    name: str
    url: str
    model: str | None
    described: dict
    command: str | None = None


def contender(name: str, url: str, headers: dict, command: str | None = None) -> Contender:
    """The server at url, described; its model is the first id /v1/models lists."""
    url = url.rstrip("/").removesuffix("/v1")  # NOTE: clients' base_url often ends in /v1; the routes add it
    described = describe_server(url, headers)
    return Contender(name, url, described["models"][0] if described["models"] else None, described, command)


def own_times(pids: Sequence[int]) -> Callable[[], SimpleNamespace]:
    """CPU times of this process and of the servers at pids with their children, summed, in the shape
    CompetingLoad reads: so that 'other processes' are neither the bench nor the servers it measures."""
    import psutil

    def read() -> SimpleNamespace:
        total = psutil.Process().cpu_times()
        user, system = total.user + total.children_user, total.system + total.children_system
        for pid in pids:
            try:
                proc = psutil.Process(pid)
                for p in [proc, *proc.children(recursive=True)]:
                    t = p.cpu_times()
                    user, system = user + t.user, system + t.system
            except psutil.Error:  # a server that ended: the run reports its failed requests
                continue
        return SimpleNamespace(user=user, system=system, children_user=0.0, children_system=0.0)

    return read


def _body(server: Contender, prompt, max_tokens: int) -> dict:
    return {
        "messages": [{"role": "user", "content": prompt.turns[0]}],
        "max_tokens": prompt.max_tokens or max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **({"model": server.model} if server.model else {}),
    }


def _warm_up(clients: dict[str, httpx.Client], servers: Sequence[Contender], prompt) -> None:
    # NOTE: the first request pays one-off costs (lazy allocation, cold caches) that belong to no prompt.
    for server in servers:
        warm = stream_request(
            clients[server.name], _body(server, prompt, WARMUP_TOKENS) | {"max_tokens": WARMUP_TOKENS}
        )
        if not warm["ok"]:
            raise LoadError(f"the warm-up request to {server.name} failed ({warm['status']}): {warm['error']}")


def run_peers(
    servers: Sequence[Contender],
    suites: Sequence[PeerSuite],
    *,
    baseline: str,
    headers: dict | None = None,
    timeout_s: float = 600.0,
    server_pids: Sequence[int] = (),
    meta: dict | None = None,
    progress: Callable[[list[PeerRecord]], None] | None = None,
) -> dict:
    """Every suite's prompts through every server, one request at a time, the order rotated per prompt;
    results (format FORMAT) for peers_report. server_pids: the started servers' processes, whose CPU time
    does not count as other processes'. progress(records of one prompt) follows every prompt.

    Example: run_peers([contender("a", url_a, {}), contender("b", url_b, {})], [PeerSuite("chat", "chat", 64)],
    baseline="a")["records"][0]["decode_tokens_per_second"].
    """
    names = [s.name for s in servers]
    if len(set(names)) != len(names) or len(names) < 2:
        raise ConfigError(f"a comparison needs two or more servers with different names, got {names}")
    if baseline not in names:
        raise ConfigError(f"the baseline {baseline!r} is not one of the servers: {', '.join(names)}")
    planned = [(suite, suite.prompts()) for suite in suites]  # every file read before any server is asked
    by_name = {s.name: s for s in servers}
    clients = {
        s.name: httpx.Client(base_url=s.url, headers=headers or {}, timeout=httpx.Timeout(timeout_s, connect=10))
        for s in servers
    }
    records: list[PeerRecord] = []
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        _warm_up(clients, servers, planned[0][1][0])
        index = 0
        for suite, prompts in planned:
            for prompt in prompts:
                competing = CompetingLoad(own_times=own_times(server_pids))
                measured = [
                    (position, name, stream_request(clients[name], _body(by_name[name], prompt, suite.max_tokens)))
                    for position, name in enumerate(rotated(names, index))
                ]
                share = round(competing.share(), 3)
                got = [
                    PeerRecord(
                        suite.name, prompt.category, prompt.question_id, name, position, **fields, other_cpu_share=share
                    )
                    for position, name, fields in measured
                ]
                records += got
                index += 1
                if progress is not None:
                    progress(got)
    finally:
        for client in clients.values():
            client.close()
    return {
        "format": FORMAT,
        "meta": {
            **(meta or {}),
            "host": host_info(),
            "baseline": baseline,
            "servers": [
                {"name": s.name, "url": s.url, "model": s.model, "command": s.command, **s.described} for s in servers
            ],
            "suites": [{**asdict(suite), "num_prompts": len(prompts)} for suite, prompts in planned],
            "started_at": started_at,
            "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        },
        "records": [
            {
                **asdict(r),
                "decode_tokens_per_second": r.decode_tokens_per_second,
                "client_decode_tokens_per_second": r.client_decode_tokens_per_second,
            }
            for r in records
        ],
    }
