"""llm-autopilot: plans, deploys and remediates vLLM workloads on Kubernetes.

Layers, from the ground floor up (each imports only from the ones below it):

- ``domain``: value types shared by everything (model architecture, GPU spec, precisions).
- ``catalog``, ``vllm``: facts (built-in models and GPUs, vLLM version knowledge) and the
  pure parser that turns a Hugging Face ``config.json`` into an architecture.
- ``planner``: the memory model and the search for the cheapest deployment that fits.
- ``render``: plan -> ``vllm serve`` argument list.
- ``api``: the ``LLMDeployment`` pydantic models and the CRD generated from them.
- shells (``hub``, ``cli``): I/O only; pure code never imports them.
"""

__version__ = "0.1.0"
