"""Fill-in-the-middle: each code family's template, detected from the tokenizer's vocabulary, and
the infill prompt built the way llama.cpp's /infill builds it (REFERENCE §3).

The prompt is assembled from token ids, never from rendered text: the user's code is tokenized
with its special tokens split, so a "<fim_suffix>" typed in a file stays text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .planning.defaults import fills_context

# llama.cpp's batch size: the prefix keeps up to 3/4 of it, the suffix up to 1/4.
INFILL_BATCH_TOKENS = 2048
EXTRA_RESERVE_TOKENS = 128  # llama.vim's n_predict: other files leave room for twice this
CONFIG_KEY = "fim_template"  # where a model's config.json names its template
REPO_NAME = "project"  # the repo-level header's name (llama.cpp has no input for it either)
CURRENT_FILE = "filename"  # llama.cpp's placeholder for the file being edited


@dataclass(frozen=True)
class FimTemplate:
    """One family's special tokens, by their text in the vocabulary.

    `requires` must all be present for the family to be detected (it tells apart families that
    share the FIM tokens); the other optional tokens are used when present.
    """

    name: str
    models: str  # for --help and errors
    prefix: str
    suffix: str
    middle: str | None  # None: the prompt ends after the prefix (Codestral)
    suffix_first: bool = False  # SPM order: suffix, then prefix
    repo_name: str | None = None
    file_sep: str | None = None
    stops: tuple[str, ...] = ()  # besides the FIM tokens themselves: what ends a middle
    requires: tuple[str, ...] = ()


TEMPLATES: tuple[FimTemplate, ...] = (
    FimTemplate(
        "codegemma",
        "CodeGemma",
        "<|fim_prefix|>",
        "<|fim_suffix|>",
        "<|fim_middle|>",
        stops=("<|file_separator|>",),
        requires=("<|file_separator|>",),
    ),
    FimTemplate(
        "qwen",
        "Qwen2.5-Coder, Qwen3-Coder",
        "<|fim_prefix|>",
        "<|fim_suffix|>",
        "<|fim_middle|>",
        repo_name="<|repo_name|>",
        file_sep="<|file_sep|>",
        stops=("<|fim_pad|>", "<|endoftext|>"),
    ),
    FimTemplate(
        "starcoder",
        "StarCoder, StarCoder2, SmolLM",
        "<fim_prefix>",
        "<fim_suffix>",
        "<fim_middle>",
        repo_name="<repo_name>",
        file_sep="<file_sep>",
        stops=("<fim_pad>", "<|endoftext|>"),
    ),
    FimTemplate(  # never detected: named by --fim-template or the model's config.json
        "starcoder-spm",
        "StarCoder's tokens in llama.cpp's --spm-infill order (models fine-tuned suffix first)",
        "<fim_prefix>",
        "<fim_suffix>",
        "<fim_middle>",
        suffix_first=True,
        repo_name="<repo_name>",
        file_sep="<file_sep>",
        stops=("<fim_pad>", "<|endoftext|>"),
    ),
    FimTemplate(
        "codellama",
        "CodeLlama",
        "▁<PRE>",
        "▁<SUF>",
        "▁<MID>",
        stops=("▁<EOT>",),
    ),
    FimTemplate(
        "deepseek",
        "DeepSeek-Coder",
        "<｜fim▁begin｜>",
        "<｜fim▁hole｜>",
        "<｜fim▁end｜>",
        stops=("<｜end▁of▁sentence｜>",),
    ),
    FimTemplate(
        "codestral",
        "Codestral, suffix first",
        "[PREFIX]",
        "[SUFFIX]",
        None,
        suffix_first=True,
        requires=("[SUFFIX]", "[PREFIX]"),
    ),
)
TEMPLATE_NAMES = tuple(t.name for t in TEMPLATES)


class FimError(ValueError):
    """A model without the tokens an infill needs; the message names the model's situation."""


@dataclass(frozen=True)
class Fim:
    """A template resolved against one vocabulary: token ids ready to assemble prompts from."""

    template: FimTemplate
    prefix: int
    suffix: int
    middle: int | None
    repo_name: int | None
    file_sep: int | None
    stop_ids: tuple[int, ...]  # every FIM token and stop of the template the vocabulary has

    @property
    def name(self) -> str:
        return self.template.name


def _resolve(template: FimTemplate, vocab: Mapping[str, int]) -> Fim | None:
    def token(text: str | None) -> int | None:
        if text is None:
            return None
        # Some conversions drop CodeLlama's leading "▁" from its control tokens.
        return vocab.get(text, vocab.get(text.removeprefix("▁")) if text.startswith("▁") else None)

    core = [token(template.prefix), token(template.suffix)]
    if template.middle is not None:
        core.append(token(template.middle))
    if any(t is None for t in core) or any(token(r) is None for r in template.requires):
        return None
    names = (
        template.prefix,
        template.suffix,
        template.middle,
        template.repo_name,
        template.file_sep,
        *template.stops,
    )
    stops = tuple(dict.fromkeys(t for t in map(token, names) if t is not None))
    return Fim(
        template,
        prefix=core[0],
        suffix=core[1],
        middle=core[2] if template.middle is not None else None,
        repo_name=token(template.repo_name),
        file_sep=token(template.file_sep),
        stop_ids=stops,
    )


def fim_token_names() -> str:
    """The FIM tokens the known templates look for, for an error that says what is missing."""
    sets = dict.fromkeys(
        "/".join(x for x in (t.prefix, t.suffix, t.middle) if x) for t in TEMPLATES
    )
    return "none of " + ", ".join(sets)


def detect_fim(vocab: Mapping[str, int], name: str | None = None) -> Fim | None:
    """The model's FIM template: the one named (`--fim-template`), else the first family whose
    tokens the vocabulary has. None when it has none (or "none" was named)."""
    if name == "none":
        return None
    if name is not None:
        template = next((t for t in TEMPLATES if t.name == name), None)
        if template is None:
            raise FimError(f"unknown FIM template {name!r}; known: {', '.join(TEMPLATE_NAMES)}")
        fim = _resolve(template, vocab)
        if fim is None:
            raise FimError(
                f"the model's vocabulary lacks the {name} FIM tokens "
                f"({template.prefix}, {template.suffix}"
                + (f", {template.middle}" if template.middle else "")
                + ")"
            )
        return fim
    for template in TEMPLATES:
        fim = _resolve(template, vocab)
        if fim is not None:
            return fim
    return None


def model_fim(
    vocab: Mapping[str, int], config: Mapping[str, object], named: str | None = None
) -> Fim | None:
    """A model's FIM template: `named` (--fim-template), else the one its config.json names
    (a model fine-tuned on one order says so), else detected from the vocabulary."""
    declared = config.get(CONFIG_KEY)
    return detect_fim(vocab, named or (declared if isinstance(declared, str) else None))


def fim_prompt(fim: Fim, prefix: Sequence[int], suffix: Sequence[int]) -> list[int]:
    """The template's tokens around already-cut prefix and suffix ids, in its order."""
    head = [fim.prefix, *prefix]
    tail = [fim.suffix, *suffix]
    body = tail + head if fim.template.suffix_first else head + tail
    return body if fim.middle is None else [*body, fim.middle]


@dataclass(frozen=True)
class InfillParts:
    """What an editor sends: the code before and after the cursor, the current line's start
    (llama.cpp's `prompt`, appended to the prefix) and chunks of other files."""

    prefix: str | Sequence[int]  # text, or token ids (a token prompt with `suffix`)
    suffix: str
    prompt: str = ""
    extra: Sequence[tuple[str, str]] = field(default_factory=tuple)  # (filename, text)


@dataclass(frozen=True)
class InfillPrompt:
    ids: tuple[int, ...]
    truncated: bool  # prefix, suffix or extra context did not fit whole
    healed: str = ""  # the prefix's trailing spaces, taken off for the middle to write again


def build_infill(
    fim: Fim,
    encode: Callable[[str], list[int]],
    parts: InfillParts,
    context_length: int,
    max_tokens: int | None,
    leading: Sequence[int] = (),
    heal: Callable[[list[int]], tuple[list[int], str]] | None = None,
) -> InfillPrompt:
    """The FIM prompt, within llama.cpp's budgets.

    Other files' chunks keep their newest tokens within what the context leaves after a batch
    (llama.cpp's 2048 tokens, at most half the context) and twice llama.vim's 128 predicted
    tokens. That share does not depend on the request's max_tokens, so llama.vim's warm-up
    (n_predict 0) leaves in the prefix cache exactly the tokens its next request starts with.
    Of what remains after the completion, the prefix keeps its last 3/4, the suffix its first
    1/4 less the current line's tokens; a completion that fills the context reserves a quarter
    of it. `encode` must not parse special tokens; `leading` is
    the tokenizer's BOS, when it adds one; `heal` takes trailing spaces off the prefix
    (sampling/token_healing.py).
    """
    extra = _repo_context(fim, encode, parts.extra)
    half = min(INFILL_BATCH_TOKENS, context_length // 2)
    extra_share = context_length - half - 2 * min(EXTRA_RESERVE_TOKENS, context_length // 8)
    take_extra = min(len(extra), max(0, extra_share))
    reserve = context_length // 4 if fills_context(max_tokens) else max_tokens
    room = context_length - take_extra - max(reserve, 1) - len(leading) - 4
    batch = max(8, min(INFILL_BATCH_TOKENS, room))
    suffix, prompt = encode(parts.suffix), encode(parts.prompt)
    if isinstance(parts.prefix, str):
        # The current line is tokenized with the text before it, as code reads in training: a
        # byte-level BPE merges the line break with the indentation after it.
        prefix = encode(parts.prefix + parts.prompt)
    else:
        prefix = [*parts.prefix, *prompt]
    take_prefix = min(len(prefix), 3 * (batch // 4) + len(prompt))
    take_suffix = min(len(suffix), max(0, batch // 4 - (2 + len(prompt))))
    kept, healed = prefix[len(prefix) - take_prefix :], ""
    if heal is not None:
        kept, healed = heal(kept)
    body = fim_prompt(fim, kept, suffix[:take_suffix])
    ids = [*leading, *extra[len(extra) - take_extra :], *body]
    truncated = (take_prefix, take_suffix, take_extra) != (len(prefix), len(suffix), len(extra))
    return InfillPrompt(tuple(ids), truncated, healed)


def _repo_context(
    fim: Fim, encode: Callable[[str], list[int]], chunks: Sequence[tuple[str, str]]
) -> list[int]:
    """Other files' chunks before the prompt: repo-level tokens when the model has them
    (`<repo_name>project`, then `<file_sep>name` + text per chunk, then the current file's
    `<file_sep>`), else llama.cpp's plain-text snippet separators. Nothing without chunks: a
    model trained on single files should not see an empty repo header on every request."""
    if not chunks:
        return []
    ids: list[int] = []
    if fim.repo_name is not None:
        ids += [fim.repo_name, *encode(REPO_NAME + "\n")]
    for filename, text in chunks:
        if fim.file_sep is not None:
            ids += [fim.file_sep, *encode(filename + "\n")]
        else:
            ids += encode("\n\n--- snippet ---\n\n")
        ids += encode(text)
    if fim.file_sep is not None:
        ids += [fim.file_sep, *encode(CURRENT_FILE + "\n")]
    return ids
