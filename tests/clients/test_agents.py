"""Each coding agent, as installed from its registry, does two turns of a small task against the
server: every request it sent was answered 2xx, it exits 0, and the second turn reuses the first's
prompt from the prefix cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import agents, tool_replay
from .conftest import RESULTS, Request

pytestmark = pytest.mark.clients

GENERATION_PATHS = {"/v1/chat/completions", "/v1/responses", "/v1/messages", "/api/chat"}


@pytest.fixture
def work(tmp_path) -> Path:
    (tmp_path / "home").mkdir()
    work = tmp_path / "work"
    work.mkdir()
    (work / "hello.py").write_text(agents.HELLO)
    return work


def largest(requests: list[Request]) -> Request:
    generations = [r for r in requests if r.path in GENERATION_PATHS and r.prompt_tokens]
    assert generations, f"no generation among {requests}"
    return max(generations, key=lambda r: r.prompt_tokens)


def agent_request(bodies: list[tuple[str, str]]) -> tuple[str, dict] | None:
    """The agent's main request of a turn, where it offered tools: the largest body that did."""
    offered = [
        (path, json.loads(text))
        for path, text in bodies
        if path in tool_replay.SHAPES and '"tools"' in text
    ]
    offered = [(path, body) for path, body in offered if body.get("tools")]
    return max(offered, key=lambda item: len(json.dumps(item[1])), default=None)


def run_agent(agent: agents.Agent, installed: Path, work: Path, access_log, url: str) -> None:
    """Both turns; then the record: the agent's prompt (turn 1's largest) and how much of turn 2's
    largest prompt came from the cache. An agent that offers tools has its first turn's request
    sent again with one forced, then with the call's result."""
    home = work.parent / "home"
    env = agents.base_env(installed, home) | agent.env
    turns = []
    for argv in agent.turns:
        run = agents.run_turn(argv, env, work)
        requests = access_log.take()
        output = f"$ {' '.join(argv)}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
        refused = [r for r in requests if not 200 <= r.status < 300]
        assert not refused, f"{agent.name}: answered {refused}\n{output}"
        assert run.returncode == 0, f"{agent.name} exited {run.returncode}\n{output}"
        turns.append(largest(requests))
        if len(turns) == 1:
            main_request = agent_request(access_log.take_bodies())
    first, second = turns
    share = second.cached_tokens / second.prompt_tokens
    line = (
        f"prompt {first.prompt_tokens} tokens; next turn {second.prompt_tokens} tokens, "
        f"{second.cached_tokens} cached ({share:.0%})"
    )
    print(f"{agent.name}: {line}")
    RESULTS.append((agent.name, line))
    assert second.cached_tokens > 0, f"{agent.name}'s second turn reused nothing: {line}"
    assert (main_request is not None) == agent.offers_tools, main_request
    if main_request is not None:
        path, body = main_request
        tool = tool_replay.round_trip(url, path, body)
        replayed = access_log.take()
        assert [r.status for r in replayed] == [200, 200], replayed
        line = f"forced {tool} on {path}, its result sent back: 200, 200"
        print(f"{agent.name}: {line}")
        RESULTS.append((agent.name, line))


def test_llm_chats_two_turns(installed, agent_server, access_log, work):
    agent = agents.llm(agent_server.url, work.parent / "home")
    run_agent(agent, installed, work, access_log, agent_server.url)


@pytest.mark.parametrize("route", ["openai", "ollama_chat"])
def test_aider_edits_over_two_turns(installed, agent_server, access_log, work, route):
    agent = agents.aider(agent_server.url, route)
    run_agent(agent, installed, work, access_log, agent_server.url)


def test_opencode_runs_two_turns(installed, agent_server, access_log, work):
    agent = agents.opencode(agent_server.url, work.parent / "home")
    run_agent(agent, installed, work, access_log, agent_server.url)


def test_continue_cli_runs_two_turns(installed, agent_server, access_log, work):
    agent = agents.continue_cli(agent_server.url, work.parent / "home")
    run_agent(agent, installed, work, access_log, agent_server.url)


def test_claude_code_runs_two_turns(installed, agent_server, access_log, work):
    agent = agents.claude_code(agent_server.url)
    run_agent(agent, installed, work, access_log, agent_server.url)


def test_codex_execs_two_turns(installed, agent_server, access_log, work):
    agent = agents.codex(agent_server.url, work.parent / "home")
    run_agent(agent, installed, work, access_log, agent_server.url)
