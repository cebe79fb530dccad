"""The demo model's scripts: the infill middles it trains on, the bigram baseline it is scored
against, and llama.vim's requests the replay sends."""

from __future__ import annotations

import sys
from functools import partial
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


def test_psm_training_samples_are_laid_out_as_infill_renders_them_and_share_the_batch():
    """With --psm-share, that share of FIM samples is /infill's PSM (starcoder) prompt followed
    by the middle; the rest stay SPM."""
    from argparse import Namespace

    from demo_data import SourceFile
    from finetune_demo_model import Sampler

    from mlxserve.fim import InfillParts, build_infill, detect_fim

    from .test_fim import FAMILIES, encoder, family_tokenizer

    tokenizer = family_tokenizer(FAMILIES["starcoder"])
    args = Namespace(
        context=64, repo_rate=0.0, middle_weight=4.0, fim_rate=1.0, chat_rate=0.0, psm_share=0.75
    )
    stream = np.array(tokenizer.encode(CODE * 8, add_special_tokens=False), dtype=np.int32)
    sampler = Sampler(tokenizer, [SourceFile("f.py", CODE)], stream, args)
    fim = detect_fim(tokenizer.get_vocab(), "starcoder")
    orders = []
    for seed in range(200):
        tokens, _ = sampler.sample(np.random.default_rng(seed), spm=True)
        ids = tokens.tolist()
        psm = ids[0] == fim.prefix
        orders.append(psm)
        if psm:
            end = ids.index(fim.middle) + 1
            prefix = tokenizer.decode(ids[1 : ids.index(fim.suffix)])
            suffix = tokenizer.decode(ids[ids.index(fim.suffix) + 1 : end - 1])
            parts = InfillParts(prefix, suffix)
            assert ids[:end] == list(build_infill(fim, encoder(tokenizer), parts, 4096, 64).ids)
        else:
            assert ids[0] == fim.suffix
    assert 0.65 < sum(orders) / len(orders) < 0.85


def test_the_packages_get_their_share_of_samples_beside_the_standard_library():
    from argparse import Namespace

    from demo_data import SourceFile
    from finetune_demo_model import Sampler

    from .test_fim import FAMILIES, family_tokenizer

    tokenizer = family_tokenizer(FAMILIES["starcoder"])
    args = Namespace(context=16, repo_rate=0.0, middle_weight=4.0, stdlib_share=0.25)
    encode = partial(tokenizer.encode, add_special_tokens=False)
    stdlib, package = "x = 1\n" * 40, "import os\n" * 400  # the package's file is 10x longer
    streams = np.array(encode(stdlib), np.int32), np.array(encode(package), np.int32)
    sampler = Sampler(
        tokenizer,
        [SourceFile("a.py", stdlib)],
        streams[0],
        args,
        ([SourceFile("pkg/b.py", package)], streams[1]),
    )
    rng = np.random.default_rng(0)
    files = [sampler.random_file(rng).name for _ in range(2000)]
    assert 0.2 < files.count("a.py") / len(files) < 0.3
    windows = [sampler.left_to_right(rng) for _ in range(2000)]
    from_stdlib = sum(set(w.tolist()) <= set(streams[0].tolist()) for w in windows)
    assert 0.2 < from_stdlib / len(windows) < 0.3


METADATA = "Metadata-Version: 2.4\nName: {name}\nVersion: 1.0\n{licence}\n\nA package.\n"


def test_only_permissively_licensed_packages_are_kept():
    from demo_corpus import licence

    def declared(line: str) -> str | None:
        return licence(METADATA.format(name="p", licence=line))

    assert declared("License-Expression: MIT") == "MIT"
    assert declared("License-Expression: Apache-2.0 OR BSD-2-Clause") == "Apache"
    assert declared("Classifier: License :: OSI Approved :: BSD License") == "BSD"
    assert declared("License: ISC license") == "ISC"
    assert declared("License-Expression: GPL-3.0-or-later") is None
    assert declared("License: MIT\nClassifier: License :: OSI Approved :: GNU LGPL v3") is None
    assert declared("License: MPL-2.0") is None
    assert declared("Summary: no licence declared") is None


def test_package_files_are_deduplicated_decontaminated_and_capped(tmp_path):
    import zipfile

    from demo_corpus import select, wheel_sources

    held_out = "def held_out_function(argument):\n    return argument.do_something_distinctive()\n"
    own = "def {0}(value):\n    result_of_{0} = compute_the_value_of(value, {0})\n    return 1\n"
    wheel = tmp_path / "p-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(
            "p-1.0.dist-info/METADATA", METADATA.format(name="p", licence="License: MIT")
        )
        archive.writestr("p/a.py", own.format("alpha"))
        archive.writestr("p/copy.py", own.format("alpha"))  # the same text again
        archive.writestr("p/backport.py", held_out + own.format("beta"))  # half held-out lines
        archive.writestr("p/table.py", "DATA = [" + "1, " * 400 + "]\n")  # one long line: data
        archive.writestr("p/b.py", own.format("gamma"))
        archive.writestr("p/readme.txt", "not Python")
    found, files = wheel_sources(wheel)
    assert found == "MIT" and {name for name, _ in files} == {
        "p/a.py",
        "p/copy.py",
        "p/backport.py",
        "p/table.py",
        "p/b.py",
    }
    stdlib_texts = [held_out, "x = 1\n"]
    kept, report = select({"p": (found, files)}, stdlib_texts, [held_out])
    names = {name for name, _ in kept["p"]}
    assert len(names & {"p/a.py", "p/copy.py"}) == 1 and "p/b.py" in names
    assert report["p"]["duplicates"] == 1 and report["p"]["contaminated"] == 1
    assert report["p"]["not_code"] == 1 and report["p"]["kept"] == 2
    capped, report = select({"p": (found, files)}, stdlib_texts, [held_out], cap=100)
    assert report["p"]["kept"] == 1 and report["p"]["over_cap"] == 1
    unlicensed, report = select({"q": (None, files)}, stdlib_texts, [held_out])
    assert unlicensed == {} and report["q"]["kept"] == 0


def test_the_eval_cuts_prompts_as_infill_does():
    """eval_demo_model's prompt keeps what /infill keeps of a long prefix and suffix."""
    from eval_demo_model import InfillTask, ModelInfiller, infill_budget

    from mlxserve.fim import InfillParts, build_infill, detect_fim

    from .test_fim import FAMILIES, encoder, family_tokenizer

    tokenizer = family_tokenizer(FAMILIES["starcoder"])
    fim = detect_fim(tokenizer.get_vocab(), "starcoder")
    before = "".join(f"line_{i} = {i}\n" for i in range(800))
    after = "\n" + "".join(f"tail_{i} = {i}\n" for i in range(800))
    infiller = ModelInfiller.__new__(ModelInfiller)  # the prompt alone: no model loaded
    infiller.tokenizer, infiller.fim, infiller.budget = tokenizer, fim, infill_budget(2048)
    ids = infiller.prompt(InfillTask("f.py", before, "x = 1", after))
    served = build_infill(fim, encoder(tokenizer), InfillParts(before, after), 8192, 48)
    assert ids == list(served.ids)
    assert infill_budget(2048) == (1536, 510) and infill_budget(1024) == (768, 254)


def test_the_blend_chosen_keeps_the_anchors_chat_answers():
    from choose_demo_blend import best

    def candidate(alpha, exact, parse, chat):
        return {"alpha": alpha, "exact_match": exact, "parse_rate": parse, "chat": {"right": chat}}

    pure, mid, low = (
        candidate(1.0, 0.3, 0.8, 3),
        candidate(0.75, 0.28, 0.8, 5),
        candidate(0.5, 0.2, 0.9, 6),
    )
    assert best([pure, mid, low], anchor_chat=5) is mid  # the purest tune lost chat answers
    assert best([pure, mid, low], anchor_chat=3) is pure
    assert best([pure, mid], anchor_chat=7) is pure  # none keeps them: the best infiller
    tie = candidate(0.75, 0.3, 0.8, 3)
    assert best([tie, pure], anchor_chat=0) is pure  # a tie goes to the larger alpha
