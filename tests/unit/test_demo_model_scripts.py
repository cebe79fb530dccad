"""The demo model's scripts: the infill middles it trains on, the bigram baseline it is scored
against, and llama.vim's requests the replay sends."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from eval_demo_model import bigram_successors  # noqa: E402
from finetune_demo_model import middle_span  # noqa: E402
from replay_llama_vim import request  # noqa: E402

# llama#fim's fields (llama.vim's autoload/llama.vim).
LLAMA_VIM_FIELDS = {
    "input_prefix",
    "input_suffix",
    "input_extra",
    "prompt",
    "n_predict",
    "n_indent",
    "top_k",
    "top_p",
    "stream",
    "samplers",
    "cache_prompt",
    "t_max_prompt_ms",
    "t_max_predict_ms",
    "response_fields",
}
CODE = "def f(a, b):\n    x = a + b\n\n    return x * 2\n\n\nprint(f(1, 2))\n"


def test_the_bigram_baseline_takes_each_tokens_most_frequent_successor():
    stream = np.array([1, 2, 1, 2, 1, 3, 5, 5, 5, 2, 70_000], dtype=np.int32)
    assert bigram_successors(stream) == {1: 2, 2: 1, 3: 5, 5: 5}


def test_training_middles_are_never_empty_and_mostly_whole_lines():
    whole_lines = 0
    for seed in range(200):
        lo, hi = middle_span(np.random.default_rng(seed), CODE)
        assert 0 <= lo < hi <= len(CODE) + 1 and CODE[lo:hi]
        starts_a_line = lo == 0 or CODE[lo - 1] == "\n"
        whole_lines += starts_a_line and bool(CODE[lo:hi].split("\n")[0].strip())
    assert whole_lines >= 0.8 * 200  # LINE_SPAN_RATE's share, and never a blank first line


def test_the_replay_sends_llama_vims_fields_and_rebuilds_the_file():
    lines = CODE.split("\n")
    index = lines.index("    return x * 2")
    body, before, after = request(lines, index, extra=[])
    assert set(body) == LLAMA_VIM_FIELDS
    assert body["prompt"] == "    return " and body["n_indent"] == 4
    assert body["samplers"] == ["top_k", "top_p", "infill"]
    assert before + "x * 2" + after == CODE
    sent = body["input_prefix"] + body["prompt"] + "x * 2" + body["input_suffix"]
    assert sent.rstrip("\n") == CODE.rstrip("\n")  # llama.vim ends the suffix with a newline


def test_spm_training_samples_are_laid_out_as_infill_renders_them():
    """A sample in SPM order is /infill's starcoder-spm prompt followed by the middle."""
    from argparse import Namespace

    from demo_data import SourceFile
    from finetune_demo_model import Sampler

    from mlxserve.fim import InfillParts, build_infill, detect_fim

    from .test_fim import FAMILIES, encoder, family_tokenizer

    tokenizer = family_tokenizer(FAMILIES["starcoder"])
    args = Namespace(context=64, repo_rate=0.0, middle_weight=4.0)
    stream = np.array(tokenizer.encode(CODE * 8, add_special_tokens=False), dtype=np.int32)
    sampler = Sampler(tokenizer, [SourceFile("f.py", CODE)], stream, args)
    fim = detect_fim(tokenizer.get_vocab(), "starcoder-spm")
    for seed in range(20):
        tokens, weights = sampler.fim(np.random.default_rng(seed), spm=True)
        ids = tokens.tolist()
        end = ids.index(fim.middle) + 1
        suffix = tokenizer.decode(ids[1 : ids.index(fim.prefix)])
        prefix = tokenizer.decode(ids[ids.index(fim.prefix) + 1 : end - 1])
        rendered = build_infill(fim, encoder(tokenizer), InfillParts(prefix, suffix), 4096, 64)
        assert ids[:end] == list(rendered.ids)
        assert weights[end] == 4.0 and weights[end - 1] == 1.0  # the middle weighs more
