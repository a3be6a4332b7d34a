"""The Hub client and model resolution, against a local Hub-shaped HTTP server (no internet; hack/hub_server.py)."""

from __future__ import annotations

import json
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import huggingface_hub.constants
import huggingface_hub.utils._http
import pytest
from hack.hub_server import TOKEN, FakeHub, Repo

from llm_autopilot.catalog.models import find_catalog_model
from llm_autopilot.domain.precision import WeightFormat
from llm_autopilot.hub.client import HubClient, ModelFetchError, fetch_adapter_config, load_local
from llm_autopilot.hub.resolve import ModelResolutionError, resolve_model

HUB_DATA = Path(__file__).resolve().parent.parent / "data" / "hub"

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_8B_BYTES = 16060522496  # metadata.total_size of its safetensors index
QWEN3_8B_BYTES = 16381470720
QWEN3_06B = "Qwen/Qwen3-0.6B"
QWEN3_06B_BYTES = 1_503_300_328  # size the test server reports for its single model.safetensors
MODELOPT_FP8 = "nvidia/Llama-3.1-70B-Instruct-FP8"
NOT_IN_CATALOG = "acme/qwen3-8b-support-bot"  # a fine-tune the built-in catalog cannot know


def fixture_files(folder: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((HUB_DATA / folder).iterdir()) if p.is_file()}


def fixture_json(folder: str, name: str = "config.json") -> dict[str, Any]:
    data: dict[str, Any] = json.loads((HUB_DATA / folder / name).read_text(encoding="utf-8"))
    return data


@pytest.fixture(autouse=True)
def _clean_hf_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own Hub settings must not leak into these tests."""
    for name in ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    server = FakeHub()
    server.repos[LLAMA_8B] = Repo(fixture_files("meta-llama--Llama-3.1-8B-Instruct"), gated=True)
    server.repos[QWEN3_06B] = Repo(fixture_files("Qwen--Qwen3-0.6B"),
                                   lfs_sizes={"model.safetensors": QWEN3_06B_BYTES})
    server.repos[MODELOPT_FP8] = Repo(fixture_files("nvidia--Llama-3.1-70B-Instruct-FP8"))
    server.repos[NOT_IN_CATALOG] = Repo(fixture_files("Qwen--Qwen3-8B"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def closed_endpoint() -> str:
    """An endpoint where nothing listens: any request to it fails (after huggingface_hub's retries)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def cache_dir(tmp_path: Path) -> str:
    return str(tmp_path / "hf-cache")


def client(hub: FakeHub, cache_dir: str, **kwargs: Any) -> HubClient:
    return HubClient(endpoint=hub.endpoint, cache_dir=cache_dir, **kwargs)


# --- HubClient.fetch ------------------------------------------------------------------------------------


def test_config_and_index_give_checkpoint_bytes(hub: FakeHub, cache_dir: str) -> None:
    files = client(hub, cache_dir, token=TOKEN).fetch(LLAMA_8B)
    assert files.config == fixture_json("meta-llama--Llama-3.1-8B-Instruct")
    assert files.checkpoint_bytes == LLAMA_8B_BYTES
    got = hub.paths("GET")
    assert f"/{LLAMA_8B}/resolve/main/config.json" in got
    assert f"/{LLAMA_8B}/resolve/main/model.safetensors.index.json" in got
    # with an index, the single-file checkpoint is not looked for
    assert not any(p.endswith("/model.safetensors") for p in hub.paths())
    # the files land in the given cache, under the commit the server reported
    snapshots = Path(cache_dir) / "models--meta-llama--Llama-3.1-8B-Instruct" / "snapshots"
    assert [p.name for p in snapshots.iterdir()] == [hub.repos[LLAMA_8B].commit("main")]


def test_hf_endpoint_environment_variable_points_the_client_at_a_mirror(
    hub: FakeHub, cache_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    files = HubClient(cache_dir=cache_dir).fetch(NOT_IN_CATALOG)
    assert files.config["hidden_size"] == 4096
    assert files.checkpoint_bytes == QWEN3_8B_BYTES
    assert f"/{NOT_IN_CATALOG}/resolve/main/config.json" in hub.paths("GET")


def test_without_index_the_size_comes_from_the_lfs_metadata(hub: FakeHub, cache_dir: str) -> None:
    files = client(hub, cache_dir).fetch(QWEN3_06B)
    assert files.config == fixture_json("Qwen--Qwen3-0.6B")
    assert files.checkpoint_bytes == QWEN3_06B_BYTES  # X-Linked-Size of the redirect
    assert f"/{QWEN3_06B}/resolve/main/model.safetensors" in hub.paths("HEAD")
    # only its metadata is read: the weights are never downloaded
    assert not any(p.endswith("model.safetensors") or "/cdn/" in p for p in hub.paths("GET"))


def test_without_index_a_plain_content_length_is_the_size(hub: FakeHub, cache_dir: str) -> None:
    hub.repos["acme/small"] = Repo(fixture_files("Qwen--Qwen3-0.6B"), plain_sizes={"model.safetensors": 123_456})
    assert client(hub, cache_dir).fetch("acme/small").checkpoint_bytes == 123_456


def test_no_index_and_no_single_file_means_unknown_size(hub: FakeHub, cache_dir: str) -> None:
    hub.repos["acme/sharded-without-index"] = Repo(fixture_files("Qwen--Qwen3-0.6B"))
    files = client(hub, cache_dir).fetch("acme/sharded-without-index")
    assert files.checkpoint_bytes is None
    assert files.config["num_hidden_layers"] == 28


def test_a_dropped_size_request_leaves_the_size_unknown(hub: FakeHub, cache_dir: str) -> None:
    hub.repos["acme/flaky"] = Repo(fixture_files("Qwen--Qwen3-0.6B"), hang_up={"model.safetensors"})
    files = client(hub, cache_dir).fetch("acme/flaky")
    assert files.config["hidden_size"] == 1024
    assert files.checkpoint_bytes is None
    assert "/acme/flaky/resolve/main/model.safetensors" in hub.paths("HEAD")


def test_a_dropped_config_request_is_a_fetch_error(hub: FakeHub, cache_dir: str) -> None:
    hub.repos["acme/flaky"] = Repo(fixture_files("Qwen--Qwen3-0.6B"), hang_up={"config.json"})
    with pytest.raises(ModelFetchError, match="cannot read acme/flaky from the Hub"):
        client(hub, cache_dir).fetch("acme/flaky")


def test_modelopt_quant_config_becomes_quantization_config(hub: FakeHub, cache_dir: str) -> None:
    files = client(hub, cache_dir).fetch(MODELOPT_FP8)
    assert "quantization_config" not in fixture_json("nvidia--Llama-3.1-70B-Instruct-FP8")
    assert files.config["quantization_config"] == {"quant_method": "modelopt", "quant_algo": "FP8"}
    assert files.config["hidden_size"] == 8192
    assert f"/{MODELOPT_FP8}/resolve/main/hf_quant_config.json" in hub.paths("GET")


def test_quantization_config_in_config_json_wins_over_hf_quant_config(hub: FakeHub, cache_dir: str) -> None:
    config = {**fixture_json("Qwen--Qwen3-0.6B"),
              "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    hub.repos["acme/fp8"] = Repo({"config.json": json.dumps(config).encode(),
                                  "hf_quant_config.json": b'{"quantization": {"quant_algo": "NVFP4"}}'})
    files = client(hub, cache_dir).fetch("acme/fp8")
    assert files.config["quantization_config"]["quant_method"] == "fp8"


def test_gated_repo_without_token_says_gated(hub: FakeHub, cache_dir: str) -> None:
    with pytest.raises(ModelFetchError, match="gated") as err:
        client(hub, cache_dir).fetch(LLAMA_8B)
    assert "token" in str(err.value)
    assert hub.requests and all(r.authorization is None for r in hub.requests)


def test_gated_repo_with_a_wrong_token_says_gated(hub: FakeHub, cache_dir: str) -> None:
    with pytest.raises(ModelFetchError, match="gated"):
        client(hub, cache_dir, token="hf_not_the_right_one").fetch(LLAMA_8B)
    assert hub.requests[0].authorization == "Bearer hf_not_the_right_one"


def test_gated_repo_with_token_argument(hub: FakeHub, cache_dir: str) -> None:
    files = client(hub, cache_dir, token=TOKEN).fetch(LLAMA_8B)
    assert files.checkpoint_bytes == LLAMA_8B_BYTES
    assert {r.authorization for r in hub.requests} == {f"Bearer {TOKEN}"}


def test_gated_repo_with_hf_token_environment_variable(
    hub: FakeHub, cache_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    files = client(hub, cache_dir).fetch(LLAMA_8B)
    assert files.config["num_hidden_layers"] == 32
    assert {r.authorization for r in hub.requests} == {f"Bearer {TOKEN}"}


def test_unknown_repo_is_not_found(hub: FakeHub, cache_dir: str) -> None:
    with pytest.raises(ModelFetchError, match="not found") as err:
        client(hub, cache_dir).fetch("acme/does-not-exist")
    assert "acme/does-not-exist" in str(err.value)
    assert "give a token" in str(err.value)  # it may be private


def test_unknown_repo_with_token_drops_the_private_hint(hub: FakeHub, cache_dir: str) -> None:
    with pytest.raises(ModelFetchError, match="not found") as err:
        client(hub, cache_dir, token=TOKEN).fetch("acme/does-not-exist")
    assert "give a token" not in str(err.value)


def test_repo_without_config_json(hub: FakeHub, cache_dir: str) -> None:
    hub.repos["acme/no-config"] = Repo({"README.md": b"# nothing here"})
    with pytest.raises(ModelFetchError, match=r"no config\.json"):
        client(hub, cache_dir).fetch("acme/no-config")


def test_config_that_is_not_json(hub: FakeHub, cache_dir: str) -> None:
    hub.repos["acme/broken"] = Repo({"config.json": b"{not json"})
    with pytest.raises(ModelFetchError, match=r"cannot read acme/broken config\.json"):
        client(hub, cache_dir).fetch("acme/broken")


def test_revision_is_passed_through_to_the_url(hub: FakeHub, cache_dir: str) -> None:
    old = {**fixture_json("Qwen--Qwen3-8B"), "max_position_embeddings": 32768}
    hub.repos[NOT_IN_CATALOG].revisions["v1.0"] = {"config.json": json.dumps(old).encode()}
    files = client(hub, cache_dir).fetch(NOT_IN_CATALOG, revision="v1.0")
    assert files.config["max_position_embeddings"] == 32768
    assert f"/{NOT_IN_CATALOG}/resolve/v1.0/config.json" in hub.paths("GET")
    assert not any("/resolve/main/" in p for p in hub.paths())


def test_unknown_revision(hub: FakeHub, cache_dir: str) -> None:
    with pytest.raises(ModelFetchError, match=r"revision 'no-such-tag' of acme/qwen3-8b-support-bot was not found"):
        client(hub, cache_dir).fetch(NOT_IN_CATALOG, revision="no-such-tag")


class _Backoff:
    """huggingface_hub's backoff clock (its module's ``time``): each wait is recorded, none is waited out."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)


def test_unreachable_endpoint_says_it_cannot_reach_the_hub(closed_endpoint: str, cache_dir: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # huggingface_hub retries connection errors with backoff (1+2+4+8+8 s): recorded here, not waited out
    backoff = _Backoff()
    monkeypatch.setattr(huggingface_hub.utils._http, "time", backoff)
    with pytest.raises(ModelFetchError, match="cannot reach the Hugging Face Hub") as err:
        HubClient(endpoint=closed_endpoint, cache_dir=cache_dir, timeout=2).fetch("acme/anything")
    assert "HF_ENDPOINT" in str(err.value)
    assert backoff.waits, "huggingface_hub no longer waits through its module's time: this test would wait again"


def test_an_unreachable_hub_is_not_an_absent_adapter_config(closed_endpoint: str, cache_dir: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # "no adapter_config.json" would plan the default rank as if the Hub had said so; "cannot ask" must say so
    monkeypatch.setattr(huggingface_hub.utils._http, "time", _Backoff())
    client = HubClient(endpoint=closed_endpoint, cache_dir=cache_dir, timeout=2)
    with pytest.raises(ModelFetchError, match="cannot reach the Hugging Face Hub for LoRA adapter org/support"):
        fetch_adapter_config(client, "org/support")


def test_offline_with_nothing_cached_is_not_an_absent_optional_file(hub: FakeHub, cache_dir: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    files = client(hub, cache_dir).fetch(QWEN3_06B)  # online: config.json is now cached, the rest is not
    assert files.checkpoint_bytes == QWEN3_06B_BYTES
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelFetchError, match="cannot reach the Hugging Face Hub for LoRA adapter"):
        fetch_adapter_config(client(hub, cache_dir), QWEN3_06B)


def test_an_adapter_config_read_once_is_answered_from_the_cache_while_the_hub_is_down(
        hub: FakeHub, cache_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # maxLoraRank's default follows the adapters' ranks: a Hub outage must give the rank read before, not none
    monkeypatch.setattr(huggingface_hub.utils._http, "time", _Backoff())
    hub.repos["org/support"] = Repo({"adapter_config.json": json.dumps({"r": 32}).encode()})
    assert fetch_adapter_config(client(hub, cache_dir, timeout=2), "org/support") == {"r": 32}
    hub.stop()
    assert fetch_adapter_config(client(hub, cache_dir, timeout=2), "org/support") == {"r": 32}


# --- load_local -----------------------------------------------------------------------------------------


def test_load_local_folder_reads_config_and_index() -> None:
    files = load_local(HUB_DATA / "meta-llama--Llama-3.1-8B-Instruct")
    assert files.config == fixture_json("meta-llama--Llama-3.1-8B-Instruct")
    assert files.checkpoint_bytes == LLAMA_8B_BYTES


def test_load_local_file_alone_has_no_size(tmp_path: Path) -> None:
    path = tmp_path / "my-config.json"
    shutil.copy(HUB_DATA / "Qwen--Qwen3-0.6B" / "config.json", path)
    files = load_local(path)
    assert files.config == fixture_json("Qwen--Qwen3-0.6B")
    assert files.checkpoint_bytes is None


def test_load_local_file_reads_the_index_beside_it() -> None:
    files = load_local(str(HUB_DATA / "Qwen--Qwen3-8B" / "config.json"))
    assert files.checkpoint_bytes == QWEN3_8B_BYTES


def test_load_local_folder_with_modelopt_quant_config() -> None:
    files = load_local(HUB_DATA / "nvidia--Llama-3.1-70B-Instruct-FP8")
    assert files.config["quantization_config"] == {"quant_method": "modelopt", "quant_algo": "FP8"}


def test_load_local_flat_hf_quant_config(tmp_path: Path) -> None:
    shutil.copy(HUB_DATA / "Qwen--Qwen3-8B" / "config.json", tmp_path / "config.json")
    (tmp_path / "hf_quant_config.json").write_text('{"quant_algo": "NVFP4"}', encoding="utf-8")
    assert load_local(tmp_path).config["quantization_config"]["quant_algo"] == "NVFP4"


@pytest.mark.parametrize("index", [{}, {"metadata": {}}, {"metadata": {"total_size": 0}},
                                   {"metadata": "oops"}, {"metadata": {"total_size": "12"}},
                                   {"metadata": {"total_size": float("inf")}}, {"metadata": {"total_size": True}}])
def test_load_local_index_without_a_usable_size(tmp_path: Path, index: dict[str, Any]) -> None:
    shutil.copy(HUB_DATA / "Qwen--Qwen3-8B" / "config.json", tmp_path / "config.json")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index), encoding="utf-8")
    assert load_local(tmp_path).checkpoint_bytes is None


def test_load_local_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ModelFetchError, match=r"no config\.json at"):
        load_local(tmp_path / "nowhere")
    with pytest.raises(ModelFetchError, match=r"no config\.json at"):
        load_local(tmp_path)  # a folder without config.json


@pytest.mark.parametrize(("text", "message"), [("{oops", "cannot read"), ("[1, 2]", "not a JSON object")])
def test_load_local_bad_json(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "config.json").write_text(text, encoding="utf-8")
    with pytest.raises(ModelFetchError, match=message):
        load_local(tmp_path)


# --- resolve_model --------------------------------------------------------------------------------------


def test_catalog_model_needs_no_network(closed_endpoint: str, cache_dir: str) -> None:
    offline = HubClient(endpoint=closed_endpoint, cache_dir=cache_dir)
    started = time.monotonic()
    resolved = resolve_model(f"hf://{LLAMA_8B}", client=offline)
    assert resolved == find_catalog_model(LLAMA_8B)
    assert resolved.checkpoint_bytes == LLAMA_8B_BYTES
    assert time.monotonic() - started < 1  # a Hub call would have retried for ~20 s, then failed


def test_unknown_model_resolves_through_the_hub(hub: FakeHub, cache_dir: str) -> None:
    assert find_catalog_model(NOT_IN_CATALOG) is None
    resolved = resolve_model(NOT_IN_CATALOG, client=client(hub, cache_dir))
    assert resolved.model_id == NOT_IN_CATALOG
    assert resolved.hidden_size == 4096
    assert resolved.num_layers == 36
    assert resolved.num_kv_heads == 8
    assert resolved.checkpoint_bytes == QWEN3_8B_BYTES
    assert f"/{NOT_IN_CATALOG}/resolve/main/config.json" in hub.paths("GET")


def test_modelopt_checkpoint_resolves_to_fp8_weights(hub: FakeHub, cache_dir: str) -> None:
    hub.repos["acme/llama-70b-modelopt"] = hub.repos[MODELOPT_FP8]
    resolved = resolve_model("acme/llama-70b-modelopt", client=client(hub, cache_dir))
    assert resolved.weight_format == WeightFormat.FP8


def test_catalog_model_at_a_revision_is_fetched(hub: FakeHub, cache_dir: str) -> None:
    hub.repos[LLAMA_8B].revisions["v1.0"] = {}
    resolved = resolve_model(LLAMA_8B, revision="v1.0", client=client(hub, cache_dir, token=TOKEN))
    assert resolved.num_layers == 32
    assert f"/{LLAMA_8B}/resolve/v1.0/config.json" in hub.paths("GET")


def test_complete_inline_override_needs_no_network(closed_endpoint: str, cache_dir: str) -> None:
    override = {k: v for k, v in fixture_json("Qwen--Qwen3-8B").items() if k != "max_position_embeddings"}
    started = time.monotonic()
    resolved = resolve_model("acme/private-model", override=override, override_checkpoint_bytes=42 * 2**30,
                             client=HubClient(endpoint=closed_endpoint, cache_dir=cache_dir))
    assert time.monotonic() - started < 1
    assert resolved.model_id == "acme/private-model"
    assert resolved.hidden_size == 4096
    assert resolved.checkpoint_bytes == 42 * 2**30
    assert resolved.max_position_embeddings == 4096  # the default when the override leaves it out


def test_partial_override_is_merged_over_the_fetched_config(hub: FakeHub, cache_dir: str) -> None:
    resolved = resolve_model(NOT_IN_CATALOG, override={"max_position_embeddings": 8192, "num_key_value_heads": 4},
                             client=client(hub, cache_dir))
    assert resolved.max_position_embeddings == 8192
    assert resolved.num_kv_heads == 4
    assert resolved.num_layers == 36  # from the Hub
    assert resolved.checkpoint_bytes == QWEN3_8B_BYTES


def test_override_of_a_catalog_model_is_merged_onto_the_catalog_config(hub: FakeHub, cache_dir: str) -> None:
    resolved = resolve_model(LLAMA_8B, override={"max_position_embeddings": 16384},
                             override_checkpoint_bytes=1000, client=client(hub, cache_dir, token=TOKEN))
    assert resolved.max_position_embeddings == 16384
    assert resolved.hidden_size == 4096
    assert resolved.checkpoint_bytes == 1000  # the override's size wins over the catalog's
    assert hub.paths("GET") == []  # air-gapped clusters can override a catalog model
    kept = resolve_model(LLAMA_8B, override={"max_position_embeddings": 16384}, client=client(hub, cache_dir))
    assert kept.checkpoint_bytes == LLAMA_8B_BYTES  # a context-only override keeps the catalog's size
    reshaped = resolve_model(LLAMA_8B, override={"num_hidden_layers": 16}, client=client(hub, cache_dir))
    assert reshaped.num_layers == 16 and reshaped.checkpoint_bytes is None  # sized from the architecture


def test_variants_are_added(closed_endpoint: str, cache_dir: str) -> None:
    resolved = resolve_model(LLAMA_8B, variants={WeightFormat.AWQ: "acme/llama-8b-awq"},
                             client=HubClient(endpoint=closed_endpoint, cache_dir=cache_dir))
    assert resolved.variants[WeightFormat.AWQ] == "acme/llama-8b-awq"


def test_failed_fetch_points_at_the_inline_architecture(hub: FakeHub, cache_dir: str) -> None:
    with pytest.raises(ModelResolutionError) as err:
        resolve_model("acme/does-not-exist", override={"hidden_size": 4096}, client=client(hub, cache_dir))
    message = str(err.value)
    assert "not found" in message
    assert "spec.model.architecture" in message
    assert "num_hidden_layers" in message and "vocab_size" in message
    assert "hidden_size" not in message.split("missing:")[1]  # given already


def test_gated_model_resolution_error_says_gated(hub: FakeHub, cache_dir: str) -> None:
    with pytest.raises(ModelResolutionError, match="gated") as err:
        resolve_model(LLAMA_8B, revision="main", client=client(hub, cache_dir))
    assert "spec.model.architecture" in str(err.value)


def test_fetched_config_that_cannot_be_planned_names_the_field(hub: FakeHub, cache_dir: str) -> None:
    config = {k: v for k, v in fixture_json("Qwen--Qwen3-8B").items() if k != "num_hidden_layers"}
    hub.repos["acme/odd"] = Repo({"config.json": json.dumps(config).encode()})
    with pytest.raises(ModelResolutionError, match=r"acme/odd: config.json has no 'num_hidden_layers'"):
        resolve_model("acme/odd", client=client(hub, cache_dir))
