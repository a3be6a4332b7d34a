#!/usr/bin/env python3
"""Local Kubernetes control plane for llm-autopilot's end-to-end tests.

There is no Docker and no container registry on the development and CI
machines, so the control plane is built from upstream Go modules and run as
plain processes bound to 127.0.0.1:

* etcd, kube-apiserver, kube-controller-manager, kube-scheduler (real ones);
* kwok, which fakes the kubelets of simulated GPU nodes (NVIDIA GPU Feature
  Discovery labels, ``nvidia.com/gpu`` capacity) and drives pod lifecycles
  through the Stage objects in ``hack/kwok/stages.yaml``;
* kube-state-metrics (metrics about the cluster's objects, for Prometheus);
* Prometheus (Debian's ``/usr/bin/prometheus``, not built here), scraping
  kube-state-metrics and the simulated vLLM pods that ``hack/vllm_sim.py``
  lists in ``<state>/prometheus/vllm-targets/*.json`` (file_sd), plus any
  target listed in ``<state>/prometheus/extra-targets/*.json`` (file_sd job
  ``extra``, e.g. an operator's /metrics; ``hack/vllm_sim.py
  add_scrape_target``), and evaluating the alerting/recording rules in
  ``<state>/prometheus/rules/*.yaml`` (re-read on ``POST /-/reload``).

The code lives in the ``localcluster`` package next to this file, split as
controller-runtime's envtest splits a control plane: ``binaries`` (Go
builds), ``pki`` (certificates, kubeconfigs), ``state`` (ports, paths),
``process`` (start, check, stop), ``components`` (the table of components,
started in order, and their arguments), ``nodes`` (simulated GPU pools),
``controlplane`` (up/down/status), ``vllm_cpu`` (the CPU build of vLLM) and
``cli``; this file only runs the CLI.

Subcommands::

    cluster.py build [COMPONENT ...]  build (or reuse cached) binaries
    cluster.py up [--no-nodes] [--no-prometheus]
                                      start the cluster, create GPU node pools
    cluster.py nodes [--print]        (re)create the GPU node pools
    cluster.py status                 show the state of every component
    cluster.py env                    print ``export KUBECONFIG=...`` lines
                                      (and LLM_AUTOPILOT_PROMETHEUS_URL, *_DIR)
    cluster.py stop|start COMPONENT   stop/start one component (e.g. prometheus)
    cluster.py down [--keep]          stop everything, remove state
    cluster.py pin                    regenerate hack/tools/*/go.mod from pins
    cluster.py vllm [install|path|status] [--version X.Y.Z]
                                      the CPU build of vLLM (a cached venv per
                                      release; default the newest, 0.32.0)

Environment:

* ``LLM_AUTOPILOT_CACHE``: cache root (default ``~/.cache/llm-autopilot``);
  binaries live in ``<cache>/bin/<component>-<version>/``.
* ``LLM_AUTOPILOT_CLUSTER_DIR``: state dir (default ``<cache>/cluster``).
* ``LLM_AUTOPILOT_PORT_BASE``: first port of the block of 100 the cluster
  uses (default 26400; the API server is on base+43).

Only the Python 3.11 standard library, the ``go`` toolchain, the
``openssl`` CLI and (for Prometheus) the Debian ``prometheus`` package are
used.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from localcluster.cli import main

if __name__ == "__main__":
    sys.exit(main())
