"""``spec.vllm.extraArgs`` as vLLM reads them: flag spelling, and the flags the operator cannot let through.

vLLM's FlexibleArgumentParser (vllm/utils/argparse_utils.py) turns ``_`` into ``-`` between the leading
``--`` and the first ``.`` (``--max_model_len`` is ``--max-model-len``; ``--compilation-config.level=3``
sets ``--compilation-config``), splits ``--flag=value``, and reads ``-O3`` as ``--optimization-level 3``.
"""

from __future__ import annotations

from llm_autopilot.vllm.flags import is_option, normalise_flag

#: Flags that break the pod the operator renders, with the right way to get what they do.
_SECRET_IN_ARGS = "would put the secret in the pod spec and in status.plan.args, readable by anyone who can read them"
REFUSED_FLAGS: dict[str, str] = {
    "--api-key": f"--api-key {_SECRET_IN_ARGS}; set VLLM_API_KEY in spec.vllm.env with "
                 "valueFrom.secretKeyRef instead",
    "--hf-token": f"--hf-token {_SECRET_IN_ARGS}; set spec.model.hubTokenSecretRef (or HF_TOKEN in spec.vllm.env "
                  "with valueFrom.secretKeyRef) instead",
    "--port": "--port cannot be changed: the Service and the health probes target port 8000 on the pod IP",
    "--host": "--host cannot be changed: the Service and the health probes reach vLLM on the pod IP, "
              "so it listens on all addresses",
    "--uds": "--uds cannot be used: the Service and the health probes need vLLM's HTTP server on port 8000",
}


def normalised_flag(arg: str) -> str | None:
    """The option ``arg`` names, spelled as vLLM's own flags are (vllm.flags.normalise_flag); None when ``arg``
    is a value."""
    return normalise_flag(arg) if is_option(arg) else None


def extra_arg_problem(arg: str) -> str | None:
    """Why one extraArgs entry cannot be passed to ``vllm serve``, with what to do instead."""
    if not arg:
        return "an empty argument reaches vllm serve as a stray positional value; remove it"
    if "\x00" in arg:
        return "a process argument cannot hold a NUL character; remove it"
    flag = normalised_flag(arg)
    if flag in REFUSED_FLAGS:
        return REFUSED_FLAGS[flag]
    return None
