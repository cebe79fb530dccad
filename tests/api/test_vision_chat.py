"""Images in, through the doors, on a tiny Qwen2-VL (tests/vision_models.py): OpenAI's chat
`image_url` (the official client) and Ollama's `images` are answered, the first token's
logprobs are mlx-vlm's own model's for the same prompt and image, an image beside a text
stream shares the batch; a text model, a URL the server was not allowed to read
(test_image_urls.py has those it was), bytes that are not an image and too many images are each
a 400 naming the field."""

from __future__ import annotations

import base64
import io
import threading

import httpx
import mlx.core as mx
import pytest

from mlxserve.vision.folder import vision_installed
from mlxserve.vision.images import MAX_IMAGES

from ..helpers import skip_for_missing
from ..vision_models import build_tiny_qwen2_vl, build_tiny_qwen3_vl, checkerboard_png

QUESTION = "What is in the picture?"


@pytest.fixture(scope="module")
def vision(live_servers, tmp_path_factory):
    if not vision_installed():
        skip_for_missing("mlx-vlm is not installed (make install-dev installs it)")
    folder = build_tiny_qwen2_vl(tmp_path_factory.mktemp("models") / "tiny-qwen2-vl")
    with live_servers.own(folder) as server:
        yield server, folder


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def image_message(png: bytes) -> dict:
    return url_message(data_url(png))


def mlx_vlm_first_logprobs(folder, png: bytes, k: int = 5, text: str | None = None):
    """mlx-vlm's own model over the prompt the server renders (`text`; else the question after
    the image): its first token's top k, {token id: logprob}."""
    from mlx_vlm.utils import load, prepare_inputs
    from PIL import Image

    model, processor = load(str(folder))
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}
    ]
    if text is None:
        text = processor.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
    inputs = prepare_inputs(
        processor,
        images=[Image.open(io.BytesIO(png)).convert("RGB")],
        prompts=text,
        image_token_index=model.config.image_token_id,
        add_special_tokens=False,
    )
    extra = {
        k: v for k, v in inputs.items() if k not in ("input_ids", "pixel_values", "attention_mask")
    }
    logits = model(inputs["input_ids"], inputs["pixel_values"], **extra).logits[0, -1]
    logprobs = logits - mx.logsumexp(logits)
    top = mx.argsort(-logprobs)[:k].tolist()
    return {t: logprobs[t].item() for t in top}


def assert_served_as_mlx_vlm(served: dict[str, float], expected: dict[int, float], tokenizer):
    """The served top logprobs (by token text) equal mlx-vlm's (by id), for the tokens whose
    text is their own (byte-level pieces of one character read alike: those are left out);
    those tokens' (text, logprob)."""
    top = [(tokenizer.decode([t]), logprob) for t, logprob in expected.items()]
    texts = [text for text, _ in top]
    unique = [(text, logprob) for text, logprob in top if texts.count(text) == 1]
    assert len(unique) >= 3
    for text, logprob in unique:
        assert served[text] == pytest.approx(logprob, abs=1e-3)
    return unique


def url_message(url: str) -> dict:
    """A user's message: the image at `url`, then the question."""
    return {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": QUESTION},
        ],
    }


def refusal(server, url: str, param: str = "messages[0].content[0].image_url.url") -> dict:
    """The 400 an image at `url` alone in a user's message gets; its error, naming `param`."""
    body = {
        "model": "tiny-qwen2-vl",
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}
        ],
    }
    reply = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param, error
    return error


def test_openai_chat_with_an_image_answers_as_mlx_vlm(vision):
    import openai

    server, folder = vision
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    png = checkerboard_png()
    reply = client.chat.completions.create(
        model="tiny-qwen2-vl",
        messages=[image_message(png)],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
    )
    assert reply.choices[0].message.content is not None
    first = reply.choices[0].logprobs.content[0]
    tokenizer = server.engine.loaded.tokenizer
    served = {t.token: t.logprob for t in first.top_logprobs}
    unique = assert_served_as_mlx_vlm(served, mlx_vlm_first_logprobs(folder, png), tokenizer)
    # another image, other logprobs: the image reached the model
    other = client.chat.completions.create(
        model="tiny-qwen2-vl",
        messages=[image_message(checkerboard_png(colors=((0, 0, 255), (255, 255, 0))))],
        max_tokens=1,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
    )
    other_first = {t.token: t.logprob for t in other.choices[0].logprobs.content[0].top_logprobs}
    assert any(abs(other_first.get(text, 0.0) - served[text]) > 1e-3 for text, _ in unique)


@pytest.fixture(scope="module")
def qwen3(live_servers, tmp_path_factory):
    """The second family's tiny model served (its template has tools: a tool's result may hold
    images)."""
    if not vision_installed():
        skip_for_missing("mlx-vlm is not installed (make install-dev installs it)")
    folder = build_tiny_qwen3_vl(tmp_path_factory.mktemp("models") / "tiny-qwen3-vl")
    with live_servers.own(folder) as server:
        yield server, folder


def test_a_qwen3_vl_model_answers_as_mlx_vlm(qwen3):
    """The second family (Qwen3-VL: interleaved M-RoPE, deepstack features in the language
    model's first layers) through the server: the first token's logprobs are mlx-vlm's own,
    and the same image on Ollama's door gives the same greedy answer."""
    server, folder = qwen3
    png = checkerboard_png((90, 60))
    body = {
        "model": "tiny-qwen3-vl",
        "messages": [image_message(png)],
        "max_tokens": 3,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 5,
    }
    reply = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    ollama = httpx.post(
        server.url + "/api/chat",
        json={
            "model": "tiny-qwen3-vl",
            "stream": False,
            "options": {"temperature": 0, "num_predict": 3},
            "messages": [
                {
                    "role": "user",
                    "content": QUESTION,
                    "images": [base64.b64encode(png).decode()],
                }
            ],
        },
        timeout=60,
    )
    tokenizer = server.engine.loaded.tokenizer
    assert ollama.status_code == 200, ollama.text
    assert ollama.json()["message"]["content"] == choice["message"]["content"]
    served = {t["token"]: t["logprob"] for t in choice["logprobs"]["content"][0]["top_logprobs"]}
    assert_served_as_mlx_vlm(served, mlx_vlm_first_logprobs(folder, png), tokenizer)


def test_an_image_beside_a_text_stream_and_ollama_images(vision):
    server, _ = vision
    texts: list[str] = []

    def stream_text():
        body = {
            "model": "tiny-qwen2-vl",
            "messages": [{"role": "user", "content": "Tell a story."}],
            "max_tokens": 24,
            "stream": True,
        }
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
            texts.append(str(r.status_code) + r.read().decode()[-40:])

    streaming = threading.Thread(target=stream_text)
    streaming.start()
    png = checkerboard_png()
    ollama = httpx.post(
        server.url + "/api/chat",
        json={
            "model": "tiny-qwen2-vl",
            "messages": [
                {"role": "user", "content": QUESTION, "images": [base64.b64encode(png).decode()]}
            ],
            "stream": False,
            "options": {"num_predict": 3},
        },
        timeout=60,
    )
    streaming.join(60)
    assert ollama.status_code == 200, ollama.text
    assert ollama.json()["done"] is True and ollama.json()["eval_count"] == 3
    assert texts and texts[0].startswith("200") and "[DONE]" in texts[0]
    shown = httpx.post(server.url + "/api/show", json={"model": "tiny-qwen2-vl"}, timeout=30)
    assert "vision" in shown.json()["capabilities"]
    cards = httpx.get(server.url + "/v1/models", timeout=30).json()["data"]
    assert [c["vision"] for c in cards if c["id"] == "tiny-qwen2-vl"] == [True]


@pytest.mark.parametrize(
    ("url", "code", "says"),
    [
        ("https://example.com/cat.png", "invalid_image_url", "with --allow-image-urls"),
        ("file:///etc/passwd", "invalid_image_url", "given with --media-dir"),
        ("ftp://example.com/cat.png", "invalid_image_url", "must be a data URL"),
        (
            "data:image/png;base64," + base64.b64encode(b"not a png").decode(),
            "invalid_image",
            "not an image",
        ),
        ("data:image/png;base64,***", None, "not valid base64"),
    ],
)
def test_images_that_cannot_be_read_are_a_400_naming_the_field(vision, url, code, says):
    server, _ = vision
    error = refusal(server, url)
    assert says in error["message"]
    if code is not None:
        assert error["code"] == code


def test_too_many_images_are_a_400(vision):
    server, _ = vision
    part = {"type": "image_url", "image_url": {"url": data_url(checkerboard_png((28, 28)))}}
    body = {
        "model": "tiny-qwen2-vl",
        "messages": [{"role": "user", "content": [part] * (MAX_IMAGES + 1)}],
    }
    reply = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "too_many_images"


def test_a_text_model_refuses_images_in_each_doors_shape(live_server, tiny_model):
    server = live_server(tiny_model)
    png = checkerboard_png()
    body = {"messages": [image_message(png)], "max_tokens": 2}
    openai_reply = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    assert openai_reply.status_code == 400
    error = openai_reply.json()["error"]
    assert (
        error["code"] == "unsupported_content_type" and "does not take images" in error["message"]
    )
    assert error["param"] == "messages[0].content[0].image_url.url"
    ollama = httpx.post(
        server.url + "/api/chat",
        json={
            "model": "tiny",
            "messages": [
                {"role": "user", "content": "hi", "images": [base64.b64encode(png).decode()]}
            ],
            "stream": False,
        },
        timeout=30,
    )
    assert ollama.status_code == 400 and "does not take images" in ollama.json()["error"]
    media = {"prompt_string": "<__media__> hi", "multimodal_data": [base64.b64encode(png).decode()]}
    llamacpp = httpx.post(server.url + "/completion", json={"prompt": media}, timeout=30)
    assert llamacpp.status_code == 400 and "does not take images" in llamacpp.text
    assert llamacpp.json()["error"]["param"] == "prompt.multimodal_data"


def test_anthropic_responses_and_ollama_generate_take_images(vision):
    """Each door's own image form, answered (Anthropic's base64 image block with the official
    client, Responses' input_image, Ollama's /api/generate images); the same image gives the
    same greedy answer through each."""
    import anthropic

    server, _ = vision
    png = checkerboard_png()
    encoded = base64.b64encode(png).decode()
    client = anthropic.Anthropic(base_url=server.url, api_key="none")
    message = client.messages.create(
        model="tiny-qwen2-vl",
        max_tokens=3,
        extra_body={"temperature": 0},  # (this client's create takes no temperature argument)
        messages=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": encoded},
                    },
                    {"type": "text", "text": QUESTION},
                ],
            }
        ],
    )
    assert message.usage.output_tokens == 3
    responses = httpx.post(
        server.url + "/v1/responses",
        json={
            "model": "tiny-qwen2-vl",
            "max_output_tokens": 3,
            "temperature": 0,
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_image", "image_url": data_url(png)},
                        {"type": "input_text", "text": QUESTION},
                    ],
                }
            ],
        },
        timeout=60,
    )
    assert responses.status_code == 200, responses.text
    generated = httpx.post(
        server.url + "/api/generate",
        json={
            "model": "tiny-qwen2-vl",
            "prompt": QUESTION,
            "images": [encoded],
            "stream": False,
            "options": {"num_predict": 3, "temperature": 0},
        },
        timeout=60,
    )
    assert generated.status_code == 200, generated.text
    answers = {
        message.content[0].text if message.content else "",
        responses.json()["output"][-1]["content"][0]["text"],
        generated.json()["response"],
    }
    assert len(answers) == 1, answers


def test_images_cross_to_the_engine_process(vision):
    """As `mlxserve serve` runs it: the front reads the image, the engine process (its own
    process, reached over ZeroMQ) prefills it; the answer is the in-process server's."""
    from ..live_server import FrontServer

    server, folder = vision
    body = {
        "model": "tiny-qwen2-vl",
        "messages": [image_message(checkerboard_png())],
        "max_tokens": 3,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    alone = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
    with FrontServer(folder) as front:
        answer = httpx.post(front.url + "/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    got, expected = answer.json()["choices"][0], alone["choices"][0]
    assert got["message"]["content"] == expected["message"]["content"]
    for mine, theirs in zip(got["logprobs"]["content"], expected["logprobs"]["content"]):
        assert mine["logprob"] == pytest.approx(theirs["logprob"], abs=1e-4)


def test_the_prefix_cache_keeps_a_prompt_by_its_images(vision):
    """The same image and question again: its KV from the prefix cache (the vision tower not
    run), the same answer. Another image with the same question: nothing reused (the prompt is
    read again from its start). A next turn after the image: the image's KV is reused."""
    server, _ = vision
    png, other = (
        checkerboard_png((56, 56)),
        checkerboard_png((56, 56), colors=((9, 9, 9), (250, 250, 250))),
    )

    def ask(messages):
        body = {
            "model": "tiny-qwen2-vl",
            "messages": messages,
            "max_tokens": 2,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": 3,
        }
        reply = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        result = reply.json()
        cached = result["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
        return result, cached

    question = [{"type": "text", "text": "Which colours, and how many squares?"}]
    first, cached_first = ask([{"role": "user", "content": [image_url(png), *question]}])
    again, cached_again = ask([{"role": "user", "content": [image_url(png), *question]}])
    assert cached_first == 0 and cached_again > 16  # the image's tokens and the text around them
    assert again["choices"][0]["logprobs"] == first["choices"][0]["logprobs"]
    changed, cached_changed = ask([{"role": "user", "content": [image_url(other), *question]}])
    assert cached_changed == 0
    assert changed["choices"][0]["logprobs"] != first["choices"][0]["logprobs"]
    turns = [
        {"role": "user", "content": [image_url(png), *question]},
        {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
        {"role": "user", "content": "And the corners?"},
    ]
    _, cached_next = ask(turns)
    assert cached_next >= cached_again


def image_url(png: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": data_url(png)}}


def test_admission_counts_the_tokens_an_image_becomes(live_servers, tmp_path_factory):
    """The KV budget's refusal counts an image's tokens (as its processor expands it), not
    the one placeholder the chat template writes: a larger image, more tokens counted."""
    import re

    from mlxserve.vision.folder import ImageTokens

    if not vision_installed():
        skip_for_missing("mlx-vlm is not installed (make install-dev installs it)")
    folder = build_tiny_qwen2_vl(tmp_path_factory.mktemp("models") / "tiny-qwen2-vl")
    counted = ImageTokens.of_folder(folder)

    def counted_tokens(server, content) -> int:
        body = {
            "model": "tiny-qwen2-vl",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 1,
        }
        reply = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["code"] == "kv_budget_exceeded", error
        return int(re.search(r"\(([\d,]+) tokens of prompt", error["message"])[1].replace(",", ""))

    text = {"type": "text", "text": QUESTION}
    with live_servers.own(folder, kv_budget_bytes=1) as server:
        alone = counted_tokens(server, [text])
        for size in ((28, 28), (300, 100)):
            image = {"type": "image_url", "image_url": {"url": data_url(checkerboard_png(size))}}
            placeholders = 3  # <|vision_start|><|image_pad|><|vision_end|>
            expected = alone + placeholders + counted.count(*size)
            assert counted_tokens(server, [image, text]) == expected
    assert counted.count(300, 100) > counted.count(28, 28)


def test_llamacpp_multimodal_prompt_reads_as_the_chat_with_the_image(vision):
    """llama.cpp's /completion prompt object (`prompt_string` with a `<__media__>` marker,
    `multimodal_data`): the chat's own rendered prompt with the marker where its template put
    the image answers as the chat does; a marker count that does not match, or an image that
    is not one, is a 400 naming multimodal_data."""
    server, folder = vision
    png = checkerboard_png()
    chat = httpx.post(
        server.url + "/v1/chat/completions",
        json={
            "model": "tiny-qwen2-vl",
            "messages": [image_message(png)],
            "max_tokens": 4,
            "temperature": 0,
        },  # fmt: skip
        timeout=60,
    )
    assert chat.status_code == 200, chat.text
    tokenizer = server.engine.loaded.tokenizer
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}],
        tokenize=False,
        add_generation_prompt=True,
    )
    placeholder = "<|vision_start|><|image_pad|><|vision_end|>"
    assert server.engine.loaded.image_placeholder == placeholder
    text = rendered.replace(placeholder, "<__media__>")
    body = {
        "prompt": {"prompt_string": text, "multimodal_data": [base64.b64encode(png).decode()]},
        "n_predict": 4,
        "temperature": 0,
    }
    reply = httpx.post(server.url + "/completion", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["content"] == chat.json()["choices"][0]["message"]["content"]
    assert reply.json()["tokens_evaluated"] == chat.json()["usage"]["prompt_tokens"]

    twice = {**body, "prompt": {**body["prompt"], "prompt_string": text + "<__media__>"}}
    for bad, says in ((twice, "2 <__media__> markers for 1"),
                      ({**body, "prompt": {**body["prompt"], "multimodal_data": ["AAAA"]}},
                       "not an image")):  # fmt: skip
        refused = httpx.post(server.url + "/completion", json=bad, timeout=60)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["param"].startswith("prompt.multimodal_data") and says in error["message"]


READ = {"name": "read", "description": "Read a file", "input_schema": {"type": "object"}}


def tool_turns(result_content: list) -> list[dict]:
    """Anthropic's turns: a question, the assistant's Read call, its result."""
    return [
        {"role": "user", "content": "What is in shot.png?"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "read", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": result_content}
            ],
        },
    ]


def image_block(png: bytes) -> dict:
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png).decode()}
    return {"type": "image", "source": source}


def test_a_tools_image_reaches_a_vision_model(qwen3, vision):
    """Claude Code's Read of a PNG, Codex's view_image: the image in a tool's result goes to a
    vision model whose template places it (Qwen3-VL's) as an image, in the tool's turn.
    Through OpenAI chat the first token's logprobs are mlx-vlm's own over the prompt the server
    renders; through the anthropic client and Responses, the prefix cache reads the same image
    again further than another one (it keeps the prompt by its images). A template that writes
    a tool's turn as text (the tiny Qwen2-VL's, which has no tools) gets the line saying the
    image was left out."""
    import anthropic

    server, folder = qwen3
    png, other = checkerboard_png(), checkerboard_png(colors=((0, 0, 255), (255, 255, 0)))
    body = {
        "model": "tiny-qwen3-vl",
        "messages": openai_tool_turns(png),
        "max_tokens": 1,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 5,
    }
    reply = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    first = reply.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    served = {t["token"]: t["logprob"] for t in first}
    rendered = httpx.post(server.url + "/apply-template", json=body, timeout=60).json()["prompt"]
    assert rendered.count("<|image_pad|>") == 1  # in the tool's turn
    assert rendered.index("<tool_response>") < rendered.index("<|image_pad|>")
    tokenizer = server.engine.loaded.tokenizer
    assert_served_as_mlx_vlm(served, mlx_vlm_first_logprobs(folder, png, text=rendered), tokenizer)

    # The anthropic client and Responses: the prefix cache keeps a prompt by its images, so the
    # same image again is read from the cache past the tool's turn, another one is not
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)

    def claude(picture: bytes) -> int:
        turns = tool_turns([image_block(picture), {"type": "text", "text": "shot.png"}])
        reply = client.messages.create(
            model="tiny-qwen3-vl",
            max_tokens=2,
            messages=turns,
            tools=[READ],
            extra_body={"temperature": 0},
        )
        return reply.usage.cache_read_input_tokens

    def codex(picture: bytes) -> int:
        output = [{"type": "input_image", "image_url": data_url(picture)}]
        items = [
            {"role": "user", "content": "What is in shot.png?"},
            {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": output},
        ]
        body = {"model": "tiny-qwen3-vl", "input": items, "max_output_tokens": 2, "temperature": 0}
        reply = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        return reply.json()["usage"]["input_tokens_details"]["cached_tokens"]

    for door in (claude, codex):
        door(png)
        assert door(png) > door(other)

    textual, _ = vision
    body = {"model": "tiny-qwen2-vl", "messages": openai_tool_turns(png), "max_tokens": 2}
    rendered = httpx.post(textual.url + "/apply-template", json=body, timeout=60).json()["prompt"]
    assert "<|image_pad|>" not in rendered and "[image left out" in rendered
    answered = httpx.post(textual.url + "/v1/chat/completions", json=body, timeout=60)
    assert answered.status_code == 200, answered.text


def openai_tool_turns(png: bytes) -> list[dict]:
    """OpenAI chat's turns: a question, the assistant's read call, its result with the image."""
    call = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    return [
        {"role": "user", "content": "What is in shot.png?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {
            "role": "tool",
            "tool_call_id": "c1",
            "content": [
                {"type": "image_url", "image_url": {"url": data_url(png)}},
                {"type": "text", "text": "shot.png"},
            ],
        },
    ]


def test_a_text_model_reads_a_line_for_a_tools_image(live_server, tiny_model):
    """A text model is told a tool's image was left out (a 400 would come back with every
    later turn, which resends the result); an image in a user's message is still a 400."""
    import anthropic

    server = live_server(tiny_model)
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    turns = tool_turns([image_block(checkerboard_png()), {"type": "text", "text": "shot.png"}])
    reply = client.messages.create(model="tiny", max_tokens=2, messages=turns, tools=[READ])
    assert reply.usage.output_tokens >= 1
    body = {"messages": openai_tool_turns(checkerboard_png())}
    rendered = httpx.post(server.url + "/apply-template", json=body, timeout=30)
    assert rendered.status_code == 200, rendered.text
    line = "[image left out: a tool's result is given to the model as text]\nshot.png"
    assert line in rendered.json()["prompt"]


def test_an_image_prompt_not_to_be_cached_answers_the_same(vision):
    """llama.cpp's `cache_prompt: false` on an image prompt: prefilled in passes and handed to
    its sequence (nothing kept), it answers as the prompt found in the prefix cache does."""
    server, _ = vision
    png = checkerboard_png(colors=((90, 10, 200), (10, 200, 90)))
    body = {
        "model": "tiny-qwen2-vl",
        "messages": [image_message(png)],
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
    }

    def ask(**extra) -> dict:
        reply = httpx.post(server.url + "/v1/chat/completions", json={**body, **extra}, timeout=60)
        assert reply.status_code == 200, reply.text
        return reply.json()

    uncached = ask(cache_prompt=False)
    assert uncached["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    first = ask()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # nothing was kept
    again = ask()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    for reply in (first, again):
        assert reply["choices"][0]["message"] == uncached["choices"][0]["message"]
        top = reply["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        expected = uncached["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        for mine, theirs in zip(top, expected):
            assert mine["token"] == theirs["token"]
            assert mine["logprob"] == pytest.approx(theirs["logprob"], abs=1e-4)
