"""How each coding agent is run: its command line, the environment and config files that point it
at the server (and nothing else), and the switches that keep it from phoning home."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

TASK = "Add a docstring to hello.py."
NEXT_TASK = "Now add a type hint to greet."
HELLO = 'def greet(name):\n    return "Hello, " + name\n'
MODEL = "tiny-agent"  # the served model's name (its folder's): Ollama's routes want it
RUN_TIMEOUT_S = 240  # one turn; Claude Code's first prompt (~18k tokens) prefills in seconds


@dataclass
class Agent:
    """One client: `turns` are its two command lines (the second continues the first's
    conversation), run in `work` with `env`."""

    name: str
    turns: tuple[list[str], list[str]]
    env: dict[str, str] = field(default_factory=dict)
    offers_tools: bool = False  # its requests offer the model tools (an agent's own)


def base_env(clients: Path, home: Path) -> dict[str, str]:
    """A clean environment: none of the developer's keys or proxies, a home of the test's own,
    Node 22 and the installed clients first on PATH."""
    node = next((clients / "node" / "node_modules").glob("node-*/bin"))
    path = [node, clients / "npm" / "node_modules" / ".bin", clients / "aider" / "bin"]
    path.append(clients / "llm" / "bin")
    return {
        "PATH": os.pathsep.join([*map(str, path), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "CI": "1",
        "NO_PROXY": "127.0.0.1,localhost",
    }


def llm(url: str, home: Path) -> Agent:
    """Simon Willison's `llm`: an OpenAI-compatible model from extra-openai-models.yaml."""
    user = home / "llm"
    user.mkdir(parents=True, exist_ok=True)
    (user / "extra-openai-models.yaml").write_text(
        f"- model_id: mlxserve\n  model_name: {MODEL}\n  api_base: {url}/v1\n"
    )
    return Agent(
        "llm",
        (["llm", "-m", "mlxserve", TASK], ["llm", "-c", NEXT_TASK]),
        {"LLM_USER_PATH": str(user)},
    )


AIDER_FLAGS = [
    "--yes-always",
    "--no-git",
    "--no-check-update",
    "--analytics-disable",
    "--no-show-release-notes",
    "--no-show-model-warnings",
    "--no-pretty",
    "--no-fancy-input",
    "--map-tokens",
    "0",
]
AIDER_ENV = {
    "AIDER_ANALYTICS": "false",
    "AIDER_CHECK_UPDATE": "false",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm fetches its price list otherwise
}


def aider(url: str, route: str) -> Agent:
    """aider through litellm: `openai/` (chat completions) or `ollama_chat/` (/api/chat)."""
    env = dict(AIDER_ENV)
    if route == "openai":
        env |= {"OPENAI_API_BASE": f"{url}/v1", "OPENAI_API_KEY": "unused"}
    else:
        env |= {"OLLAMA_API_BASE": url}
    first = ["aider", "--model", f"{route}/{MODEL}", *AIDER_FLAGS, "--message", TASK, "hello.py"]
    second = [*first[:-3], "--restore-chat-history", "--message", NEXT_TASK, "hello.py"]
    return Agent(f"aider ({route}/)", (first, second), env)


def opencode(url: str, home: Path) -> Agent:
    """opencode: an OpenAI-compatible provider (AI SDK's) in its config."""
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "mlxserve": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "mlxserve",
                "options": {"baseURL": f"{url}/v1", "apiKey": "unused"},
                "models": {MODEL: {"name": MODEL, "limit": {"context": 65536, "output": 4096}}},
            }
        },
        "model": f"mlxserve/{MODEL}",
        "small_model": f"mlxserve/{MODEL}",
        "autoupdate": False,
        "share": "disabled",
    }
    path = home / "opencode.json"
    path.write_text(json.dumps(config, indent=2))
    env = {
        "OPENCODE_CONFIG": str(path),
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",  # models.dev
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    }
    turns = (["opencode", "run", TASK], ["opencode", "run", "--continue", NEXT_TASK])
    return Agent("opencode", turns, env, offers_tools=True)


def continue_cli(url: str, home: Path) -> Agent:
    """Continue's `cn`: an `openai` provider model in a config.yaml."""
    path = home / "continue.yaml"
    path.write_text(
        "name: mlxserve\nversion: 1.0.0\nschema: v1\nmodels:\n"
        f"  - name: {MODEL}\n    provider: openai\n    model: {MODEL}\n"
        f"    apiBase: {url}/v1\n    apiKey: unused\n    roles: [chat, edit, apply]\n"
        "    defaultCompletionOptions:\n      contextLength: 65536\n"
    )
    first = ["cn", "-p", TASK, "--config", str(path)]
    env = {
        "CONTINUE_GLOBAL_DIR": str(home / ".continue"),
        "CONTINUE_CLI_ENABLE_TELEMETRY": "0",
        "CONTINUE_METRICS_ENABLED": "0",
        "CONTINUE_CLI_AUTO_UPDATED": "1",  # no self-update
    }
    second = ["cn", "-p", NEXT_TASK, "--config", str(path), "--resume"]
    return Agent("cn (Continue)", (first, second), env, offers_tools=True)


def claude_code(url: str) -> Agent:
    """Claude Code: Anthropic's /v1/messages at ANTHROPIC_BASE_URL."""
    env = {
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": "unused",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # telemetry, error reports, updates
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    turns = (["claude", "-p", TASK], ["claude", "-p", "--continue", NEXT_TASK])
    return Agent("Claude Code", turns, env, offers_tools=True)


def codex(url: str, home: Path) -> Agent:
    """Codex: OpenAI's /v1/responses through a model provider in config.toml."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        f'model = "{MODEL}"\nmodel_provider = "mlxserve"\ncheck_for_update_on_startup = false\n\n'
        f'[model_providers.mlxserve]\nname = "mlxserve"\nbase_url = "{url}/v1"\n'
        'wire_api = "responses"\n\n[analytics]\nenabled = false\n'
    )
    first = ["codex", "exec", "--skip-git-repo-check", TASK]
    second = ["codex", "exec", "--skip-git-repo-check", "resume", "--last", NEXT_TASK]
    return Agent("Codex", (first, second), {"CODEX_HOME": str(codex_home)}, offers_tools=True)


def run_turn(argv: list[str], env: dict[str, str], work: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv,
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
