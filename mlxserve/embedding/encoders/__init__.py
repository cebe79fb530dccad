"""Encoder architectures in MLX, their parameters named as in Hugging Face checkpoints. Each
family's model reads token ids into its first layer's input (`begin`), runs one layer at a time
(`run`) and closes (`end`), so that a batch may go through its layers over several engine
turns; its cross-encoder (a reranker) holds it as `encoder` and scores a pair (`score`)."""

from __future__ import annotations

from typing import Any

import mlx.nn as nn

from .bert import BertModel, CrossEncoder
from .common import EncoderFacts
from .gte import GteCrossEncoder, GteModel
from .modernbert import ModernBertCrossEncoder, ModernBertModel
from .nomic_bert import NomicBertModel

# model_type -> (its encoder, its cross-encoder or None where this server has none)
FAMILIES: dict[str, tuple[type, type | None]] = {
    "bert": (BertModel, CrossEncoder),
    "roberta": (BertModel, CrossEncoder),
    "xlm-roberta": (BertModel, CrossEncoder),
    "camembert": (BertModel, CrossEncoder),
    "modernbert": (ModernBertModel, ModernBertCrossEncoder),
    "nomic_bert": (NomicBertModel, None),
    "new": (GteModel, GteCrossEncoder),  # GTE v1.5 and gte-multilingual
}


def build(config: dict[str, Any], reranker: bool) -> nn.Module:
    """The family's network for `config` (weights not loaded); a ValueError saying why not."""
    model_type = config.get("model_type")
    encoder, cross_encoder = FAMILIES[model_type]
    if not reranker:
        return encoder.of(config)
    if cross_encoder is None:
        raise ValueError(f"{model_type} cross-encoders are not run by this server")
    return cross_encoder.of(config)


def facts(config: dict[str, Any]) -> EncoderFacts:
    return FAMILIES[config.get("model_type")][0].facts_of(config)
