#!/usr/bin/env python3
"""The process kubelet of the local cluster's ``vllm-cpu`` pool (``localcluster/kubelet.py``); started by
``hack/cluster.py up`` as the ``process-kubelet`` component."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from localcluster.kubelet import main

if __name__ == "__main__":
    sys.exit(main())
