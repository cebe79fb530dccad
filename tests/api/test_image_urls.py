"""Image URLs where the user allowed them (--allow-image-urls, --media-dir), on the tiny
Qwen2-VL: an http URL and a file in the media folder give the model what the same image as a
data URL gives it (the official openai and anthropic clients); a missing image, one too large,
one too slow, a redirect loop, a path out of the media folder (`..`, a link) are each a 400
naming the field."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from mlxserve.settings import ChatSettings
from mlxserve.vision import media
from mlxserve.vision.folder import vision_installed
from mlxserve.vision.images import MAX_IMAGE_BYTES

from ..helpers import skip_for_missing
from ..vision_models import build_tiny_qwen2_vl, checkerboard_png
from .test_vision_chat import data_url, refusal, url_message

# The HTTP contract alone: the platform policy does not change it (not in the portable pass).
pytestmark = pytest.mark.http_only

PNG = checkerboard_png()


class Images(BaseHTTPRequestHandler):
    """The web the server may fetch from: an image, a missing one, one too large, a slow one,
    a redirect loop, bytes that are not an image."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path == "/checker.png":
            self._send(PNG)
        elif self.path == "/huge.png":  # no Content-Length: the limit is counted as it comes
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            block = b"\0" * (1 << 20)
            try:
                for _ in range((MAX_IMAGE_BYTES >> 20) + 2):
                    self.wfile.write(block)
            except (BrokenPipeError, ConnectionResetError):
                pass
        elif self.path == "/slow.png":
            time.sleep(1.5)
            self._send(PNG)
        elif self.path == "/loop":
            self.send_response(302)
            self.send_header("Location", "/loop")
            self.end_headers()
        elif self.path == "/text.png":
            self._send(b"this is not a png")
        else:
            self.send_error(404)

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def web():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Images)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def allowed(live_servers, tmp_path_factory):
    """A vision server allowed to fetch image URLs and to read files in a media folder."""
    if not vision_installed():
        skip_for_missing("mlx-vlm is not installed (make install-dev installs it)")
    folder = build_tiny_qwen2_vl(tmp_path_factory.mktemp("models") / "tiny-qwen2-vl")
    root = tmp_path_factory.mktemp("media")
    (root / "photos").mkdir()
    (root / "photos" / "checker.png").write_bytes(PNG)
    outside = tmp_path_factory.mktemp("outside") / "secret.png"
    outside.write_bytes(PNG)
    (root / "photos" / "link.png").symlink_to(outside)
    chat = ChatSettings(image_urls=True, media_dir=str(root / "photos"))
    with live_servers.own(folder, chat=chat) as server:
        yield server, root / "photos", outside


def first_logprobs(server, url: str) -> dict[str, float]:
    body = {
        "model": "tiny-qwen2-vl",
        "messages": [url_message(url)],
        "max_tokens": 1,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 5,
    }
    reply = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    top = reply.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    return {t["token"]: t["logprob"] for t in top}


def test_an_http_url_and_a_media_file_give_the_model_the_same_image(allowed, web):
    server, photos, _ = allowed
    inline = first_logprobs(server, data_url(PNG))
    assert first_logprobs(server, f"{web}/checker.png") == inline
    assert first_logprobs(server, (photos / "checker.png").as_uri()) == inline
    other = first_logprobs(server, data_url(checkerboard_png(colors=((0, 0, 255), (9, 9, 9)))))
    assert other != inline  # the image is what the model reads


def test_the_anthropic_clients_url_image_is_fetched(allowed, web):
    import anthropic

    server, _, _ = allowed
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)

    def answer(source: dict) -> str:
        reply = client.messages.create(
            model="tiny-qwen2-vl",
            max_tokens=4,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": source},
                        {"type": "text", "text": "What is in the picture?"},
                    ],
                }
            ],
            extra_body={"temperature": 0},
        )
        return reply.content[0].text

    inline = {"type": "base64", "media_type": "image/png", "data": data_url(PNG).split(",")[1]}
    assert answer({"type": "url", "url": f"{web}/checker.png"}) == answer(inline)
    with pytest.raises(anthropic.BadRequestError, match="HTTP 404"):
        answer({"type": "url", "url": f"{web}/missing.png"})


@pytest.mark.parametrize(
    ("path", "code", "says"),
    [
        ("/missing.png", "image_fetch_failed", "HTTP 404"),
        ("/huge.png", "image_too_large", "over 20 MB"),
        ("/loop", "image_fetch_failed", "more than 3 redirects"),
        ("/text.png", "invalid_image", "not an image"),
    ],
)
def test_urls_that_give_no_image_are_a_400(allowed, web, path, code, says):
    server, _, _ = allowed
    error = refusal(server, web + path)
    assert error["code"] == code and says in error["message"], error


def test_a_fetch_past_its_time_is_a_400(allowed, web, monkeypatch):
    server, _, _ = allowed
    monkeypatch.setattr(media, "FETCH_TIMEOUT_S", 0.5)  # the server runs in this process
    error = refusal(server, f"{web}/slow.png")
    assert error["code"] == "image_fetch_failed" and "not fetched in 0.5 s" in error["message"]


def test_files_outside_the_media_folder_are_a_400(allowed):
    server, photos, outside = allowed
    escapes = [
        (photos.as_uri() + f"/../../{outside.parent.name}/{outside.name}", "not a file inside"),
        ((photos / "link.png").as_uri(), "not a file inside"),  # a link leading out
        (outside.as_uri(), "not a file inside"),
        (photos.as_uri(), "not a file inside"),  # the folder itself
        ((photos / "missing.png").as_uri(), "no such file"),
        ("file://example.com" + str(photos / "checker.png"), "names a host"),
    ]
    for url, says in escapes:
        error = refusal(server, url)
        assert says in error["message"], (url, error)
    assert outside.read_bytes() == PNG  # (a file was there to be read)
