"""How the front answers an engine's error event: an image the model's processor refused is
the request's fault (a 400 `invalid_image`), anything else the server's (a 500)."""

from __future__ import annotations

import pytest

from mlxserve.api.errors import InvalidRequest, ServerError
from mlxserve.api.responses import raise_on_error
from mlxserve.engine import GenerationEvent
from mlxserve.engine.requests import INVALID_IMAGE


def test_a_refused_image_is_a_400_and_other_failures_a_500():
    with pytest.raises(InvalidRequest) as refused:
        raise_on_error(GenerationEvent(index=0, error="too narrow", code=INVALID_IMAGE))
    assert refused.value.status == 400 and refused.value.code == INVALID_IMAGE
    with pytest.raises(ServerError):
        raise_on_error(GenerationEvent(index=0, error="the step failed"))
    raise_on_error(GenerationEvent(index=0, text="fine"))  # no error: nothing raised
