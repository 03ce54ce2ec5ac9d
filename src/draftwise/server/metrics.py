"""Prometheus metrics of one server, in its own CollectorRegistry (two apps in one process,
as in tests, never share counters).

Counters accumulate the quantities of docs/design.md section 5 over finished requests; the rate gauges
(acceptance rate, tokens per step, tokens/s, accepted-per-position) are derived from those
running totals, so they describe the server's whole life, not the last request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from draftwise.metrics import RequestStats

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
RATE_BUCKETS = (1, 2, 5, 10, 20, 30, 40, 60, 80, 120, 200, 500, 1000)


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._totals = {"generated": 0, "drafted": 0, "accepted": 0, "steps": 0, "decode_s": 0.0}
        self._position_drafted: list[int] = []
        self._position_accepted: list[int] = []
        self._memory_tracked = False

        self.requests = Counter(
            "draftwise_requests",
            "Generation requests that reached the engine, by outcome.",
            ["endpoint", "finish_reason"],
            registry=r,
        )
        self.errors = Counter(
            "draftwise_errors", "Error responses and failed generations.", ["status", "type"], registry=r
        )
        self.prompt_tokens = Counter("draftwise_prompt_tokens", "Prompt tokens of finished requests.", registry=r)
        self.reused_tokens = Counter(
            "draftwise_reused_prompt_tokens",
            "Prompt tokens whose KV entries were reused from the previous request.",
            ["model"],
            registry=r,
        )
        self.generated_tokens = Counter("draftwise_generated_tokens", "Generated tokens.", registry=r)
        self.drafted_tokens = Counter("draftwise_drafted_tokens", "Draft tokens proposed.", registry=r)
        self.accepted_tokens = Counter(
            "draftwise_accepted_tokens", "Draft tokens accepted (bonus/correction tokens excluded).", registry=r
        )
        self.steps = Counter("draftwise_steps", "Target verification forwards after the prompt.", registry=r)
        self.decode_seconds = Counter("draftwise_decode_seconds", "Time spent decoding (prefill excluded).", registry=r)
        self.prefill_seconds = Counter("draftwise_prefill_seconds", "Time spent on prompt prefill.", registry=r)
        self.drafter_steps = Counter(
            "draftwise_drafter_steps", "Steps by the drafter the policy chose ('none': plain).", ["drafter"], registry=r
        )
        self.k_steps = Counter(
            "draftwise_planned_k_steps", "Steps by the draft length k the policy planned.", ["k"], registry=r
        )
        self.acceptance_rate = Gauge(
            "draftwise_acceptance_rate", "accepted / drafted over the server's life.", registry=r
        )
        self.tokens_per_step = Gauge(
            "draftwise_tokens_per_step", "committed tokens (EOS included) / steps over the server's life.", registry=r
        )
        self.tokens_per_second = Gauge(
            "draftwise_tokens_per_second",
            "generated tokens / decode seconds over the server's life (prefill excluded).",
            registry=r,
        )
        self.accepted_per_position = Gauge(
            "draftwise_accepted_per_position",
            "Fraction of drafts whose position i was accepted, over the server's life.",
            ["position"],
            registry=r,
        )
        self.request_tokens_per_second = Histogram(
            "draftwise_request_tokens_per_second", "Per-request decode tokens/s.", buckets=RATE_BUCKETS, registry=r
        )
        self.request_seconds = Histogram(
            "draftwise_request_duration_seconds", "Queue wait + generation.", buckets=LATENCY_BUCKETS, registry=r
        )
        self.queue_seconds = Histogram(
            "draftwise_queue_wait_seconds", "Time a request waited for the engine.", buckets=LATENCY_BUCKETS, registry=r
        )
        self.first_token_seconds = Histogram(
            "draftwise_time_to_first_token_seconds",
            "Arrival to first streamed text.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_length = Gauge("draftwise_queue_length", "Requests waiting for the engine.", registry=r)
        self.running = Gauge(
            "draftwise_requests_running", "Requests the engine is working on (busy slots).", registry=r
        )
        self.slots_total = Gauge(
            "draftwise_slots", "Requests the engine can decode together (serve --parallel).", registry=r
        )
        self.batch_rows = Histogram(
            "draftwise_batch_rows",
            "Target rows per batched forward (draft + prompt chunks).",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            registry=r,
        )
        self.last_batch_rows = Gauge(
            "draftwise_last_batch_rows", "Target rows in the last batched forward (the chat page's panel).", registry=r
        )

    def track_memory(self, engine) -> None:
        """Memory gauges read at each scrape: the process's resident memory (prometheus_client's
        process collector), the KV caches' bytes per model (reserved and used, kv_bytes()) and
        the drafters' own state summed over the open slots (memory_bytes(): indexes, history).
        Once per server (a second call, another Serving on the same metrics, adds nothing)."""
        if self._memory_tracked:
            return
        self._memory_tracked = True
        ProcessCollector(registry=self.registry)
        kv = Gauge(
            "draftwise_kv_cache_bytes",
            "KV cache bytes by model (target, or a draft model drafter's name) and kind (reserved, used).",
            ["model", "kind"],
            registry=self.registry,
        )
        models = {"target": engine.target}
        models.update({d.name: d.backend for d in engine.drafters if d.backend is not None})
        for name, backend in models.items():
            kv.labels(name, "reserved").set_function(lambda b=backend: b.kv_bytes()["allocated"])
            kv.labels(name, "used").set_function(lambda b=backend: b.kv_bytes()["used"])
        state = Gauge(
            "draftwise_drafter_state_bytes",
            "What each drafter's state holds over the open slots (n-gram and suffix indexes, history, datastore).",
            ["drafter"],
            registry=self.registry,
        )
        for drafter in engine.drafters:
            if drafter.backend is None:
                state.labels(drafter.name).set_function(lambda n=drafter.name: _drafter_bytes(engine, n))

    def observe_batch(self, rows: int) -> None:
        self.batch_rows.observe(rows)
        self.last_batch_rows.set(rows)

    def track_queue(self, queue_length: Callable[[], int], running: Callable[[], int]) -> None:
        self.queue_length.set_function(queue_length)
        self.running.set_function(running)

    def observe_error(self, status: int, error_type: str) -> None:
        self.errors.labels(str(status), error_type).inc()

    def observe_request(
        self, endpoint: str, stats: RequestStats, *, queue_s: float, total_s: float, first_token_s: float | None
    ) -> None:
        self.requests.labels(endpoint, stats.finish_reason or "unknown").inc()
        self.prompt_tokens.inc(stats.num_prompt_tokens)
        self.reused_tokens.labels("target").inc(stats.num_reused_tokens)
        self.reused_tokens.labels("draft").inc(stats.num_draft_reused_tokens)
        self.generated_tokens.inc(stats.num_generated)
        self.drafted_tokens.inc(stats.num_drafted)
        self.accepted_tokens.inc(stats.num_accepted)
        self.steps.inc(stats.num_steps)
        self.decode_seconds.inc(stats.decode_ms / 1000)
        self.prefill_seconds.inc(stats.prefill_ms / 1000)
        for drafter, n in stats.drafter_choices.items():
            self.drafter_steps.labels(drafter).inc(n)
        for k, n in stats.k_choices.items():
            self.k_steps.labels(str(k)).inc(n)
        if stats.num_generated and stats.decode_ms > 0:
            self.request_tokens_per_second.observe(stats.tokens_per_second)
        self.request_seconds.observe(total_s)
        self.queue_seconds.observe(queue_s)
        if first_token_s is not None:
            self.first_token_seconds.observe(first_token_s)
        self._update_rates(stats)

    def _update_rates(self, stats: RequestStats) -> None:
        with self._lock:
            t = self._totals
            t["generated"] += stats.num_generated
            t["drafted"] += stats.num_drafted
            t["accepted"] += stats.num_accepted
            t["steps"] += stats.num_steps
            t["committed"] = t.get("committed", 0) + stats.num_generated + stats.num_eos  # EOS is a step's token too
            t["decode_s"] += stats.decode_ms / 1000
            for i, (drafted, accepted) in enumerate(zip(stats.position_drafted, stats.position_accepted)):
                if i == len(self._position_drafted):
                    self._position_drafted.append(0)
                    self._position_accepted.append(0)
                self._position_drafted[i] += drafted
                self._position_accepted[i] += accepted
            self.acceptance_rate.set(t["accepted"] / t["drafted"] if t["drafted"] else 0.0)
            self.tokens_per_step.set(t["committed"] / t["steps"] if t["steps"] else 0.0)
            self.tokens_per_second.set(t["generated"] / t["decode_s"] if t["decode_s"] > 0 else 0.0)
            for i, (drafted, accepted) in enumerate(zip(self._position_drafted, self._position_accepted)):
                self.accepted_per_position.labels(str(i)).set(accepted / drafted if drafted else 0.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _drafter_bytes(engine, name: str) -> int:
    """A drafter's state summed over the engine's open slots (each slot's drafters are its own)."""
    return sum(d.memory_bytes() for slot in engine.pool.open_slots() for d in slot.drafters if d.name == name)
