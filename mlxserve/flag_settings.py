"""The settings `mlxserve serve` builds from its flags, each value checked: a flag whose value
cannot be served raises ValueError (its one-line message is the command's error)."""

from __future__ import annotations

import argparse
from pathlib import Path

import jinja2

from .chat.templates import CHATML
from .flag_values import read_api_key
from .settings import ChatSettings, Limits, Settings, SpeculationSettings, prefix_cache_dir
from .speculation.ngram import MAX_NGRAM
from .speculation.planner import MAX_DRAFT_TOKENS

# (flag, Limits field, type, help): each request limit's flag; the defaults come from Limits.
LIMIT_FLAGS = (
    ("--max-body-bytes", "max_body_bytes", int, "largest request body accepted (larger: 413)"),
    (
        "--body-timeout",
        "body_timeout_s",
        float,
        "seconds a client may take to send its headers and body (slower: 408)",
    ),
    (
        "--max-prompt-tokens",
        "max_prompt_tokens",
        int,
        "longest prompt in tokens (longer: 400, or cut where the request asks to truncate); "
        "default: the model's context window",
    ),
    (
        "--max-tokens-limit",
        "max_tokens",
        int,
        "the most tokens one sequence may generate: a larger max_tokens is lowered to it "
        "(400 with --strict-context), and -1/null (until the context is full) stops here",
    ),
    ("--max-n", "max_n", int, "largest n and best_of"),
    ("--max-sequences", "max_sequences_per_request", int, "prompts x best_of per request"),
    ("--max-logprobs", "max_logprobs", int, "largest logprobs (OpenAI's completions)"),
    ("--max-top-logprobs", "max_top_logprobs", int, "largest top_logprobs (OpenAI's chat)"),
    ("--max-n-probs", "max_n_probs", int, "largest n_probs (llama.cpp's routes)"),
    (
        "--grammar-timeout",
        "grammar_timeout_s",
        float,
        "seconds a grammar or JSON schema may take to compile (longer: 400)",
    ),
    (
        "--request-timeout",
        "request_timeout_s",
        float,
        "seconds after which a request's generation ends with finish_reason 'length'; 0 = never",
    ),
)


def settings_from_flags(args: argparse.Namespace, models: list[str]) -> Settings:
    """What `args` asks for, serving `models` (the default first)."""
    api_key = read_api_key(args.api_key, args.api_key_file)
    limits = request_limits(args)
    chat = chat_settings(args)
    speculation = speculation_settings(args)
    memory = {}
    if args.kv_budget_mb is not None:
        memory["kv_budget_bytes"] = args.kv_budget_mb << 20
    if args.prefix_cache_mb is not None:
        memory["prefix_cache_bytes"] = args.prefix_cache_mb << 20
    memory["prefix_cache_dir"] = prefix_cache_dir(args.prefix_cache_dir)
    memory["kv_bits"], memory["kv_group_size"] = args.kv_bits, args.kv_group_size
    if args.prefix_cache_disk_mb is not None:
        memory["prefix_cache_disk_bytes"] = args.prefix_cache_disk_mb << 20
    if args.memory_budget is not None:
        memory["memory_budget_bytes"] = args.memory_budget
    return Settings(
        model=models[0],
        models=tuple(models[1:]),
        pins=tuple(args.pin),
        adapters=tuple(args.adapter),
        aliases=tuple(args.alias),
        host=args.host,
        port=args.port,
        api_key=api_key,
        limits=limits,
        cors_origins=tuple(args.cors_origin),
        drain_timeout_s=args.drain_timeout,
        max_queued_sequences=args.max_queue,
        fim_template=args.fim_template,
        chat=chat,
        models_dirs=tuple(args.models_dir),
        allow_switch=args.allow_switch,
        strict_model_names=args.strict_model_names,
        strict_context=args.strict_context,
        idle_unload_s=args.idle_unload,
        max_stream_gap=args.max_stream_gap,
        distributed=args.distributed,
        engine_in_process=args.engine_in_process,
        rank_timeout_s=args.rank_timeout,
        layer_split=args.layer_split,
        parallel=args.parallel,
        speculation=speculation,
        **memory,
    )


def chat_settings(args: argparse.Namespace) -> ChatSettings:
    """--chat-template (a Jinja file, or ChatML by name), --tool-parser, --reasoning-format."""
    template = source = None
    if args.chat_template is not None:
        source = args.chat_template
        if source.lower() == "chatml":
            template = CHATML
        else:
            path = Path(source).expanduser()
            try:
                template = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as error:
                raise ValueError(
                    f"--chat-template {source}: not a readable Jinja file, nor 'chatml' ({error})"
                ) from error
            try:
                jinja2.Environment().parse(template)
            except jinja2.TemplateSyntaxError as error:
                raise ValueError(
                    f"--chat-template {source}: line {error.lineno}: {error.message}"
                ) from error
    return ChatSettings(
        template=template,
        template_source=source,
        tool_parser=args.tool_parser,
        reasoning_format=args.reasoning_format,
        strict_tools=args.strict_tools,
        image_urls=args.allow_image_urls,
        media_dir=_media_dir(args.media_dir),
    )


def _media_dir(value: str | None) -> str | None:
    if value is None:
        return None
    folder = Path(value).expanduser()
    if not folder.is_dir():
        raise ValueError(f"--media-dir {value}: not a folder")
    return str(folder.resolve())


def speculation_settings(args: argparse.Namespace) -> SpeculationSettings:
    if not 0 <= args.num_draft_tokens <= MAX_DRAFT_TOKENS:
        raise ValueError(f"--num-draft-tokens must be 0 to {MAX_DRAFT_TOKENS}")
    if not 1 <= args.spec_ngram_min <= args.spec_ngram_max <= MAX_NGRAM:
        raise ValueError(
            f"--spec-ngram-min and --spec-ngram-max: need 1 <= min <= max <= {MAX_NGRAM}"
        )
    return SpeculationSettings(
        args.num_draft_tokens,
        args.spec_ngram_min,
        args.spec_ngram_max,
        args.draft_model,
        args.spec_fixed_width,
    )


def request_limits(args: argparse.Namespace) -> Limits:
    values = {name: getattr(args, flag[2:].replace("-", "_")) for flag, name, _, _ in LIMIT_FLAGS}
    for flag, name, _, _ in LIMIT_FLAGS:
        value = values[name]
        if value is not None and (value < 0 or value == 0 and name != "request_timeout_s"):
            raise ValueError(f"{flag} must be positive, got {value}")
    if values["request_timeout_s"] == 0:
        values["request_timeout_s"] = None
    return Limits(**values)
