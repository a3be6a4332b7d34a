"""The local control plane, split along controller-runtime's envtest lines.

``paths`` (cache and state directories, logging), ``binaries`` (building the Go components), ``pki``
(certificates and kubeconfigs), ``process`` (starting, checking and stopping processes), ``components``
(the table of control-plane components and their arguments), ``nodes`` (simulated GPU node pools),
``vllm_cpu`` (the CPU build of vLLM in its own virtual environment) and ``cli`` (``hack/cluster.py``).
Standard library only: it runs before the project's virtual environment exists.
"""
