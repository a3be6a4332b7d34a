"""The local cluster's volumes and pods: the provisioner's decisions, a claim's folder, read-only and sized mounts,
restart policies and container images of the process kubelet, and SeaweedFS's access-log records."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hack.localcluster import crilog, local_path, runtime, s3
from hack.localcluster.podworker import Environment, Image, StandIns, VolumeNotReady, claim_source, restarts


def claim(name: str = "data", *, uid: str = "u1", size: str = "64Mi", cls: str | None = "local-path",
          phase: str = "Pending", volume: str | None = None, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    spec: dict[str, Any] = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": size}}}
    if cls is not None:
        spec["storageClassName"] = cls
    if volume:
        spec["volumeName"] = volume
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def pv(name: str, *, phase: str = "Bound", ours: bool = True, deleting: bool = False, path: str = "/x",
       reclaim: str = "Delete") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "annotations": {local_path.PROVISIONED_BY: local_path.PROVISIONER} if ours
                            else {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return {"metadata": meta, "spec": {"hostPath": {"path": path}, "persistentVolumeReclaimPolicy": reclaim},
            "status": {"phase": phase}}


def test_a_pending_claim_of_the_class_gets_one_volume_of_its_size_bound_to_it() -> None:
    claims = [claim(), claim("other-class", uid="u2", cls="fast"), claim("bound", uid="u3", volume="pv-x"),
              claim("gone", uid="u4", deleting=True), claim("no-class", uid="u5", cls=None)]
    wanted = local_path.to_provision(claims, [])
    assert [c["metadata"]["name"] for c in wanted] == ["data"]
    manifest = local_path.volume_manifest(wanted[0], Path("/state/volumes/pvc-u1"))
    assert manifest["metadata"]["name"] == "pvc-u1"
    assert manifest["spec"]["capacity"] == {"storage": str(64 * 2**20)}
    assert manifest["spec"]["accessModes"] == ["ReadWriteMany"]
    assert manifest["spec"]["claimRef"] == {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "ns",
                                            "name": "data", "uid": "u1"}
    assert manifest["spec"]["hostPath"]["path"] == "/state/volumes/pvc-u1"
    assert manifest["metadata"]["finalizers"] == [local_path.FINALIZER]
    # made once: a claim whose volume exists (not yet bound) is left alone
    assert local_path.to_provision(claims, [pv("pvc-u1", phase="Available")]) == []


def test_a_tiny_request_still_gets_a_file_system_and_the_class_is_the_default() -> None:
    assert local_path.requested_bytes(claim(size="1Ki")) == local_path.MIN_BYTES
    assert local_path.requested_bytes(claim(size="1Gi")) == 2**30
    sc = local_path.storage_class()
    assert sc["metadata"]["annotations"][local_path.DEFAULT_CLASS_ANNOTATION] == "true"
    assert (sc["provisioner"], sc["reclaimPolicy"]) == (local_path.PROVISIONER, "Delete")


def test_released_or_deleted_volumes_of_ours_lose_their_storage_bound_ones_keep_it() -> None:
    volumes = [pv("bound"), pv("released", phase="Released"), pv("deleted", phase="Available", deleting=True),
               pv("deleted-but-bound", deleting=True), pv("static", phase="Released", ours=False),
               pv("retained", phase="Released", reclaim="Retain")]
    assert [v["metadata"]["name"] for v in local_path.to_delete(volumes)] == ["released", "deleted"]


def test_a_claim_is_mounted_from_its_bound_volume_folder(tmp_path: Path) -> None:
    bound = claim(phase="Bound", volume="pvc-u1")
    assert claim_source(bound, pv("pvc-u1", path=str(tmp_path)), "data") == tmp_path
    with pytest.raises(VolumeNotReady, match='persistentvolumeclaim "data" not found'):
        claim_source(None, None, "data")
    with pytest.raises(VolumeNotReady, match="is not bound"):
        claim_source(claim(), None, "data")
    with pytest.raises(VolumeNotReady, match="does not exist on the node"):
        claim_source(bound, pv("pvc-u1", path=str(tmp_path / "missing")), "data")
    nfs = {"metadata": {"name": "pvc-u1"}, "spec": {"nfs": {"server": "x", "path": "/"}, "capacity": {}}}
    with pytest.raises(runtime.StartError, match=r"\(nfs\): the process kubelet mounts hostPath and local"):
        claim_source(bound, nfs, "data")


def test_mounts_are_binds_made_read_only_in_the_container_namespace() -> None:
    ro = runtime.Mount(target="/models", source=Path("/vol/pvc-1"), read_only=True, create_source=False).shell()
    assert ro == ("mkdir -p /models && mount --bind /vol/pvc-1 /models && mount -o remount,bind,ro /models")
    tmpfs = runtime.Mount(target="/dev/shm", size_bytes=2**30).shell()
    assert tmpfs == f"mkdir -p /dev/shm && mount -t tmpfs -o mode=1777,size={2**30} tmpfs /dev/shm"


def test_the_termination_message_file_is_bound_over_its_path_and_read_as_the_kubelet_reads_it(
        tmp_path: Path) -> None:
    mount = runtime.Mount(target="/dev/termination-log", source=Path("/pods/p/main/0.termination-log"), file=True,
                          create_source=False).shell()
    assert mount == ("{ [ -e /dev/termination-log ] || { mkdir -p /dev && : > /dev/termination-log; }; } && "
                     "mount --bind /pods/p/main/0.termination-log /dev/termination-log")
    written = tmp_path / "0.termination-log"
    assert crilog.message_file(written) == ""  # never written: empty (FallbackToLogsOnError may apply)
    written.write_text('{"ok": true}')
    assert crilog.message_file(written) == '{"ok": true}'
    written.write_bytes(b"a" * 10 + b"b" * crilog.TERMINATION_MESSAGE_BYTES)
    assert crilog.message_file(written) == "b" * 4096  # the last 4096 bytes, as tail.ReadAtMost


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_a_file_bound_in_a_private_mount_namespace_receives_what_the_process_writes(tmp_path: Path) -> None:
    host, target = tmp_path / "host-file", tmp_path / "in-container" / "termination-log"
    host.write_bytes(b"")
    mount = runtime.Mount(target=str(target), source=host, file=True, create_source=False)
    script = f"{mount.shell()} && echo -n report > {target}"
    subprocess.run(["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script], check=True)
    assert host.read_text() == "report"
    assert target.is_file() and target.read_text() == ""  # the mount point outside stayed an empty file


@pytest.mark.parametrize(("policy", "code", "again"), [
    ("Always", 0, True), ("Always", 1, True), (None, 0, True),
    ("OnFailure", 0, False), ("OnFailure", 3, True), ("Never", 0, False), ("Never", 1, False)])
def test_restart_policy(policy: str | None, code: int, again: bool) -> None:
    assert restarts(policy, code) is again


def test_an_llm_autopilot_command_runs_the_operator_image() -> None:
    env = Environment(images={"": Image("/vllm/bin:/usr/bin", None), "llm-autopilot": Image("/repo/.venv/bin", None)},
                      base_env={}, stand_ins=lambda pod, spec, node: StandIns())
    assert env.image({"command": ["llm-autopilot", "cache", "fill"]}).path == "/repo/.venv/bin"
    assert env.image({"command": ["vllm"], "args": ["serve", "m"]}).path == "/vllm/bin:/usr/bin"
    assert env.image({"args": ["llm-autopilot"]}).path == "/repo/.venv/bin"


def test_the_access_log_collector_reads_records_across_chunks() -> None:
    one = json.dumps(["seaweedfs.s3.access", 1764633600, {"operation": "REST.GET.OBJECT", "key": "m/config.json"},
                      {}])
    two = json.dumps(["seaweedfs.s3.access", 1764633601, {"operation": "REST.PUT.OBJECT", "key": "m/a"}, {}])
    found, rest = s3.records(one + two[:20])
    assert [r["operation"] for r in found] == ["REST.GET.OBJECT"]
    found, rest = s3.records(rest + two[20:] + "\n")
    assert [(r["operation"], r["key"], r["time"]) for r in found] == [("REST.PUT.OBJECT", "m/a", 1764633601)]
    assert rest == ""


def test_the_identity_config_names_the_keys_and_no_anonymous_access() -> None:
    config = s3.identity_config({"accessKey": "AK", "secretKey": "SK"})
    assert config["identities"] == [{"name": s3.IDENTITY, "credentials": [{"accessKey": "AK", "secretKey": "SK"}],
                                     "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mkfs.ext4") is None, reason="needs root and mkfs.ext4")
def test_a_volume_is_its_own_file_system_of_the_requested_size(tmp_path: Path) -> None:
    store = local_path.Store(tmp_path / "volumes")
    path = store.create("pvc-test", 4 * 2**20)
    try:
        assert local_path.mounted(path)
        assert list(path.iterdir()) == [path / "lost+found"]  # a fresh file system
        with pytest.raises(OSError) as full, (path / "big").open("wb") as f:
            for _ in range(8):
                f.write(b"\0" * 2**20)
                f.flush()
                os.fsync(f.fileno())
        assert full.value.errno == errno.ENOSPC
        assert store.names() == ["pvc-test"]
    finally:
        store.remove("pvc-test")
    assert not path.exists() and not store.image("pvc-test").exists()
    assert subprocess.run(["mountpoint", "-q", str(path)], check=False).returncode != 0
