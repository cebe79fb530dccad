"""FIM templates: each family detected from a tokenizer built here with that family's special
tokens, and the infill prompt assembled in its order, within llama.cpp's budgets."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from mlxserve.fim import InfillParts, build_infill, detect_fim
from mlxserve.text import LineRules

CORPUS = ["def add(a, b):\n    return a + b\n", "print(add(1, 2))\n", "project\nfilename\n"]

FAMILIES = {
    "qwen": [
        "<|endoftext|>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
    ],
    "starcoder": [
        "<|endoftext|>",
        "<fim_prefix>",
        "<fim_middle>",
        "<fim_suffix>",
        "<fim_pad>",
        "<repo_name>",
        "<file_sep>",
    ],
    "codellama": ["<s>", "</s>", "▁<PRE>", "▁<MID>", "▁<SUF>", "▁<EOT>"],
    "deepseek": [
        "<｜begin▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
        "<｜fim▁hole｜>",
        "<｜fim▁begin｜>",
        "<｜fim▁end｜>",
    ],
    "codestral": ["<s>", "</s>", "[INST]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]"],
    "codegemma": [
        "<bos>",
        "<eos>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|file_separator|>",
    ],
}


def family_tokenizer(special: list[str]) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on a few lines, with the family's special tokens added."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer)
    fast.add_special_tokens({"additional_special_tokens": special})
    return fast


def encoder(tokenizer):
    return lambda text: tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)


def infill_text(family: str, parts: InfillParts, context: int = 4096, max_tokens: int = 64):
    tokenizer = family_tokenizer(FAMILIES[family])
    fim = detect_fim(tokenizer.get_vocab())
    assert fim is not None and fim.name == family
    built = build_infill(fim, encoder(tokenizer), parts, context, max_tokens)
    return tokenizer.decode(list(built.ids)), built, fim, tokenizer


PARTS = InfillParts(prefix="def add(a, b):\n", suffix="\nprint(add(1, 2))\n", prompt="    ")


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        (
            "qwen",
            "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\nprint(add(1, 2))\n<|fim_middle|>",
        ),
        (
            "starcoder",
            "<fim_prefix>def add(a, b):\n    <fim_suffix>\nprint(add(1, 2))\n<fim_middle>",
        ),
        ("codellama", "▁<PRE>def add(a, b):\n    ▁<SUF>\nprint(add(1, 2))\n▁<MID>"),
        (
            "deepseek",
            "<｜fim▁begin｜>def add(a, b):\n    <｜fim▁hole｜>\nprint(add(1, 2))\n<｜fim▁end｜>",
        ),
        (
            "codegemma",
            "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\nprint(add(1, 2))\n<|fim_middle|>",
        ),
        # Codestral is suffix first and has no middle token: the prefix runs into the middle.
        ("codestral", "[SUFFIX]\nprint(add(1, 2))\n[PREFIX]def add(a, b):\n    "),
    ],
)
def test_each_family_gets_its_template(family, expected):
    text, built, _, _ = infill_text(family, PARTS)
    assert text == expected
    assert not built.truncated


def test_codegemma_and_qwen_share_tokens_but_not_their_ends():
    _, _, gemma, tokenizer = infill_text("codegemma", PARTS)
    assert tokenizer.convert_tokens_to_ids("<|file_separator|>") in gemma.stop_ids
    _, _, qwen, tokenizer = infill_text("qwen", PARTS)
    for end in ("<|fim_pad|>", "<|file_sep|>", "<|endoftext|>"):
        assert tokenizer.convert_tokens_to_ids(end) in qwen.stop_ids


def test_a_vocabulary_without_fim_tokens_has_no_template():
    assert detect_fim(family_tokenizer(["<s>", "</s>"]).get_vocab()) is None


def test_a_named_template_overrides_and_a_missing_one_is_an_error():
    vocab = family_tokenizer(FAMILIES["qwen"]).get_vocab()
    assert detect_fim(vocab, "none") is None
    with pytest.raises(ValueError, match="lacks the starcoder FIM tokens"):
        detect_fim(vocab, "starcoder")
    with pytest.raises(ValueError, match="unknown FIM template"):
        detect_fim(vocab, "gpt")


def test_starcoder_spm_is_named_never_detected_and_puts_the_suffix_first():
    tokenizer = family_tokenizer(FAMILIES["starcoder"])
    assert detect_fim(tokenizer.get_vocab()).name == "starcoder"
    fim = detect_fim(tokenizer.get_vocab(), "starcoder-spm")
    built = build_infill(fim, encoder(tokenizer), PARTS, 4096, 64)
    assert tokenizer.decode(list(built.ids)) == (
        "<fim_suffix>\nprint(add(1, 2))\n<fim_prefix>def add(a, b):\n    <fim_middle>"
    )


def test_repo_level_tokens_frame_other_files_when_the_model_has_them():
    parts = InfillParts(prefix="x = 1\n", suffix="", extra=[("lib/a.py", "A = 2\n")])
    text, *_ = infill_text("qwen", parts)
    assert text == (
        "<|repo_name|>project\n<|file_sep|>lib/a.py\nA = 2\n<|file_sep|>filename\n"
        "<|fim_prefix|>x = 1\n<|fim_suffix|><|fim_middle|>"
    )
    text, *_ = infill_text("codellama", parts)  # no repo tokens: llama.cpp's plain separator
    assert text.startswith("\n\n--- snippet ---\n\nA = 2\n▁<PRE>x = 1\n")


def test_special_token_text_in_user_code_stays_text():
    parts = InfillParts(prefix="s = '<fim_suffix>'\n", suffix="")
    _, built, fim, _ = infill_text("starcoder", parts)
    assert list(built.ids).count(fim.suffix) == 1


def test_budgets_keep_the_end_of_the_prefix_and_the_start_of_the_suffix():
    prefix = "".join(f"line_{i} = {i}\n" for i in range(400))
    suffix = "".join(f"after_{i} = {i}\n" for i in range(400))
    text, built, _, _ = infill_text(
        "starcoder", InfillParts(prefix=prefix, suffix=suffix), context=512, max_tokens=64
    )
    assert built.truncated and len(built.ids) <= 512 - 64
    kept_prefix = text.split("<fim_suffix>")[0]
    kept_suffix = text.split("<fim_suffix>")[1].removesuffix("<fim_middle>")
    assert kept_prefix.endswith("line_399 = 399\n") and "line_0 = 0\n" not in kept_prefix
    assert kept_suffix.startswith("after_0 = 0\n") and "after_399" not in kept_suffix
    assert len(kept_prefix) > 2 * len(kept_suffix)  # 3/4 of the batch against 1/4


def test_n_indent_ends_at_a_line_indented_less_and_cuts_before_it():
    rules = LineRules(min_indent=4)
    assert rules.feed("x = 1").text == "x = 1" and not rules.seen_newline
    assert rules.feed("\n    y = 2\n  ").text == "\n    y = 2\n  "
    cut = rules.feed("  z = 3\n")
    assert not cut.stopped and rules.seen_newline  # "  " + "  z": indented 4, inside the block
    cut = rules.feed("\treturn x")
    assert cut.stopped and cut.text == "\t"  # one tab is less than 4: cut before "return"
    assert LineRules(min_indent=0).feed("a\nb\n").stopped is False


def test_other_files_are_cut_the_same_whatever_n_predict():
    """llama.vim's warm-up (n_predict 0) must leave in the prefix cache exactly the tokens its
    next request (n_predict 128) starts with, even when other files' chunks do not fit."""
    tokenizer = family_tokenizer(FAMILIES["starcoder"])
    fim = detect_fim(tokenizer.get_vocab())
    extra = [(f"pkg/m{i}.py", f"def add(a, b):\n    return a + {i}\n" * 8) for i in range(6)]
    parts = InfillParts(prefix="x = 1\n", suffix="", extra=extra)
    warm = build_infill(fim, encoder(tokenizer), parts, 512, 0)
    request = build_infill(fim, encoder(tokenizer), parts, 512, 128)
    assert warm.truncated and request.truncated
    start = list(request.ids).index(fim.prefix)
    assert list(warm.ids)[:start] == list(request.ids)[:start]


def test_the_current_line_is_tokenized_with_the_prefix_as_in_a_file():
    """llama.vim's `prompt` (the line up to the cursor) joins the prefix before tokenizing: a
    byte-level BPE merges a line break with the next line's indentation, as the model saw it."""
    tokenizer = family_tokenizer(FAMILIES["starcoder"])
    fim, encode = detect_fim(tokenizer.get_vocab()), encoder(tokenizer)
    parts = InfillParts(prefix="def add(a, b):\n", suffix="\n", prompt="    return ")
    built = build_infill(fim, encode, parts, 4096, 64)
    whole = encode(parts.prefix + parts.prompt)
    assert whole != encode(parts.prefix) + encode(parts.prompt)
    start = built.ids.index(fim.prefix) + 1
    assert list(built.ids[start : start + len(whole)]) == whole
