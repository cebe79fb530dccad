"""Tiny models trained to answer fixed requests in a family's own output, under that family's
real chat template and special tokens: so a test through the server's doors has the rendering,
the stop tokens and the reading back of reasoning and calls on one path.

A small Llama (mlx-lm's own class) is trained on each request's prompt as the template renders
it (today's date in it, the default reasoning effort) followed by the answer the family's model
would write, until it predicts every token of each answer: then its greedy answer is that one.
About a minute of a CPU's time.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mlxserve.tiny_families import _shared_tokenizer

TEMPLATES = Path(__file__).resolve().parents[1].parent / "shared" / "chat-templates"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        # in the order the ollama client sends a schema's keys (a template that prints the
        # tools as JSON renders one prompt for every door)
        "parameters": {
            "type": "object",
            "required": ["location"],
            "properties": {"location": {"type": "string", "description": "The city."}},
        },
    },
}
QUESTION = "What is the weather like in Paris today?"
REASONING, CONTENT = "The user asks about Paris.", "Paris is mild today."
CALL_REASONING = "Need the weather tool."


@dataclass(frozen=True)
class TrainedFamily:
    """A family's template, the special tokens it writes, what ends an answer, and the answers
    it is trained to give: to the question alone, and to it with the weather tool offered."""

    template: str
    special_tokens: tuple[str, ...]
    stop_tokens: tuple[str, ...]
    answer: str
    call: str
    reasons: bool = True  # its answers open with REASONING and CALL_REASONING
    bos: str | None = None  # the template's bos_token


HARMONY = TrainedFamily(
    template="openai-gpt-oss-120b.jinja",
    special_tokens=(
        "<|start|>",
        "<|end|>",
        "<|message|>",
        "<|channel|>",
        "<|constrain|>",
        "<|return|>",
        "<|call|>",
    ),
    stop_tokens=("<|return|>", "<|call|>"),
    answer=f"<|channel|>analysis<|message|>{REASONING}<|end|><|start|>assistant"
    f"<|channel|>final<|message|>{CONTENT}<|return|>",
    call=f"<|channel|>analysis<|message|>{CALL_REASONING}<|end|><|start|>assistant"
    '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"location":'
    '"Paris"}<|call|>',
)
_CHATML = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
QWEN3 = TrainedFamily(  # Hermes calls after <think>
    template="Qwen-Qwen3-0.6B.jinja",
    special_tokens=(*_CHATML, "<think>", "</think>", "<tool_call>", "</tool_call>"),
    stop_tokens=("<|im_end|>",),
    answer=f"<think>\n{REASONING}\n</think>\n\n{CONTENT}<|im_end|>",
    call=f"<think>\n{CALL_REASONING}\n</think>\n\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call><|im_end|>',
)
QWEN3_CODER = TrainedFamily(  # XML calls, no reasoning
    template="Qwen3-Coder.jinja",
    special_tokens=(*_CHATML, "<tool_call>", "</tool_call>"),
    stop_tokens=("<|im_end|>",),
    answer=f"{CONTENT}<|im_end|>",
    call="<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n"
    "</function>\n</tool_call><|im_end|>",
    reasons=False,
)
MINISTRAL = TrainedFamily(  # Ministral 3 / Magistral: [THINK], then [TOOL_CALLS]
    template="mistralai-Ministral-3-14B-Reasoning-2512.jinja",
    special_tokens=(
        "<s>",
        "</s>",
        "[INST]",
        "[/INST]",
        "[SYSTEM_PROMPT]",
        "[/SYSTEM_PROMPT]",
        "[AVAILABLE_TOOLS]",
        "[/AVAILABLE_TOOLS]",
        "[TOOL_CALLS]",
        "[ARGS]",
        "[THINK]",
        "[/THINK]",
        "[TOOL_RESULTS]",
        "[/TOOL_RESULTS]",
    ),
    stop_tokens=("</s>",),
    answer=f"[THINK]{REASONING}[/THINK]{CONTENT}</s>",
    call=f'[THINK]{CALL_REASONING}[/THINK][TOOL_CALLS]get_weather[ARGS]{{"location": "Paris"}}</s>',
    bos="<s>",
)
TRAINED_FAMILIES = {
    "harmony": HARMONY,
    "qwen3": QWEN3,
    "qwen3_coder": QWEN3_CODER,
    "ministral3": MINISTRAL,
}
CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}


def build_trained_family(family: TrainedFamily, name: str, steps: int = 600) -> Path:
    """The trained model, built once into the user's cache under a hash of all it is made
    from (so the suite's portable pass, and later runs, reuse the first pass's), staged and
    renamed into place (test workers building it at once never see half of it)."""
    import platformdirs

    template = (TEMPLATES / family.template).read_text()
    made_of = json.dumps([repr(family), template, CONFIG, steps], sort_keys=True)
    digest = hashlib.sha256(made_of.encode()).hexdigest()[:16]
    root = Path(platformdirs.user_cache_dir("mlxserve")) / "tests" / "trained"
    out = root / f"{name}-{digest}"
    if (out / ".complete").exists():
        return out
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        tokenizer = _tokenizer(family, template, staging)
        rows = _training_rows(family, tokenizer)
        model, config = _trained(rows, len(tokenizer), steps)
        config["eos_token_id"] = [tokenizer.convert_tokens_to_ids(t) for t in family.stop_tokens]
        _save(model, config, staging)
        (staging / ".complete").write_text("")
        try:
            os.replace(staging, out)
        except OSError:  # another worker's is in place
            if not (out / ".complete").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _tokenizer(family: TrainedFamily, template: str, out: Path):
    from transformers import PreTrainedTokenizerFast

    shared = _shared_tokenizer(out.parent.parent / "families")
    for file in shared.iterdir():
        if file.is_file() and file.name != ".complete":
            shutil.copyfile(file, out / file.name)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(out))
    tokenizer.add_special_tokens({"additional_special_tokens": list(family.special_tokens)})
    tokenizer.eos_token = family.stop_tokens[0]
    if family.bos is not None:
        tokenizer.bos_token = family.bos
    tokenizer.chat_template = template
    tokenizer.save_pretrained(str(out))
    return PreTrainedTokenizerFast.from_pretrained(str(out))


def _training_rows(family: TrainedFamily, tokenizer) -> list[tuple[list[int], int]]:
    """(tokens, where the answer starts) for each request."""
    messages = [{"role": "user", "content": QUESTION}]
    rows = []
    for tools, answer in ((None, family.answer), ([WEATHER_TOOL], family.call)):
        text = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer.encode(text, add_special_tokens=False)
        answer_ids = tokenizer.encode(answer, add_special_tokens=False)
        rows.append((ids + answer_ids, len(ids)))
    return rows


def _trained(rows, vocab: int, steps: int):
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx_lm.models import llama

    config = CONFIG | {"vocab_size": -(-vocab // 64) * 64}
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    longest = max(len(tokens) for tokens, _ in rows)
    inputs = mx.array([t[:-1] + [0] * (longest - len(t)) for t, _ in rows])
    # the answers' positions, flat: only they go through the head
    at = [(row, i) for row, (t, start) in enumerate(rows) for i in range(start - 1, len(t) - 1)]
    rows_at, positions = mx.array([r for r, _ in at]), mx.array([i for _, i in at])
    targets = mx.array([rows[r][0][i + 1] for r, i in at])

    def logits(model):
        hidden = model.model(inputs)[rows_at, positions]
        return model.model.embed_tokens.as_linear(hidden)

    def loss(model):
        return nn.losses.cross_entropy(logits(model), targets).mean()

    schedule = optim.cosine_decay(1e-2, steps, end=1e-4)
    optimizer = optim.Adam(learning_rate=schedule)
    step = nn.value_and_grad(model, loss)
    for number in range(steps):
        _, grads = step(model)
        optimizer.update(model, grads)
        mx.eval(model.parameters(), optimizer.state)
        if number % 10 == 9 and mx.all(mx.argmax(logits(model), axis=-1) == targets).item():
            return model, config
    raise RuntimeError(f"not trained to its answers in {steps} steps")


def _save(model, config: dict, out: Path) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps(config, indent=2))
