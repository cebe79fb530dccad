"""What planning and the front doors read of a loaded model: its tokenizer and sizes, no weights
and no MLX. The engine's `LoadedModel` is these facts plus the model; the front process gets
them from the engine process (ipc/) with the tokenizer the engine loaded."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from ..chat.templates import image_placeholder
from ..fim import Fim
from ..sampling.grammars import GrammarCompiler
from ..sampling.token_healing import TokenTexts
from ..vision.folder import ImageTokens

PLAIN_KV = "kv"  # a layer's cache of one position a token, cut anywhere (cache_kinds.py)
# Engine features a model's architecture may rule out (`ModelFacts.features_off`'s keys)
SPECULATION = "speculation"
ROW_ISOLATION = "failed-row isolation"
MIXED_BATCHES = "mixed batches"


@dataclass
class ModelFacts:
    model_id: str
    path: str
    tokenizer: Any  # mlx-lm TokenizerWrapper
    context_length: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    kv_bytes_per_token: int = 0  # KV cache memory one token of one sequence takes
    fim: Fim | None = None  # its fill-in-the-middle template, when the vocabulary has one
    how_it_runs: str = ""  # what the platform does to it, its KV's kind included
    weight_bytes: int = 0  # memory its weights take, as this platform runs them (its own only)
    base_model: str | None = None  # an adapter's: the model whose weights it shares
    kind: str = "generate"  # or "embed": an embedding model (mlxserve/embedding/)
    dimensions: int = 0  # an embedding model's vector size
    matryoshka: bool = False  # its vectors may be cut short (`dimensions`), its config says
    prompts: dict[str, str] = field(default_factory=dict)  # an embedding model's instructions
    default_prompt: str | None = None  # the instruction put before every text, by name
    judges_pairs: bool = False  # a reranker that is a language model judging a prompt (yes_no.py)
    takes_images: bool = False  # a vision-language model served with its image side (vision/)
    image_tokens: ImageTokens | None = None  # how many tokens its images become
    cache_kinds: tuple[str, ...] = ()  # what its layers keep (mlx_lm_compat/cache_kinds.py)
    features_off: dict[str, str] = field(default_factory=dict)  # engine feature: why it is off
    _grammars: GrammarCompiler | None = field(default=None, repr=False)
    _grammars_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _token_texts: TokenTexts | None = field(default=None, repr=False)
    _image_placeholder: tuple[str | None] | None = field(default=None, repr=False)

    @property
    def keeps_checkpoints(self) -> bool:
        """Its caches cannot be cut to a shared prefix (sliding windows, linear attention):
        prompts are reused from snapshots taken where later ones may continue them."""
        return bool(self.cache_kinds) and self.cache_kinds != (PLAIN_KV,)

    @property
    def grammars(self) -> GrammarCompiler:
        """The grammar compiler for this tokenizer, built on first use (about a second)."""
        with self._grammars_lock:
            if self._grammars is None:
                self._grammars = GrammarCompiler(
                    self.tokenizer._tokenizer, self.vocab_size, list(self.eos_token_ids)
                )
            return self._grammars

    @property
    def image_placeholder(self) -> str | None:
        """The text the model's chat template writes for one image (Qwen's
        `<|vision_start|><|image_pad|><|vision_end|>`), or None where it writes none."""
        with self._grammars_lock:
            if self._image_placeholder is None:
                self._image_placeholder = (image_placeholder(self.tokenizer),)
            return self._image_placeholder[0]

    @property
    def token_texts(self) -> TokenTexts:
        """Each token's text, for token healing; built on first use (a fraction of a second)."""
        with self._grammars_lock:
            if self._token_texts is None:
                self._token_texts = TokenTexts.of(self.tokenizer._tokenizer)
            return self._token_texts
