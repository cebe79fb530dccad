"""GET /metrics in Prometheus' format (prometheus-client), behind the API key if there is one.

Each app has its own registry: each model's engine counters are read at scrape time (labelled by
model), HTTP requests are counted by route and status, and every generation's time to first
token and total time go into histograms.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from quart import Blueprint, Quart, Response, current_app, request

blueprint = Blueprint("metrics", __name__)
TELEMETRY = "MLXSERVE_TELEMETRY"
# Seconds: from a fast tiny model's first token to a long generation on a big one.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300, 600)

# (name, help, how to read it from the engine); counters get Prometheus' `_total` suffix.
ENGINE_COUNTERS: tuple[tuple[str, str, Callable], ...] = (
    ("decode_steps", "Batched decode steps run", lambda e: e.stats.decode_steps),
    ("generated_tokens", "Tokens generated", lambda e: e.stats.generated_tokens),
    ("prompt_tokens", "Prompt tokens submitted", lambda e: e.stats.prompt_tokens),
    (
        "finished_sequences",
        "Sequences finished or cancelled",
        lambda e: e.stats.finished_sequences,
    ),
    (
        "cancelled_sequences",
        "Sequences cancelled (client gone)",
        lambda e: e.stats.cancelled_sequences,
    ),
    (
        "prefix_cache_lookups",
        "Prompts looked up in the prefix cache",
        lambda e: e.stats.prefix_lookups,
    ),
    ("prefix_cache_hits", "Prompts that reused cached KV", lambda e: e.stats.prefix_hits),
    (
        "prefix_cache_reused_tokens",
        "Prompt tokens whose KV came from the cache",
        lambda e: e.stats.prefix_reused_tokens,
    ),
    (
        "embedded_inputs",
        "Inputs embedded (an embedding model's, POST /v1/embeddings and the others)",
        lambda e: e.stats.embedded_inputs,
    ),
    (
        "draft_tokens",
        "Tokens drafted (prompt lookup or a draft model) and verified (speculative decoding)",
        lambda e: e.stats.drafted_tokens,
    ),
    (
        "draft_tokens_accepted",
        "Drafted tokens the model agreed with, emitted without a pass of their own",
        lambda e: e.stats.accepted_tokens,
    ),
    (
        "prefix_cache_disk_loads",
        "Prompts started from KV read from the prefix cache's folder on disk",
        lambda e: e.stats.prefix_disk_loads,
    ),
)
ENGINE_GAUGES: tuple[tuple[str, str, Callable], ...] = (
    ("batch_size", "Sequences in the running batch", lambda e: e.stats.active_sequences),
    ("peak_batch_size", "Largest batch so far", lambda e: e.stats.peak_batch),
    ("pending_sequences", "Sequences submitted and not finished", lambda e: e.pending_sequences),
    (
        "queue_depth",
        "Sequences waiting for a batch slot",
        lambda e: max(0, e.pending_sequences - e.stats.active_sequences),
    ),
    (
        "tokens_per_second",
        "Generated tokens per second over the last seconds",
        lambda e: e.current_tokens_per_second(),
    ),
    (
        "prefix_cache_hit_ratio",
        "Prefix cache hits over lookups",
        lambda e: e.stats.prefix_hits / max(1, e.stats.prefix_lookups),
    ),
    (
        "prefix_cache_bytes",
        "Bytes of KV held by the prefix cache",
        lambda e: e.stats.prefix_cache_bytes,
    ),
    (
        "prefix_cache_disk_entries",
        "This model's files in the prefix cache's folder on disk",
        lambda e: e.stats.prefix_disk_entries,
    ),
)


class EngineCollector:
    """Each model's engine counters, labelled by model, read when Prometheus scrapes (no
    copies to keep in step)."""

    def __init__(self, pool):
        self.pool = pool

    def collect(self):
        engines = self.pool.engines
        for kind, family in ((ENGINE_COUNTERS, CounterMetricFamily), (ENGINE_GAUGES, None)):
            for name, help_text, read in kind:
                metric = (family or GaugeMetricFamily)(
                    f"mlxserve_{name}", help_text, labels=["model"]
                )
                for engine in engines:
                    metric.add_metric([engine.model_name], read(engine))
                yield metric
        restarts = getattr(self.pool, "restarts", None)  # the engine's own process (ipc/)
        if restarts is not None:
            metric = CounterMetricFamily(
                "mlxserve_engine_restarts", "Engine processes restarted after dying"
            )
            metric.add_metric([], restarts)
            yield metric


class Telemetry:
    """One app's metrics."""

    def __init__(self, pool):
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(EngineCollector(pool))
        self.requests = Counter(
            "mlxserve_http_requests",
            "HTTP requests answered, by route and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.first_token = Histogram(
            "mlxserve_time_to_first_token_seconds",
            "From a generation request's hand-over to the engine to its first token",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.duration = Histogram(
            "mlxserve_generation_duration_seconds",
            "From a generation request's hand-over to the engine to its end (finished, "
            "cancelled or failed)",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

    async def timed(self, events: AsyncIterator) -> AsyncIterator:
        """`events` (an engine.submit iterator) passed through, timing its first token and end."""
        started = time.perf_counter()
        first = True
        try:
            async with aclosing(events):
                async for event in events:
                    if first and (event.token_ids or event.text or event.finish_reason):
                        first = False
                        self.first_token.observe(time.perf_counter() - started)
                    yield event
        finally:
            self.duration.observe(time.perf_counter() - started)


def install(app: Quart) -> None:
    disable_created_metrics()  # `_created` timestamps per series: noise for a single server
    telemetry = Telemetry(app.config["POOL"])
    app.config[TELEMETRY] = telemetry

    @app.after_request
    async def count(response):
        rule = request.url_rule.rule if request.url_rule is not None else "unmatched"
        telemetry.requests.labels(rule, request.method, str(response.status_code)).inc()
        return response


def timed(events: AsyncIterator) -> AsyncIterator:
    """Time a generation's events on this app's histograms (call it inside the request)."""
    return current_app.config[TELEMETRY].timed(events)


@blueprint.get("/metrics")
async def metrics():
    registry = current_app.config[TELEMETRY].registry
    return Response(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
