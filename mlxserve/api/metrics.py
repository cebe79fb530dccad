"""GET /metrics: the engine's counters in Prometheus' text format (behind the API key, if any)."""

from __future__ import annotations

from quart import Blueprint, Response, current_app

blueprint = Blueprint("metrics", __name__)

# (name, type, help, how to read it from the engine)
METRICS = (
    ("decode_steps_total", "counter", "Batched decode steps run", lambda e: e.stats.decode_steps),
    ("generated_tokens_total", "counter", "Tokens generated", lambda e: e.stats.generated_tokens),
    ("prompt_tokens_total", "counter", "Prompt tokens submitted", lambda e: e.stats.prompt_tokens),
    (
        "finished_sequences_total",
        "counter",
        "Sequences finished or cancelled",
        lambda e: e.stats.finished_sequences,
    ),
    (
        "cancelled_sequences_total",
        "counter",
        "Sequences cancelled (client gone)",
        lambda e: e.stats.cancelled_sequences,
    ),
    ("batch_size", "gauge", "Sequences in the running batch", lambda e: e.stats.active_sequences),
    ("peak_batch_size", "gauge", "Largest batch so far", lambda e: e.stats.peak_batch),
    (
        "pending_sequences",
        "gauge",
        "Sequences submitted and not finished",
        lambda e: e.pending_sequences,
    ),
    (
        "queue_depth",
        "gauge",
        "Sequences waiting for a batch slot",
        lambda e: max(0, e.pending_sequences - e.stats.active_sequences),
    ),
    (
        "tokens_per_second",
        "gauge",
        "Generated tokens per second over the last seconds",
        lambda e: round(e.current_tokens_per_second(), 3),
    ),
    (
        "prefix_cache_lookups_total",
        "counter",
        "Prompts looked up in the prefix cache",
        lambda e: e.stats.prefix_lookups,
    ),
    (
        "prefix_cache_hits_total",
        "counter",
        "Prompts that reused cached KV",
        lambda e: e.stats.prefix_hits,
    ),
    (
        "prefix_cache_hit_ratio",
        "gauge",
        "Hits over lookups",
        lambda e: round(e.stats.prefix_hits / max(1, e.stats.prefix_lookups), 4),
    ),
    (
        "prefix_cache_reused_tokens_total",
        "counter",
        "Prompt tokens whose KV came from the cache",
        lambda e: e.stats.prefix_reused_tokens,
    ),
    (
        "prefix_cache_bytes",
        "gauge",
        "Bytes of KV held by the prefix cache",
        lambda e: e.stats.prefix_cache_bytes,
    ),
)


@blueprint.get("/metrics")
async def metrics():
    engine = current_app.config["ENGINE"]
    lines = []
    for name, kind, help_text, read in METRICS:
        lines += [
            f"# HELP mlxserve_{name} {help_text}.",
            f"# TYPE mlxserve_{name} {kind}",
            f"mlxserve_{name} {read(engine)}",
        ]
    return Response("\n".join(lines) + "\n", content_type="text/plain; version=0.0.4")
