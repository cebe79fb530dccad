"""Tiny embedding models built in the tests, as tiny_model.py builds the tiny Llama: a BERT
encoder (a WordPiece vocabulary written out, seeded weights, mean pooling without Normalize, so
the doors that normalise can be told from those that do not) and a decoder embedding model
(the tiny Llama with a sentence-transformers Pooling module on its last token)."""

from __future__ import annotations

import json
import shutil
import string
from pathlib import Path

import numpy as np

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (
    "the a an is are was of to and in on for with def return class import from self print "
    "man woman child dog cat eating food bread baby girl carrying sky blue red green why how "
    "what python code file function value list string number hello world test"
).split()
TINY_BERT = {
    "architectures": ["BertModel"],
    "model_type": "bert",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "hidden_act": "gelu",
    "pad_token_id": 0,
}


def seeded_normal(seed: int):
    """normal(*shape, scale=0.2): float32 draws, in order, from one generator seeded `seed`."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return normal


def loaded(folder: Path):
    """(the folder's EmbeddingModel, its config.json), as the engine loads it."""
    from mlxserve.embedding.model import embedding_architecture, embedding_model, load_network

    network, config = load_network(folder, embedding_architecture(folder))
    return embedding_model(folder, network, config), config


def token_rows(folder: Path, texts: list[str]) -> list[list[int]]:
    """`texts` as the folder's own tokenizer writes them (special tokens included)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return [tokenizer.encode(text) for text in texts]


def vocabulary() -> list[str]:
    pieces = list(string.ascii_lowercase + string.digits + string.punctuation)
    return SPECIALS + pieces + [f"##{p}" for p in pieces] + WORDS


def build_tiny_cross_encoder(out: Path, seed: int = 1) -> Path:
    """A BertForSequenceClassification with one label, as cross-encoders are saved: the
    encoder's weights under `bert.`, its pooler, a `classifier` (no sentence-transformers
    modules)."""
    if (out / "model.safetensors").exists():
        return out
    from safetensors.numpy import save_file

    build_tiny_bert(out, seed)
    for name in ("modules.json", "model.safetensors"):
        (out / name).unlink()
    shutil.rmtree(out / "1_Pooling")
    config = json.loads((out / "config.json").read_text())
    config |= {"architectures": ["BertForSequenceClassification"], "id2label": {"0": "LABEL_0"}}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    weights = {f"bert.{k}": v for k, v in bert_weights(config, seed).items()}
    rng = np.random.default_rng(seed + 100)
    weights["classifier.weight"] = rng.standard_normal((1, config["hidden_size"])).astype(
        np.float32
    )
    weights["classifier.bias"] = np.array([0.1], np.float32)
    save_file(weights, str(out / "model.safetensors"))
    return out


def build_tiny_bert(out: Path, seed: int = 0, pooling: str = "mean", normalize=False) -> Path:
    """A BERT folder as sentence-transformers saves one (config, weights, tokenizer, modules)."""
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer
    from tokenizers.models import WordPiece
    from tokenizers.normalizers import BertNormalizer
    from tokenizers.pre_tokenizers import BertPreTokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    if (out / "model.safetensors").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    vocab = {token: i for i, token in enumerate(vocabulary())}
    tokenizer = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = BertPreTokenizer()
    tokenizer.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=TINY_BERT["max_position_embeddings"],
    )
    fast.save_pretrained(str(out))
    config = {**TINY_BERT, "vocab_size": len(vocab)}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_file(bert_weights(config, seed), str(out / "model.safetensors"))
    write_sentence_transformers(out, pooling, config["hidden_size"], normalize)
    prompts = {
        "prompts": {"query": "query: ", "document": "passage: "},
        "default_prompt_name": None,
    }
    (out / "config_sentence_transformers.json").write_text(json.dumps(prompts))
    return out


def bert_weights(config: dict, seed: int) -> dict[str, np.ndarray]:
    """Seeded weights under the Hugging Face checkpoint's names (a pooler too, as saved)."""
    normal = seeded_normal(seed)
    size, inner = config["hidden_size"], config["intermediate_size"]

    weights = {
        "embeddings.word_embeddings.weight": normal(config["vocab_size"], size, scale=1.0),
        "embeddings.position_embeddings.weight": normal(config["max_position_embeddings"], size),
        "embeddings.token_type_embeddings.weight": normal(config["type_vocab_size"], size),
        "embeddings.LayerNorm.weight": 1 + normal(size, scale=0.1),
        "embeddings.LayerNorm.bias": normal(size, scale=0.1),
        "pooler.dense.weight": normal(size, size),
        "pooler.dense.bias": normal(size),
    }
    for n in range(config["num_hidden_layers"]):
        layer = f"encoder.layer.{n}."
        for name in ("query", "key", "value"):
            weights[f"{layer}attention.self.{name}.weight"] = normal(size, size)
            weights[f"{layer}attention.self.{name}.bias"] = normal(size, scale=0.1)
        for name, (rows, cols) in (
            ("attention.output", (size, size)),
            ("intermediate", (inner, size)),
            ("output", (size, inner)),
        ):
            weights[f"{layer}{name}.dense.weight"] = normal(rows, cols)
            weights[f"{layer}{name}.dense.bias"] = normal(rows, scale=0.1)
        for name in ("attention.output", "output"):
            weights[f"{layer}{name}.LayerNorm.weight"] = 1 + normal(size, scale=0.1)
            weights[f"{layer}{name}.LayerNorm.bias"] = normal(size, scale=0.1)
    return weights


def build_tiny_decoder_embedder(tiny_model: Path, out: Path, normalize: bool = True) -> Path:
    """The tiny Llama as an embedding model: a Pooling module on its last token."""
    if (out / "modules.json").exists():
        return out
    shutil.copytree(tiny_model, out)
    config = json.loads((out / "config.json").read_text())
    write_sentence_transformers(out, "last", config["hidden_size"], normalize)
    return out


def write_sentence_transformers(out: Path, pooling: str, size: int, normalize: bool) -> None:
    """sentence-transformers' pipeline files: the model, a Pooling module, a Normalize one."""
    kinds = ["Transformer", "Pooling"] + (["Normalize"] if normalize else [])
    paths = ["", "1_Pooling", "2_Normalize"]
    modules = [
        {"idx": i, "name": str(i), "path": paths[i], "type": f"sentence_transformers.models.{k}"}
        for i, k in enumerate(kinds)
    ]
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    keys = {
        "cls": "pooling_mode_cls_token",
        "mean": "pooling_mode_mean_tokens",
        "max": "pooling_mode_max_tokens",
        "last": "pooling_mode_lasttoken",
    }
    pooling_config = {"word_embedding_dimension": size} | {
        k: k == keys[pooling] for k in keys.values()
    }
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config, indent=2))


TINY_MODERNBERT = {
    "model_type": "modernbert",
    "hidden_size": 32,
    "num_hidden_layers": 4,  # global, sliding, sliding, global
    "num_attention_heads": 4,
    "intermediate_size": 48,
    "max_position_embeddings": 64,
    "global_attn_every_n_layers": 3,
    "local_attention": 4,  # a window of 2 tokens each side: shorter than the test inputs
    "global_rope_theta": 160000.0,
    "local_rope_theta": 10000.0,
    "norm_eps": 1e-5,
    "norm_bias": False,
    "attention_bias": False,
    "mlp_bias": False,
    "hidden_activation": "gelu",
    "classifier_pooling": "mean",
    "classifier_activation": "gelu",
    "classifier_bias": False,
    "pad_token_id": 0,
}
TINY_NOMIC = {
    "model_type": "nomic_bert",
    "architectures": ["NomicBertModel"],
    "n_embd": 32,
    "n_head": 4,
    "n_layer": 2,
    "n_inner": 48,
    "n_positions": 64,
    "type_vocab_size": 2,
    "activation_function": "swiglu",
    "layer_norm_epsilon": 1e-12,
    "rotary_emb_fraction": 0.5,  # half of each head rotates, as the reference allows
    "rotary_emb_base": 1000,
    "rotary_emb_interleaved": False,
    "qkv_proj_bias": False,
    "mlp_fc1_bias": False,
    "mlp_fc2_bias": False,
    "prenorm": False,
    "pad_token_id": 0,
}


def _tokenizer_from_tiny_bert(out: Path) -> None:
    """The tiny BERT's WordPiece tokenizer files in `out` (these families' real ones are
    BPE or WordPiece too; the tests are about the network)."""
    source = build_tiny_bert(out.parent / f"{out.name}-tokenizer")
    out.mkdir(parents=True, exist_ok=True)
    for file in source.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "vocab")):
            shutil.copy(file, out / file.name)


def build_tiny_modernbert(out: Path, seed: int = 2, reranker: bool = False) -> Path:
    """A ModernBERT folder as Hugging Face saves one: `model.`-prefixed weights and its
    masked-LM head (an embedding model), or a one-label classification head (a reranker)."""
    from safetensors.numpy import save_file

    if (out / "model.safetensors").exists():
        return out
    _tokenizer_from_tiny_bert(out)
    vocab = len(vocabulary())
    architecture = "ModernBertForSequenceClassification" if reranker else "ModernBertForMaskedLM"
    config = TINY_MODERNBERT | {"vocab_size": vocab, "architectures": [architecture]}
    if reranker:
        config["id2label"] = {"0": "LABEL_0"}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    normal = seeded_normal(seed)
    size, inner = config["hidden_size"], config["intermediate_size"]

    weights = {
        "model.embeddings.tok_embeddings.weight": normal(vocab, size, scale=1.0),
        "model.embeddings.norm.weight": 1 + normal(size, scale=0.1),
        "model.final_norm.weight": 1 + normal(size, scale=0.1),
        "head.dense.weight": normal(size, size),
        "head.norm.weight": 1 + normal(size, scale=0.1),
    }
    for n in range(config["num_hidden_layers"]):
        layer = f"model.layers.{n}."
        if n:  # the first layer has no attention norm
            weights[layer + "attn_norm.weight"] = 1 + normal(size, scale=0.1)
        weights[layer + "attn.Wqkv.weight"] = normal(3 * size, size)
        weights[layer + "attn.Wo.weight"] = normal(size, size)
        weights[layer + "mlp_norm.weight"] = 1 + normal(size, scale=0.1)
        weights[layer + "mlp.Wi.weight"] = normal(2 * inner, size)
        weights[layer + "mlp.Wo.weight"] = normal(size, inner)
    if reranker:
        weights["classifier.weight"] = normal(1, size, scale=1.0)
        weights["classifier.bias"] = np.array([0.1], np.float32)
    else:
        weights["decoder.bias"] = normal(vocab)  # the masked-LM head's, tied to the embeddings
        write_sentence_transformers(out, "mean", size, normalize=True)
    save_file(weights, str(out / "model.safetensors"))
    return out


def build_tiny_nomic(out: Path, seed: int = 3) -> Path:
    """A NomicBERT folder as nomic-embed-text ships: its weights unprefixed, mean pooling and
    Normalize, and its task prefixes as sentence-transformers prompts."""
    from safetensors.numpy import save_file

    if (out / "model.safetensors").exists():
        return out
    _tokenizer_from_tiny_bert(out)
    vocab = len(vocabulary())
    config = TINY_NOMIC | {"vocab_size": vocab}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    normal = seeded_normal(seed)
    size, inner = config["n_embd"], config["n_inner"]

    weights = {
        "embeddings.word_embeddings.weight": normal(vocab, size, scale=1.0),
        "embeddings.token_type_embeddings.weight": normal(2, size),
        "emb_ln.weight": 1 + normal(size, scale=0.1),
        "emb_ln.bias": normal(size, scale=0.1),
    }
    for n in range(config["n_layer"]):
        layer = f"encoder.layers.{n}."
        weights[layer + "attn.Wqkv.weight"] = normal(3 * size, size)
        weights[layer + "attn.out_proj.weight"] = normal(size, size)
        weights[layer + "mlp.fc11.weight"] = normal(inner, size)
        weights[layer + "mlp.fc12.weight"] = normal(inner, size)
        weights[layer + "mlp.fc2.weight"] = normal(size, inner)
        for norm in ("norm1", "norm2"):
            weights[layer + f"{norm}.weight"] = 1 + normal(size, scale=0.1)
            weights[layer + f"{norm}.bias"] = normal(size, scale=0.1)
    save_file(weights, str(out / "model.safetensors"))
    write_sentence_transformers(out, "mean", size, normalize=True)
    prompts = {"prompts": {"query": "search_query: ", "document": "search_document: "}}
    (out / "config_sentence_transformers.json").write_text(json.dumps(prompts))
    return out


TINY_GTE = {
    "model_type": "new",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 48,
    "hidden_act": "gelu",
    "max_position_embeddings": 32,  # each row's query scale log(length) / log(32) differs
    "type_vocab_size": 0,
    "layer_norm_type": "layer_norm",
    "layer_norm_eps": 1e-12,
    "position_embedding_type": "rope",
    "rope_theta": 500000.0,
    "rope_scaling": {"type": "ntk", "factor": 2.0},
    "logn_attention_scale": True,
    "logn_attention_clip1": False,
    "pack_qkv": True,
    "pad_token_id": 0,
}


def build_tiny_gte(out: Path, seed: int = 4, *, reranker: bool = False) -> Path:
    """A GTE v1.5 folder ("new", as gte-base-en-v1.5 ships: CLS pooling and Normalize), or its
    reranker (`NewForSequenceClassification`, as gte-multilingual-reranker-base: `new.`-prefixed
    weights, a pooler and a one-label classifier)."""
    from safetensors.numpy import save_file

    if (out / "model.safetensors").exists():
        return out
    _tokenizer_from_tiny_bert(out)
    vocab = len(vocabulary())
    architecture = "NewForSequenceClassification" if reranker else "NewModel"
    config = TINY_GTE | {"vocab_size": vocab, "architectures": [architecture]}
    if reranker:
        config["id2label"] = {"0": "LABEL_0"}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    normal = seeded_normal(seed)
    size, inner = config["hidden_size"], config["intermediate_size"]
    prefix = "new." if reranker else ""

    weights = {
        "embeddings.word_embeddings.weight": normal(vocab, size, scale=1.0),
        "embeddings.LayerNorm.weight": 1 + normal(size, scale=0.1),
        "embeddings.LayerNorm.bias": normal(size, scale=0.1),
    }
    for n in range(config["num_hidden_layers"]):
        layer = f"encoder.layer.{n}."
        weights[layer + "attention.qkv_proj.weight"] = normal(3 * size, size)
        weights[layer + "attention.qkv_proj.bias"] = normal(3 * size)
        weights[layer + "attention.o_proj.weight"] = normal(size, size)
        weights[layer + "attention.o_proj.bias"] = normal(size)
        weights[layer + "mlp.up_gate_proj.weight"] = normal(2 * inner, size)
        weights[layer + "mlp.down_proj.weight"] = normal(size, inner)
        weights[layer + "mlp.down_proj.bias"] = normal(size)
        for norm in ("attn_ln", "mlp_ln"):
            weights[layer + f"{norm}.weight"] = 1 + normal(size, scale=0.1)
            weights[layer + f"{norm}.bias"] = normal(size, scale=0.1)
    weights = {prefix + name: value for name, value in weights.items()}
    if reranker:
        weights["new.pooler.dense.weight"] = normal(size, size)
        weights["new.pooler.dense.bias"] = normal(size)
        weights["classifier.weight"] = normal(1, size, scale=1.0)
        weights["classifier.bias"] = np.array([0.1], np.float32)
    else:
        write_sentence_transformers(out, "cls", size, normalize=True)
    save_file(weights, str(out / "model.safetensors"))
    return out


def build_tiny_yes_no_reranker(tiny_model: Path, out: Path) -> Path:
    """The tiny Llama as a language-model reranker (Qwen3-Reranker's kind): vLLM's marker in its
    config (a Llama is not a Qwen3 named a reranker), and "yes" in its vocabulary in place of a
    token no merge makes ("no" is one already)."""
    if (out / "config.json").exists():
        return out
    shutil.copytree(tiny_model, out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"is_original_qwen3_reranker": True}))
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    assert "no" in vocab and "yes" not in vocab
    vocab["yes"] = vocab.pop("Y")
    (out / "tokenizer.json").write_text(json.dumps(tokenizer))
    return out
