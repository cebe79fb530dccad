"""Output constraints compiled to llguidance grammars, validated against the model's tokenizer.

Pure Python plus llguidance (no MLX): the API's planning thread compiles a request's constraint
here, so a bad grammar is a 400 before anything reaches the engine; the engine only builds a
matcher from the compiled text (sampling/grammar_mask.py).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

import llguidance
from llguidance import LLMatcher

# llguidance's grammar_from formats we use. "grammar" is GBNF or Lark (told apart by llguidance).
Kind = Literal["grammar", "lark", "regex", "json_schema", "choice", "llguidance"]
# JSON without free-form whitespace: a model (a random one above all) can otherwise pad forever
# between tokens. A schema's own "x-guidance" options still override this.
JSON_DEFAULTS: dict[str, Any] = {"whitespace_flexible": False}
CACHE_SIZE = 256


class GrammarError(ValueError):
    """The constraint does not compile; the message is the compiler's reason."""


@dataclass(frozen=True)
class Constraint:
    """One request's constraint: the field it came from (for errors), its kind and its text."""

    field: str
    kind: Kind
    text: str  # the grammar, regex or schema as text (JSON for schemas, choices and llguidance)


class GrammarCompiler:
    """Compiles constraints for one tokenizer.

    Compiled grammars are cached by the constraint's text (LRU), each with a prototype matcher:
    the engine thread deep-copies it per sequence (cheap) instead of parsing the grammar again.
    """

    def __init__(self, hf_tokenizer: Any, vocab_size: int, eos_token_ids: list[int]):
        import llguidance.hf

        # A tokenizer may hold more tokens than the model has logits (added tokens past the
        # embedding): llguidance needs every token, and a mask is cut to the logits it meets.
        vocab_size = max(vocab_size, len(hf_tokenizer))
        self.tokenizer = llguidance.hf.from_tokenizer(
            hf_tokenizer, n_vocab=vocab_size, eos_token=list(eos_token_ids)
        )
        self.vocab_size = vocab_size  # the masks' length
        self._texts: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._prototypes: OrderedDict[str, LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, constraint: Constraint) -> str:
        """The llguidance grammar for `constraint`; GrammarError with the compiler's reason."""
        key = (constraint.kind, constraint.text)
        with self._lock:
            if key in self._texts:
                self._texts.move_to_end(key)
                return self._texts[key]
        grammar = _grammar_text(constraint)
        prototype = self._new_matcher(grammar)
        with self._lock:
            _remember(self._texts, key, grammar)
            _remember(self._prototypes, grammar, prototype)
        return grammar

    def matcher(self, grammar: str) -> LLMatcher:
        """A fresh matcher at the grammar's start, for one sequence."""
        with self._lock:
            prototype = self._prototypes.get(grammar)
        if prototype is None:  # evicted since it was compiled
            prototype = self._new_matcher(grammar)
        return prototype.deep_copy()

    def _new_matcher(self, grammar: str) -> LLMatcher:
        matcher = LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(matcher.get_error())
        return matcher


def _grammar_text(constraint: Constraint) -> str:
    try:
        if constraint.kind == "json_schema":
            return LLMatcher.grammar_from_json_schema(constraint.text, defaults=dict(JSON_DEFAULTS))
        return llguidance.grammar_from(constraint.kind, constraint.text)
    except (ValueError, TypeError) as error:
        raise GrammarError(str(error)) from error


def _remember(cache: OrderedDict, key, value) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > CACHE_SIZE:
        cache.popitem(last=False)
