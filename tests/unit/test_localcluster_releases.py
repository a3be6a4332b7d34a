"""The process kubelet runs a vLLM container with the CPU build of the release its image's tag names, and fails a
container whose release is not installed on the node as a kubelet fails an image it cannot pull."""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest
from hack.localcluster import vllm_cpu
from hack.localcluster.kubelet import STANDIN_IMAGE, image_release, vllm_release_image
from hack.localcluster.podnet import Bridge
from hack.localcluster.podworker import Environment, Image, PodWorker, StandIns, container_status


@pytest.mark.parametrize(("image", "release"), [
    ("vllm/vllm-openai:v0.31.0", "0.31.0"),
    ("vllm/vllm-openai:v0.32.0", "0.32.0"),
    ("registry.local:5000/vllm/vllm-openai:0.31.0", "0.31.0"),
    ("vllm/vllm-openai:v0.31.0-cpu", "0.31.0"),
    ("vllm/vllm-openai:latest", None),
    ("vllm/vllm-openai", None),
    ("registry.local:5000/vllm", None),  # a registry's port is no tag
    ("vllm/vllm-openai@sha256:" + "0" * 64, None),
    ("python:3.11", None),
])
def test_the_release_is_the_one_the_tag_names(image: str, release: str | None) -> None:
    assert image_release(image) == release


def only(*releases: str) -> Any:
    return lambda release: release in releases


def test_each_image_runs_the_install_of_its_release() -> None:
    image_31 = vllm_release_image("vllm/vllm-openai:v0.31.0", installed=only("0.31.0", "0.32.0"))
    image_32 = vllm_release_image("vllm/vllm-openai:v0.32.0", installed=only("0.31.0", "0.32.0"))
    assert image_31.problem is None and image_32.problem is None
    assert image_31.path.split(":")[0] == str(vllm_cpu.home("0.31.0") / "bin")
    assert image_32.path.split(":")[0] == str(vllm_cpu.home("0.32.0") / "bin")


def test_an_image_that_names_no_release_runs_the_default_one() -> None:
    for image in ("vllm/vllm-openai:latest", "vllm/vllm-openai", ""):
        chosen = vllm_release_image(image, installed=only(vllm_cpu.VLLM_CPU_VERSION))
        assert chosen.problem is None
        assert chosen.path.split(":")[0] == str(vllm_cpu.home(vllm_cpu.VLLM_CPU_VERSION) / "bin")


def test_a_release_not_installed_is_refused_with_the_command_that_installs_it() -> None:
    chosen = vllm_release_image("vllm/vllm-openai:v0.31.0", installed=only("0.32.0"))
    assert chosen.problem is not None
    assert "vLLM 0.31.0 is not installed on this node" in chosen.problem
    assert "`python3 hack/cluster.py vllm install --version 0.31.0`" in chosen.problem


def environment(installed: Any) -> Environment:
    operator = Image("/repo/.venv/bin", None)
    return Environment(images={"": vllm_release_image(""), "llm-autopilot": operator,
                               STANDIN_IMAGE: Image("/stand-in/bin", None)},
                       base_env={}, stand_ins=lambda pod, spec, node: StandIns(),
                       other_image=lambda image: vllm_release_image(image, installed=installed))


def test_the_operator_image_and_the_stand_in_are_chosen_before_any_release() -> None:
    env = environment(only())  # no vLLM at all: neither needs one
    serve = {"command": ["vllm", "serve", "m"]}
    assert env.image({**serve, "image": f"{STANDIN_IMAGE}:v0.31.0"}).path == "/stand-in/bin"
    assert env.image({"command": ["llm-autopilot", "cache"], "image": "vllm/vllm-openai:v0.31.0"}).path == \
        "/repo/.venv/bin"


class RecordingKubelet:
    """What a PodWorker asks of its kubelet before a container starts: the environment, and Events."""

    def __init__(self, env: Environment, pods_dir: Path) -> None:
        self.environment = env
        self.pods_dir = pods_dir
        self.bridge = Bridge.for_port_base(26400)
        self.events: list[tuple[str, str, str]] = []

    def event(self, pod: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))


def test_a_pod_of_a_release_not_installed_waits_as_an_image_that_cannot_be_pulled(tmp_path: Path) -> None:
    kubelet = RecordingKubelet(environment(only("0.32.0")), tmp_path)
    pod = {"metadata": {"namespace": "ns", "name": "p", "uid": "u1"},
           "spec": {"nodeName": "vllm-cpu-0", "containers": [
               {"name": "vllm", "image": "vllm/vllm-openai:v0.31.0", "command": ["vllm", "serve", "m"]}]}}
    worker = PodWorker(kubelet, pod, ipaddress.IPv4Address("10.214.0.2"))
    container = worker.containers[0]
    worker._start(container)
    assert container.instance is None  # never another release in its place
    assert container.waiting is not None and container.waiting[0] == "ErrImagePull"
    assert "hack/cluster.py vllm install --version 0.31.0" in container.waiting[1]
    worker._start(container)  # the retry after the back-off
    assert container.waiting[0] == "ImagePullBackOff"
    assert [(t, r) for t, r, _ in kubelet.events] == [("Warning", "Failed")]  # one Event, not one per retry
    assert kubelet.events[0][2].startswith('Failed to pull image "vllm/vllm-openai:v0.31.0": ')
    waiting = container_status(container)["state"]["waiting"]  # what the pod's status says
    assert waiting["reason"] == "ImagePullBackOff" and "--version 0.31.0" in waiting["message"]


def fake_release(version: str, files: dict[str, bytes]) -> Path:
    """An installed release (stamp, python) whose distribution ``dist-1.0`` holds ``files``, with pip's RECORD."""
    site = vllm_cpu.home(version) / "lib" / "python3.11" / "site-packages"
    (vllm_cpu.home(version) / "bin").mkdir(parents=True)
    vllm_cpu.python(version).write_text("")
    (vllm_cpu.home(version) / ".installed.json").write_text(json.dumps({"recipe": vllm_cpu.RECIPE}))
    record = []
    for path, content in files.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_bytes(content)
        digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(content)}")
    (site / "dist-1.0.dist-info").mkdir(parents=True, exist_ok=True)
    (site / "dist-1.0.dist-info" / "RECORD").write_text("\n".join([*record, "dist-1.0.dist-info/RECORD,,"]) + "\n")
    return site


def test_a_second_release_hard_links_the_files_it_shares_with_an_installed_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_AUTOPILOT_CACHE", str(tmp_path))
    first = fake_release("0.32.0", {"torch/lib.so": b"same" * 100, "vllm/a.py": b"new"})
    second = fake_release("0.31.0", {"torch/lib.so": b"same" * 100, "vllm/a.py": b"old"})
    assert vllm_cpu.installed_releases() == ["0.31.0", "0.32.0"]
    assert vllm_cpu.share_files("0.31.0") == 400
    assert (second / "torch/lib.so").stat().st_ino == (first / "torch/lib.so").stat().st_ino
    assert (second / "vllm/a.py").read_bytes() == b"old"  # its own file stays its own
    assert (second / "vllm/a.py").stat().st_ino != (first / "vllm/a.py").stat().st_ino
    assert vllm_cpu.share_files("0.31.0") == 0  # already shared: nothing to do
