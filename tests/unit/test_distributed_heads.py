"""How a model splits over the ranks is decided before its weights load: tensor parallel where
its heads split, pipeline parallel where mlx-lm has it for the architecture, else a refusal with
the numbers that would work (SmolLM2's 9 heads over 2 ranks failed in its first forward pass
with mlx-lm's shape error). Rank 0 knows it is rank 0 from its launcher's variables, before
MLX starts: its engine runs in a process of its own."""

from __future__ import annotations

import pytest
from mlx_lm.utils import _get_classes

from mlxserve.engine.cluster.launched import launched_rank
from mlxserve.engine.cluster.lockstep import DistributedError, sharding


def model(model_type: str, heads: int, kv_heads: int, layers: int = 2):
    """mlx-lm's own model class for `model_type`, tiny."""
    config = {
        "model_type": model_type,
        "hidden_size": 16 * heads,
        "num_hidden_layers": layers,
        "intermediate_size": 32,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": 16,
        "vocab_size": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
    }
    model_class, args_class = _get_classes(config)
    return model_class(args_class.from_dict(config))


@pytest.mark.parametrize(
    "model_type, heads, kv_heads, ranks",
    [("llama", 4, 2, 2), ("llama", 9, 3, 3), ("qwen2", 4, 2, 2)],
)
def test_heads_that_split_shard_by_tensors(model_type, heads, kv_heads, ranks):
    assert sharding(model(model_type, heads, kv_heads), ranks) == "tensor"


def test_heads_that_do_not_split_fall_back_to_a_pipeline_where_mlx_lm_has_one():
    assert sharding(model("qwen2", 3, 3), 2) == "pipeline"
    assert sharding(model("qwen2", 4, 1), 2) == "pipeline"


def test_without_a_pipeline_the_refusal_names_the_ranks_that_would_work():
    with pytest.raises(
        DistributedError,
        match=r"9 attention heads \(3 key/value heads\) do not split evenly over 2 ranks "
        r"\(3 ranks would\), and mlx-lm has no pipeline parallelism for llama models",
    ):
        sharding(model("llama", 9, 3), 2)
    with pytest.raises(DistributedError, match="no number of ranks would"):
        sharding(model("llama", 8, 1), 2)


def test_a_pipeline_needs_a_layer_a_rank():
    with pytest.raises(
        DistributedError,
        match=r"\(2 or 4 ranks would\), and its 2 layers are too few for a pipeline of 3 ranks",
    ):
        sharding(model("qwen2", 4, 4, layers=2), 3)


def test_an_architecture_with_neither_is_refused():
    with pytest.raises(DistributedError, match="gemma architecture supports neither"):
        sharding(model("gemma", 4, 4), 2)


@pytest.mark.parametrize(
    ("environment", "rank"),
    [
        ({"MLX_RANK": "0"}, 0),  # mlx.launch: ring, JACCL, NCCL
        ({"MLX_RANK": "2"}, 2),
        ({"OMPI_COMM_WORLD_RANK": "1"}, 1),  # mpirun: Open MPI
        ({"PMI_RANK": "0"}, 0),  # MPICH
        ({"MLX_RANK": ""}, None),
        ({}, None),
    ],
)
def test_the_launchers_rank_is_read_before_mlx_starts(environment, rank):
    assert launched_rank(environment) == rank
