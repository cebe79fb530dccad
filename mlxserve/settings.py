"""Server settings: one place for every default and limit."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .speculation.ngram import DEFAULT_NGRAM_MAX, DEFAULT_NGRAM_MIN
from .speculation.planner import DEFAULT_DRAFT_TOKENS

# A running stream's longest gap while prompts prefill beside it, in times its usual gap
# (--max-stream-gap): the trade between its smoothness and the prompts' prefill time.
DEFAULT_MAX_STREAM_GAP = 3.0

# The embedded default: a small Python code model with fill-in-the-middle (its model card says
# how it was trained), shipped in the wheel: the first `mlxserve serve` downloads nothing.
DEFAULT_MODEL = Path(__file__).resolve().parent / "models" / "mlxserve-demo-coder"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
# Sequences that may wait beyond the running batch before new requests get 503 + Retry-After.
DEFAULT_MAX_QUEUED_SEQUENCES = 256
# --kv-bits and --kv-group-size: what MLX's quantized matmuls take.
QUANTIZED_KV_BITS = (4, 8)
QUANTIZED_KV_GROUP_SIZES = (32, 64, 128)
# The prefix cache's folder on disk when --prefix-cache-dir is not given ("none": off).
PREFIX_CACHE_DIR_ENV = "MLXSERVE_PREFIX_CACHE_DIR"


def default_prefix_cache_dir() -> Path:
    """Under the user's cache folder (~/Library/Caches on macOS, ~/.cache on Linux)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("mlxserve")) / "prefix-cache"


def prefix_cache_dir(value: str | None) -> Path | None:
    """--prefix-cache-dir's folder: None (not given) is the default, "none" is no folder."""
    if value is None:
        return default_prefix_cache_dir()
    if value.strip().lower() in ("none", ""):
        return None
    return Path(value).expanduser()


def machine_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 << 30


def default_memory_budget_bytes() -> int:
    """The resident models' weights: half of the machine's memory (the KV budget and the prefix
    cache take a quarter and an eighth of the rest)."""
    return machine_memory_bytes() // 2


def default_kv_budget_bytes() -> int:
    """KV cache for the requests in flight: a quarter of the machine's memory."""
    return machine_memory_bytes() // 4


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the server. Each is a `serve` flag; /openapi.json states them."""

    max_body_bytes: int = 8 * 1024 * 1024  # larger bodies get 413
    body_timeout_s: float = 30.0  # a body (or its headers) not received by then gets 408
    max_prompt_tokens: int | None = None  # None: the model's context window
    max_tokens: int = 32_768  # the most tokens one sequence may generate
    max_n: int = 128  # n and best_of
    max_sequences_per_request: int = 256  # prompts x best_of
    max_logprobs: int = 5  # OpenAI's completions limit (logprobs on /v1/completions)
    max_top_logprobs: int = 20  # OpenAI's chat limit (top_logprobs on /v1/chat/completions)
    max_n_probs: int = 100  # llama.cpp's n_probs on its routes (llama.cpp sets no limit)
    grammar_timeout_s: float = 10.0  # compiling a grammar or JSON schema
    request_timeout_s: float | None = 1800.0  # generation ends (finish_reason "length") after this


@dataclass(frozen=True)
class ChatSettings:
    """How /v1/chat/completions renders messages and reads answers, for every model served."""

    template: str | None = None  # Jinja text in place of the model's own; None: the model's
    template_source: str | None = None  # where it came from (a file, or "chatml"), for /v1/models
    tool_parser: str | None = None  # an mlx-lm tool parser's name, or "hermes"; None: inferred
    reasoning_format: str = "auto"  # "none": thinking text stays in content
    strict_tools: bool = False  # tools the provider runs (web search, ...): 400, not left out
    image_urls: bool = False  # fetch http(s) image URLs (--allow-image-urls); else a 400
    media_dir: str | None = None  # file:// images are read only inside this folder


@dataclass(frozen=True)
class SpeculationSettings:
    """Speculative decoding (speculation/): greedy rows draft the tokens that followed the
    latest earlier occurrence of their last n tokens (prompt lookup), or a draft model's,
    verified in the batch."""

    draft_tokens: int = DEFAULT_DRAFT_TOKENS  # the most drafts a row verifies a pass; 0: off
    ngram_min: int = DEFAULT_NGRAM_MIN
    ngram_max: int = DEFAULT_NGRAM_MAX
    draft_model: str | None = None  # drafts from this model (the default model's), not lookup
    fixed_width: bool = False  # draft all that is found, not the width timed to pay best

    def runs(self, distributed: bool, quantized_kv: bool) -> bool:
        """Whether drafting runs: not at 0 drafts, not over ranks (every rank's passes must be
        alike), not with quantized KV (not rolled back)."""
        return self.draft_tokens > 0 and not distributed and not quantized_kv


@dataclass(frozen=True)
class Settings:
    model: str  # the default model: requests naming no model (or one not served) get it
    models: tuple[str, ...] = ()  # more models served beside it, loaded at start
    pins: tuple[str, ...] = ()  # models (names or sources) never unloaded to make room
    adapters: tuple[tuple[str, str], ...] = ()  # (name, adapter folder) served on the default
    aliases: tuple[tuple[str, str], ...] = ()  # (name a client sends, model it gets)
    memory_budget_bytes: int = field(default_factory=default_memory_budget_bytes)
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: str | None = None
    limits: Limits = field(default_factory=Limits)
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call the API; () = CORS off
    drain_timeout_s: float = 30.0  # SIGTERM: requests in flight get this long to finish
    max_queued_sequences: int = DEFAULT_MAX_QUEUED_SEQUENCES
    kv_budget_bytes: int = field(default_factory=default_kv_budget_bytes)
    prefix_cache_bytes: int | None = None  # None: engine default from memory; 0: off
    prefix_cache_dir: Path | None = None  # long prompts' KV across restarts (None: not kept)
    prefix_cache_disk_bytes: int | None = None  # that folder's budget (None: from free space)
    kv_bits: int | None = None  # KV caches quantized to these bits (None: the model's dtype)
    kv_group_size: int = 64  # ... in groups of this many values
    speculation: SpeculationSettings = field(default_factory=SpeculationSettings)
    fim_template: str | None = None  # None: detected from the model's vocabulary
    chat: ChatSettings = field(default_factory=ChatSettings)
    models_dirs: tuple[str, ...] = ()  # folders of model folders, besides the HF cache, LM Studio
    allow_switch: bool = False  # a request's `model` may load another known model
    strict_model_names: bool = False  # a `model` the server does not serve: 404, not the loaded one
    strict_context: bool = False  # max_tokens beyond the context or the limit: 400, not clamped
    idle_unload_s: float | None = None  # free the model after this long without requests
    max_stream_gap: float | None = DEFAULT_MAX_STREAM_GAP  # None: prefill unbounded
    distributed: bool = False  # one model over the ranks mlx.launch started
    engine_in_process: bool = False  # the engine in the HTTP server's process (no ipc/)
    rank_timeout_s: float = 60.0  # distributed: a step waiting longer on the other ranks fails
    layer_split: tuple[int, ...] | None = None  # distributed: a pipeline's layers by rank
    parallel: str = "auto"  # distributed: "tensor", "pipeline", or measured at start

    @property
    def speculative(self) -> dict | None:
        """Drafting as /props and /v1/models tell it for the default model (prompt lookup, or
        its draft model), None where it is off (`SpeculationSettings.runs`, as the engine
        decides it)."""
        return self.speculative_for(default_model=True)

    def speculative_for(self, default_model: bool) -> dict | None:
        """The same for a model of the pool: `--draft-model` drafts for the default alone."""
        spec = self.speculation
        if not spec.runs(self.distributed, bool(self.kv_bits)):
            return None
        if spec.draft_model is not None and default_model:
            return {
                "type": "draft_model",
                "num_draft_tokens": spec.draft_tokens,
                "draft_model": spec.draft_model,
            }
        return {
            "type": "ngram",
            "num_draft_tokens": spec.draft_tokens,
            "ngram_min": spec.ngram_min,
            "ngram_max": spec.ngram_max,
        }
