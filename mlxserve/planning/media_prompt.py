"""llama.cpp's multimodal prompt on /completion: `{"prompt_string": ..., "multimodal_data":
[base64, ...]}`, one `<__media__>` marker in the text an image. The images are read as a chat's
are (vision/images.py), and each marker becomes the placeholder the model's own chat template
writes for an image, which the model's processor then expands."""

from __future__ import annotations

from dataclasses import replace

from ..api.errors import InvalidRequest
from ..settings import ChatSettings
from .chat import read_image_parts
from .messages import image_part
from .model_facts import ModelFacts
from .request import Request

MEDIA_MARKER = "<__media__>"  # llama.cpp's (mtmd's default)
PARAM = "prompt.multimodal_data"


def with_media(body: Request, model: ModelFacts, settings: ChatSettings) -> Request:
    """`body` with its media read: the images, the tokens they become, the prompt's text with
    each marker made the model's image placeholder."""
    text = body.prompt if isinstance(body.prompt, str) else ""
    if not model.takes_images:
        raise InvalidRequest(
            f"The model {model.model_id} does not take images: it is a text model.",
            param=PARAM,
            code="unsupported_content_type",
        )
    markers = text.count(MEDIA_MARKER)
    if markers != len(body.media):
        raise InvalidRequest(
            f"prompt.prompt_string has {markers} {MEDIA_MARKER} markers for "
            f"{len(body.media)} items of multimodal_data; put one marker where each image goes.",
            param=PARAM,
        )
    parts = [
        image_part(item, f"{PARAM}[{index}]", base64=not str(item).startswith("data:"))
        for index, item in enumerate(body.media)
    ]
    images, tokens = read_image_parts(parts, model, settings, PARAM)
    placeholder = model.image_placeholder
    if placeholder is None:
        raise InvalidRequest(
            f"The model {model.model_id}'s chat template writes no image placeholder, so a "
            "raw prompt cannot place images; send them through /v1/chat/completions.",
            param=PARAM,
            code="unsupported_content_type",
        )
    prompt = text.replace(MEDIA_MARKER, placeholder)
    return replace(
        body,
        prompt=prompt,
        media=(),
        images=images,
        image_tokens=tokens,
        images_prompt=prompt,
    )
