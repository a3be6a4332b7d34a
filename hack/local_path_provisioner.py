#!/usr/bin/env python3
"""The local cluster's volume provisioner for the default StorageClass ``local-path``
(``localcluster/local_path.py``); started by ``hack/cluster.py up`` as the ``local-path-provisioner`` component."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from localcluster.local_path import main

if __name__ == "__main__":
    sys.exit(main())
