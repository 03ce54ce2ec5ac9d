"""Keystroke replay for `draftwise bench-serve --keystrokes`: users typing code, as editors ask for it.

A session types the first line of a `fim` suite cut (the removed text) into its file: an /infill
request every `every` characters, as llama.vim builds it (input_prefix: the lines above, prompt:
the typed part of the line, input_suffix: the lines after, n_indent, the editor's sampling
chain, t_max_prompt_ms / t_max_predict_ms). Three modes send the same requests, session by
session (each session in every mode before the next, so drift of the machine hits all alike):

Before typing (in the typing and warm modes) the session sends the request an editor sends when
the cursor arrives on the new line (nothing typed yet) and waits for its answer, as a user reads
the suggestion before typing on: the file around the cursor is then in the server's cache, as it
is after an editor's earlier requests in that file. It is recorded (typed 0) and counted in no
mode's latency; `open_line=False` starts typing on whatever the cache holds.

- typing: at typing speed (a request every `every * char_ms` ms, whether or not the previous one
  has answered), each on a new connection from the same client, so a server that supersedes (draftwise)
  cancels the running one; latency counts the requests that were not superseded.
- warm: one after another, the cache kept between them (what a slot's cache buys).
- cold: one after another, each with a unique first extra-context chunk, so no server can reuse
  anything of the prompt after its fixed opening (the FIM prompt's repo header): the same
  requests with the cache cleared before each.

Works against any server with llama.cpp's /infill (draftwise serve, llama-server).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import httpx

from draftwise.bench.record.timing import host_info
from draftwise.bench.serving.load import LoadError, _error_message
from draftwise.bench.suites.prompts import Prompt

FORMAT = "draftwise-bench-keystrokes/1"
MODES = ("typing", "warm", "cold")
EXTRA = {"filename": "notes.txt", "text": "Project notes: keep functions short and name things plainly.\n"}


@dataclass(frozen=True)
class Session:
    """One typing session: `typed` is typed after `indent` on a new line between `above` and `below`."""

    name: str
    above: str
    indent: str
    typed: str
    below: str


@dataclass(frozen=True)
class KeystrokeRecord:
    mode: str
    session: str
    typed: int  # characters typed when the request was sent
    ok: bool
    status: int | None
    error: str | None
    superseded: bool
    latency_s: float
    prompt_n: int | None  # prompt tokens the server read (llama.cpp's timings)
    cache_n: int | None  # prompt tokens it reused
    predicted_n: int | None


def sessions_from(
    prompts: Sequence[Prompt], num: int, chars: int, prefix_lines: int, suffix_lines: int
) -> list[Session]:
    """Sessions from fim cuts: the first line of each cut's removed text (at most `chars` of it
    after its indentation) is typed; the lines above and below are cut to llama.vim's window."""
    out = []
    for p in prompts:
        if p.suffix is None or not isinstance(p.reference, str) or not p.reference.strip():
            continue
        first, _, rest = p.reference.partition("\n")
        indent = first[: len(first) - len(first.lstrip())]
        typed = first[len(indent) :][:chars]
        if len(typed) < 2:
            continue
        above = "".join(p.turns[0].splitlines(keepends=True)[-prefix_lines:])
        below = "".join((rest + p.suffix).splitlines(keepends=True)[:suffix_lines])
        out.append(Session(str(p.question_id), above, indent, typed, below))
        if len(out) == num:
            break
    return out


def request_body(session: Session, n: int, *, n_predict: int, cold: bool) -> dict:
    """The /infill body after n typed characters, as llama.vim sends it (its default sampling)."""
    extra = [EXTRA]
    if cold:  # a unique first chunk: nothing after the prompt's fixed opening can come from a cache
        extra = [{"filename": f"cold-{uuid.uuid4().hex}.txt", "text": uuid.uuid4().hex + "\n"}, EXTRA]
    return {
        "input_prefix": session.above,
        "input_suffix": "\n" + session.below,
        "input_extra": extra,
        "prompt": session.indent + session.typed[:n],
        "n_predict": n_predict,
        "n_indent": len(session.indent),
        "top_k": 40,
        "top_p": 0.99,
        "stream": False,
        "samplers": ["top_k", "top_p", "infill"],
        "cache_prompt": True,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 1000,
    }


async def _send(client: httpx.AsyncClient, url: str, body: dict, mode: str, session: str, n: int, headers: dict):
    t0 = time.perf_counter()
    try:
        # a connection per request, as llama.vim's curl jobs
        r = await client.post(f"{url}/infill", json=body, headers={**headers, "Connection": "close"})
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
        return KeystrokeRecord(mode, session, n, False, None, error, False, time.perf_counter() - t0, None, None, None)
    latency = time.perf_counter() - t0
    if r.status_code != 200:
        error = _error_message(r.content)
        return KeystrokeRecord(mode, session, n, False, r.status_code, error, False, latency, None, None, None)
    answer = r.json()
    answer = answer[0] if isinstance(answer, list) else answer
    timings = answer.get("timings") or {}
    return KeystrokeRecord(
        mode,
        session,
        n,
        True,
        200,
        None,
        bool(answer.get("superseded")),
        latency,
        timings.get("prompt_n"),
        timings.get("cache_n"),
        timings.get("predicted_n"),
    )


async def _replay(
    url: str,
    session: Session,
    mode: str,
    *,
    every: int,
    char_ms: float,
    n_predict: int,
    timeout_s: float,
    headers,
    open_line: bool = True,
) -> list[KeystrokeRecord]:
    points = list(range(every, len(session.typed) + 1, every)) or [len(session.typed)]
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        opened = []
        if open_line and mode != "cold":  # the editor's request on the new line, read before typing
            body = request_body(session, 0, n_predict=n_predict, cold=False)
            opened.append(await _send(client, url, body, mode, session.name, 0, headers))
        if mode != "typing":
            out = opened
            for n in points:
                body = request_body(session, n, n_predict=n_predict, cold=mode == "cold")
                out.append(await _send(client, url, body, mode, session.name, n, headers))
            return out
        tasks = []
        for i, n in enumerate(points):
            if i or opened:
                await asyncio.sleep(every * char_ms / 1000)
            body = request_body(session, n, n_predict=n_predict, cold=False)
            tasks.append(asyncio.ensure_future(_send(client, url, body, mode, session.name, n, headers)))
        return opened + list(await asyncio.gather(*tasks))


def summarize(records: Sequence[KeystrokeRecord], mode: str) -> dict:
    """Per mode: requests, errors, superseded, and over the answered ones (not superseded) the
    median and p95 latency (ms), median prompt tokens read and reused; the requests sent when
    the line opened (typed 0) are counted apart (`opened`, their median latency)."""
    opened = [r for r in records if r.mode == mode and r.typed == 0]
    mine = [r for r in records if r.mode == mode and r.typed > 0]
    done = [r for r in mine if r.ok and not r.superseded]
    lat = sorted(1000 * r.latency_s for r in done)

    def median(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    return {
        "mode": mode,
        "requests": len(mine),
        "errors": sum(not r.ok for r in mine),
        "superseded": sum(r.superseded for r in mine),
        "answered": len(done),
        "median_ms": round(statistics.median(lat), 1) if lat else None,
        "p95_ms": round(lat[min(len(lat) - 1, int(0.95 * len(lat)))], 1) if lat else None,
        "median_prompt_n": median(r.prompt_n for r in done),
        "median_cache_n": median(r.cache_n for r in done),
        "opened": len(opened),
        "open_median_ms": round(statistics.median(1000 * r.latency_s for r in opened), 1) if opened else None,
    }


def against_cold(records: Sequence[KeystrokeRecord], mode: str) -> dict | None:
    """Each answered request of mode (typed > 0, not superseded) against the same request
    (session, characters typed) sent cold: the median of the per-request latency ratios, and
    the two medians over those pairs. None without such pairs."""
    cold = {(r.session, r.typed): r.latency_s for r in records if r.mode == "cold" and r.ok}
    pairs = [
        (r.latency_s, cold[(r.session, r.typed)])
        for r in records
        if r.mode == mode and r.typed > 0 and r.ok and not r.superseded and (r.session, r.typed) in cold
    ]
    if not pairs:
        return None
    return {
        "mode": mode,
        "pairs": len(pairs),
        "median_ratio": round(statistics.median(a / b for a, b in pairs), 3),
        "median_ms": round(1000 * statistics.median(a for a, _ in pairs), 1),
        "cold_median_ms": round(1000 * statistics.median(b for _, b in pairs), 1),
    }


def run_keystrokes(
    url: str,
    sessions: Sequence[Session],
    *,
    every: int = 2,
    char_ms: float = 100.0,
    n_predict: int = 64,
    timeout_s: float = 600.0,
    api_key: str | None = None,
    meta: dict | None = None,
    progress=None,
    modes: Sequence[str] = MODES,
    open_line: bool = True,
) -> dict:
    """Replay every session in each of modes (typing, warm, cold); returns the results dict.
    open_line: typing and warm sessions first send the request of the opened line (see above)."""
    if not modes or set(modes) - set(MODES):
        raise LoadError(f"modes are {', '.join(MODES)}; got {', '.join(modes) or 'none'}")
    if not sessions:
        raise LoadError("no typing session: the prompts hold no fill-in-the-middle cut with removed text")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:  # one request first, so loading and calibration are in no mode's figures
        body = request_body(sessions[0], 1, n_predict=1, cold=False)
        probe = httpx.post(f"{url}/infill", json=body, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise LoadError(f"cannot reach {url}/infill: {exc}") from None
    if probe.status_code != 200:
        raise LoadError(f"{url}/infill answered {probe.status_code}: {_error_message(probe.content)}")
    records: list[KeystrokeRecord] = []
    # Session by session, each in every mode: a machine that speeds up or slows down during the
    # replay shifts every mode alike, so the ratios between modes stay side by side.
    for session in sessions:
        for mode in modes:
            replay = _replay(
                url,
                session,
                mode,
                every=every,
                char_ms=char_ms,
                n_predict=n_predict,
                timeout_s=timeout_s,
                headers=headers,
                open_line=open_line,
            )
            got = asyncio.run(replay)
            records += got
            if progress:
                progress(mode, session, got)
    return {
        "format": FORMAT,
        "meta": {
            **(meta or {}),
            "url": url,
            "every": every,
            "char_ms": char_ms,
            "n_predict": n_predict,
            "open_line": open_line,
            "host": host_info(),
            "sessions": [{"name": s.name, "typed": s.typed, "indent": len(s.indent)} for s in sessions],
            "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        },
        "summary": [summarize(records, mode) for mode in modes],
        "against_cold": [a for mode in modes if mode != "cold" and (a := against_cold(records, mode))],
        "records": [asdict(r) for r in records],
    }


def markdown(results: dict) -> str:
    meta = results["meta"]
    rows = [
        "| mode | requests | answered | superseded | errors | median ms | p95 ms | prompt tokens read | reused "
        "| open ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in results["summary"]:
        rows.append(
            f"| {s['mode']} | {s['requests']} | {s['answered']} | {s['superseded']} | {s['errors']} | "
            f"{s['median_ms']} | {s['p95_ms']} | {s['median_prompt_n']} | {s['median_cache_n']} | "
            f"{s.get('open_median_ms') or '-'} |"
        )
    by_mode = {s["mode"]: s["median_ms"] for s in results["summary"]}
    ratio = ""
    if by_mode.get("cold"):
        parts = [f"{m} {by_mode[m] / by_mode['cold']:.2f}" for m in ("typing", "warm") if by_mode.get(m)]
        ratio = f"\nMedian latency against cold: {', '.join(parts)}.\n" if parts else ""
    same = [
        f"{a['mode']} {a['median_ratio']:.2f} ({a['pairs']} requests: median {a['median_ms']:.0f} ms, the same "
        f"requests cold {a['cold_median_ms']:.0f} ms)"
        for a in results.get("against_cold", [])
    ]
    if same:
        ratio += (
            "Against the same requests sent cold (median of each answered request's latency over its cold "
            f"latency): {'; '.join(same)}.\n"
        )
    return "\n".join(
        [
            "# Keystroke replay (/infill)",
            "",
            f"Server {meta['url']}; client host {_host_line(meta.get('host'))}; "
            f"{len(meta['sessions'])} sessions, a request every {meta['every']} characters "
            f"({meta['every'] * meta['char_ms']:.0f} ms apart when typing), n_predict {meta['n_predict']}. "
            "typing: at typing speed, a newer request supersedes the running one; warm: one after another, cache "
            "kept; cold: one after another, nothing reusable. Latency counts answered requests (not superseded); "
            "prompt tokens read / reused are the server's timings (medians). "
            + (
                "Typing and warm sessions first send the request of the opened line (nothing typed) and wait for "
                "its answer, as a user reads the suggestion before typing: the file around the cursor is cached "
                "as after an editor's earlier requests there; those requests are in no latency figure (open ms)."
                if meta.get("open_line")
                else "Typing starts on whatever the cache holds (no request of the opened line first)."
            ),
            "",
            *rows,
            ratio,
            f"Command: `{meta.get('command', '')}`",
            "",
        ]
    )


def _host_line(info: dict | None) -> str:
    if not info:
        return "not recorded"
    return f"{info.get('cpu') or info.get('machine')}, {info.get('cpus')} CPUs, {info.get('isa') or 'no AVX2'}"


def write_outputs(results: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    report = out / "report.md"
    report.write_text(markdown(results))
    return report
