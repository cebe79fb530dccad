"""Images beside text (issue 63), on a random-weight Qwen2-VL with SmolLM2's language model size
(30 layers of 576, 9 heads, 3 KV heads; a 4-layer vision tower), built here: no real vision
model is in the package registries.

1. Throughput: 4 image requests (one 224x224 image each: 64 image tokens) and 4 text requests,
   48 tokens each, sent to the server at once (chat, greedy, `ignore_eos`, drafting off),
   against mlx-vlm's own batch generation in-process on the same folder: its `batch_generate`
   over the 4 image prompts, then over the 4 text prompts (it does not batch text and images
   together). Generated tokens/s over the wall time; the ratio in each run.
2. The gap: a greedy text stream; once it has run 64 tokens, a chat with one 448x448 image (256
   image tokens) is sent; the stream's worst gap while that prompt is prefilled, over its
   median gap before (the server's bound: `--max-stream-gap`, 3).

`--passes`: in-process, the passes a 448x448 image's prefill takes beside streams (the patch
embedding, each vision block's attention and the rest of it): the longest over one stream's
decode step, with the attention cut by query rows (`vision/attention_rows.py`, as served) and
whole (its bound lifted), side by side in each run.

    python benchmarks/vision.py [--runs 3] [--tokens 48] [--passes]
"""

from __future__ import annotations

import base64
import io
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from common import (
    ROW_ERRORS,
    bench_parser,
    beside,
    mlxserve_command,
    print_median_ratios,
    print_table,
    reexec_for_cpu,
    row_failed,
    served,
    spawn,
)

TEXT = {
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 8, 8]},
}
VISION = {"depth": 4, "embed_dim": 256, "num_heads": 4}
IMAGE_TOKENS = 256  # the most an image becomes: a 448x448 one
REQUESTS = 4  # of each kind
QUESTION = "Describe the picture."
STORY = "Tell a story about a lighthouse."


def parse_args():
    parser = bench_parser("Images beside text: throughput against mlx-vlm, and a stream's gap")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--passes", action="store_true", help="the image's passes, in-process")
    return parser.parse_args()


def image_passes(language, tower, image: bytes) -> list[float]:
    """Seconds of each pass of the image's part of a prefill (before any prompt token)."""
    from mlx_lm.models.cache import make_prompt_cache

    text = tower.processor.tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}],
        tokenize=False,
        add_generation_prompt=True,
    )
    job = tower.prefill_in_passes(tower.prepare(text, [image]), lambda: make_prompt_cache(language))
    times = []
    while job.done_tokens == 0:
        start = time.perf_counter()
        job.advance(1)
        times.append(time.perf_counter() - start)
    return times


def decode_step_s(language, context: int = 128, steps: int = 16) -> float:
    """One stream's decode step, the median of `steps`, after `context` tokens."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(language)
    mx.eval(language(mx.array([list(range(1, context + 1))]), cache=cache))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        mx.eval(language(mx.array([[7]]), cache=cache))
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def passes_main(folder: Path, runs: int) -> int:
    """The longest image pass over a decode step, cut by rows and whole, in each run."""
    from mlxserve.engine.models.host import load_model
    from mlxserve.vision import attention_rows

    loaded = load_model(str(folder), calibrate=False)  # as the server loads it (the platform's)
    language, tower = loaded.model, loaded.vision
    step = decode_step_s(language)
    ratios: dict[str, list[float]] = {}
    bound = attention_rows.MAX_SCORES
    for run in range(runs):
        image = picture(448, 100 + run)
        found = {}
        for name, scores in (("whole", 1 << 62), ("rows", bound)):
            attention_rows.MAX_SCORES = scores
            image_passes(language, tower, image)  # warm: the shapes of its passes
            times = image_passes(language, tower, image)
            found[name] = times
            ratios.setdefault(f"longest image pass / decode step, {name}", []).append(
                max(times) / step
            )
        attention_rows.MAX_SCORES = bound
        ratios.setdefault("longest pass, rows / whole", []).append(
            max(found["rows"]) / max(found["whole"])
        )
        print(
            f"run {run + 1}: decode step {step * 1000:.0f} ms; "
            + "; ".join(
                f"{name}: {len(t)} passes, longest {max(t) * 1000:.0f} ms, all {sum(t):.2f} s"
                for name, t in found.items()
            ),
            flush=True,
        )
    print_median_ratios(ratios)
    return 0


def picture(size: int, seed: int) -> bytes:
    """A PNG of coloured squares, its colours from `seed`."""
    from PIL import Image

    image = Image.new("RGB", (size, size))
    for x in range(0, size, 16):
        for y in range(0, size, 16):
            colour = ((x * 7 + seed * 40) % 256, (y * 5 + seed * 90) % 256, (x + y) % 256)
            image.paste(colour, (x, y, x + 16, y + 16))
    data = io.BytesIO()
    image.save(data, format="PNG")
    return data.getvalue()


def chat_body(text: str, tokens: int, image: bytes | None = None) -> dict:
    content: list | str = text
    if image is not None:
        url = "data:image/png;base64," + base64.b64encode(image).decode()
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]
    return {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


def served_rate(url: str, tokens: int, images: list[bytes]) -> float:
    """Generated tokens/s of REQUESTS image chats and REQUESTS text chats sent at once."""
    bodies = [chat_body(QUESTION, tokens, image) for image in images]
    bodies += [chat_body(f"{STORY} ({i})", tokens) for i in range(REQUESTS)]

    def send(body: dict) -> int:
        reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
        reply.raise_for_status()
        return reply.json()["usage"]["completion_tokens"]

    start = time.perf_counter()
    with ThreadPoolExecutor(len(bodies)) as pool:
        generated = sum(pool.map(send, bodies))
    return generated / (time.perf_counter() - start)


def mlx_vlm_rate(model, processor, tokens: int, images: list[bytes]) -> float:
    """Generated tokens/s of mlx-vlm's batch_generate over the same prompts in-process."""
    from mlx_vlm.generate import batch_generate
    from PIL import Image

    pictures = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
    start = time.perf_counter()
    with_images = batch_generate(
        model,
        processor,
        images=pictures,
        prompts=[QUESTION] * len(pictures),  # (batch_generate applies the chat template)
        max_tokens=tokens,
    )
    texts = batch_generate(
        model,
        processor,
        prompts=[f"{STORY} ({i})" for i in range(REQUESTS)],
        max_tokens=tokens,
    )
    elapsed = time.perf_counter() - start
    generated = sum(
        len(processor.tokenizer.encode(t, add_special_tokens=False))
        for t in [*with_images.texts, *texts.texts]
    )
    return generated / elapsed


def main() -> int:
    args = parse_args()
    reexec_for_cpu()
    from mlx_vlm.utils import load

    from mlxserve.tiny_vision_model import build_tiny_qwen2_vl

    folder = Path(tempfile.mkdtemp(prefix="mlxserve-bench-vlm-")) / "qwen2-vl-smollm2-size"
    build_tiny_qwen2_vl(folder, text=TEXT, vision_size=VISION, image_tokens=IMAGE_TOKENS)
    if args.passes:
        return passes_main(folder, args.runs)
    model, processor = load(str(folder))
    small = [picture(224, seed) for seed in range(REQUESTS)]
    rates, ratios = [], {}
    flags = ["--num-draft-tokens", "0"]
    try:
        start = lambda port, log: spawn(mlxserve_command(str(folder), port, flags), log)  # noqa: E731
        with served(start, "vlm") as server:
            url = server.url
            served_rate(url, 4, small)  # warm: shapes, the processor
            mlx_vlm_rate(model, processor, 4, small)
            for run in range(args.runs):
                theirs = mlx_vlm_rate(model, processor, args.tokens, small)
                mine = served_rate(url, args.tokens, small)
                image = picture(448, 100 + run)  # a new image each run: not in the prefix cache
                gap = beside(url, "", send=lambda image=image: _ask(url, image))
                rates.append((mine, theirs, gap.worst / gap.median, gap.waited))
                ratios.setdefault("server / mlx-vlm batch_generate", []).append(mine / theirs)
                ratios.setdefault("stream's worst gap beside an image / its median", []).append(
                    gap.worst / gap.median
                )
                print(
                    f"run {run + 1}: server {mine:.1f} tok/s, mlx-vlm {theirs:.1f} tok/s, "
                    f"worst gap {gap.worst * 1000:.0f} ms / median {gap.median * 1000:.0f} ms "
                    f"over {gap.waited:.2f} s",
                    flush=True,
                )
    except ROW_ERRORS as error:
        row_failed("server", error)
        return 1
    print()
    print(
        f"random-weight Qwen2-VL, SmolLM2's size, {args.tokens} tokens, {time.strftime('%Y-%m-%d')}"
    )
    print_table(
        [
            (
                f"run {i + 1}: server / mlx-vlm tok/s; worst gap / median",
                f"{m:.1f} / {t:.1f}; {g:.2f}x",
            )
            for i, (m, t, g, _) in enumerate(rates)
        ]
    )
    print_median_ratios(ratios)
    return 0


def _ask(url: str, image: bytes) -> None:
    reply = httpx.post(
        f"{url}/v1/chat/completions", json=chat_body(QUESTION, 1, image), timeout=600
    )
    reply.raise_for_status()


if __name__ == "__main__":
    sys.exit(main())
