"""The model's answer, as it streams, split into content, reasoning and tool calls.

Reasoning is the text inside the thinking tags at the start of the answer (or from the start,
when the prompt opened the tag): `<think>`, Mistral's `[THINK]`, whatever the family writes
(families.py); gpt-oss's harmony channels are split by harmony.py. Tool calls are read in the
model's syntax (tool_calls.py); a bare JSON answer is held to the end and read as calls where it
is one. Text that might be the start of a tag is held back until the next piece decides it, so
no tag leaks into content.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .tool_calls import PYTHON_TAG, ToolCall, ToolSyntax, cut_calls, parse_json_calls

THINK_TAGS = ("<think>", "</think>")


@dataclass(frozen=True)
class OutputSpec:
    think: tuple[str, str] | None = None  # the thinking tags; None: reasoning stays in content
    thinking_open: bool = False  # the prompt ended inside the thinking block
    tools: ToolSyntax | None = None  # None: calls are not looked for
    json_calls: bool = False  # a bare JSON answer may be a call (tools offered, choice auto)
    # The grammar made the whole answer calls: in `tools`' syntax, or (tools None) bare JSON, a
    # call or a list of them. Nothing else in it is content.
    forced: bool = False
    max_calls: int | None = None  # parallel_tool_calls false: the first call only
    harmony: bool = False  # gpt-oss's channels, not tags (harmony.py)
    reasoning_in_content: bool = False  # harmony's analysis channel as content (format "none")


@dataclass
class Delta:
    content: str = ""
    reasoning: str = ""
    calls: list[ToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.calls)

    def add(self, other: Delta) -> None:
        self.content += other.content
        self.reasoning += other.reasoning
        self.calls += other.calls


class StreamSplitter:
    """An answer's text as it streams, through a state machine: each state a method
    `_<state>(out, final)` that takes what it can decide from `pending` into `out`. Feed text
    as it comes (`feed`), then `finish`; each returns what is decided so far."""

    def __init__(self, spec: OutputSpec):
        self.spec = spec
        self.pending = ""
        self.calls_made = 0
        self.state = ""

    def feed(self, text: str, last: bool = False) -> Delta:
        """What `text` decides; with `last`, the rest too (the answer ends with it)."""
        self.pending += text
        out = self._drain(final=False)
        if last:
            out.add(self._drain(final=True))
        return out

    def finish(self) -> Delta:
        return self._drain(final=True)

    def _drain(self, final: bool) -> Delta:
        out = Delta()
        while True:
            step = getattr(self, f"_{self.state}")
            before = (self.state, len(self.pending))
            step(out, final)
            if (self.state, len(self.pending)) == before:
                return out

    def _take(self, out: Delta, calls: list[ToolCall]) -> None:
        if self.spec.max_calls is not None:
            calls = calls[: max(self.spec.max_calls - self.calls_made, 0)]
        self.calls_made += len(calls)
        out.calls += calls

    def _release(self, markers: tuple[str, ...], final: bool) -> str:
        """The pending text, less an end that may begin one of `markers` (kept pending)."""
        keep = 0 if final else max(partial_suffix(self.pending, m) for m in markers)
        text = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(self.pending) - keep :]
        return text


class AnswerSplitter(StreamSplitter):
    """Thinking tags, tool-call syntaxes and bare JSON calls. A harmony answer gets
    harmony.py's splitter, which answers the same calls."""

    def __new__(cls, spec: OutputSpec):
        if spec.harmony:
            from .harmony import HarmonySplitter  # it builds on this module's types

            return HarmonySplitter(spec)
        return super().__new__(cls)

    def __init__(self, spec: OutputSpec):
        super().__init__(spec)
        self.reasoned = False
        self.reasoning_begins = True  # its leading blank lines are dropped
        if spec.forced and spec.tools is None:
            self.state = "whole"
        elif spec.think is not None and spec.thinking_open:
            self.state = "reasoning"
        else:
            self.state = "start"

    def _start(self, out: Delta, final: bool) -> None:
        """The answer's first characters decide: thinking, a JSON call, or content."""
        text = self.pending.lstrip()
        if self.reasoned:
            self.pending = text  # the blank lines after </think> are not content
        think = self.spec.think if not self.reasoned else None
        tools = self.spec.tools
        if think is not None and text.startswith(think[0]):
            self.pending, self.state = text[len(think[0]) :], "reasoning"
        elif tools is not None and text.startswith(tools.start):
            self.state = "content"  # which finds the call at once
        elif not final and (self.reasoned and not text or _undecided(text, think, self.spec)):
            return
        elif self.spec.json_calls and (text[:1] in ("{", "[") or text.startswith(PYTHON_TAG)):
            self.state = "whole"
        else:
            self.state = "content"

    def _reasoning(self, out: Delta, final: bool) -> None:
        end = self.spec.think[1]
        if self.reasoning_begins:
            self.pending = self.pending.lstrip()
            self.reasoning_begins = not self.pending
        at = self.pending.find(end)
        if at >= 0:
            out.reasoning += self.pending[:at].rstrip()
            self.pending = self.pending[at + len(end) :]
            self.state, self.reasoned = "start", True
            return
        text = self._release((end,), final)
        blank_end = text[len(text.rstrip()) :]  # trailing blanks wait for what follows them
        out.reasoning += text[: len(text) - len(blank_end)]
        self.pending = ("" if final else blank_end) + self.pending

    def _content(self, out: Delta, final: bool) -> None:
        tools = self.spec.tools
        if tools is None:
            out.content += self.pending
            self.pending = ""
            return
        at = self.pending.find(tools.start)
        if at >= 0:
            text = self.pending[:at]
            self.pending = self.pending[at + len(tools.start) :]
            self.state = "call"
        else:
            text = self._release((tools.start,), final)
        if not self.spec.forced:  # else only the separators between the forced calls
            out.content += text

    def _call(self, out: Delta, final: bool) -> None:
        tools = self.spec.tools
        at = self.pending.find(tools.end) if tools.end else -1
        if at < 0 and not final:
            return
        raw = self.pending if at < 0 else self.pending[:at]
        self.pending = "" if at < 0 else self.pending[at + len(tools.end) :]
        self.state = "content"
        try:
            self._take(out, tools.parse(raw))
        except ValueError:  # cut short, or not a call after all: the text stays the answer's
            if self.spec.forced and at < 0:  # the grammar's call, cut by max_tokens
                self._take(out, cut_calls(raw))
            else:
                out.content += tools.start + raw + (tools.end if at >= 0 else "")

    def _whole(self, out: Delta, final: bool) -> None:
        """Held to the end: the whole answer is a call (or a list), or it is content."""
        if not final:
            return
        text, self.pending = self.pending, ""
        self.state = "done"
        try:
            self._take(out, parse_json_calls(text))
        except ValueError:
            if self.spec.forced:  # the grammar's calls, cut by max_tokens
                self._take(out, cut_calls(text))
            else:
                out.content += text

    def _done(self, out: Delta, final: bool) -> None:
        out.content += self.pending
        self.pending = ""


def _undecided(text: str, think: tuple[str, str] | None, spec: OutputSpec) -> bool:
    """Only blanks so far, or the beginning of a tag the answer may open with."""
    openers = [think[0]] if think is not None else []
    if spec.tools is not None:
        openers.append(spec.tools.start)
    if spec.json_calls:
        openers.append(PYTHON_TAG)
    if not text:
        return bool(openers)
    return any(opener.startswith(text) for opener in openers)


def partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker` (shorter than it)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def split_answer(spec: OutputSpec, text: str) -> Delta:
    """A whole answer at once (a response that is not streamed)."""
    return AnswerSplitter(spec).feed(text, last=True)
