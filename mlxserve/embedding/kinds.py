"""What a model folder holds, read from its files without MLX (the front process lists models
too): an encoder or a cross-encoder of a family this server runs, a decoder with a
sentence-transformers pipeline, or none of these (a generation model)."""

from __future__ import annotations

from pathlib import Path

from ..registry import read_json
from .yes_no import is_yes_no_reranker

# The encoder families this server runs (encoders/__init__.py has their models)
ENCODER_TYPES = ("bert", "roberta", "xlm-roberta", "camembert", "modernbert", "nomic_bert", "new")
# Encoder families this server does not run yet: refused by name, not read as a decoder
OTHER_ENCODERS = ("jina_bert", "distilbert", "mpnet", "t5", "deberta-v2", "electra")
ENCODER, DECODER, RERANKER = "encoder", "decoder", "reranker"
YES_NO = "yes-no reranker"  # a language model judging a pair (yes_no.py)
OTHER = "other encoder"  # an encoder of a family in OTHER_ENCODERS


def embedding_architecture(folder: Path) -> str | None:
    """ENCODER, DECODER, RERANKER or YES_NO where the folder holds an embedding model or a
    reranker, else None: an encoder family's config (with a classification head: a
    cross-encoder), a language model named a reranker (yes_no.py), or a sentence-transformers
    pipeline over a decoder (a generation model without one is served for generation)."""
    config = read_json(folder / "config.json")
    if config.get("model_type") in ENCODER_TYPES:
        heads = [a for a in config.get("architectures") or [] if a.endswith("Classification")]
        return RERANKER if heads else ENCODER
    if config.get("model_type") in OTHER_ENCODERS:
        return OTHER
    if is_yes_no_reranker(folder, config):
        return YES_NO
    if (folder / "modules.json").is_file():
        return DECODER
    return None


def model_kind(folder: Path) -> str:
    """What the pool serves the folder's model for: "generate", "embed" or "rerank"."""
    architecture = embedding_architecture(folder)
    if architecture is None:
        return "generate"
    return "rerank" if architecture in (RERANKER, YES_NO) else "embed"
