"""mlxserve's command line: `mlxserve serve ...`. `--help` is the manual."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from typing import NoReturn

from .chat.tool_calls import parser_names
from .engine.cluster.launched import engine_in_front
from .fim import TEMPLATE_NAMES, TEMPLATES
from .flag_settings import LIMIT_FLAGS, settings_from_flags
from .flag_values import layer_split, memory_size, name_and_value, stream_gap
from .platform import reexec_for_cpu
from .settings import (
    DEFAULT_HOST,
    DEFAULT_MAX_QUEUED_SEQUENCES,
    DEFAULT_MAX_STREAM_GAP,
    DEFAULT_MODEL,
    DEFAULT_PORT,
    PREFIX_CACHE_DIR_ENV,
    QUANTIZED_KV_BITS,
    QUANTIZED_KV_GROUP_SIZES,
    Limits,
    default_prefix_cache_dir,
)
from .speculation.ngram import DEFAULT_NGRAM_MAX, DEFAULT_NGRAM_MIN
from .speculation.planner import DEFAULT_DRAFT_TOKENS


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each flag's default, except None: those flags' help says what happens instead."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


def version_text() -> str:
    """mlxserve's version and the MLX stack it runs on, from the installed packages' metadata
    (nothing is imported: `--version` answers at once)."""
    from .versions import installed

    def of(package: str) -> str:
        return installed(package) or "not installed"

    return f"mlxserve {of('mlxserve')} (mlx {of('mlx')}, mlx-lm {of('mlx-lm')})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlxserve",
        description="A local, OpenAI-compatible LLM server built on MLX.",
    )
    parser.add_argument("--version", action="version", version=version_text())
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="serve one model over HTTP",
        description="Serve one model over an OpenAI-compatible HTTP API "
        "(POST /v1/chat/completions, /v1/completions, GET /v1/models, GET /health).",
        formatter_class=DefaultsFormatter,
    )
    serve.add_argument(
        "--model",
        action="append",
        default=None,
        help="an mlx-lm model folder or Hugging Face repo id (repeatable: every one is served "
        "and loaded at start; the first answers requests that name no model); the default is "
        "mlxserve-demo-coder, a small Python code model with fill-in-the-middle that ships "
        "with mlxserve",
    )
    serve.add_argument(
        "--memory-budget",
        type=memory_size,
        default=None,
        metavar="SIZE",
        help="the resident models' weights together (e.g. 24G, 800M, 60%%): a model that does "
        "not fit unloads the least recently used idle ones first (default: half of this "
        "machine's memory)",
    )
    serve.add_argument(
        "--pin",
        action="append",
        default=[],
        metavar="MODEL",
        help="never unload this model (a --model, its name, or an --adapter's name) to make "
        "room for another (repeatable); it is loaded at start",
    )
    serve.add_argument(
        "--adapter",
        action="append",
        default=[],
        type=name_and_value,
        metavar="NAME=PATH",
        help="serve a LoRA adapter (mlx-lm's format, as mlx_lm.lora writes it) as the model "
        "NAME, on the weights of its base (the model its adapter_config.json names, else the "
        "first --model), shared in memory (repeatable)",
    )
    serve.add_argument(
        "--alias",
        action="append",
        default=[],
        type=name_and_value,
        metavar="NAME=MODEL",
        help="requests for model NAME (a name a client hard-codes: gpt-4o-mini, "
        "codellama:7b) get MODEL (repeatable)",
    )
    serve.add_argument("--host", default=DEFAULT_HOST, help="address to listen on")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on")
    serve.add_argument(
        "--api-key",
        default=os.environ.get("MLXSERVE_API_KEY"),
        help="require this key (Authorization: Bearer KEY) on every route but /health; "
        "defaults to $MLXSERVE_API_KEY (a flag shows in `ps`: prefer the variable or a file)",
    )
    serve.add_argument(
        "--api-key-file",
        default=os.environ.get("MLXSERVE_API_KEY_FILE"),
        metavar="PATH",
        help="read the API key from this file (its first line); defaults to $MLXSERVE_API_KEY_FILE",
    )
    serve.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let web pages from this origin (e.g. http://localhost:3000) call the API from a "
        "browser (repeatable); without it, no CORS headers are sent",
    )
    serve.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM or Ctrl-C, requests in flight get this long to finish (new ones get "
        "503); a second signal stops at once",
    )
    defaults = Limits()
    for flag, name, kind, help_text in LIMIT_FLAGS:
        serve.add_argument(flag, type=kind, default=getattr(defaults, name), help=help_text)
    serve.add_argument(
        "--kv-budget-mb",
        type=int,
        default=None,
        help="KV cache for requests in flight; one that can never fit gets a 400, one that "
        "cannot fit now a 503 (default: a quarter of this machine's memory)",
    )
    serve.add_argument(
        "--max-queue",
        type=int,
        default=DEFAULT_MAX_QUEUED_SEQUENCES,
        help="sequences that may wait beyond the running batch before new requests get 503",
    )
    serve.add_argument(
        "--prefix-cache-mb",
        type=int,
        default=None,
        help="KV kept for reuse by later prompts sharing a prefix; 0 turns it off "
        "(default: an eighth of this machine's memory, at most 8 GiB)",
    )
    serve.add_argument(
        "--kv-bits",
        type=int,
        choices=QUANTIZED_KV_BITS,
        default=None,
        help="hold the KV caches quantized to this many bits: about 3.5x (4) or 1.9x (8) more "
        "tokens in the same memory than 16-bit, for a small loss of quality (default: the "
        "model's own dtype)",
    )
    serve.add_argument(
        "--kv-group-size",
        type=int,
        choices=QUANTIZED_KV_GROUP_SIZES,
        default=64,
        help="values sharing a scale and a bias in quantized KV",
    )
    serve.add_argument(
        "--prefix-cache-dir",
        metavar="DIR",
        default=os.environ.get(PREFIX_CACHE_DIR_ENV),
        help="where prompts of 1,024 tokens or more keep their KV across restarts; none turns "
        f"it off (default: ${PREFIX_CACHE_DIR_ENV}, else {default_prefix_cache_dir()})",
    )
    serve.add_argument(
        "--prefix-cache-disk-mb",
        metavar="MB",
        type=int,
        default=None,
        help="that folder's budget; the least recently used files go first "
        "(default: a tenth of the disk's free space, at most 16 GiB)",
    )
    serve.add_argument(
        "--num-draft-tokens",
        metavar="N",
        type=int,
        default=DEFAULT_DRAFT_TOKENS,
        help="speculative decoding by prompt lookup: greedy requests draft up to N tokens a step "
        "from their own prompt and output, verified in the batch's pass (the same text; "
        "drafting adapts to what it gains); 0 turns it off (default: %(default)s; a request's "
        "num_draft_tokens overrides it, and makes a sampled request draft too)",
    )
    serve.add_argument(
        "--embedding-model",
        action="append",
        default=[],
        metavar="PATH|REPO",
        help="also serve this embedding model (repeatable): a sentence-transformers folder "
        "(BERT, RoBERTa, XLM-RoBERTa families; or an mlx-lm model with a Pooling module) for "
        "POST /v1/embeddings, Ollama's /api/embed and llama.cpp's /embedding",
    )
    serve.add_argument(
        "--draft-model",
        metavar="PATH|REPO",
        default=None,
        help="speculative decoding with this smaller model's drafts (it must share the default "
        "model's tokenizer) in place of prompt lookup; up to --num-draft-tokens a step",
    )
    serve.add_argument(
        "--spec-fixed-width",
        action="store_true",
        help="draft every token found, up to --num-draft-tokens, in every step that finds some "
        "(as llama.cpp and vLLM do), rather than the width timed to pay best on this machine",
    )
    serve.add_argument(
        "--spec-ngram-min",
        metavar="N",
        type=int,
        default=DEFAULT_NGRAM_MIN,
        help="shortest run of tokens looked up for drafts (default: %(default)s)",
    )
    serve.add_argument(
        "--spec-ngram-max",
        metavar="N",
        type=int,
        default=DEFAULT_NGRAM_MAX,
        help="longest run of tokens looked up for drafts, tried first (default: %(default)s)",
    )
    serve.add_argument(
        "--fim-template",
        choices=[*TEMPLATE_NAMES, "none"],
        default=None,
        help="fill-in-the-middle format for `suffix` and /infill: "
        + "; ".join(f"{t.name} ({t.models})" for t in TEMPLATES)
        + "; none turns infill off (default: detected from the model's special tokens)",
    )
    serve.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE|chatml",
        help="render chat messages with this Jinja file (or ChatML) in place of the model's own "
        "chat template (default: the model's; ChatML where it has none)",
    )
    serve.add_argument(
        "--tool-parser",
        choices=parser_names(),
        default=None,
        help="read tool calls in this syntax (hermes: <tool_call>{json}</tool_call>; the others "
        "are mlx-lm's) (default: the one mlx-lm picks from the chat template, else hermes)",
    )
    serve.add_argument(
        "--allow-image-urls",
        action="store_true",
        help="fetch images that requests give as http(s) URLs (10 s, 20 MB each); without it "
        "such an image is a 400 asking for a data URL",
    )
    serve.add_argument(
        "--media-dir",
        metavar="DIR",
        help="read images that requests give as file:// URLs, only inside DIR; without it "
        "file URLs are a 400",
    )
    serve.add_argument(
        "--strict-tools",
        action="store_true",
        help="a tool the provider would run (OpenAI's web_search, file_search, code_interpreter; "
        "Anthropic's server tools) gets 400; without it, such tools are left out of the prompt "
        "and named once in the log, so clients that send them by default (Codex, Claude Code) "
        "work",
    )
    serve.add_argument(
        "--reasoning-format",
        choices=["auto", "deepseek", "none"],
        default="auto",
        help="auto/deepseek: text in the template's thinking tags goes to reasoning_content; "
        "none: it stays in content (a request's reasoning_format wins)",
    )
    serve.add_argument(
        "--models-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of mlx-lm model folders to offer besides the Hugging Face cache and LM "
        "Studio's (repeatable); GET /v1/models lists them all",
    )
    serve.add_argument(
        "--allow-switch",
        action="store_true",
        help="a request's `model` may name any known model (GET /v1/models), which is then "
        "loaded beside the others within --memory-budget (without it, only POST /admin/load "
        "loads models not served from the start)",
    )
    serve.add_argument(
        "--strict-model-names",
        action="store_true",
        help="a request naming a model this server does not serve gets 404 (model_not_found); "
        "without it, the loaded model answers whatever name a client sends (the response's "
        "`model` says which), as llama.cpp and LM Studio do",
    )
    serve.add_argument(
        "--strict-context",
        action="store_true",
        help="a max_tokens that does not fit the context beside the prompt (or exceeds "
        "--max-tokens-limit) gets 400, as OpenAI answers; without it, max_tokens is lowered to "
        "what fits and generation stops when the context is full (finish_reason length)",
    )
    serve.add_argument(
        "--idle-unload",
        type=float,
        default=None,
        metavar="SECONDS",
        help="free the model's memory after this long without requests; the next one reloads it",
    )
    serve.add_argument(
        "--max-stream-gap",
        type=stream_gap,
        default=DEFAULT_MAX_STREAM_GAP,
        metavar="TIMES",
        help="a running stream's longest pause between tokens while other prompts prefill, in "
        "times its usual pause: lower keeps streams smoother, higher prefills new prompts "
        "faster; 'off': prefill as fast as possible",
    )
    serve.add_argument(
        "--distributed",
        action="store_true",
        help="serve one model over the ranks `mlx.launch` started (ring backend: a hostfile or "
        "--hosts): rank 0 serves HTTP, every rank holds a shard",
    )
    serve.add_argument(
        "--rank-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="with --distributed: a step that waits this long on the other ranks means one is "
        "gone: rank 0 fails the requests in flight with 503 and exits, the other ranks exit "
        "(5 s once a stop signal came)",
    )
    serve.add_argument(
        "--parallel",
        choices=("auto", "tensor", "pipeline"),
        default="auto",
        help="with --distributed: split each layer over the ranks (tensor: where the attention "
        "heads and MLP split evenly) or the layers (pipeline); auto: tensor where its "
        "collectives, timed at start, cost less than the weight reads it saves",
    )
    serve.add_argument(
        "--layer-split",
        type=layer_split,
        metavar="N,N,...",
        help="with --distributed: split the model as a pipeline of its layers, this many on each "
        "rank (rank 0 first), e.g. 8,22 (default: in proportion to each rank's memory)",
    )
    serve.add_argument(
        "--engine-in-process",
        action="store_true",
        help="run the engine inside the HTTP server's process, not in a supervised process of "
        "its own (then an engine crash ends the server)",
    )
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="how much the server logs (debug: each engine step's work)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.command == "serve":
        if argv is None:  # the real command line, not a caller's list
            if engine_in_front(args.engine_in_process, args.distributed):
                reexec_for_cpu()  # else the engine process is started under it
            exit_without_finalizing(serve(args))
        return serve(args)
    return 2


def exit_without_finalizing(code: int) -> NoReturn:
    """End the served process at once, its server and engine already stopped.

    A thread that used MLX keeps per-thread state in MLX's Python bindings whose destructor takes
    the GIL when the thread exits; if the interpreter is finalizing by then, the thread is ended
    inside that destructor and the process aborts ("terminate called without an active
    exception"): 1 run in ~15 of test_cli's SIGINT test, after the engine thread had finished.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve(args: argparse.Namespace) -> int:
    from .engine.models.sources import ModelLoadError, check_adapter_folder, check_model_source

    if args.layer_split and args.parallel == "tensor":
        print(
            "mlxserve: error: --layer-split splits the layers (a pipeline): it cannot go with "
            "--parallel tensor",
            file=sys.stderr,
        )
        return 2
    models = list(dict.fromkeys((args.model or [str(DEFAULT_MODEL)]) + args.embedding_model))
    try:
        for source in models + ([args.draft_model] if args.draft_model else []):
            check_model_source(source)
        for _, path in args.adapter:
            check_adapter_folder(path)
        if args.distributed and (len(models) > 1 or args.adapter):
            raise ModelLoadError("--distributed serves one model: no second --model or --adapter")
    except ModelLoadError as error:
        print(f"mlxserve: error: {error}", file=sys.stderr)
        return 2
    try:
        settings = settings_from_flags(args, models)
        if not args.distributed:  # there, rank 0 alone listens: it checks when it binds
            check_port_free(args.host, args.port)
    except ValueError as error:
        print(f"mlxserve: error: {error}", file=sys.stderr)
        return 2
    supervisor = None
    if not engine_in_front(settings.engine_in_process, settings.distributed):
        from .ipc.mlx_lm_text import use_text_only_mlx_lm
        from .ipc.supervisor import EngineSupervisor

        use_text_only_mlx_lm()  # before anything imports mlx-lm: the front loads no MLX
        supervisor = EngineSupervisor(settings)
        supervisor.spawn()  # now: its imports run while this process imports the HTTP server
    from .server import serve_forever

    return serve_forever(settings, supervisor)


def check_port_free(host: str, port: int) -> None:
    """Before the model loads (a minute, for some): a port another program listens on is a
    one-line error now, not a traceback after the load."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Hypercorn binds
        try:
            probe.bind((host, port))
        except OSError as error:
            raise ValueError(
                f"cannot listen on {host}:{port}: {error.strerror or error} "
                "(another server there? choose another with --port)"
            ) from error


if __name__ == "__main__":
    sys.exit(main())
