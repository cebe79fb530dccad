"""Hostile images on every door of a vision model (the tiny Qwen2-VL), drawn by hypothesis:
images of any size, mode and format, cut short, with headers that lie, random bytes, wrong
types. Each answer is a 200 or a 400 in the door's own error shape, never a 5xx, and the server
answers a plain image request as before afterwards."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import httpx
import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from mlxserve.vision.folder import vision_installed

from ..helpers import skip_for_missing
from ..vision_models import build_tiny_qwen2_vl, checkerboard_png

# The HTTP contract alone: the platform policy does not change it (not in the portable pass).
pytestmark = [pytest.mark.http_only, pytest.mark.fuzz]

MODEL = "tiny-qwen2-vl"
EXAMPLES = 30  # a door


@pytest.fixture(scope="module")
def server(live_servers, tmp_path_factory):
    if not vision_installed():
        skip_for_missing("mlx-vlm is not installed (make install-dev installs it)")
    folder = build_tiny_qwen2_vl(tmp_path_factory.mktemp("models") / MODEL)
    with live_servers.own(folder) as live:
        yield live


def encoded(size: tuple[int, int], mode: str, fmt: str) -> bytes:
    from PIL import Image

    image = Image.new(mode, size)
    data = io.BytesIO()
    try:
        image.save(data, format=fmt)
    except (OSError, ValueError):  # a mode the format does not store
        data = io.BytesIO()
        image.convert("RGB").save(data, format=fmt)
    return data.getvalue()


def lying_png(width: int, height: int) -> bytes:
    """A PNG whose header claims `width` x `height` over a few bytes of pixels."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\0" * 64)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


SIDES = st.integers(1, 80)
IMAGES = st.one_of(
    st.builds(
        encoded,
        st.tuples(SIDES, SIDES),
        st.sampled_from(["RGB", "L", "RGBA", "P", "1", "CMYK", "I;16", "F"]),
        st.sampled_from(["PNG", "GIF", "BMP", "TIFF"]),
    ),
    st.builds(
        encoded, st.tuples(st.integers(1, 3), st.integers(200, 700)), st.just("RGB"), st.just("PNG")
    ),  # fmt: skip
    st.builds(lambda data, cut: data[:cut], st.just(checkerboard_png()), st.integers(0, 400)),
    st.builds(lying_png, st.integers(1, 100_000), st.integers(1, 100_000)),
    st.binary(max_size=200),
)
TEXT = st.text(max_size=40)


def as_base64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def image_values(data_strategy):
    """What a client might put where an image goes: the image's base64 (as the door wants
    it), or text, numbers, nulls, lists and objects."""
    return st.one_of(
        data_strategy.map(as_base64),
        TEXT,
        st.none(),
        st.integers(),
        st.lists(TEXT, max_size=2),
        st.dictionaries(TEXT, TEXT, max_size=2),
    )


def openai_body(value) -> dict:
    url = f"data:image/png;base64,{value}" if isinstance(value, str) else value
    return {
        "model": MODEL,
        "max_tokens": 1,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": "?"},
                ],
            }
        ],
    }


def responses_body(value) -> dict:
    url = f"data:image/png;base64,{value}" if isinstance(value, str) else value
    return {
        "model": MODEL,
        "max_output_tokens": 16,
        "input": [{"role": "user", "content": [{"type": "input_image", "image_url": url}]}],
    }


def anthropic_body(value) -> dict:
    source = {"type": "base64", "media_type": "image/png", "data": value}
    return {
        "model": MODEL,
        "max_tokens": 1,
        "messages": [{"role": "user", "content": [{"type": "image", "source": source}]}],
    }


def ollama_body(value) -> dict:
    return {
        "model": MODEL,
        "stream": False,
        "options": {"num_predict": 1},
        "messages": [{"role": "user", "content": "?", "images": [value]}],
    }


def llamacpp_body(value) -> dict:
    prompt = {"prompt_string": "<__media__>?", "multimodal_data": [value]}
    return {"prompt": prompt, "n_predict": 1}


DOORS = {
    "/completion": (llamacpp_body, "openai"),
    "/v1/chat/completions": (openai_body, "openai"),
    "/v1/responses": (responses_body, "openai"),
    "/v1/messages": (anthropic_body, "anthropic"),
    "/api/chat": (ollama_body, "ollama"),
}


def assert_in_shape(reply: httpx.Response, shape: str) -> None:
    assert reply.status_code < 500, reply.text
    if reply.status_code == 200:
        return
    assert reply.status_code in (400, 413, 422), reply.text
    body = reply.json()
    if shape == "openai":
        assert isinstance(body["error"]["message"], str), body
    elif shape == "anthropic":
        assert body["type"] == "error" and isinstance(body["error"]["message"], str), body
    else:
        assert isinstance(body["error"], str), body


@pytest.mark.parametrize("route", sorted(DOORS))
def test_hostile_images_are_a_200_or_a_400_in_the_doors_shape(server, route):
    make_body, shape = DOORS[route]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(image_values(IMAGES))
    def check(value):
        reply = httpx.post(server.url + route, json=make_body(value), timeout=60)
        assert_in_shape(reply, shape)

    check()
    plain = httpx.post(
        server.url + route, json=make_body(as_base64(checkerboard_png())), timeout=60
    )
    assert plain.status_code == 200, plain.text
