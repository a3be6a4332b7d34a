"""``spec.vllm.extraArgs`` and ``spec.vllm.env`` as the pod runs them: the one table of the ``vllm serve`` flags
the operator owns, and the rules for what the kubelet and vLLM would otherwise read behind the plan's back.

vLLM's FlexibleArgumentParser (vllm/utils/argparse_utils.py) turns ``_`` into ``-`` between the leading
``--`` and the first ``.`` (``--max_model_len`` is ``--max-model-len``; ``--compilation-config.level=3``
sets ``--compilation-config``), splits ``--flag=value``, and reads ``-O3`` as ``--optimization-level 3``;
argparse then takes unambiguous prefixes (``--max-model``) and short options with their value attached
(``-n4``): ``vllm.flags.named_options`` reads an argument so. vLLM takes the last occurrence of a flag, and
extraArgs come after the planned flags: an owned flag in extraArgs would run something other than
``status.plan`` says. So every owned flag is refused, with the spec field that sets it. A config argument's keys
(``--structured-outputs-config.reasoning_parser=x``, ``--structured-outputs-config '{"reasoning_parser": "x"}'``)
that set what an owned flag sets are refused too (:data:`OWNED_CONFIG_KEYS`): vLLM gathers dotted keys into the
config's JSON object and reads both forms alike.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from llm_autopilot.vllm.flags import named_options

_SECRET_IN_ARGS = "would put the secret in the pod spec and in status.plan.args, readable by anyone who can read them"
_PLANNER_SPLITS = ("the planner decides how many GPUs one replica uses and how the model is split across them "
                   "(status.plan.tensorParallelSize, pipelineParallelSize); bound it with spec.gpu.maxGPUs")
_NODES = ("the planner decides how many nodes one replica spans (status.plan.nodes) and the operator wires them "
          "(rank, leader address, port); it cannot be set")
_DATA_PARALLEL = ("one pod group serves one replica: scale with spec.replicas or spec.autoscaling; vLLM's data "
                  "parallelism cannot be set")
_KV_SIZE = ("the planner sizes the KV cache from the memory left under spec.vllm.gpuMemoryUtilization "
            "(status.plan.memory); it cannot be set")
_CUDA_GRAPHS = ("CUDA-graph memory is part of the plan (status.plan.memory.cudaGraphGiB); turn CUDA graphs off "
                "with spec.vllm.enforceEager")
_BATCHED = "set spec.vllm.maxNumBatchedTokens instead"


def _owned(pointer: str, *flags: str) -> dict[str, str]:
    return dict.fromkeys(flags, pointer)


@dataclass(frozen=True)
class PassedFlag:
    """A spec field the operator passes to ``vllm serve`` as given (the planner does not decide it). Declared once,
    in :data:`PASSED_FLAGS`: ``api.v1alpha1.VLLMSettings.passed_args`` renders every row, and extraArgs naming
    its flag are refused with the field to set instead (:data:`OWNED_FLAGS`)."""

    #: the attribute on ``api.v1alpha1.VLLMSettings``
    field: str
    #: its name in the spec, under spec.vllm
    alias: str
    #: the flag as rendered first, then every other spelling vLLM 0.31-0.33 takes for it
    flags: tuple[str, ...]

    def args(self, value: object) -> list[str]:
        """The arguments for the field's value: none when unset (vLLM's default), the bare flag for True."""
        if value is None or value is False:
            return []
        if value is True:
            return [self.flags[0]]
        return [self.flags[0], str(value)]


#: The spec fields passed to ``vllm serve`` as given, in the order they are rendered (after the planned flags,
#: before extraArgs). A new one is this row plus its field on ``api.v1alpha1.VLLMSettings``.
PASSED_FLAGS: tuple[PassedFlag, ...] = (
    PassedFlag("reasoning_parser", "reasoningParser", ("--reasoning-parser",)),
)


#: Every ``vllm serve`` option the planner or the renderer sets, or that changes what the plan's memory arithmetic
#: assumes, in every spelling vLLM 0.31-0.33 gives it (short aliases, ``--no-`` negations, older names), with what
#: to do instead. extraArgs naming one are refused, at admission and again when the reconciler reads the spec.
OWNED_FLAGS: dict[str, str] = {
    **_owned(f"set by the operator from the plan: {_PLANNER_SPLITS}", "--tensor-parallel-size", "-tp",
             "--pipeline-parallel-size", "-pp", "--decode-context-parallel-size", "-dcp",
             "--prefill-context-parallel-size", "-pcp"),
    **_owned(f"set by the operator for a replica across nodes: {_NODES}", "--nnodes", "-n", "--node-rank", "-r",
             "--headless", "--master-addr", "--master-port"),
    **_owned(_DATA_PARALLEL, "--data-parallel-size", "-dp", "--data-parallel-size-local", "-dpl",
             "--data-parallel-rank", "-dpn", "--data-parallel-start-rank", "-dpr", "--data-parallel-address",
             "-dpa", "--data-parallel-rpc-port", "-dpp", "--data-parallel-backend", "-dpb",
             "--data-parallel-external-lb", "--no-data-parallel-external-lb", "-dpe", "--data-parallel-hybrid-lb",
             "--no-data-parallel-hybrid-lb", "-dph", "--data-parallel-multi-port-external-lb", "-dpm",
             "--data-parallel-supervisor-port"),
    **_owned("set by the operator from the plan; set spec.vllm.gpuMemoryUtilization instead",
             "--gpu-memory-utilization", "--device-memory-utilization"),
    **_owned(_KV_SIZE, "--kv-cache-memory-bytes", "--num-gpu-blocks-override", "--block-size"),
    "--cpu-offload-gb": "set by the operator from the plan; allow it with spec.serving.allowCPUOffload",
    "--max-model-len": "set by the operator from the plan; set spec.serving.maxModelLen instead",
    "--max-num-seqs": "set by the operator from the plan; set spec.vllm.maxNumSeqs instead",
    **_owned(f"set by the operator from the plan; {_BATCHED}", "--max-num-batched-tokens",
             "--max-num-scheduled-tokens"),
    **_owned("set by the operator from the plan; list the formats it may use in spec.serving.allowedQuantizations "
             "(and pre-quantized checkpoints in spec.model.variants)", "--quantization", "-q",
             "--quantization-config"),
    "--kv-cache-dtype": "set by the operator from the plan; list the dtypes it may use in "
                        "spec.serving.allowedKVCacheDtypes",
    "--dtype": "set by the operator from the plan; set spec.vllm.dtype instead",
    **_owned("set by the operator from the plan; set spec.vllm.enforceEager instead", "--enforce-eager",
             "--no-enforce-eager"),
    **_owned(_CUDA_GRAPHS, "-O", "--optimization-level", "--compilation-config", "-cc", "--cudagraph-capture-sizes",
             "--max-cudagraph-capture-size", "--cuda-graph-sizes"),
    "--model": "set by the operator; set spec.model.name instead",
    "--revision": "set by the operator; set spec.model.revision instead",
    "--served-model-name": "set by the operator; set spec.model.servedModelName instead",
    **_owned("the planner reads the model's config.json; correct it with spec.model.architecture",
             "--hf-overrides", "--hf-config-path"),
    **_owned("a draft model's memory is not in the plan; it cannot be set", "--speculative-config", "-sc"),
    **_owned("set by the operator from spec.lora (the adapter slots are in the plan: status.plan.memory.loraSlotsGiB)",
             "--enable-lora", "--no-enable-lora", "--disable-lora", "--max-loras", "--max-lora-rank", "--max-cpu-loras",
             "--lora-modules", "--lora-dtype", "--fully-sharded-loras", "--no-fully-sharded-loras",
             "--lora-target-modules", "--specialize-active-lora", "--no-specialize-active-lora"),
    **{flag: f"set by the operator from the spec; set spec.vllm.{passed.alias} instead"
       for passed in PASSED_FLAGS for flag in passed.flags},
    "--shutdown-timeout": "set by the operator from spec.vllm.drainSeconds (with the pod's preStop wait and "
                          "terminationGracePeriodSeconds to match); set spec.vllm.drainSeconds instead",
    "--config": "a config file sets flags no admission check sees; put the flags in spec.vllm.extraArgs",
    "--port": "the Service and the health probes target port 8000 on the pod IP; it cannot be changed",
    "--host": "the Service and the health probes reach vLLM on the pod IP, so it listens on all addresses; "
              "it cannot be changed",
    "--uds": "the Service and the health probes need vLLM's HTTP server on port 8000; it cannot be used",
    "--api-key": f"{_SECRET_IN_ARGS}; set VLLM_API_KEY in spec.vllm.env with valueFrom.secretKeyRef instead",
    "--hf-token": f"{_SECRET_IN_ARGS}; set spec.model.hubTokenSecretRef (or HF_TOKEN in spec.vllm.env with "
                  "valueFrom.secretKeyRef) instead",
}

#: Config arguments (a JSON object, given whole or key by key as ``--<config>.<key>=value``) whose keys set what an
#: owned flag sets, by key (vLLM's own spelling: snake_case), with what to do instead. vLLM copies
#: ``--reasoning-parser`` into both configs' ``reasoning_parser``, and the config's own key wins where it is set.
OWNED_CONFIG_KEYS: dict[str, dict[str, str]] = {
    config: {"reasoning_parser": f"set by the operator from the spec; set spec.vllm.{PASSED_FLAGS[0].alias} instead"}
    for config in ("--structured-outputs-config", "--reasoning-config")
}


def owned_options(arg: str) -> list[str]:
    """The owned options one extraArgs entry may set, as vLLM's parser reads it (any spelling, abbreviation)."""
    return sorted(named_options(arg) & OWNED_FLAGS.keys())


def _as_written(arg: str) -> str:
    return arg.split("=", 1)[0]


def _owned_problem(arg: str) -> str | None:
    owned = owned_options(arg)
    if not owned:
        return None
    written = _as_written(arg)
    if len(owned) > 1:
        return (f"{written} abbreviates {', '.join(owned)}, which the operator owns: "
                + "; ".join(f"{f}: {OWNED_FLAGS[f]}" for f in owned))
    flag = owned[0]
    named = written if written == flag else f"{written} ({flag})"
    return f"{named} is owned by the operator: {OWNED_FLAGS[flag]}"


# --- the kubelet's $(VAR) expansion -------------------------------------------------------------------------

#: No ``$(`` the kubelet would expand (``$$`` is its escape for ``$``): RE2- and Python-compatible, so the same
#: text is the CRD's pattern and the model's check.
NO_VAR_REFERENCE = r"^(?:[^$]|\$\$|\$[^$(])*\$?$"
_NO_VAR_REFERENCE_RE = re.compile(NO_VAR_REFERENCE)
_VAR_HINT = ("the kubelet expands $(NAME) in container args and env values, so the pod would run what no check "
             "saw; write $$( for a literal $(")


def var_reference_problem(value: str) -> str | None:
    return None if _NO_VAR_REFERENCE_RE.fullmatch(value) else f"$( is refused: {_VAR_HINT}"


def _config_key(key: str) -> str:
    """A config key as vLLM's config classes name it (``reasoning-parser``, ``reasoning_parser+``)."""
    return key.strip().removesuffix("+").replace("-", "_")


def _json_keys(value: str) -> list[str]:
    """The top-level keys of a JSON object value; none when it is not one (vLLM would refuse it anyway)."""
    try:
        parsed = json.loads(value)
    except ValueError:
        return []
    return [str(k) for k in parsed] if isinstance(parsed, dict) else []


def _owned_config_keys(args: Sequence[str], index: int) -> list[tuple[str, str, str]]:
    """(config, key, why) for each owned key extraArgs[``index``] sets: as ``--<config>.<key>[=value]`` (the value
    may be the next argument), or in the JSON object given as ``--<config>=<json>`` or ``--<config> <json>``."""
    arg = args[index]
    configs = sorted(named_options(arg) & OWNED_CONFIG_KEYS.keys())
    if len(configs) != 1:
        return []
    config, owned = configs[0], OWNED_CONFIG_KEYS[configs[0]]
    written, has_value, value = arg.partition("=")
    if "." in written:
        keys = [_config_key(written.split(".")[1])]
    elif has_value:
        keys = [_config_key(k) for k in _json_keys(value)]
    elif index + 1 < len(args):
        keys = [_config_key(k) for k in _json_keys(args[index + 1])]
    else:
        keys = []
    return [(config, key, owned[key]) for key in keys if key in owned]


def extra_args_problems(args: Sequence[str]) -> list[tuple[int, str]]:
    """(index, why) for every extraArgs entry that cannot be passed: :func:`extra_arg_problem` of each, and the
    keys of config arguments that set what an owned flag sets, in every spelling vLLM's parser reads."""
    problems: list[tuple[int, str]] = []
    for i, arg in enumerate(args):
        if (problem := extra_arg_problem(arg)) is not None:
            problems.append((i, problem))
            continue
        for config, key, why in _owned_config_keys(args, i):
            problems.append((i, f"{_as_written(arg)} sets {config}'s {key}, which the operator owns: {why}"))
    return problems


def extra_arg_problem(arg: str) -> str | None:
    """Why one extraArgs entry cannot be passed to ``vllm serve``, with what to do instead."""
    if not arg:
        return "an empty argument reaches vllm serve as a stray positional value; remove it"
    if "\x00" in arg:
        return "a process argument cannot hold a NUL character; remove it"
    if (problem := var_reference_problem(arg)) is not None:
        return problem
    return _owned_problem(arg)


# --- environment variables ----------------------------------------------------------------------------------

#: Names whose value is a credential: only from a Secret (valueFrom.secretKeyRef), never a literal in the spec,
#: the Deployment and everything that reads them. Matched on the upper-cased name.
SECRET_ENV_NAME = r"^(.*_)?(API_?KEY|TOKEN|SECRET|SECRET_KEY|SECRET_ACCESS_KEY|PASSWORD|PASSWD|CREDENTIALS?)$"
_SECRET_ENV_NAME_RE = re.compile(SECRET_ENV_NAME)
#: Names the operator's multi-node rendering sets and its args or shell wrapper read (render/groups.py), and the
#: LeaderWorkerSet controller injects without overriding one the pod already has.
OWNED_ENV_PREFIXES = ("LLM_AUTOPILOT_", "LWS_")


def secret_env_name(name: str) -> bool:
    return bool(_SECRET_ENV_NAME_RE.fullmatch(name.upper()))


def env_name_problem(name: str) -> str | None:
    if name.startswith(OWNED_ENV_PREFIXES):  # as the CRD's CEL rule: env names are case-sensitive
        return (f"{name} is refused: names starting with {' or '.join(OWNED_ENV_PREFIXES)} are set by the operator "
                "(and LeaderWorkerSet) for the pods of a replica across nodes")
    return None


def env_value_problem(name: str, value: str) -> str | None:
    """Why an env var cannot have this literal value."""
    if value and secret_env_name(name):
        return (f"{name} looks like a credential: a literal value would be readable by anyone who can read the "
                "LLMDeployment or its Deployment; set it with valueFrom.secretKeyRef")
    problem = var_reference_problem(value)
    return problem and f"{name}: {problem}"
