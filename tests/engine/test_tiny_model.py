"""scripts/make_tiny_model.py: deterministic, and loadable by mlx-lm."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def digest(folder: Path) -> dict[str, str]:
    return {
        name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
        for name in ("model.safetensors", "tokenizer.json", "config.json")
    }


def build(out: Path, seed: int) -> None:
    subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "make_tiny_model.py"),
            "--out",
            str(out),
            "--seed",
            str(seed),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )


def test_same_seed_same_model_other_seed_other_weights(tmp_path, tiny_model):
    build(tmp_path / "again", seed=0)
    assert digest(tmp_path / "again") == digest(tiny_model)
    build(tmp_path / "other", seed=1)
    other = digest(tmp_path / "other")
    assert other["model.safetensors"] != digest(tiny_model)["model.safetensors"]
    assert other["tokenizer.json"] == digest(tiny_model)["tokenizer.json"]


def test_mlx_lm_loads_it_with_a_working_tokenizer(tiny_model):
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(tiny_model))
    ids = tokenizer.encode("def f(x):\n    return x")
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == "def f(x):\n    return x"


def test_the_agent_model_holds_an_agents_prompt_in_chatml_and_answers_briefly(tmp_path):
    """The coding agents' tier's model (tests/clients): a 64k context, the model's own ChatML
    template, and answers that end at once when greedy, not a loop to the context's end."""
    import mlx_lm

    from mlxserve.tiny_model import build_tiny_agent_model

    model, tokenizer = mlx_lm.load(str(build_tiny_agent_model(tmp_path / "agent")))
    assert tokenizer.model_max_length == 65536
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert mlx_lm.generate(model, tokenizer, prompt, max_tokens=64) == ""
