"""Whether a model or adapter source can possibly load, checked before serving (no MLX: the
front process checks what the command line names), and the error a failed load raises."""

from __future__ import annotations

import json
from pathlib import Path

HUB_TIMEOUT_S = 10.0  # the start-up check that the Hugging Face hub answers
LOCAL_FOLDER_HINT = "or serve a model folder on this machine: --model /path/to/folder"
ADAPTER_FILES = ("adapter_config.json", "adapters.safetensors")


class ModelLoadError(Exception):
    """The model could not be loaded; the message is one line a user can act on."""


def check_model_source(path_or_repo: str) -> None:
    """Fail fast, before serving, on a source that cannot possibly load: a folder that is not
    a model, or a hub repo id that is not in the local cache while the hub cannot be reached
    (or has no such repo)."""
    path = Path(path_or_repo).expanduser()
    if looks_like_path(path_or_repo):
        if not path.is_dir():
            raise ModelLoadError(f"model folder not found: {path_or_repo}")
        if not (path / "config.json").exists():
            raise ModelLoadError(f"{path_or_repo} has no config.json: not an mlx-lm model folder")
    elif cached_hub_folder(path_or_repo) is None:
        _check_hub(path_or_repo)


def looks_like_path(path_or_repo: str) -> bool:
    return path_or_repo.startswith((".", "/", "~")) or Path(path_or_repo).expanduser().exists()


def cached_hub_folder(repo: str) -> Path | None:
    """`repo`'s snapshot folder in the local Hugging Face cache, if it is there."""
    from huggingface_hub import try_to_load_from_cache

    try:
        config = try_to_load_from_cache(repo, "config.json")
    except ValueError:  # not a repo id at all
        return None
    return Path(config).parent if isinstance(config, str) else None


def _not_cached(repo: str) -> str:
    from huggingface_hub import constants

    return (
        f"model {repo} is not a folder here nor in the local Hugging Face cache "
        f"({constants.HF_HUB_CACHE})"
    )


def hub_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def hub_failed(repo: str, what: str) -> ModelLoadError:
    return ModelLoadError(
        f"{_not_cached(repo)}, and {what}; check the network (or HF_ENDPOINT), {LOCAL_FOLDER_HINT}"
    )


def _check_hub(repo: str) -> None:
    """One look-up on the hub for a repo not in the cache: an unreachable hub, or no such repo,
    is a one-line error before serving, not a failed load after it."""
    from huggingface_hub import constants, model_info
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    if constants.HF_HUB_OFFLINE:
        raise ModelLoadError(
            f"{_not_cached(repo)}, and HF_HUB_OFFLINE is set, so it is not downloaded from "
            f"{constants.ENDPOINT}: unset HF_HUB_OFFLINE, {LOCAL_FOLDER_HINT}"
        )
    try:
        model_info(repo, timeout=HUB_TIMEOUT_S)
    except ValueError as error:  # huggingface_hub's HFValidationError
        raise ModelLoadError(
            f"model folder not found, and not a Hugging Face repo id either: {repo} ({error})"
        ) from error
    except RepositoryNotFoundError as error:
        raise ModelLoadError(
            f"{_not_cached(repo)}, and {constants.ENDPOINT} has no such repo (or it is private "
            f"or gated: `hf auth login`); {LOCAL_FOLDER_HINT.removeprefix('or ')}"
        ) from error
    except HfHubHTTPError:
        return  # the hub answered: the download itself may still work
    except Exception as error:  # the network's errors (httpx, OSError), in the user's words
        reason = f"{type(error).__name__}: {first_line(error)}"
        raise hub_failed(repo, f"{constants.ENDPOINT} cannot be reached ({reason})") from error


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def check_adapter_folder(path: str) -> None:
    """Fail fast (ModelLoadError) on a folder that is not an mlx-lm adapter."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ModelLoadError(f"adapter folder not found: {path}")
    missing = [name for name in ADAPTER_FILES if not (folder / name).is_file()]
    if missing:
        raise ModelLoadError(
            f"{path} is not an mlx-lm adapter folder: it has no {' or '.join(missing)}"
        )
    try:
        config = json.loads((folder / "adapter_config.json").read_text())
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"{path}/adapter_config.json: {error}") from error
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path}/adapter_config.json is not a JSON object")
