"""Loading an embedding model (mlxserve/embedding/) as a model of the pool: the same facts a
generation model gives the front (its tokenizer, its longest input), its kind and size."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ...embedding.kinds import ENCODER_TYPES, OTHER
from ...embedding.model import NotAnEmbeddingModel, embedding_model, load_network
from ...embedding.pooling import PoolingError
from ...platform import PlatformPolicy
from ...registry import read_json
from .host import LoadedModel, LoadProgress, eval_in_slices, weight_bytes
from .naming import model_id_for
from .sources import ModelLoadError, first_line


def load_embedding_model(
    folder: Path,
    architecture: str,
    source: str,
    policy: PlatformPolicy,
    progress: LoadProgress,
    between: Callable[[], None] | None = None,
    cluster=None,
) -> LoadedModel:
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    if cluster is not None and cluster.size > 1:
        raise ModelLoadError(f"{source}: an embedding model is served by one process, not ranks")
    if architecture == OTHER:
        family = read_json(folder / "config.json").get("model_type")
        raise ModelLoadError(
            f"{source}: {family} encoders are not supported yet; encoders of these families "
            f"are ({', '.join(ENCODER_TYPES)}), and decoders mlx-lm loads with a "
            "sentence-transformers Pooling module"
        )
    progress.enter("reading config and tokenizer", str(folder))
    try:
        tokenizer = load_tokenizer(folder)
        network, config = load_network(folder, architecture)
        model = embedding_model(folder, network, config)
    except (NotAnEmbeddingModel, PoolingError) as error:
        raise ModelLoadError(f"{source}: {error}") from error
    except Exception as error:
        raise ModelLoadError(f"could not load model {source}: {first_line(error)}") from error
    progress.enter("reading weights", progress.count_weights(folder))
    eval_in_slices(network, between)
    policy.prepare_model(network, evaluate=lambda m: eval_in_slices(m, between))
    eval_in_slices(network, between)
    return LoadedModel(
        model_id=model_id_for(source),
        path=str(source),
        model=model,
        tokenizer=tokenizer,
        context_length=model.max_tokens,
        vocab_size=int(config.get("vocab_size") or len(tokenizer.get_vocab())),
        eos_token_ids=tuple(sorted(getattr(tokenizer, "eos_token_ids", ()) or ())),
        bos_token_id=tokenizer.bos_token_id,
        weights_folder=folder,
        how_it_runs=_how_it_runs(model),
        weight_bytes=weight_bytes(network),
        kind=model.kind,
        dimensions=model.dimensions,
        matryoshka=bool(config.get("matryoshka_dimensions") or config.get("is_matryoshka")),
        prompts=model.prompts,
        default_prompt=model.default_prompt if model.default_prompt in model.prompts else None,
        judges_pairs=model.answer_ids is not None,
    )


def _how_it_runs(model) -> str:
    if model.answer_ids is not None:
        return 'a language model judging each (query, document) pair: "yes" against "no"'
    if model.kind == "rerank":
        return "cross-encoder: a score a (query, document) pair"
    normalised = ", normalised" if model.pooling.normalize else ""
    return f"{model.architecture} embeddings, {model.pooling.mode} pooling{normalised}"
