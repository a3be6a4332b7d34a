"""LoRA adapter memory, derived from vLLM 0.33's source (planner/lora.py): hand-checked on Llama-3.1-8B."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from llm_autopilot.catalog.hf_config import parse_hf_config
from llm_autopilot.domain.architecture import ModelArchitecture
from llm_autopilot.domain.precision import GIB
from llm_autopilot.planner import lora
from llm_autopilot.planner.config import ServingConfig
from llm_autopilot.planner.lora import LoRASettings
from llm_autopilot.planner.memory import estimate
from llm_autopilot.planner.plan import Infeasible, Plan, PlanRequest, Targets
from llm_autopilot.planner.search import plan
from llm_autopilot.vllm.versions import VLLMBehaviour
from tests.conftest import gpu, model

CONFIGS = Path("/work/shared/data/model-configs")


def real_config(name: str) -> ModelArchitecture:
    path = CONFIGS / f"{name}.json"
    if not path.exists():  # the catalog holds the same config.json files
        return model(name.replace("--", "/"))
    return parse_hf_config(json.loads(path.read_text()), name.replace("--", "/"))


def config(vllm: VLLMBehaviour, m: ModelArchitecture, **changes: object) -> ServingConfig:
    base = ServingConfig(model=m, gpu=gpu("nvidia-h100-80gb"), vllm=vllm, tensor_parallel_size=1,
                         pipeline_parallel_size=1, gpu_memory_utilization=0.9, max_model_len=8192,
                         max_num_seqs=256, max_num_batched_tokens=2048)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_llama_8b_slots_by_hand() -> None:
    # Llama-3.1-8B: hidden 4096, 32 heads, 8 KV heads of 128, intermediate 14336, 32 layers, vocab 128256.
    # Rank 16, one layer, one slot (elements):
    #   qkv_proj  A 3 x 16 x 4096 = 196,608   B (4096 + 2 x 1024) x 16 = 98,304
    #   o_proj    A 16 x 4096 = 65,536        B 4096 x 16 = 65,536
    #   gate_up   A 2 x 16 x 4096 = 131,072   B 2 x 14336 x 16 = 458,752
    #   down      A 16 x 14336 = 229,376      B 4096 x 16 = 65,536           -> 1,310,720 per layer
    # 32 layers = 41,943,040; embed_tokens 128256 x 16 + 4096 x 16 = 2,117,632 and lm_head the same
    # -> 46,178,304 elements x 2 bytes (bf16) = 92,356,608 bytes per slot (88.1 MiB).
    m = real_config("meta-llama--Llama-3.1-8B-Instruct")
    assert lora.layer_slot_elements(m, 1, 16, dense_mlp=True) == 1_310_720
    one = lora.slot_bytes(m, 1, 32, 0, LoRASettings(1, 16), dtype_bytes=2)
    assert one == 92_356_608
    assert lora.slot_bytes(m, 1, 32, 0, LoRASettings(4, 16), dtype_bytes=2) == 4 * one
    assert lora.slot_bytes(m, 1, 32, 0, LoRASettings(1, 64), dtype_bytes=2) == 4 * one  # linear in the rank


def test_tensor_parallel_shards_only_the_column_b_and_row_a_halves() -> None:
    # TP 2: qkv B (2048 + 2 x 512) x 16, o_proj A 16 x 2048, gate_up B 2 x 7168 x 16, down A 16 x 7168;
    # the column A and row B halves, the embeddings and the LM head stay whole on every rank.
    m = real_config("meta-llama--Llama-3.1-8B-Instruct")
    tp2 = lora.layer_slot_elements(m, 2, 16, dense_mlp=True)
    assert tp2 == 196_608 + 49_152 + 32_768 + 65_536 + 131_072 + 229_376 + 114_688 + 65_536
    # KV heads never go below one per rank (replicated), as the KV projection is
    m8 = lora.layer_slot_elements(m, 16, 16, dense_mlp=True)
    assert m8 == 3 * 16 * 4096 + (256 + 2 * 128) * 16 + 16 * 256 + 4096 * 16 + 2 * 16 * 4096 + 2 * 896 * 16 \
        + 16 * 896 + 4096 * 16


def test_moe_experts_are_counted_per_expert() -> None:
    m = real_config("Qwen--Qwen3-30B-A3B")
    assert m.moe is not None
    e, h, inter, r = m.moe.num_experts, m.hidden_size, m.moe.expert_intermediate_size, 16
    dense = lora.layer_slot_elements(dataclasses.replace(m, moe=None), 1, r, dense_mlp=True)
    attention = dense - (2 * r * h + 2 * m.intermediate_size * r + r * m.intermediate_size + h * r)
    experts = e * r * (3 * h + 3 * inter) + r * h + e * r
    assert lora.layer_slot_elements(m, 1, r, dense_mlp=False) == attention + experts


def test_estimate_subtracts_slots_profile_and_doubles_graph_sizes(vllm033: VLLMBehaviour) -> None:
    m = real_config("meta-llama--Llama-3.1-8B-Instruct")
    base = estimate(config(vllm033, m))
    with_lora = estimate(config(vllm033, m, lora=LoRASettings(4, 16)))
    assert with_lora.lora_slots_bytes == pytest.approx(4 * 92_356_608 + lora.punica_metadata_bytes(2048, 256, 4))
    assert with_lora.lora_profile_bytes == 3 * 2048 * 16 * 4
    graphs_extra = with_lora.cuda_graph_bytes - base.cuda_graph_bytes
    assert 0 < graphs_extra < base.cuda_graph_bytes  # the per-size part doubles, not the pool
    assert base.kv_cache_bytes - with_lora.kv_cache_bytes == pytest.approx(
        with_lora.lora_slots_bytes + with_lora.lora_profile_bytes + graphs_extra)
    assert with_lora.as_dict()["lora_slots_gib"] == round(with_lora.lora_slots_bytes / GIB, 2)
    assert "lora_slots_gib" not in base.as_dict()


def test_mla_models_are_refused_not_guessed(vllm033: VLLMBehaviour) -> None:
    m = real_config("deepseek-ai--DeepSeek-V3")
    e = estimate(config(vllm033, m, tensor_parallel_size=8, lora=LoRASettings(1, 16)))
    assert not e.fits and any("LoRA memory is not modelled" in p for p in e.problems)


def test_rank_for_rounds_up_to_what_vllm_accepts() -> None:
    assert [lora.rank_for(r) for r in (1, 2, 8, 9, 300, 512, 513)] == [1, 8, 8, 16, 320, 512, None]


def test_planner_fits_lora_and_names_the_smallest_fix(vllm033: VLLMBehaviour) -> None:
    m = model("Qwen/Qwen3-8B")
    ok = plan(PlanRequest(m, gpu("nvidia-l4"), vllm033,
                          Targets(max_model_len=8192, max_gpus=1, lora=LoRASettings(2, 16))))
    assert isinstance(ok, Plan)
    assert ok.estimate.lora_slots_bytes > 0 and any(r.field == "lora" for r in ok.reasons)
    # 8 slots at rank 64 (~1.9 GiB per GPU) leave no KV room on one L4 next to 15.3 GiB of weights
    too_many = plan(PlanRequest(m, gpu("nvidia-l4"), vllm033,
                                Targets(max_model_len=8192, max_gpus=1, lora=LoRASettings(8, 64), lora_min_slots=2)))
    assert isinstance(too_many, Infeasible)
    assert "LoRA slots at rank 64" in too_many.message
    assert too_many.suggestions[:2] == (
        "lower spec.lora.maxLoras to 3 (from 8; never below the 2 pinned)",
        "lower spec.lora.maxLoraRank to 16 (from 64; adapters of a higher rank are then refused)")
    assert any("needs at least 2 x L4" in s for s in too_many.suggestions)
    # never below the pinned adapters: with 4 pinned, 3 slots are not offered
    pinned = plan(PlanRequest(m, gpu("nvidia-l4"), vllm033,
                              Targets(max_model_len=8192, max_gpus=1, lora=LoRASettings(8, 64), lora_min_slots=4)))
    assert isinstance(pinned, Infeasible) and not any("maxLoras" in s for s in pinned.suggestions)
    # when the KV cache is what does not fit, fp8 KV keeps every slot
    kv = plan(PlanRequest(m, gpu("nvidia-l4"), vllm033,
                          Targets(max_model_len=16384, max_gpus=1, lora=LoRASettings(2, 16))))
    assert isinstance(kv, Infeasible)
    assert "add fp8 to allowedKVCacheDtypes (keeps 2 slots at rank 16 on 1 x L4)" in kv.suggestions


# --- the API: spec.lora -> targets, arguments, status; refusals -------------------------------------------------

import yaml  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from llm_autopilot.api import convert  # noqa: E402
from llm_autopilot.api.lora import AdapterConfig, lora_problems, parse_adapter_config  # noqa: E402
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec  # noqa: E402
from llm_autopilot.controller.admission import review  # noqa: E402
from llm_autopilot.render.vllm_args import conflicting_extra_args, render_vllm_args  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen3-8b-l4-lora.yaml"


def spec(**lora: object) -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate({"model": {"name": "Qwen/Qwen3-8B"},
                                             "gpu": {"product": "nvidia-l4", "maxGPUs": 1},
                                             "serving": {"maxModelLen": 16384, "allowedKVCacheDtypes": ["auto", "fp8"]},
                                             "lora": lora})


ADAPTERS = [{"name": "support-bot", "source": "hf://org/support", "pinned": True},
            {"name": "sql", "source": "org/sql"}]


def test_spec_lora_renders_the_flags_and_the_status(vllm033: VLLMBehaviour) -> None:
    s = spec(adapters=ADAPTERS, maxCPULoras=4)
    t = convert.targets(s)
    assert t.lora == LoRASettings(2, 16, 4, (("support-bot", "org/support"), ("sql", "org/sql")))
    assert t.lora_min_slots == 1  # one pinned adapter
    result = plan(PlanRequest(model("Qwen/Qwen3-8B"), gpu("nvidia-l4"), vllm033, t))
    assert isinstance(result, Plan)
    args = render_vllm_args(result)
    tail = args[args.index("--enable-lora"):]
    assert tail == ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "16", "--max-cpu-loras", "4",
                    "--lora-modules", "support-bot=org/support", "sql=org/sql", "--port", "8000"]
    status = convert.plan_status(result, args)
    assert status.lora_adapters == ["support-bot", "sql"]
    dumped = status.model_dump(by_alias=True)["memory"]
    assert dumped["loraSlotsGiB"] == round(result.estimate.lora_slots_bytes / GIB, 2) > 0
    assert "loraProfileGiB" in dumped


def test_the_lora_flags_are_owned() -> None:
    assert conflicting_extra_args(["--max-loras=8", "--max_lora_rank", "64", "--enable-lora", "--lora-modules"]) == [
        "--enable-lora", "--lora-modules", "--max-loras", "--max_lora_rank"]


def test_default_rank_is_the_largest_adapter_rank_rounded_to_what_vllm_accepts() -> None:
    s = spec(adapters=ADAPTERS)
    t = convert.targets(s, adapter_configs={"support-bot": AdapterConfig(12, None), "sql": AdapterConfig(8, None)})
    assert t.lora is not None and t.lora.max_lora_rank == 16
    t = convert.targets(s, adapter_configs={"sql": AdapterConfig(40, None)})
    assert t.lora is not None and t.lora.max_lora_rank == 64


@pytest.mark.parametrize(("lora", "message"), [
    ({"adapters": ADAPTERS, "maxLoras": 1, "maxCPULoras": 1} | {"adapters": [
        {"name": "a", "source": "org/a", "pinned": True}, {"name": "b", "source": "org/b", "pinned": True}]},
     "2 pinned adapters need 2 slots but maxLoras is 1; raise maxLoras to 2 or unpin some"),
    ({"adapters": ADAPTERS, "maxLoras": 4, "maxCPULoras": 2}, "maxCPULoras (2) must be at least maxLoras (4)"),
    ({"adapters": [{"name": "a", "source": "org/a"}, {"name": "a", "source": "org/b"}]}, "names must be unique"),
    ({"adapters": [{"name": "a", "source": "org/a", "revision": "v2"}]}, "has no revision"),
    ({"adapters": [{"name": "Qwen/Qwen3-8B", "source": "org/a"}]}, "is the base model's served name"),
    ({"adapters": [{"name": "a=b", "source": "org/a"}]}, "String should match pattern"),
    ({"maxLoras": 0}, "greater than or equal to 1"),
    ({"maxLoras": 65}, "less than or equal to 64"),
    ({"maxLoraRank": 24}, "Input should be 1, 8, 16, 32, 64, 128, 256, 320 or 512"),
    ({"maxCPULoras": 1025}, "less than or equal to 1024"),
])
def test_spec_mistakes_are_refused_with_the_fix(lora: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        spec(**lora)


def test_adapter_configs_refuse_a_higher_rank_and_another_base_model() -> None:
    s = spec(adapters=ADAPTERS, maxLoraRank=16)
    configs = {"support-bot": parse_adapter_config({"r": 8, "rank_pattern": {"q_proj": 32},
                                                    "base_model_name_or_path": "Qwen/Qwen3-8B"}),
               "sql": parse_adapter_config({"r": 16, "base_model_name_or_path": "meta-llama/Llama-3.1-8B"})}
    assert configs["support-bot"] == AdapterConfig(32, "Qwen/Qwen3-8B")
    assert lora_problems(s, configs) == [
        "lora.adapters[0] (support-bot): rank 32 exceeds maxLoraRank 16; vLLM refuses to load it: raise "
        "lora.maxLoraRank to 32 (every slot grows with it)",
        "lora.adapters[1] (sql): its adapter_config.json says it was trained on meta-llama/Llama-3.1-8B, not "
        "Qwen/Qwen3-8B; serve it on that model, or use an adapter of this one",
    ]
    # a trainer's local path says nothing; the hf:// prefix and case do not matter; unknown adapters pass
    fine = {"support-bot": AdapterConfig(8, "/data/base"), "sql": AdapterConfig(16, "hf://qwen/qwen3-8b")}
    assert lora_problems(s, fine) == [] and lora_problems(s, {}) == []
    # above vLLM's largest rank: no maxLoraRank holds it, and the default (which follows the adapters) would not
    # be a rank vLLM accepts either
    for fields in ({"adapters": ADAPTERS}, {"adapters": ADAPTERS, "maxLoraRank": 512}):
        assert lora_problems(spec(**fields), {"sql": AdapterConfig(1024, None)}) == [
            "lora.adapters[1] (sql): rank 1024 is above vLLM's largest max_lora_rank (512); vLLM cannot serve it: "
            "retrain the adapter at a lower rank"]


def test_the_example_is_admitted(vllm033: VLLMBehaviour) -> None:
    obj = yaml.safe_load(EXAMPLE.read_text())
    verdict = review(obj["spec"], "0.33.0", name=obj["metadata"]["name"])
    assert verdict.allowed, verdict.message
    s = LLMDeploymentSpec.model_validate(obj["spec"])
    result = plan(PlanRequest(model("Qwen/Qwen3-8B"), gpu("nvidia-l4"), vllm033, convert.targets(s)))
    assert isinstance(result, Plan) and result.estimate.lora_slots_bytes > 0


# --- reading adapter_config.json from a Hub-shaped server (hack/hub_server.py, no internet) ----------------------

from hack.hub_server import FakeHub, Repo  # noqa: E402

from llm_autopilot.hub.client import HubClient, ModelFetchError, fetch_adapter_config  # noqa: E402


def test_adapter_config_is_read_through_the_hub_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    hub = FakeHub()
    raw = {"r": 32, "base_model_name_or_path": "Qwen/Qwen3-8B", "target_modules": ["q_proj", "v_proj"]}
    hub.repos["org/support"] = Repo({"adapter_config.json": json.dumps(raw).encode()})
    hub.repos["org/empty"] = Repo({"README.md": b"no adapter here"})
    hub.start()
    try:
        client = HubClient(endpoint=hub.endpoint, cache_dir=str(tmp_path / "cache"))
        found = fetch_adapter_config(client, "org/support")
        assert found == raw and parse_adapter_config(found) == AdapterConfig(32, "Qwen/Qwen3-8B")
        assert fetch_adapter_config(client, "org/empty") is None
        with pytest.raises(ModelFetchError, match="LoRA adapter org/missing was not found on the Hub"):
            fetch_adapter_config(client, "org/missing")
    finally:
        hub.stop()


# --- admission and reconcile refuse what vLLM would refuse, with the same message, before anything is applied ---

import huggingface_hub.constants  # noqa: E402

from llm_autopilot.api.conditions import PLANNED  # noqa: E402
from llm_autopilot.api.lora import lora_refusal  # noqa: E402
from llm_autopilot.controller.adapters import admission_check  # noqa: E402
from tests.unit.fakes import Run  # noqa: E402

ON_L4 = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4", "maxGPUs": 1},
         "serving": {"maxModelLen": 8192, "allowedKVCacheDtypes": ["auto", "fp8"]}}


@pytest.fixture
def adapter_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A Hub-shaped server with three adapters; the operator's Hub client finds it through HF_ENDPOINT."""
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    hub = FakeHub()
    for repo, raw in {"org/support": {"r": 32, "base_model_name_or_path": "Qwen/Qwen3-8B"},
                      "org/sql": {"r": 16, "base_model_name_or_path": "meta-llama/Llama-3.1-8B"},
                      "org/fine": {"r": 8, "base_model_name_or_path": "Qwen/Qwen3-8B"}}.items():
        hub.repos[repo] = Repo({"adapter_config.json": json.dumps(raw).encode()})
    hub.start()
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    yield hub
    hub.stop()


def body(**lora: object) -> dict[str, object]:
    return {**ON_L4, "lora": lora}


REFUSED = body(maxLoraRank=16, adapters=[{"name": "support-bot", "source": "hf://org/support"},
                                         {"name": "sql", "source": "org/sql"}])
EXPECTED = ("spec.lora.adapters[0] (support-bot): rank 32 exceeds maxLoraRank 16; vLLM refuses to load it: raise "
            "lora.maxLoraRank to 32 (every slot grows with it); spec.lora.adapters[1] (sql): its adapter_config.json "
            "says it was trained on meta-llama/Llama-3.1-8B, not Qwen/Qwen3-8B; serve it on that model, or use an "
            "adapter of this one")


def test_admission_refuses_a_higher_rank_and_another_base_model_with_the_fix(adapter_hub: FakeHub) -> None:
    verdict = review(REFUSED, "0.33.0", adapters=lambda s: admission_check(s, timeout=5.0, budget=60.0))
    assert not verdict.allowed and verdict.message == EXPECTED
    # without the adapters' configs (a webhook that cannot read the Hub), nothing to refuse on
    assert review(REFUSED, "0.33.0").allowed


def test_admission_admits_an_unreadable_adapter_with_a_warning(adapter_hub: FakeHub) -> None:
    verdict = review(body(adapters=[{"name": "gone", "source": "org/missing"}, {"name": "ok", "source": "org/fine"}]),
                     "0.33.0", adapters=lambda s: admission_check(s, timeout=5.0, budget=60.0))
    assert verdict.allowed, verdict.message
    assert any("lora adapter gone: LoRA adapter org/missing was not found on the Hub; checked again when the "
               "operator reconciles it" in w for w in verdict.warnings), verdict.warnings


class SilentHub:
    """A Hub that accepts every request and answers none until released, then answers each with 404
    RepoNotFound (which huggingface_hub does not retry), so an abandoned read ends soon after the release."""

    def __init__(self) -> None:
        self.released = threading.Event()
        released = self.released

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.do_HEAD()

            def do_HEAD(self) -> None:
                released.wait()
                with contextlib.suppress(OSError):  # the client gave up on this request (its timeout)
                    self.send_response(404)
                    self.send_header("X-Error-Code", "RepoNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


def test_admission_answers_within_its_budget_when_the_hub_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    hub = SilentHub()  # accepts, never answers within the budget (a refused port fails at once, then retries)
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    pool = ThreadPoolExecutor(max_workers=1)
    started = time.monotonic()
    try:
        verdict = review(REFUSED, "0.33.0", adapters=lambda s: admission_check(s, timeout=1.0, budget=2.0, pool=pool))
        elapsed = time.monotonic() - started
    finally:
        hub.released.set()  # the abandoned read now gets 404s and ends
        pool.shutdown(wait=True)  # ... before the test does
        hub.stop()
    # huggingface_hub alone retries a request that times out 5 times: ~29 s per file on this Hub
    assert verdict.allowed and elapsed < 10.0, elapsed
    assert any("could not be read from the Hub within 2 s; checked when the operator reconciles it" in w
               for w in verdict.warnings), verdict.warnings


def test_reconcile_gives_planned_false_with_the_same_message_and_applies_nothing(adapter_hub: FakeHub) -> None:
    run = Run(REFUSED)
    out = run.once()
    planned = run.condition(PLANNED)
    assert (planned["status"], planned["reason"], planned["message"]) == ("False", "LoRAAdapterRefused", EXPECTED)
    assert run.cluster.objects == {} and out.settled and not out.retry
    assert lora_refusal(LLMDeploymentSpec.model_validate(REFUSED),
                                    {"support-bot": AdapterConfig(32, "Qwen/Qwen3-8B"),
                                     "sql": AdapterConfig(16, "meta-llama/Llama-3.1-8B")}) == EXPECTED


def test_reconcile_retries_an_adapter_it_cannot_read(adapter_hub: FakeHub) -> None:
    run = Run(body(adapters=[{"name": "gone", "source": "org/missing"}]))
    out = run.once()
    planned = run.condition(PLANNED)
    assert (planned["status"], planned["reason"]) == ("False", "LoRAAdapterUnresolved")
    assert "LoRA adapter org/missing was not found on the Hub" in planned["message"]
    assert run.cluster.objects == {} and out.retry


def test_reconcile_deploys_adapters_it_accepts(adapter_hub: FakeHub) -> None:
    run = Run(body(adapters=[{"name": "ok", "source": "org/fine"}]))
    run.once()
    assert run.condition(PLANNED)["status"] == "True", run.condition(PLANNED)
    assert any(kind == "Deployment" for kind, _ in run.cluster.objects), list(run.cluster.objects)


def test_more_pinned_adapters_than_max_loras_is_refused_on_both_paths() -> None:
    pinned = body(maxLoras=1, maxCPULoras=2, adapters=[{"name": "a", "source": "org/a", "pinned": True},
                                                       {"name": "b", "source": "org/b", "pinned": True}])
    message = "2 pinned adapters need 2 slots but maxLoras is 1; raise maxLoras to 2 or unpin some"
    verdict = review(pinned, "0.33.0")
    assert not verdict.allowed and message in verdict.message
    run = Run(pinned)
    run.once()
    planned = run.condition(PLANNED)
    assert (planned["status"], planned["reason"]) == ("False", "InvalidSpec") and message in planned["message"]
    assert planned["message"] == verdict.message and run.cluster.objects == {}


# --- the max_loras rung: an OOM lowers the adapter slots, never below the pinned adapters ------------------------

from llm_autopilot.remediation.classify import Classification, Signal  # noqa: E402
from llm_autopilot.remediation.ladder import Overrides, candidates  # noqa: E402
from tests.unit.test_remediation import CUDA_STARTUP, running  # noqa: E402


def rung_actions(signal: Signal, **changes: object) -> list[str]:
    return [c.action for c in candidates(Classification(signal, "test"), running(**changes), Overrides())]


def test_the_rung_halves_the_slots_after_fewer_batched_tokens_and_before_eager() -> None:
    assert rung_actions(Signal.CUDA_OOM_STARTUP, max_loras=8, floor_max_loras=1) == [
        "max_num_batched_tokens 8192 -> 4096", "max_loras 8 -> 4 (fewer LoRA adapter slots on the GPU)",
        "CUDA graphs captured up to 512 -> 256 tokens per batch", "enforce eager mode (no CUDA graphs)",
        "gpu_memory_utilization 0.92 -> 0.88"]
    assert "max_loras 8 -> 4 (fewer LoRA adapter slots on the GPU)" in rung_actions(Signal.NO_KV_MEMORY, max_loras=8)


def test_the_rung_never_goes_below_the_pinned_adapters_and_is_absent_without_lora() -> None:
    assert "max_loras 8 -> 6 (fewer LoRA adapter slots on the GPU, never below the 6 pinned)" in rung_actions(
        Signal.CUDA_OOM_STARTUP, max_loras=8, floor_max_loras=6)
    assert not any("max_loras" in a for a in rung_actions(Signal.CUDA_OOM_STARTUP, max_loras=6, floor_max_loras=6))
    assert not any("max_loras" in a for a in rung_actions(Signal.CUDA_OOM_STARTUP, max_loras=1))
    assert not any("max_loras" in a for a in rung_actions(Signal.CUDA_OOM_STARTUP))  # no LoRA: max_loras 0


def max_loras_arg(run: Run) -> str:
    args = run.cluster.deployment()["spec"]["template"]["spec"]["containers"][0]["args"]
    return str(args[args.index("--max-loras") + 1])


def test_an_oom_at_start_up_lowers_max_loras_in_the_deployment_and_says_why(adapter_hub: FakeHub) -> None:
    for repo in ("org/a", "org/b", "org/c"):
        raw = {"r": 16, "base_model_name_or_path": "Qwen/Qwen3-8B"}
        adapter_hub.repos[repo] = Repo({"adapter_config.json": json.dumps(raw).encode()})
    lora_spec = {"maxLoras": 8, "maxLoraRank": 16, "adapters": [
        {"name": "a", "source": "org/a", "pinned": True}, {"name": "b", "source": "org/b", "pinned": True},
        {"name": "c", "source": "org/c", "pinned": True}]}
    spec_body = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-h100-80gb"},
                 "serving": {"maxModelLen": 16384},
                 # the batched tokens at their floor: the first rung of an OOM at start-up has nothing to lower
                 "remediation": {"cooldownSeconds": 0, "maxSteps": 6, "floors": {"minMaxNumBatchedTokens": 8192}},
                 "lora": lora_spec}
    run = Run(spec_body)
    run.once()
    assert run.condition(PLANNED)["status"] == "True", run.condition(PLANNED)
    assert max_loras_arg(run) == "8"
    seen = []
    for i in range(1, 5):  # each OOM at start-up is a new crash of the current plan's pod
        run.cluster.crash(CUDA_STARTUP, restarts=i, finished_at=f"2026-12-01T00:0{i}:00Z")
        run.once()
        seen.append((run.remediation["history"][-1]["action"], max_loras_arg(run)))
        if seen[-1][1] == "3":
            break
    actions = [a for a, _ in seen]
    assert "max_loras 8 -> 4 (fewer LoRA adapter slots on the GPU, never below the 3 pinned)" in actions, seen
    assert "max_loras 4 -> 3 (fewer LoRA adapter slots on the GPU, never below the 3 pinned)" in actions, seen
    assert seen[-1][1] == "3" and run.remediation["applied"][-1]["maxLoras"] == 3, seen
