"""Rerankers that are language models answering "yes" or "no" (Qwen3-Reranker): a (query,
document) pair is written into the model's judging prompt, and its score is the softmax of the
"yes" and "no" logits at the answer's position, sigmoid(yes - no). Their config says only that
they are Qwen3 causal models, so the folder's name tells them, as llama.cpp's converter and
vLLM's docs tell them (`is_original_qwen3_reranker`, vLLM's override, is read too). No MLX: the
front writes the prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ANSWERS = ("yes", "no")  # the tokens whose logits score a pair
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
# The model card's prompt: the part before the pair, the pair, the part after
HEAD = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
PAIR = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
TAIL = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
DECODER_TYPES = ("qwen3",)  # the families whose rerankers are written this way


def is_yes_no_reranker(folder: Path, config: dict[str, Any]) -> bool:
    """A Qwen3 causal model whose folder (or Hugging Face repository) is named a reranker."""
    if config.get("is_original_qwen3_reranker"):
        return True
    if config.get("model_type") not in DECODER_TYPES:
        return False
    folder = folder.resolve()
    names = [folder.name]
    if folder.parent.name == "snapshots":  # the Hugging Face cache's models--org--name/snapshots/…
        names.append(folder.parent.parent.name)
    return any("reranker" in name.lower() for name in names)


def pair_rows(
    tokenizer, query: str, documents: list[str], limit: int, instruction: str | None
) -> list[list[int]] | None:
    """Each (query, document) pair's prompt as token ids, its document cut from the end to fit
    `limit` tokens; None where even the query does not fit. `tokenizer`: a Hugging Face fast
    tokenizer. The prompt's fixed parts are encoded once for all the documents."""

    def encoded(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    task = instruction or DEFAULT_INSTRUCTION
    head, tail = encoded(HEAD), encoded(TAIL)
    room = limit - len(head) - len(tail)
    if len(encoded(PAIR.format(instruction=task, query=query, document=""))) > room:
        return None
    return [
        head + encoded(PAIR.format(instruction=task, query=query, document=d))[:room] + tail
        for d in documents
    ]
