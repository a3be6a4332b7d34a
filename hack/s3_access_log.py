#!/usr/bin/env python3
"""SeaweedFS's S3 access log collector (``localcluster/s3.py``); started by ``hack/cluster.py up`` as the
``s3-access-log`` component."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from localcluster.s3 import main

if __name__ == "__main__":
    sys.exit(main())
