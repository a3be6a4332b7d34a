"""The burn-in's shell: send one pod's vLLM the bounded load desired/burn_in.py chose, on the pod's own IP, and
measure what vLLM's /metrics says meanwhile; ``BurnInRunner`` runs one such load per pod in the background.

Never raises for the network: a request that fails is an error in the measurement, a /metrics that cannot be
read leaves its figures unknown.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import math
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx

from llm_autopilot.domain import egress
from llm_autopilot.domain.burn_in import FULL_KV_USAGE, BurnInLoad, BurnInMeasurement
from llm_autopilot.remediation.text import clean_line
from llm_autopilot.vllm.metrics import KV_CACHE_USAGE_NAMES, PREEMPTIONS, REQUESTS_RUNNING, REQUESTS_WAITING

logger = logging.getLogger(__name__)
#: a /metrics read gets at most this long
METRICS_SECONDS = 2.0


def base_url(address: str, port: int) -> str:
    try:
        host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    except ValueError:
        host = address
    return f"http://{host}:{port}"


def parse_metrics(text: str) -> dict[str, float]:
    """The largest value of each series name in a Prometheus text exposition (over its label sets: engines)."""
    found: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if name_end <= 0:
            continue
        name = line[:name_end]
        rest = line[line.rfind("}") + 1:] if "{" in line[:name_end + 1] else line[name_end:]
        parts = rest.split()
        if not parts:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        if not math.isnan(value):  # NaN is no figure
            found[name] = max(found.get(name, value), value)
    return found


def _counter(values: dict[str, float], name: str) -> float | None:
    """A counter as prometheus_client exposes it (``name_total``), or under its own name."""
    for candidate in (f"{name}_total", name):
        if candidate in values:
            return values[candidate]
    return None


@dataclass
class _Sampler:
    """The peaks of vLLM's gauges over the run's samples."""

    samples: int = 0
    full_while_waiting: int = 0
    usage: float | None = None
    waiting: float | None = None
    running: float | None = None
    preemptions: float | None = None

    def add(self, values: dict[str, float]) -> None:
        self.samples += 1
        usage = next((values[n] for n in KV_CACHE_USAGE_NAMES if n in values), None)
        waiting = values.get(REQUESTS_WAITING)
        if usage is not None and usage >= FULL_KV_USAGE and (waiting or 0) >= 1:
            self.full_while_waiting += 1
        self.usage = _peak(self.usage, usage)
        self.waiting = _peak(self.waiting, waiting)
        self.running = _peak(self.running, values.get(REQUESTS_RUNNING))
        counter = _counter(values, PREEMPTIONS)
        if counter is not None:
            self.preemptions = counter


def _peak(current: float | None, value: float | None) -> float | None:
    if value is None:
        return current
    return value if current is None else max(current, value)


def run_load(address: str, load: BurnInLoad, *, transport: httpx.BaseTransport | None = None,
             clock: Callable[[], float] = time.monotonic, sample_every: float = 0.1) -> BurnInMeasurement:
    """Send ``load`` to the vLLM at ``address`` and measure it (see the module's docstring)."""
    refused = egress.pod_address_problem(address)
    if refused is not None:  # a pod IP, in-cluster by design, but never loopback or the metadata service
        return BurnInMeasurement(completed=0, sent=load.requests, errors=load.requests, first_error=refused)
    url = base_url(address, load.port)
    started = clock()
    deadline = started + load.timeout_seconds
    sampler = _Sampler()
    errors: list[str] = []
    completed = generated = 0
    lock = threading.Lock()
    with httpx.Client(base_url=url, transport=transport, trust_env=False) as client:

        def metrics() -> dict[str, float] | None:
            try:
                response = client.get("/metrics", timeout=METRICS_SECONDS)
            except httpx.HTTPError:
                return None
            return parse_metrics(response.text) if response.status_code == 200 else None

        baseline = metrics()
        before = _counter(baseline, PREEMPTIONS) if baseline is not None else None

        def one(index: int) -> None:
            nonlocal completed, generated
            body = {"model": load.model, "prompt": load.prompt(index), "max_tokens": load.max_tokens,
                    "temperature": 0, "ignore_eos": True}
            remaining = max(deadline - clock(), 0.1)
            try:
                response = client.post("/v1/completions", json=body, timeout=remaining)
            except httpx.HTTPError as exc:
                with lock:
                    errors.append(clean_line(f"{type(exc).__name__}: {exc}", 200))
                return
            if response.status_code != 200:
                with lock:
                    errors.append(clean_line(f"HTTP {response.status_code}: {response.text}", 200))
                return
            try:
                tokens = int(response.json().get("usage", {}).get("completion_tokens", 0))
            except (ValueError, TypeError, AttributeError):
                tokens = 0
            with lock:
                completed += 1
                generated += tokens

        with ThreadPoolExecutor(max_workers=load.requests, thread_name_prefix="burn-in") as pool:
            futures = [pool.submit(one, i) for i in range(load.requests)]
            while True:
                _, pending = wait(futures, timeout=sample_every)
                if (found := metrics()) is not None:
                    sampler.add(found)
                if not pending or clock() >= deadline:
                    break
        timed_out = any(not f.done() for f in futures) or clock() > deadline
        final = metrics()
        if final is not None:
            sampler.add(final)
    after = sampler.preemptions
    preemptions = max(after - (before or 0.0), 0.0) if after is not None else 0.0
    return BurnInMeasurement(
        completed=completed, sent=load.requests, errors=len(errors), first_error=errors[0] if errors else "",
        timed_out=timed_out, preemptions=preemptions, peak_kv_usage=sampler.usage, peak_waiting=sampler.waiting,
        peak_running=sampler.running, samples=sampler.samples, full_while_waiting=sampler.full_while_waiting,
        generated_tokens=generated,
        wall_seconds=round(clock() - started, 3))


@dataclass
class BurnInRunner:
    """One background run per pod uid, for the LLMDeployment (its uid: the owner) that started it. A result is
    kept only while its owner's reconcile may still judge it: ``keep`` drops the owner's others (a pod gone or
    being deleted, a pod of a plan no longer in force, a pod whose verdict status.burnIn records), a run under
    way that is no longer wanted leaves no result, and ``forget_owner`` drops a deleted LLMDeployment's."""

    run: Callable[[str, BurnInLoad], BurnInMeasurement] = run_load
    #: pod uid -> (owner, what its run measured)
    _results: dict[str, tuple[str, BurnInMeasurement]] = field(default_factory=dict)
    #: pod uid -> owner, while its run is under way
    _running: dict[str, str] = field(default_factory=dict)
    #: runs under way whose result no reconcile wants any more
    _unwanted: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, uid: str, address: str, load: BurnInLoad, owner: str = "") -> None:
        with self._lock:
            if uid in self._running or uid in self._results:
                return
            self._running[uid] = owner
        threading.Thread(target=self._run, args=(uid, address, load), name=f"burn-in-{uid[:8]}",
                         daemon=True).start()

    def _run(self, uid: str, address: str, load: BurnInLoad) -> None:
        started = datetime.now(UTC).replace(microsecond=0)  # the kubelet's times are whole seconds
        try:
            measured = self.run(address, load)
        except Exception as exc:  # never a silently dead run: it is a failed request
            logger.exception("burn-in of pod %s failed", uid)
            measured = BurnInMeasurement(completed=0, sent=load.requests, errors=1,
                                         first_error=clean_line(f"{type(exc).__name__}: {exc}", 200))
        measured = dataclasses.replace(measured, started_at=started)
        with self._lock:
            owner = self._running.pop(uid, "")
            if uid in self._unwanted:
                self._unwanted.discard(uid)
            else:
                self._results[uid] = (owner, measured)

    def result(self, uid: str) -> BurnInMeasurement | None:
        with self._lock:
            found = self._results.get(uid)
        return found[1] if found is not None else None

    def running(self, uid: str) -> bool:
        with self._lock:
            return uid in self._running

    def keep(self, owner: str, uids: Collection[str]) -> None:
        """Keep only the runs of ``owner``'s pods ``uids`` (its reconcile's view: the pods of the plan in force
        whose verdict is not recorded yet)."""
        wanted = set(uids)
        with self._lock:
            for uid in [u for u, (o, _) in self._results.items() if o == owner and u not in wanted]:
                del self._results[uid]
            for uid, o in self._running.items():
                if o == owner:
                    if uid in wanted:
                        self._unwanted.discard(uid)
                    else:
                        self._unwanted.add(uid)

    def forget_owner(self, owner: str) -> None:
        """The LLMDeployment ``owner`` was deleted: none of its runs is wanted."""
        self.keep(owner, ())

    def kept(self) -> int:
        """How many results are kept."""
        with self._lock:
            return len(self._results)
