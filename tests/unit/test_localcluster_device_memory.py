"""The process kubelet's opt-in simulated device memory: a node annotation gives a vLLM container a memory node of
that size (its meminfo, bound over /sys after `ip netns exec` remounts it) instead of a fixed KV room."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from hack.localcluster import runtime, vllm_cpu
from hack.localcluster.kubelet import (
    DEFAULT_KV_BYTES,
    DEVICE_MEMORY_ANNOTATION,
    DEVICE_MEMORY_NAMESPACE_ANNOTATION,
    KV_BYTES_ANNOTATION,
    stand_ins_for,
)
from hack.localcluster.podworker import StandIns, memory_nodes

SERVE = ["vllm", "serve", "llm-autopilot/tiny-llama-gqa", "--max-model-len", "2048"]
GIB = 2**30

STAND_INS = {
    "no annotation: the default KV room": (SERVE, {}, "ns", StandIns(("--kv-cache-memory-bytes",
                                                                    str(DEFAULT_KV_BYTES)))),
    "the node's KV room": (SERVE, {KV_BYTES_ANNOTATION: "4194304"}, "ns",
                           StandIns(("--kv-cache-memory-bytes", "4194304"))),
    "a KV room the args set wins": ([*SERVE, "--kv-cache-memory-bytes=1"], {}, "ns", StandIns()),
    "a device: no KV room, vLLM sizes it": (SERVE, {DEVICE_MEMORY_ANNOTATION: str(3 * GIB),
                                                    KV_BYTES_ANNOTATION: "4194304"}, "ns",
                                            StandIns(device_memory_bytes=3 * GIB)),
    "a device for this namespace": (SERVE, {DEVICE_MEMORY_ANNOTATION: str(GIB),
                                            DEVICE_MEMORY_NAMESPACE_ANNOTATION: "mine"}, "mine",
                                    StandIns(device_memory_bytes=GIB)),
    "a device for another namespace: as before": (SERVE, {DEVICE_MEMORY_ANNOTATION: str(GIB),
                                                          DEVICE_MEMORY_NAMESPACE_ANNOTATION: "theirs"}, "mine",
                                                  StandIns(("--kv-cache-memory-bytes", str(DEFAULT_KV_BYTES)))),
    "a device size that is not a number: as before": (SERVE, {DEVICE_MEMORY_ANNOTATION: "3Gi"}, "ns",
                                                      StandIns(("--kv-cache-memory-bytes", str(DEFAULT_KV_BYTES)))),
    "a device of no bytes: as before": (SERVE, {DEVICE_MEMORY_ANNOTATION: "0"}, "ns",
                                        StandIns(("--kv-cache-memory-bytes", str(DEFAULT_KV_BYTES)))),
}


@pytest.mark.parametrize("case", sorted(STAND_INS))
def test_what_a_vllm_container_is_given_for_what_a_cpu_lacks(case: str) -> None:
    argv, annotations, namespace, expected = STAND_INS[case]
    assert stand_ins_for(argv, annotations, namespace) == expected


def _vllm_reader(node: int) -> list[str]:
    # vLLM's own reader of a memory node (the CPU worker's budget and its "available")
    return [str(vllm_cpu.python()), "-c", "from vllm.utils.cpu_resource_utils import get_memory_node_info as g; "
            f"i = g({node}); print(i.total_memory, i.available_memory)"]


def test_the_simulated_meminfo_reads_as_a_node_of_that_size_all_free() -> None:
    text = runtime.simulated_meminfo(0, 3 * GIB + 4096)
    # parsed as vLLM 0.32.0 parses it (cpu_resource_utils.get_memory_node_info): "Node 0 MemTotal: N kB"
    fields = {line.split()[2].rstrip(":"): int(line.split()[3]) * 1024 for line in text.splitlines()}
    assert fields["MemTotal"] == fields["MemFree"] == 3 * GIB + 4096
    assert fields["Active(file)"] == fields["Inactive(file)"] == fields["SReclaimable"] == 0
    assert runtime.simulated_meminfo(1, GIB).startswith("Node 1 MemTotal:")


def test_sysfs_binds_come_after_the_network_namespace_which_remounts_sys() -> None:
    bind = runtime.Mount(target="/sys/devices/system/node/node0/meminfo", source=Path("/p/0.node0.meminfo"),
                         file=True, create_source=False)
    volume = runtime.Mount(target="/models", source=Path("/vol"))
    command = runtime.command_line(procs_file=Path("/cg/procs"), mounts=(volume,), network_prefix=["ip", "netns",
                                   "exec", "pod"], sysfs_mounts=(bind,), executable="/venv/bin/vllm", args=["serve"])
    netns, sysfs = command.index("netns"), command.index("sysfs")
    assert command.index("volumes") < netns < sysfs < command.index("/venv/bin/vllm")
    assert "mount --bind /p/0.node0.meminfo /sys/devices/system/node/node0/meminfo" in command[sysfs - 1]
    assert "meminfo" not in " ".join(command[:netns])
    # without the opt-in: the chain as before
    plain = runtime.command_line(procs_file=Path("/cg/procs"), mounts=(), network_prefix=["ip", "netns", "exec",
                                 "pod"], sysfs_mounts=(), executable="/venv/bin/vllm", args=["serve"])
    assert plain == ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', "/cg/procs", "ip", "netns", "exec", "pod",
                     "/venv/bin/vllm", "serve"]


def test_the_memory_nodes_are_those_with_a_meminfo(tmp_path: Path) -> None:
    for name in ("node0", "node1", "nodefoo"):
        (tmp_path / "devices/system/node" / name).mkdir(parents=True)
        (tmp_path / "devices/system/node" / name / "meminfo").write_text("")
    (tmp_path / "devices/system/node/node2").mkdir()  # no meminfo: not a memory node
    assert memory_nodes(tmp_path) == [0, 1]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None
                    or not vllm_cpu.installed() or not Path(runtime.NODE_MEMINFO.format(node=0)).is_file(),
                    reason="needs root, ip, unshare, a NUMA memory node and the CPU build of vLLM")
def test_vllm_reads_the_device_size_in_the_containers_chain_and_the_host_is_untouched(tmp_path: Path) -> None:
    host_before = Path(runtime.NODE_MEMINFO.format(node=0)).read_text().splitlines()[0]
    fake = tmp_path / "0.node0.meminfo"
    fake.write_text(runtime.simulated_meminfo(0, 3 * GIB))
    bind = runtime.Mount(target=runtime.NODE_MEMINFO.format(node=0), source=fake, file=True, create_source=False)
    namespace = f"lora-test-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", namespace], check=True)
    try:
        def run(mounts: tuple[runtime.Mount, ...], sysfs: tuple[runtime.Mount, ...], argv: list[str]) -> str:
            command = runtime.command_line(procs_file=tmp_path / "procs", mounts=mounts,
                                           network_prefix=["ip", "netns", "exec", namespace], sysfs_mounts=sysfs,
                                           executable=argv[0], args=argv[1:])
            return subprocess.run(command, check=True, capture_output=True, text=True, timeout=120,
                                  env=vllm_cpu.offline_env()).stdout

        # after `ip netns exec`: vLLM's budget is the device's size, all of it available (no cgroup clamp: the
        # namespace's fresh /sys has no cgroup tree)
        assert run((), (bind,), _vllm_reader(0)).split()[-2:] == [str(3 * GIB), str(3 * GIB)]
        # bound before it (with the volumes), `ip netns exec`'s own sysfs hides the bind: why the order matters
        head = ["/usr/bin/head", "-1", runtime.NODE_MEMINFO.format(node=0)]
        assert run((bind,), (), head).strip() == host_before
    finally:
        subprocess.run(["ip", "netns", "delete", namespace], check=False)
    assert Path(runtime.NODE_MEMINFO.format(node=0)).read_text().splitlines()[0] == host_before
