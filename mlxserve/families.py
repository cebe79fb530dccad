"""What each model family needs of the server, in one place, as plain data both processes read.

A family is named by the mlx-lm modules that run it (`mlx_lm.models.NAME`: config.json's
`model_type`, after mlx-lm's own renames: Mistral runs as `llama`). What its files say is read
from them, not written here: the kinds of cache its layers keep (`CacheLayout.of`, at load),
its FIM template (the vocabulary's tokens, fim.py), its chat template, and the reasoning tags
and tool-call parser mlx-lm infers from its vocabulary and template (chat/). Written here is
what the server must know beyond its files, and what the family matrix holds each family to:
the kinds of cache, mixed batches, and the output formats mlx-lm does not read (`OUTPUT_FORMATS`,
told by a marker the chat template holds, whatever the model's architecture).

Adding a family: docs/architecture.md, "Adding a family".
"""

from __future__ import annotations

from dataclasses import dataclass

# the kinds of cache a layer keeps (engine/mlx_lm_compat/cache_kinds.py's names)
KV = "kv"
WINDOW = "sliding window"
STATE = "linear attention / state space"


@dataclass(frozen=True)
class Family:
    name: str
    modules: tuple[str, ...]  # the mlx-lm model modules that run it
    caches: tuple[str, ...]  # what its layers may keep (the family matrix checks it)
    # prompt chunks ride in decode passes (engine/mlx_lm_compat/mixed_batch.py runs its layers:
    # a norm, attention with Qwen3's q/k norms or none, a norm and an MLP); else passes apart
    mixed_batches: bool = False
    output: str = ""  # the name of its own OUTPUT_FORMATS entry, where it writes one
    notes: str = ""  # what else a user of it should know


FAMILIES: tuple[Family, ...] = (
    Family("llama", ("llama",), (KV,), mixed_batches=True, notes="Llama 2 / 3, Mistral 7B, SmolLM"),
    Family("qwen2", ("qwen2",), (KV,), mixed_batches=True, notes="Qwen2 / 2.5, Qwen2.5-Coder"),
    Family("qwen3", ("qwen3",), (KV,), mixed_batches=True),
    Family("qwen3_moe", ("qwen3_moe",), (KV,)),
    Family("qwen3_5", ("qwen3_5",), (STATE, KV), notes="Qwen3.5 / 3.6, dense and MoE"),
    Family("qwen3_next", ("qwen3_next",), (STATE, KV)),
    Family("gemma3", ("gemma3_text", "gemma3"), (WINDOW, KV)),
    Family("gemma4", ("gemma4_text", "gemma4"), (WINDOW, KV)),
    Family(
        "gpt_oss",
        ("gpt_oss",),
        (WINDOW, KV),
        output="harmony",
        notes="attention sinks: no --kv-bits",
    ),
    Family(
        "deepseek_v3",
        ("deepseek_v3",),
        (KV,),
        output="deepseek calls",
        notes="V3, V3.1; MLA, its latent KV kept as plain KV",
    ),
    Family("glm4_moe", ("glm4_moe",), (KV,)),
    Family(
        "ministral3",
        ("ministral3",),
        (WINDOW, KV),
        output="mistral reasoning",
        notes="Mistral 3, Ministral 3, Magistral",
    ),
    Family("lfm2", ("lfm2",), (STATE, KV)),
    Family("nemotron_h", ("nemotron_h",), (STATE, KV), notes="mlx-lm's batching mended"),
    Family("granitemoehybrid", ("granitemoehybrid",), (STATE, KV)),
    Family("kimi_linear", ("kimi_linear",), (STATE, KV)),
)

_BY_MODULE = {module: family for family in FAMILIES for module in family.modules}


def family_of(module: str) -> Family | None:
    """The family an mlx-lm model module (`mlx_lm.models.NAME` or NAME) runs, if named here."""
    return _BY_MODULE.get(module.rsplit(".", 1)[-1])


def mixed_batch_modules() -> tuple[str, ...]:
    """The mlx-lm modules whose layers ride prompt chunks in decode passes."""
    return tuple(m for f in FAMILIES if f.mixed_batches for m in f.modules)


@dataclass(frozen=True)
class OutputFormat:
    """How a family writes its answer where mlx-lm reads it otherwise or not at all."""

    name: str
    marker: str  # text its chat template holds, which tells the format
    think: tuple[str, str] | None = None  # its reasoning's tags
    tool_syntax: str | None = None  # the tool parser of ours (chat/tool_calls.OWN_SYNTAXES)
    channels: bool = False  # gpt-oss's harmony channels (chat/harmony.py), not tags

    @property
    def reasons(self) -> bool:
        """Its answers carry reasoning the server reads apart from content."""
        return self.think is not None or self.channels


OUTPUT_FORMATS: tuple[OutputFormat, ...] = (
    OutputFormat("harmony", "<|channel|>", channels=True),
    OutputFormat("mistral reasoning", "[THINK]", think=("[THINK]", "[/THINK]")),
    OutputFormat("seed reasoning", "<seed:think>", think=("<seed:think>", "</seed:think>")),
    OutputFormat("deepseek calls", "<｜tool▁calls▁begin｜>", tool_syntax="deepseek_v31"),
)


def output_format(chat_template: str | None) -> OutputFormat | None:
    """The format a chat template's markers tell, if it is one mlx-lm does not read."""
    if not chat_template:
        return None
    return next((f for f in OUTPUT_FORMATS if f.marker in chat_template), None)
