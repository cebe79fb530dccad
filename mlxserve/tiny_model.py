"""Build a tiny random-weight Llama with a locally trained SentencePiece tokenizer.

Tests need a model that builds in seconds without any download: the tokenizer is trained on the
Python standard library's own sources (present on every machine), the weights are seeded noise.
scripts/make_tiny_model.py is its command line; tests build it through a session fixture.
"""

from __future__ import annotations

import json
import sys
import sysconfig
from collections.abc import Callable, Iterable
from pathlib import Path

import platformdirs

TINY_CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
TRAINING_TEXT_BYTES = 3_000_000
# The coder's special tokens, first in its vocabulary as in StarCoder's.
CODER_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<repo_name>",
    "<file_sep>",
    "<fim_prefix>",
    "<fim_middle>",
    "<fim_suffix>",
    "<fim_pad>",
)
FORMAT_VERSION = 1


def default_tiny_model_dir(seed: int = 0) -> Path:
    """Where scripts/make_tiny_model.py puts it by default: the user cache, a folder per seed."""
    cache = Path(platformdirs.user_cache_dir("mlxserve"))
    return cache / "models" / f"tiny-llama-v{FORMAT_VERSION}-seed{seed}"


def _stdlib_text(limit: int) -> str:
    """Concatenated standard-library sources, in a stable order, up to `limit` bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="ignore")
        chunks.append(text)
        total += len(text)
        if total >= limit:
            break
    return "".join(chunks)[:limit]


def train_sentencepiece(
    out: Path, lines: Iterable[str], tokenizer_config: dict, **options: object
) -> None:
    """Train a SentencePiece BPE tokenizer (byte fallback) on `lines` into `out`, then write what
    transformers needs to load it: tokenizer_config.json and tokenizer.json (REFERENCE §6).

    `options` are SentencePiece trainer options on top of the shared ones (vocab_size, ...).
    """
    import sentencepiece as spm

    corpus = out / "corpus.txt"
    corpus.write_text("\n".join(lines), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(out / "tokenizer"),
        model_type="bpe",
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        shuffle_input_sentence=False,
        input_sentence_size=0,
        minloglevel=2,
        **options,
    )
    corpus.unlink()
    (out / "tokenizer.vocab").unlink(missing_ok=True)
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(out)).save_pretrained(str(out))


def _train_tokenizer(out: Path, vocab_size: int) -> None:
    lines = [line for line in _stdlib_text(TRAINING_TEXT_BYTES).splitlines() if line.strip()]
    config = {
        "tokenizer_class": "LlamaTokenizer",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "add_eos_token": False,
        "model_max_length": TINY_CONFIG["max_position_embeddings"],
    }
    train_sentencepiece(
        out,
        lines,
        config,
        vocab_size=vocab_size,
        character_coverage=1.0,
        split_digits=True,
        num_threads=1,
    )


def _write_weights(
    out: Path, seed: int, config: dict, reshape: Callable[[dict], None] | None = None
) -> None:
    """`reshape`: changes the seeded weights (a dict of name to array) in place first."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    mx.random.seed(seed)
    model_class, args_class = _get_classes(config)  # llama, unless an override says otherwise
    model = model_class(args_class.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    if reshape is not None:
        reshape(weights)
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps(config, indent=2))


def _train_byte_level_tokenizer(
    out: Path,
    vocab_size: int,
    context: int = TINY_CONFIG["max_position_embeddings"],
    chat_template: str | None = None,
) -> None:
    """A byte-level BPE like StarCoder's (SmolLM's), with its FIM and file tokens as special
    tokens: what the demo model's tokenizer does to code, at a size that trains in seconds."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(CODER_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = _stdlib_text(TRAINING_TEXT_BYTES).splitlines(keepends=True)
    tokenizer.train_from_iterator(lines, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|im_start|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        model_max_length=context,
        clean_up_tokenization_spaces=False,
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(str(out))


CODER_CONFIG = TINY_CONFIG | {
    "bos_token_id": None,
    "eos_token_id": CODER_SPECIAL_TOKENS.index("<|endoftext|>"),
    "fim_template": "starcoder-spm",
}


def build_tiny_coder(out: Path, seed: int = 0, force: bool = False) -> Path:
    """The tiny model with the demo model's kind of vocabulary: StarCoder's FIM tokens in the SPM
    order its config.json names, so infill requests run end to end in milliseconds."""
    return _build(out, seed, force, _train_byte_level_tokenizer, CODER_CONFIG)


# Coding agents' prompts (tests/clients/): Claude Code's system prompt and tools are ~20k tokens
# of a real model's vocabulary, ~2x that in this small one's, so a 64k context; a vocabulary 4x the
# coder's, so those prompts take fewer tokens; ChatML, the model's own template, ending on
# <|im_end|>. One layer of one head: attention's scores are what a long prompt's prefill costs
# on a CPU (25k tokens: ~15 s on a core, 4 heads of 16 took 4x that).
AGENT_CONFIG = CODER_CONFIG | {
    "vocab_size": 4096,
    "num_hidden_layers": 1,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "max_position_embeddings": 65536,
    "tie_word_embeddings": False,  # its own output head: see _answer_briefly
    "eos_token_id": [
        CODER_SPECIAL_TOKENS.index("<|endoftext|>"),
        CODER_SPECIAL_TOKENS.index("<|im_end|>"),
    ],
}


def build_tiny_agent_model(out: Path, seed: int = 0, force: bool = False) -> Path:
    """The tiny coder with a long context and a ChatML chat template: the coding agents' real
    requests (a system prompt of tens of thousands of tokens, tools) end to end, fast on a CPU."""
    from .chat.templates import CHATML

    def train(out: Path, vocab_size: int) -> None:
        context = AGENT_CONFIG["max_position_embeddings"]
        _train_byte_level_tokenizer(out, vocab_size, context, CHATML)

    def reshape(weights: dict) -> None:
        vocab = json.loads((Path(out) / "tokenizer.json").read_text())["model"]["vocab"]
        _answer_briefly(weights, vocab['"'])

    return _build(out, seed, force, train, AGENT_CONFIG, reshape)


# Logits set through a coordinate every hidden state has, where random weights' spread ~1 (the
# largest of 4096 ~4, now and then more). <|im_end|>'s: greedy decoding ends at once, sampling
# at temperature 1 within a few tokens (a third a step); a random model's text otherwise runs to
# the context's end (greedy: a loop), and an agent whose answer max_tokens cut short asks again
# for more. A double quote's, below it: where a grammar rules <|im_end|> out, inside a tool
# call's JSON, a string ends within ~20 tokens (greedy: at once) rather than hundreds.
END_LOGIT = 8.0
QUOTE_LOGIT = 6.0
END_COORDINATE = 2.2  # the first coordinate after the final norm (measured)


def _answer_briefly(weights: dict, quote: int) -> None:
    """Every input embedding gets the same first coordinate, which no layer writes to, so the
    last hidden state always has it; only <|im_end|>'s and the double quote's output rows read
    it."""
    import mlx.core as mx

    embed = weights["model.embed_tokens.weight"]
    embed[:, 0] = 4 * mx.sqrt(mx.mean(embed * embed))
    for name, array in weights.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            array[0, :] = 0.0
    head = mx.array(embed)
    head[:, 0] = 0.0
    head[CODER_SPECIAL_TOKENS.index("<|im_end|>"), 0] = END_LOGIT / END_COORDINATE
    head[quote, 0] = QUOTE_LOGIT / END_COORDINATE
    weights["model.embed_tokens.weight"] = embed
    weights["lm_head.weight"] = head


def build_tiny_model(
    out: Path, seed: int = 0, force: bool = False, overrides: dict | None = None
) -> Path:
    """Build the model into `out` (idempotent: an existing complete build is reused);
    `overrides`: config keys changed (other head counts, say)."""
    return _build(out, seed, force, _train_tokenizer, TINY_CONFIG | (overrides or {}))


def _build(
    out: Path,
    seed: int,
    force: bool,
    train_tokenizer,
    config: dict,
    reshape: Callable[[dict], None] | None = None,
) -> Path:
    """Tokenizer, then seeded weights, into `out`; a `.complete` marker makes it idempotent."""
    out = Path(out)
    done = out / ".complete"
    if done.exists() and not force:
        return out
    out.mkdir(parents=True, exist_ok=True)
    train_tokenizer(out, config["vocab_size"])
    _write_weights(out, seed, config, reshape)
    done.write_text(json.dumps({"seed": seed, "python": sys.version.split()[0]}))
    return out


def build_tiny_adapter(base: Path, out: Path, seed: int = 0, rank: int = 4) -> Path:
    """A LoRA adapter for the model at `base`, in mlx-lm's format (what `mlx_lm.lora` writes),
    with random matrices on both sides: a trained adapter's zero-started side would leave the
    base's answers unchanged, and tests must tell the two apart."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.tuner.utils import linear_to_lora_layers
    from mlx_lm.utils import load_model

    out = Path(out)
    if (out / "adapters.safetensors").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    model, _ = load_model(Path(base))
    layers = len(model.layers)
    parameters = {"rank": rank, "scale": 2.0, "dropout": 0.0}
    linear_to_lora_layers(model, layers, parameters)
    mx.random.seed(seed)
    lora = {
        name: mx.random.normal(array.shape) * 0.5
        for name, array in tree_flatten(model.parameters())
        if name.rsplit(".", 1)[-1] in ("lora_a", "lora_b")
    }
    mx.save_safetensors(str(out / "adapters.safetensors"), lora)
    config = {"fine_tune_type": "lora", "num_layers": layers, "lora_parameters": parameters}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return out
