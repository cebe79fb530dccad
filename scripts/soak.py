"""Soak test: a real server under N minutes of C concurrent clients, some of which hang up.

Starts `mlxserve serve` (the embedded demo model unless --model, or --url for a running server),
then:

1. computes every request template's answer alone, one request at a time (seeded or greedy, so
   each has one right answer);
2. runs C client loops for --minutes: each picks a template at random (OpenAI /v1/completions
   streamed or not, n=2, logprobs, stop strings, a JSON schema, llama.cpp's /completion and
   /infill) and checks the answer against the solo one. With probability --disconnect-rate the
   client hangs up instead: in the request headers, in the body, while the prompt prefills, or
   mid-stream;
3. reports requests ok / 4xx / 5xx, lost answers (no complete answer, no hang-up of ours),
   cross-talk (an answer closer to another template's than to its own), answers that drifted
   (they start as the solo run does, then a seeded draw near a tie went the other way: a
   batch's float sums differ from a lone sequence's in the last bits),
   the server's memory (RSS) idle and every 30 s after --warmup-s under load (MLX's buffer cache
   and the prefix cache fill up first): growth is the median of the last quarter of those
   samples over the first quarter's; and whether every sequence was freed.

Exit status 1 if any 5xx, lost or cross-talked answer, unfreed sequence or memory
growth of 10 % or more.

With --fault-rate, that share of requests is made to fail mid-step in its own row: the request's
`user` names a stage (sampler, detokenizer, the batch's decode pass (forward) or a pass carrying
its prompt (prefill), or the grammar for the JSON-schema template), which soak's own server
honours because it runs through the tests' fault injection (`python -m tests.faults serve`,
tests/faults.py; mlxserve itself never reads `user` for this, so --fault-rate cannot go with
--url). Each must end in a 500 or an error in its stream ("faults reported"), and every other
answer must still equal its solo run.

With --second-model, the server serves that model too and every template but infill is sent to
it as well (naming it): two models' batches on one thread, each answer against its own model's.

    python scripts/soak.py [--minutes 30] [--concurrency 16] [--disconnect-rate 0.1]
                           [--fault-rate 0.01] [--model PATH | --url http://127.0.0.1:8080]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from common import ServerDidNotStart, demo_model, served, sse_chunk, start_server  # noqa: E402

PROMPTS = [
    "def fibonacci(n):\n",
    "import os\n\n\ndef list_files(path):\n",
    "class Stack:\n    def __init__(self):\n",
    "def read_json(path):\n    with open(path) as f:\n",
    "# Parse command line arguments\nimport argparse\n\n",
    "def is_prime(n):\n    if n < 2:\n",
    "for i in range(10):\n",
    "def merge(a, b):\n    result = []\n",
]
FAULT_STAGES = ("sampler", "detokenizer", "forward", "prefill")
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "size": {"type": "integer"}},
    "required": ["name", "size"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class Template:
    """One request and where it goes; `answer` reads the text(s) out of its response."""

    route: str
    body: dict[str, Any]
    stream: bool

    def payload(self) -> dict[str, Any]:
        return {**self.body, "stream": self.stream}


def templates(rng: random.Random, second_model: str | None = None) -> list[Template]:
    """Every template once; with `second_model`, each again naming it (but infill, which the
    second model may not have), so two models' batches run side by side."""
    out = []
    for i, prompt in enumerate(PROMPTS):
        base = {"prompt": prompt, "max_tokens": rng.choice([8, 16, 32, 48])}
        out += [
            Template("/v1/completions", {**base, "temperature": 0.8, "seed": i}, False),
            Template("/v1/completions", {**base, "temperature": 0.8, "seed": i + 100}, True),
            Template("/v1/completions", {**base, "temperature": 0}, True),
            Template(
                "/v1/completions",
                {**base, "temperature": 0.9, "seed": i, "n": 2, "logprobs": 2, "stop": ["\n\n"]},
                False,
            ),
            Template("/completion", {**base, "seed": i, "n_predict": base["max_tokens"]}, True),
        ]
    out += [
        Template(
            "/infill",
            {"input_prefix": p, "input_suffix": "\n\nprint('done')\n", "n_predict": 24, "seed": i},
            False,
        )
        for i, p in enumerate(PROMPTS[:4])
    ]
    out.append(
        Template(
            "/v1/completions",
            {"prompt": "JSON: ", "max_tokens": 48, "seed": 3, "response_format": schema_format()},
            False,
        )
    )
    if second_model is not None:
        out += [
            Template(t.route, {**t.body, "model": second_model}, t.stream)
            for t in out
            if t.route != "/infill"
        ]
    return out


def schema_format() -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA}}


def answer_of(template: Template, status: int, chunks: list[dict[str, Any]]) -> list[str] | None:
    """The texts a response carries (one per choice), or None when it is incomplete."""
    if status != 200 or not chunks:
        return None
    if template.route == "/v1/completions":
        texts: dict[int, str] = {}
        finished = set()
        for chunk in chunks:
            for choice in chunk.get("choices", []):
                texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
                if choice.get("finish_reason"):
                    finished.add(choice["index"])
        if finished != set(texts):
            return None
        return [texts[i] for i in sorted(texts)]
    text = "".join(c.get("content", "") for c in chunks)
    return [text] if chunks[-1].get("stop") else None


@dataclass
class Tally:
    counts: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)

    def add(self, kind: str, example: str = "") -> None:
        self.counts[kind] += 1
        if example and kind not in self.examples:
            self.examples[kind] = example[:300]


async def send(
    client: httpx.AsyncClient, template: Template, hang_up_after: int | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """POST a template; returns (status, parsed chunks or the one body). `hang_up_after`: close
    the stream after that many chunks (0 = right after the headers)."""
    if not template.stream:
        response = await client.post(template.route, json=template.payload())
        body = response.json()
        return response.status_code, body if isinstance(body, list) else [body]
    chunks: list[dict[str, Any]] = []
    async with client.stream("POST", template.route, json=template.payload()) as response:
        if response.status_code != 200:
            await response.aread()
            return response.status_code, [response.json()]
        async for line in response.aiter_lines():
            if hang_up_after is not None and len(chunks) >= hang_up_after:
                return -1, chunks
            chunk = sse_chunk(line)
            if chunk is not None:
                chunks.append(chunk)
    return 200, chunks


async def hang_up_raw(port: int, template: Template, where: str) -> None:
    """Send part of a request over a bare socket, then close it: in the headers or the body."""
    body = json.dumps(template.payload()).encode()
    head = (
        f"POST {template.route} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    data = head[: len(head) // 2] if where == "headers" else head + body[: len(body) // 2]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.close()
    await writer.wait_closed()


async def client_loop(
    base_url: str,
    port: int,
    pool: list[Template],
    expected: dict[int, list[str]],
    owners: dict[str, int],
    deadline: float,
    rate: float,
    rng: random.Random,
    tally: Tally,
    fault_rate: float = 0.0,
) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        while time.monotonic() < deadline:
            index = rng.randrange(len(pool))
            template = pool[index]
            if rng.random() < rate:
                await hang_up(client, port, template, rng, tally)
                continue
            if rng.random() < fault_rate:
                await faulty(client, template, rng, tally)
                continue
            try:
                status, chunks = await send(client, template)
            except (httpx.HTTPError, ValueError) as error:
                tally.add("lost", f"{template.route}: {error!r}")
                continue
            if status >= 500 or any("error" in chunk for chunk in chunks):
                tally.add("5xx", json.dumps(chunks)[:300])  # or an error inside a stream
                continue
            if status >= 400:
                tally.add("4xx", json.dumps(chunks)[:300])
                continue
            texts = answer_of(template, status, chunks)
            if texts is None:
                tally.add("lost", f"incomplete answer from {template.route}")
            elif texts == expected[index]:
                tally.add("ok")
            else:
                kind, note = compare(texts, index, expected)
                tally.add(kind, f"{template.route} {template.body}: {note}")


async def faulty(
    client: httpx.AsyncClient, template: Template, rng: random.Random, tally: Tally
) -> None:
    """The template made to fail in one of its row's stages after a few tokens: the failure
    must reach the client (a 500, or an error in the stream)."""
    stage = "grammar" if "response_format" in template.body else rng.choice(FAULT_STAGES)
    after = rng.randrange(4)
    body = {**template.body, "user": f"mlxserve-fault:{stage}:{after}"}
    try:
        status, chunks = await send(client, Template(template.route, body, template.stream))
    except (httpx.HTTPError, ValueError) as error:
        tally.add("lost", f"a faulty {template.route}: {error!r}")
        return
    reported = status >= 500 or any("error" in chunk for chunk in chunks)
    if reported:
        tally.add("faults reported")
    elif stage != "prefill" and (generated_tokens(chunks) or after + 1) <= after:
        tally.add("faults not reached", f"{stage}:{after}: {json.dumps(chunks)[:300]}")
    else:
        tally.add("faults unreported", f"{stage}:{after}: {json.dumps(chunks)[:300]}")


def generated_tokens(chunks: list[dict]) -> int | None:
    """The tokens an answer says it generated (OpenAI's usage), if it says."""
    counts = [
        c["usage"]["completion_tokens"]
        for c in chunks
        if isinstance(c.get("usage"), dict) and "completion_tokens" in c["usage"]
    ]
    return max(counts) if counts else None


def common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def compare(texts: list[str], index: int, expected: dict[int, list[str]]) -> tuple[str, str]:
    """An answer unlike its solo run is cross-talk when it is closer to another template's
    answer than to its own; otherwise it drifted: it starts as the solo run does and then took
    another draw (a batch's float sums differ from a lone sequence's in the last bits)."""

    def closeness(other: int) -> int:
        return sum(common_prefix(a, b) for a, b in zip(texts, expected[other]))

    own = closeness(index)
    nearest = max((i for i in expected if i != index), key=closeness)
    if len(texts) != len(expected[index]) or closeness(nearest) > own:
        return "cross-talk", f"{texts!r} is closest to template {nearest}"
    return "drifted", f"the first {own} characters as alone, then {texts!r}"


async def hang_up(
    client: httpx.AsyncClient, port: int, template: Template, rng: random.Random, tally: Tally
) -> None:
    where = rng.choice(["headers", "body", "prefill", "stream"])
    try:
        if where in ("headers", "body"):
            await hang_up_raw(port, template, where)
        elif where == "prefill" or not template.stream:
            # Give up after a few milliseconds: mostly while the prompt is being processed.
            await asyncio.wait_for(send(client, template), timeout=rng.uniform(0.005, 0.2))
        else:
            await send(client, template, hang_up_after=rng.randrange(0, 4))
    except (asyncio.TimeoutError, httpx.HTTPError, OSError):
        pass
    tally.add(f"hung up ({where})")


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (ps works on macOS and Linux alike)."""
    out = subprocess.run(["ps", "-o", "rss=", "-p", str(pid)], capture_output=True, text=True)
    return int(out.stdout.strip() or 0) * 1024


def metric(base_url: str, name: str) -> float:
    """A metric summed over its models' samples (engine metrics carry a model label)."""
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in httpx.get(f"{base_url}/metrics", timeout=10).text.splitlines()
        if line.startswith((f"mlxserve_{name} ", f"mlxserve_{name}{{"))
    ]
    if not values:
        raise KeyError(name)
    return sum(values)


async def soak(args: argparse.Namespace, base_url: str, port: int, pid: int | None) -> int:
    rng = random.Random(args.seed)
    second = Path(args.second_model).name if args.second_model else None
    pool = templates(rng, second)
    expected: dict[int, list[str]] = {}
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        for index, template in enumerate(pool):
            status, chunks = await send(client, template)
            texts = answer_of(template, status, chunks)
            if texts is None:
                raise RuntimeError(f"solo run of {template} failed: {status} {chunks}")
            expected[index] = texts
    owners = {json.dumps(texts): index for index, texts in expected.items()}
    print(f"{len(pool)} templates answered alone; {len(owners)} distinct answers")
    rss_idle = rss_bytes(pid) if pid else 0
    tally = Tally()
    deadline = time.monotonic() + args.minutes * 60
    loops = [
        client_loop(
            base_url,
            port,
            pool,
            expected,
            owners,
            deadline,
            args.disconnect_rate,
            random.Random(args.seed * 1000 + c),
            tally,
            args.fault_rate,
        )
        for c in range(args.concurrency)
    ]
    samples: list[int] = []

    async def sample_memory() -> None:
        """RSS every 30 s; the first sample, once warmed up under load, is the baseline."""
        await asyncio.sleep(min(args.warmup_s, args.minutes * 60))
        while pid and time.monotonic() < deadline:
            samples.append(rss_bytes(pid))
            done = sum(tally.counts.values())
            left = max(0, deadline - time.monotonic()) / 60
            print(f"  {done} requests, RSS {samples[-1] / 2**20:.0f} MiB, {left:.1f} min left")
            await asyncio.sleep(min(30, max(0.1, deadline - time.monotonic())))

    started = time.monotonic()
    await asyncio.gather(sample_memory(), *loops)
    elapsed = time.monotonic() - started
    await asyncio.sleep(1.0)  # let the server notice the last hang-ups
    pending = metric(base_url, "pending_sequences")
    batch = metric(base_url, "batch_size")
    memory = Memory(rss_idle, [*samples, rss_bytes(pid)]) if pid else None
    return report(args, tally, elapsed, memory, pending, batch)


@dataclass
class Memory:
    """RSS samples every 30 s after the warm-up. RSS swings by ~20 % between samples as freed
    memory goes back to the system and is taken again, so growth compares the medians of the
    first and the last quarter of the samples, not two single samples."""

    idle: int  # after the solo runs, before the load
    samples: list[int]  # under load, after --warmup-s

    @property
    def quarters(self) -> tuple[int, int]:
        quarter = max(1, len(self.samples) // 4)
        return (
            int(statistics.median(self.samples[:quarter])),
            int(statistics.median(self.samples[-quarter:])),
        )

    @property
    def growth(self) -> float:
        first, last = self.quarters
        return (last - first) / first if first else 0.0


def report(args, tally, elapsed, memory: Memory | None, pending, batch) -> int:
    counts = tally.counts
    answered = counts["ok"] + counts["drifted"] + counts["cross-talk"]
    hung_up = sum(v for k, v in counts.items() if k.startswith("hung up"))
    growth = memory.growth if memory else 0.0
    print(f"\n{args.minutes:g} min at {args.concurrency} clients ({elapsed:.0f} s measured)")
    print("| | count |\n|---|---|")
    rows = [
        ("answers checked", answered),
        ("ok (identical to the solo run)", counts["ok"]),
        ("drifted (same start as alone, then another draw)", counts["drifted"]),
        ("cross-talk (another request's answer)", counts["cross-talk"]),
        ("lost (no complete answer, no hang-up)", counts["lost"]),
        ("4xx", counts["4xx"]),
        ("5xx", counts["5xx"]),
        ("hung up on purpose", hung_up),
        ("made to fail on purpose: failure reported", counts["faults reported"]),
        ("made to fail on purpose: failure not reported", counts["faults unreported"]),
        ("made to fail on purpose: ended before the fault was due", counts["faults not reached"]),
    ]
    rows += [(f"  {k}", v) for k, v in sorted(counts.items()) if k.startswith("hung up")]
    for name, value in rows:
        print(f"| {name} | {value} |")
    print(f"| requests per second | {(answered + hung_up) / elapsed:.1f} |")
    if memory:
        first, last = memory.quarters
        mib = [round(m / 2**20) for m in (memory.idle, min(memory.samples), max(memory.samples))]
        print(
            f"| server RSS idle / under load min, max | {mib[0]} / {mib[1]}, {mib[2]} MiB |\n"
            f"| RSS median, first / last quarter of the run | {first / 2**20:.0f} / "
            f"{last / 2**20:.0f} MiB ({growth:+.1%}) |"
        )
    print(f"| sequences pending / in the batch at the end | {pending:g} / {batch:g} |")
    for kind, example in tally.examples.items():
        if kind in ("lost", "5xx", "4xx", "drifted", "cross-talk", "faults unreported"):
            print(f"example of {kind}: {example}")
    failed = counts["5xx"] or counts["lost"] or counts["cross-talk"] or pending
    failed = failed or counts["faults unreported"]
    return 1 if failed or growth >= 0.10 else 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--disconnect-rate", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--fault-rate",
        type=float,
        default=0.0,
        help="share of requests made to fail mid-step in their own row; soak's own server only "
        "(it then runs through tests/faults.py's fault injection), not with --url",
    )
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=120.0,
        help="seconds under load before the memory baseline (MLX's buffer cache and the prefix "
        "cache fill up first)",
    )
    parser.add_argument("--model", default=None, help="model folder (default: the demo model)")
    parser.add_argument("--url", default=None, help="soak a running server instead")
    parser.add_argument(
        "--second-model",
        default=None,
        help="serve this model too and send every request to it as well (requests name it)",
    )
    args = parser.parse_args()
    if args.url and args.fault_rate:
        parser.error(
            "--fault-rate needs soak's own server: faults on purpose come from the tests' "
            "wrappers (tests/faults.py) around the engine, which a server at --url does not run"
        )
    if args.url:
        port = int(args.url.rsplit(":", 1)[1].strip("/"))
        return asyncio.run(soak(args, args.url.rstrip("/"), port, None))
    try:
        extra = ["--model", args.second_model] if args.second_model else []
        module = "tests.faults" if args.fault_rate else "mlxserve"
        start = partial(start_server, args.model or demo_model(), extra=extra, module=module)
        with served(start, "soak") as server:
            try:
                return asyncio.run(soak(args, server.url, server.port, server.process.pid))
            finally:
                print(f"server log: {server.log_path}")
    except ServerDidNotStart as error:
        print(f"soak: server did not start: {error}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
