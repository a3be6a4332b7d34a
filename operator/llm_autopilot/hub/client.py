"""Fetch the files that describe a model: config.json, the safetensors index, hf_quant_config.json.

Uses huggingface_hub, so ``HF_ENDPOINT`` (a mirror, or the test server), ``HF_TOKEN`` and the
local cache work as users expect. Errors become :class:`ModelFetchError` with an actionable message.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

CONFIG = "config.json"
SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_SINGLE = "model.safetensors"
MODELOPT_QUANT_CONFIG = "hf_quant_config.json"


class ModelFetchError(RuntimeError):
    """The model's files could not be read; the message says what to do."""


@dataclass(frozen=True)
class ModelFiles:
    """What we read about one checkpoint."""

    config: dict[str, Any]
    checkpoint_bytes: int | None


def _endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None


def _read_json(path: str | Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelFetchError(f"cannot read {what}: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelFetchError(f"{what} is not a JSON object")
    return data


def _total_size(index: dict[str, Any]) -> int | None:
    size = index.get("metadata", {}).get("total_size") if isinstance(index.get("metadata"), dict) else None
    if isinstance(size, bool) or not isinstance(size, int | float) or not math.isfinite(size) or size <= 0:
        return None  # also 1e400, which JSON reads as inf
    return int(size)


def _with_modelopt(config: dict[str, Any], modelopt: dict[str, Any] | None) -> dict[str, Any]:
    """NVIDIA ModelOpt checkpoints describe their quantization in hf_quant_config.json."""
    if modelopt and "quantization_config" not in config:
        quant = modelopt.get("quantization", modelopt)
        algo = quant.get("quant_algo") if isinstance(quant, dict) else None
        if algo:
            return {**config, "quantization_config": {"quant_method": "modelopt", "quant_algo": algo}}
    return config


def load_local(path: str | Path) -> ModelFiles:
    """A config.json file, or a folder holding one (and optionally its safetensors index)."""
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    config_path = p / CONFIG if p.is_dir() else p
    if not config_path.is_file():
        raise ModelFetchError(f"no config.json at {config_path}")
    config = _read_json(config_path, str(config_path))
    index_path = folder / SAFETENSORS_INDEX
    size = _total_size(_read_json(index_path, str(index_path))) if index_path.is_file() else None
    modelopt_path = folder / MODELOPT_QUANT_CONFIG
    modelopt = _read_json(modelopt_path, str(modelopt_path)) if modelopt_path.is_file() else None
    return ModelFiles(_with_modelopt(config, modelopt), size)


class HubClient:
    """Reads model files from the Hub (or the ``HF_ENDPOINT`` mirror)."""

    def __init__(self, *, token: str | None = None, endpoint: str | None = None,
                 cache_dir: str | None = None, timeout: float = 10.0) -> None:
        self._token = token or os.environ.get("HF_TOKEN") or None
        self._endpoint = endpoint or _endpoint()
        self._cache_dir = cache_dir
        self._timeout = timeout

    def _download(self, repo_id: str, filename: str, revision: str | None) -> str:
        return hf_hub_download(repo_id, filename, revision=revision, token=self._token or False,
                               endpoint=self._endpoint, cache_dir=self._cache_dir,
                               etag_timeout=self._timeout)

    def _optional_json(self, repo_id: str, filename: str, revision: str | None) -> dict[str, Any] | None:
        try:
            return _read_json(self._download(repo_id, filename, revision), f"{repo_id}/{filename}")
        except LocalEntryNotFoundError:
            # the Hub could not be asked (unreachable, or offline with nothing cached): not "the file is absent",
            # which would plan an adapter's default rank or a model with no size as if the Hub had said so
            raise
        except EntryNotFoundError:
            return None

    def _file_size(self, repo_id: str, filename: str, revision: str | None) -> int | None:
        url = hf_hub_url(repo_id, filename, revision=revision, endpoint=self._endpoint)
        try:
            meta = get_hf_file_metadata(url, token=self._token or False, timeout=self._timeout)
        except Exception:  # best effort, including the HTTP library's transport errors
            return None
        return meta.size

    def fetch(self, repo_id: str, revision: str | None = None) -> ModelFiles:
        where = f"{repo_id}@{revision}" if revision else repo_id
        try:
            config = _read_json(self._download(repo_id, CONFIG, revision), f"{where} config.json")
            index = self._optional_json(repo_id, SAFETENSORS_INDEX, revision)
            size = _total_size(index) if index else self._file_size(repo_id, SAFETENSORS_SINGLE, revision)
            modelopt = self._optional_json(repo_id, MODELOPT_QUANT_CONFIG, revision)
        except GatedRepoError as exc:
            raise ModelFetchError(f"{repo_id} is gated: accept its licence on the Hub and give a token") from exc
        except RepositoryNotFoundError as exc:
            hint = " (or it is private: give a token)" if not self._token else ""
            raise ModelFetchError(f"model {repo_id} was not found on the Hub{hint}") from exc
        except RevisionNotFoundError as exc:
            raise ModelFetchError(f"revision {revision!r} of {repo_id} was not found") from exc
        except LocalEntryNotFoundError as exc:  # before EntryNotFoundError: it is a subclass
            raise ModelFetchError(
                f"cannot reach the Hugging Face Hub for {where} (set HF_ENDPOINT for a mirror)"
            ) from exc
        except EntryNotFoundError as exc:
            raise ModelFetchError(f"{where} has no config.json") from exc
        except HfHubHTTPError as exc:
            raise ModelFetchError(f"the Hub answered an error for {where}: {exc}") from exc
        except ModelFetchError:
            raise
        except Exception as exc:  # the HTTP library's transport errors (dropped connection, bad response...)
            raise ModelFetchError(
                f"cannot read {where} from the Hub ({type(exc).__name__}: {exc}); check HF_ENDPOINT"
            ) from exc
        return ModelFiles(_with_modelopt(config, modelopt), size)


ADAPTER_CONFIG = "adapter_config.json"


def fetch_adapter_config(client: HubClient, repo_id: str, revision: str | None = None) -> dict[str, Any] | None:
    """A PEFT adapter's ``adapter_config.json`` (its rank ``r`` and ``base_model_name_or_path``); None when the
    repository has none. Raises ModelFetchError when the Hub cannot be read."""
    where = f"{repo_id}@{revision}" if revision else repo_id
    try:
        return client._optional_json(repo_id, ADAPTER_CONFIG, revision)
    except GatedRepoError as exc:
        raise ModelFetchError(f"LoRA adapter {repo_id} is gated: accept its licence on the Hub and give a token") \
            from exc
    except RepositoryNotFoundError as exc:
        raise ModelFetchError(f"LoRA adapter {repo_id} was not found on the Hub") from exc
    except LocalEntryNotFoundError as exc:
        raise ModelFetchError(
            f"cannot reach the Hugging Face Hub for LoRA adapter {where} (set HF_ENDPOINT for a mirror)"
        ) from exc
    except ModelFetchError:
        raise
    except Exception as exc:  # transport errors, HTTP errors
        raise ModelFetchError(f"cannot read {where}/{ADAPTER_CONFIG} from the Hub ({type(exc).__name__}: {exc})") \
            from exc
