"""How a model splits over the ranks is decided before its weights load: tensor parallel where
its heads split, else a pipeline of its layers (mlx-lm's, or mlxserve's for any architecture
whose forward pass runs its layers alike), else a refusal with the numbers that would work
(SmolLM2's 9 heads over 2 ranks failed in its first forward pass with mlx-lm's shape error; it
now runs as a pipeline). A pipeline's layers go by each rank's memory. Rank 0 knows it is rank 0
from its launcher's variables, before MLX starts: its engine runs in a process of its own."""

from __future__ import annotations

import pytest
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes

from mlxserve.engine.cluster.launched import launched_rank
from mlxserve.engine.cluster.lockstep import DistributedError, LinkCosts, sharding
from mlxserve.engine.cluster.pipeline import pipeline_refusal, split_by_memory


def model(model_type: str, heads: int, kv_heads: int, layers: int = 2, mlp: int = 48):
    """mlx-lm's own model class for `model_type`, tiny."""
    config = {
        "model_type": model_type,
        "hidden_size": 16 * heads,
        "num_hidden_layers": layers,
        "intermediate_size": mlp,
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


def test_heads_that_do_not_split_run_as_a_pipeline_of_layers_in_any_uniform_architecture():
    """SmolLM2's shape (9 heads, 3 KV heads) over 2 ranks, and architectures mlx-lm has no
    pipeline for: a pipeline of their layers."""
    assert sharding(model("llama", 9, 3), 2) == "pipeline"
    for model_type in ("llama", "phi3", "gemma", "gemma2", "starcoder2", "olmo2", "internlm2"):
        assert pipeline_refusal(model(model_type, 4, 4)) is None, model_type


def test_an_mlp_that_does_not_split_runs_as_a_pipeline():
    """3 heads over 3 ranks split, but an MLP of 32 rows does not (mlx-lm's shard refused it
    at load: "Cannot shard the output of size 32 across 3 devices")."""
    assert sharding(model("llama", 3, 3, layers=3, mlp=32), 3) == "pipeline"


def test_measured_costs_choose_tensor_only_where_its_collectives_cost_less_than_it_saves():
    """A tensor split runs 2 collectives a layer each token and saves each rank the reading of
    the other ranks' share of the weights: slow links (or small models) pipeline instead."""
    tiny = model("llama", 4, 2)
    weights = sum(v.nbytes for _, v in tree_flatten(tiny.parameters()))
    slow_link = LinkCosts(collective_s=1e-3, read_bytes_per_s=1e10)  # a TCP ring
    assert not slow_link.tensor_pays(tiny, 2)
    assert sharding(tiny, 2, "auto", slow_link) == "pipeline"
    fast_link = LinkCosts(collective_s=1e-9, read_bytes_per_s=weights)  # 1 s to read them all
    assert fast_link.tensor_pays(tiny, 2)
    assert sharding(tiny, 2, "auto", fast_link) == "tensor"
    assert sharding(tiny, 2, "tensor", slow_link) == "tensor"  # as asked
    assert "collectives 4.00 ms a token" in slow_link.why(tiny, 2)


def test_a_layer_split_asks_for_a_pipeline_where_heads_would_split():
    assert sharding(model("llama", 4, 2), 2) == "tensor"
    assert sharding(model("llama", 4, 2), 2, "pipeline") == "pipeline"


def test_a_forward_pass_that_picks_layers_by_position_is_refused_saying_so():
    """Gemma 3 chooses each layer's mask by its index: on a rank holding layers 3-5 it would
    give layer 3 the mask of layer 0."""
    with pytest.raises(
        DistributedError,
        match=r"a pipeline of its layers cannot split gemma3_text models: its forward pass "
        r"treats each layer by its position",
    ):
        sharding(model("gemma3_text", 9, 3), 2)
    with pytest.raises(DistributedError, match="a pipeline was asked for, and gemma3_text"):
        sharding(model("gemma3_text", 4, 2), 2, "pipeline")


def test_a_pipeline_needs_a_layer_a_rank():
    with pytest.raises(
        DistributedError,
        match=r"\(2 or 4 ranks would\), and its 2 layers are too few for a pipeline of 3 ranks "
        r"\(at most 2 ranks would\)",
    ):
        sharding(model("qwen2", 4, 4, layers=2), 3)
    with pytest.raises(DistributedError, match="no number of ranks would"):
        sharding(model("llama", 8, 1, layers=2), 3)


@pytest.mark.parametrize(
    ("layers", "memory", "split"),
    [
        (30, [64, 16], [24, 6]),  # a 64 GB Mac and a 16 GB one
        (30, [1, 1], [15, 15]),
        (31, [1, 1], [16, 15]),  # as mlx-lm's even split: the low ranks take the extra
        (30, [1, 1, 1], [10, 10, 10]),
        (3, [100, 1, 1], [1, 1, 1]),  # every rank keeps a layer
        (22, [32, 16, 16], [11, 6, 5]),
    ],
)
def test_layers_go_by_each_ranks_memory(layers, memory, split):
    assert split_by_memory(layers, memory) == split


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
