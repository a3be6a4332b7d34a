"""The burn-in's shell (controller/burn_in_load.py) against vLLM-shaped answers on httpx.MockTransport: what it
sends, what it measures from /metrics, and that the network never raises out of it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import httpx

from llm_autopilot.controller.burn_in_load import BurnInRunner, base_url, parse_metrics, run_load
from llm_autopilot.domain.burn_in import BurnInLoad, BurnInMeasurement

LOAD = BurnInLoad(model="tiny", port=8000, requests=4, prompt_tokens=64, max_tokens=8, timeout_seconds=30)


def metrics_text(usage: float, waiting: float, preemptions: float) -> str:
    """vLLM 0.32's exposition of the series the burn-in reads (names and labels as it writes them)."""
    return "\n".join([
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="tiny"}} {usage}',
        f'vllm:num_requests_waiting{{engine="0",model_name="tiny"}} {waiting}',
        'vllm:num_requests_running{engine="0",model_name="tiny"} 4.0',
        "# TYPE vllm:num_preemptions counter",
        f'vllm:num_preemptions_total{{engine="0",model_name="tiny"}} {preemptions}',
        f'vllm:num_preemptions_created{{engine="0",model_name="tiny"}} {time.time()}',
        'vllm:cache_config_info{block_size="128",num_gpu_blocks="NaN"} NaN',
    ]) + "\n"


class Server:
    """A vLLM as the burn-in sees it: completions, and /metrics whose figures move as requests arrive."""

    def __init__(self, usage: float = 0.4, waiting: float = 0, preempted: float = 0, status: int = 200) -> None:
        self.usage, self.waiting, self.preempted, self.status = usage, waiting, preempted, status
        self.bodies: list[dict[str, object]] = []
        self.lock = threading.Lock()
        self.hosts: set[str] = set()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.hosts.add(request.url.host)
        if request.url.path == "/metrics":
            with self.lock:
                busy = bool(self.bodies)
            return httpx.Response(200, text=metrics_text(self.usage if busy else 0.0, self.waiting if busy else 0,
                                                         self.preempted if busy else 0))
        with self.lock:
            self.bodies.append(json.loads(request.content))
        if self.status != 200:
            return httpx.Response(self.status, text="engine dead")
        return httpx.Response(200, json={"choices": [{"text": "x"}], "usage": {"completion_tokens": 8}})


def test_a_healthy_run_sends_the_load_and_reads_the_peaks() -> None:
    server = Server(usage=0.4, waiting=1)
    m = run_load("10.0.0.7", LOAD, transport=httpx.MockTransport(server), sample_every=0.01)
    assert (m.completed, m.sent, m.errors, m.timed_out) == (4, 4, 0, False)
    assert m.generated_tokens == 32 and m.preemptions == 0 and m.samples >= 1
    assert m.peak_kv_usage == 0.4 and m.peak_waiting == 1 and m.peak_running == 4 and m.full_while_waiting == 0
    prompts = sorted(tuple(b["prompt"]) for b in server.bodies)  # type: ignore[arg-type]
    assert prompts == sorted(tuple(LOAD.prompt(i)) for i in range(4))
    assert all(b["max_tokens"] == 8 and b["ignore_eos"] is True and b["model"] == "tiny" for b in server.bodies)
    assert server.hosts == {"10.0.0.7"}


def test_preemptions_are_counted_from_the_counter_before_the_run() -> None:
    m = run_load("10.0.0.7", LOAD, transport=httpx.MockTransport(Server(usage=1.0, waiting=2, preempted=3)),
                 sample_every=0.01)
    assert m.preemptions == 3 and m.peak_kv_usage == 1.0 and m.peak_waiting == 2
    assert 1 <= m.full_while_waiting <= m.samples  # the busy samples: full, with requests waiting


def test_failed_requests_are_errors_never_exceptions() -> None:
    m = run_load("10.0.0.7", LOAD, transport=httpx.MockTransport(Server(status=500)), sample_every=0.01)
    assert (m.completed, m.errors) == (0, 4) and m.first_error == "HTTP 500: engine dead"

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    m = run_load("10.0.0.7", LOAD, transport=httpx.MockTransport(refused), sample_every=0.01)
    assert m.errors == 4 and m.first_error.startswith("ConnectError: connection refused") and m.samples == 0


def test_a_run_out_of_time_is_said_and_returns() -> None:
    release = threading.Event()

    def slow(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=metrics_text(0.5, 0, 0))
        release.wait(2.0)
        return httpx.Response(200, json={"usage": {"completion_tokens": 8}})

    quick = BurnInLoad(model="tiny", port=8000, requests=2, prompt_tokens=8, max_tokens=8, timeout_seconds=0.3)
    started = time.monotonic()
    m = run_load("10.0.0.7", quick, transport=httpx.MockTransport(slow), sample_every=0.05)
    release.set()
    assert m.timed_out and time.monotonic() - started < 5


def test_ipv6_addresses_are_bracketed() -> None:
    assert base_url("fd00::7", 8000) == "http://[fd00::7]:8000"
    assert base_url("10.0.0.7", 8000) == "http://10.0.0.7:8000"


def test_the_exposition_is_read_per_name_at_its_largest() -> None:
    text = 'a{engine="0"} 0.2\na{engine="1"} 0.9\nb 3\nc{x="1"} NaN\n# a comment 7\nd{x="a b"} 5 1700000000\n'
    assert parse_metrics(text) == {"a": 0.9, "b": 3.0, "d": 5.0}


def test_the_runner_runs_once_per_pod_and_a_crash_is_a_failed_request() -> None:
    calls: list[str] = []
    done = threading.Event()

    def run(address: str, load: BurnInLoad) -> BurnInMeasurement:
        calls.append(address)
        if address == "bad":
            raise RuntimeError("boom")
        done.wait(5)
        return BurnInMeasurement(completed=load.requests, sent=load.requests)

    runner = BurnInRunner(run=run)
    runner.start("u1", "10.0.0.1", LOAD)
    runner.start("u1", "10.0.0.1", LOAD)
    assert runner.running("u1") and runner.result("u1") is None
    done.set()
    deadline = time.monotonic() + 5
    while runner.result("u1") is None and time.monotonic() < deadline:
        time.sleep(0.01)
    measured = runner.result("u1")
    assert measured is not None and not runner.running("u1")
    assert replace(measured, started_at=None) == BurnInMeasurement(completed=4, sent=4)
    assert measured.started_at is not None and abs(datetime.now(UTC) - measured.started_at) < timedelta(seconds=30)
    runner.start("u1", "10.0.0.1", LOAD)  # measured: never again
    runner.start("u2", "bad", LOAD)
    while runner.result("u2") is None and time.monotonic() < deadline:
        time.sleep(0.01)
    failed = runner.result("u2")
    assert failed is not None and failed.errors == 1 and failed.first_error == "RuntimeError: boom"
    assert calls == ["10.0.0.1", "bad"]


def _until(what: str, done: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_the_runner_keeps_only_the_results_its_owners_still_need() -> None:
    """Results were kept for the operator's life (``forget`` was never called). Each reconcile now says which of
    its object's runs it still needs; the others go, and a deleted object's all."""
    release = threading.Event()

    def run(address: str, load: BurnInLoad) -> BurnInMeasurement:
        if address == "slow":
            release.wait(5)
        return BurnInMeasurement(completed=load.requests, sent=load.requests)

    runner = BurnInRunner(run=run)
    for uid, owner in (("a1", "A"), ("a2", "A"), ("b1", "B")):
        runner.start(uid, "10.0.0.1", LOAD, owner=owner)
    _until("three results", lambda: runner.kept() == 3)
    runner.keep("A", ["a2"])  # a1 judged and recorded, or gone: dropped; B's untouched
    assert (runner.result("a1"), runner.result("a2") is not None, runner.result("b1") is not None) == (
        None, True, True)
    runner.start("a1", "10.0.0.1", LOAD, owner="A")  # a new start of a dropped uid runs again (desired asks it)
    runner.start("a3", "slow", LOAD, owner="A")
    runner.keep("A", ["a1"])  # a3 still runs and is no longer wanted (its pod went): it leaves no result
    assert runner.running("a3")
    release.set()
    _until("a3 finished", lambda: not runner.running("a3"))
    _until("a1 measured again", lambda: runner.result("a1") is not None)
    assert runner.result("a3") is None and runner.result("a2") is None and runner.kept() == 2
    runner.forget_owner("B")  # its LLMDeployment was deleted
    assert runner.result("b1") is None and runner.kept() == 1


def test_a_run_wanted_again_before_it_ends_keeps_its_result() -> None:
    release = threading.Event()
    runner = BurnInRunner(run=lambda address, load: (release.wait(5), BurnInMeasurement(completed=1, sent=1))[1])
    runner.start("u", "10.0.0.1", LOAD, owner="A")
    runner.keep("A", [])  # a reconcile that did not need it, then one that does
    runner.keep("A", ["u"])
    release.set()
    _until("measured", lambda: runner.result("u") is not None)
