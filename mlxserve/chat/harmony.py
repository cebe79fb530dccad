"""gpt-oss's harmony answer, as it streams, split into content, reasoning and tool calls.

A harmony answer is a run of messages, each a header then a body:
`<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...`. The
analysis channel is reasoning, the final channel content. A header naming a recipient
(`to=functions.NAME`, before or after the channel, with `<|constrain|>json` or a bare `json`
beside it) makes the body a call's JSON arguments; commentary without one is a preamble the user
sees, content. `<|call|>` and `<|return|>` end the answer (the model's stop tokens), `<|end|>` a
message. Text before any header (a model not writing harmony) is content.
"""

from __future__ import annotations

import re

from .output import Delta, OutputSpec, StreamSplitter
from .tool_calls import ToolCall, call_id

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
END, CALL, RETURN, CONSTRAIN = "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"
MARKERS = (START, CHANNEL, MESSAGE, END, CALL, RETURN, CONSTRAIN)
_BODY_ENDS = (END, CALL, RETURN)
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*(\w+)")
FUNCTIONS = "functions."
RECIPIENT = "to="


class HarmonySplitter(StreamSplitter):
    """Harmony's headers and bodies, channel by channel."""

    def __init__(self, spec: OutputSpec):
        super().__init__(spec)
        self.state = "loose"  # text outside any message: content until a header starts
        self.header = ""
        self.channel = ""
        self.recipient: str | None = None
        self.arguments = ""
        self.begins = True  # a body's leading blank lines are dropped

    def _loose(self, out: Delta, final: bool) -> None:
        """Outside a message: `<|start|>` or `<|channel|>` opens a header; anything else is
        content (a model that writes no harmony), but for the blanks between messages. A
        recipient may open the header before its channel (` to=functions.f<|channel|>...`, the
        generation prompt having written `<|start|>assistant`)."""
        stripped = self.pending.lstrip()
        if stripped.startswith(RECIPIENT):
            self.pending, self.state, self.header = stripped, "header", ""
            return
        if not final and stripped and RECIPIENT.startswith(stripped):
            return  # it may be a recipient's beginning
        at = _first(self.pending, (START, CHANNEL))
        if at is None:
            text = self._release((START, CHANNEL), final)
            if not self.spec.forced and text.strip():
                out.content += text
            return
        text, self.pending = self.pending[:at], self.pending[at:]
        if not self.spec.forced and text.strip():
            out.content += text
        self.state, self.header = "header", ""

    def _header(self, out: Delta, final: bool) -> None:
        at = self.pending.find(MESSAGE)
        if at < 0:
            if final:  # a header cut off by max_tokens: nothing of it is the answer's
                self.pending = ""
            return
        self.header = self.pending[:at]
        self.pending = self.pending[at + len(MESSAGE) :]
        channel = _CHANNEL.search(self.header)
        recipient = _RECIPIENT.search(self.header)
        self.channel = channel.group(1) if channel else ""
        self.recipient = recipient.group(1) if recipient else None
        self.arguments, self.begins = "", True
        self.state = "body"

    def _body(self, out: Delta, final: bool) -> None:
        at = _first(self.pending, _BODY_ENDS)
        if at is None:
            text = self._release(_BODY_ENDS, final)
            ended = final
        else:
            text = self.pending[:at]
            marker = next(m for m in _BODY_ENDS if self.pending.startswith(m, at))
            self.pending = self.pending[at + len(marker) :]
            ended = True
        self._emit(out, text, ended)
        if ended:
            self.state = "loose"

    def _emit(self, out: Delta, text: str, ended: bool) -> None:
        if self.recipient is not None:
            self.arguments += text
            if ended:
                self._call(out)
            return
        if self.begins:
            text = text.lstrip()
            self.begins = not text
        if self.channel == "analysis" and not self.spec.reasoning_in_content:
            out.reasoning += text
        elif not self.spec.forced:
            out.content += text

    def _call(self, out: Delta) -> None:
        name = self.recipient.removeprefix(FUNCTIONS)
        self._take(out, [ToolCall(name, self.arguments.strip() or "{}", call_id())])


def _first(text: str, markers: tuple[str, ...]) -> int | None:
    found = [at for m in markers if (at := text.find(m)) >= 0]
    return min(found) if found else None
