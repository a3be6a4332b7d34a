"""Two releases of the real CPU vLLM on the local cluster: the process kubelet runs a pod with the release its
image's tag names (hack/localcluster/kubelet.py), so a test of an upgrade starts what it says it starts. The older
release is installed on first use (the ``vllm_release`` fixture), cached as the default one is."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Kubectl, wait_for
from tests.e2e.real_vllm import (
    OLDER_RELEASE,
    START_SECONDS,
    apply,
    complete,
    operator_for,
    ready_pods,
    real_vllm_fixture,  # noqa: F401 - a fixture
    tiny,
    vllm_release_fixture,  # noqa: F401 - a fixture
)

pytestmark = [pytest.mark.e2e, pytest.mark.real_vllm, pytest.mark.usefixtures("real_vllm")]


def test_a_deployment_of_the_older_release_is_served_by_that_release(
        kubectl: Kubectl, namespace: str, vllm_release: Any, tmp_path: Path) -> None:
    release = vllm_release(OLDER_RELEASE)
    started = time.monotonic()
    with operator_for(kubectl, namespace, tmp_path):
        apply(kubectl, namespace, tiny("older", vllm={"image": f"vllm/vllm-openai:v{release}", "version": release}))
        pod: dict[str, Any] = wait_for(f"a Ready pod of {namespace}/older",
                                       lambda: next(iter(ready_pods(kubectl, namespace, "older")), None),
                                       timeout=START_SECONDS, interval=2)
        assert pod["spec"]["containers"][0]["image"] == f"vllm/vllm-openai:v{release}"
        with urllib.request.urlopen(f"http://{pod['status']['podIP']}:8000/version", timeout=30) as response:
            served = json.load(response)["version"]
        assert served.split("+")[0] == release, served  # vLLM's own answer, not the image's name
        answer = complete(pod)
        assert answer["usage"]["completion_tokens"] == 8, answer
    sys.stderr.write(f"\n[real vLLM] release {release}: /version {served}; "
                     f"Ready and answering {time.monotonic() - started:.0f} s after the apply\n")
