"""The canonical request: what a request asks of planning and the engine, whichever door it came
through. Each door's wire model (pydantic, validated once) translates into it; nothing here
knows a door's field names, and a field a door adds lands here once."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..fim import InfillParts
from ..sampling.grammars import Constraint
from ..sampling.params import SamplingParams
from .messages import Message

if TYPE_CHECKING:
    from ..engine import StopSpec

# Text, token ids, a list of either (one prompt each), or llama.cpp's mix of text and ids.
PromptInput = str | list[Any]
# OpenAI's {"token id": bias}, or llama.cpp's text keys and [[id or text, bias]] pairs; a bias
# of False bans the token. Token ids come from the loaded model's tokenizer, in planning.
LogitBias = dict[str, float | bool] | list[tuple[int | str, float | bool]]


@dataclass(frozen=True)
class Output:
    """What the answer carries beside its text, and how it goes out."""

    logprobs: int | None = None  # alternatives per token (0: the chosen one's); None: none
    echo: bool = False  # the prompt leads the text (scored too, with logprobs)
    post_sampling_probs: bool = False  # llama.cpp: probabilities after the sampler chain
    skip_special_tokens: bool = True
    stream: bool = False
    usage_in_stream: bool = False  # OpenAI's stream_options.include_usage
    token_ids: bool = False  # vLLM's return_token_ids, llama.cpp's return_tokens
    timings: bool = False  # llama.cpp's timings_per_token
    progress: bool = False  # llama.cpp's return_progress


@dataclass(frozen=True)
class ContextFit:
    """What becomes of a prompt the context window cannot hold with its completion."""

    truncate: bool = False  # its oldest tokens go (else a 400 naming the numbers)
    keep_last: int | None = None  # only its last tokens, up front (vLLM, Ollama's num_ctx)
    keep_first: int | None = 0  # its first tokens (after BOS) stay where it is cut; None: all


@dataclass(frozen=True)
class NamedTool:
    """A tool_choice that names the function to call."""

    name: str | None


@dataclass(frozen=True)
class Chat:
    """A conversation for the model's chat template, and how its answer may call tools."""

    messages: tuple[Message, ...]  # checked (messages.check_messages)
    tools: tuple[
        dict[str, Any], ...
    ] = ()  # {"type": "function", "function": {...}}, as templates read them
    tool_choice: str | NamedTool | None = None  # "none", "auto", "required", one function
    parallel_tool_calls: bool = True
    add_generation_prompt: bool | None = None  # None: unless continuing the last message
    continue_final_message: bool = False
    template_kwargs: dict[str, Any] | None = None
    reasoning_format: str | None = None  # None: the server's --reasoning-format

    @property
    def generation_prompt(self) -> bool:
        if self.add_generation_prompt is None:
            return not self.continue_final_message
        return self.add_generation_prompt

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.for_template() for m in self.messages]

    def images(self) -> list[dict[str, Any]]:
        """Every image part of the conversation, in order (messages.image_part)."""
        return [part for m in self.messages for part in m.images()]

    def tool_images_left_out(self) -> Chat:
        """The conversation with the images of tools' results as lines saying so (for a model
        that reads none, or a template that places none in a tool's turn)."""
        messages = tuple(m.images_left_out() if m.role == "tool" else m for m in self.messages)
        return replace(self, messages=messages)

    @property
    def has_tool_images(self) -> bool:
        return any(m.role == "tool" and m.images() for m in self.messages)


@dataclass(frozen=True)
class Request:
    """One request: a prompt (or a conversation, rendered to one before planning), how many
    sequences, how each samples and stops, and what the answer carries."""

    sampling: SamplingParams  # logit_bias, DRY's breakers and the grammar are planning's
    stop: StopSpec  # the deadline is planning's
    model: str | None = None
    prompt: PromptInput | None = None  # a chat request's: its rendered token ids
    suffix: str | None = None  # text after the cursor: the model's fill-in-the-middle prompt
    infill: InfillParts | None = None  # llama.cpp's /infill
    chat: Chat | None = None
    max_tokens: int | None = None  # None: until the model ends or the context window is full
    n: int = 1
    best_of: int | None = None
    seed: int | None = None  # None or -1: random (defaults.random_seed)
    logit_bias: LogitBias | None = None
    constraint: Constraint | None = None  # the one output constraint
    output: Output = Output()
    fit: ContextFit = ContextFit()
    cache_prompt: bool = True
    num_draft_tokens: int | None = None  # most drafts a pass (None: the server's; 0: none)
    user: str | None = None
    media: tuple[str, ...] = ()  # llama.cpp's multimodal_data, as sent (media_prompt.py)
    images: tuple[bytes, ...] = ()  # a chat's images, read, in order
    image_tokens: int = 0  # the tokens its images become in the model's prompt (counted)
    images_prompt: str = ""  # with images: the rendered prompt's text, which the model's
    # processor reads (it expands each image's placeholder)
    checkpoints: tuple[int, ...] = ()  # a chat's message ends in its prompt's tokens
