"""llama.cpp's streaming extras, as its web UI and llama.vscode read them: `return_progress`
(`prompt_progress` chunks while the prompt is read, before the first token) and
`timings_per_token` (timings on every chunk), on /completion, /v1/completions and
/v1/chat/completions."""

from __future__ import annotations

from ..helpers import stream_chunks

# Long enough that the prompt is read in more than one chunk where the pacer splits it.
LONG = "Once upon a time there was a little robot who loved to count the stars. " * 24


def progress_of(chunks: list) -> list[dict]:
    return [c["prompt_progress"] for c in chunks if isinstance(c, dict) and "prompt_progress" in c]


def test_completion_reports_the_prompts_progress_before_its_first_token(http):
    chunks = stream_chunks(
        http, "/completion", prompt=LONG, n_predict=3, return_progress=True, cache_prompt=False
    )
    progress = progress_of(chunks)
    assert progress, chunks[:2]
    first_text = next(i for i, c in enumerate(chunks) if c.get("content"))
    assert all("prompt_progress" not in c for c in chunks[first_text:])
    total = chunks[-1]["tokens_evaluated"]
    assert all(p["total"] == total and 0 <= p["cache"] <= p["processed"] <= total for p in progress)
    assert [p["processed"] for p in progress] == sorted(p["processed"] for p in progress)
    assert progress[-1]["processed"] == total and progress[-1]["time_ms"] >= 0
    plain = stream_chunks(http, "/completion", prompt=LONG, n_predict=3, cache_prompt=False)
    assert not progress_of(plain)


def test_a_cached_prompt_says_how_much_came_from_the_cache(http):
    body = {"prompt": LONG + "The end.", "n_predict": 2, "return_progress": True}
    stream_chunks(http, "/completion", **body)
    again = progress_of(stream_chunks(http, "/completion", **body))
    assert again and again[-1]["cache"] > 0 and again[-1]["processed"] == again[-1]["total"]


def test_chat_progress_comes_as_llama_cpps_chunks_and_timings_on_every_chunk(http):
    chunks = stream_chunks(
        http,
        "/v1/chat/completions",
        messages=[{"role": "user", "content": LONG}],
        max_tokens=4,
        ignore_eos=True,
        return_progress=True,
        timings_per_token=True,
        cache_prompt=False,
    )
    chunks = [c for c in chunks if isinstance(c, dict)]
    progress = [c for c in chunks if "prompt_progress" in c]
    assert progress and all(c["object"] == "chat.completion.chunk" for c in progress)
    assert progress[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    texts = [c for c in chunks if c["choices"][0]["delta"].get("content")]
    assert texts and all("timings" in c for c in texts)
    predicted = [c["timings"]["predicted_n"] for c in texts]
    assert predicted == sorted(predicted) and predicted[-1] <= 4
    assert chunks[-1]["timings"]["predicted_n"] == 4


def test_completions_stream_progress_and_per_token_timings(http):
    chunks = stream_chunks(
        http,
        prompt=LONG,
        max_tokens=3,
        ignore_eos=True,
        return_progress=True,
        timings_per_token=True,
        cache_prompt=False,
    )
    chunks = [c for c in chunks if isinstance(c, dict)]
    assert progress_of(chunks)
    texts = [c for c in chunks if c["choices"][0]["text"]]
    assert texts and all("timings" in c for c in texts)
