"""Each stream's framing keeps one event's JSON on one line for readers that split with
str.splitlines (httpx's iter_lines: the `ollama` client), and the text parses back as sent."""

from __future__ import annotations

import json

import pytest

from mlxserve.api.ollama.replies import line
from mlxserve.api.responses import named_sse, sse

TEXT = 'naïve 🙂 a\u2028b\u0085c\u2029d\nq"\\'


@pytest.mark.parametrize("frame", [sse, line, named_sse], ids=["sse", "ndjson", "named"])
def test_one_event_is_one_line_to_splitlines(frame):
    payload = {"type": "content_block_delta", "text": TEXT}
    framed = frame(payload)
    data = [x for x in framed.splitlines() if x]
    assert json.loads(data[-1].removeprefix("data: ")) == payload
    assert len(data) == (2 if frame is named_sse else 1)
    assert "naïve 🙂" in framed  # other text goes as is, not \u-escaped
