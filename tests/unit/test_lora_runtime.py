"""LoRA adapters changed on running pods (issue #17 item 4): the pure decision (desired/lora_sync.py) as named
tables, and the shell (controller/lora_runtime.py) against a fake vLLM behind httpx's MockTransport that answers
as vLLM 0.32.0's entrypoints/openai/models/serving.py does."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from llm_autopilot.api import convert
from llm_autopilot.api.status import LoRAStatus
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.controller import lora_runtime, world_reads
from llm_autopilot.controller.lora_runtime import LoRAAnswers, ReadyPod, VLLMAdapters, call_pod, read_pods, ready_pods
from llm_autopilot.desired import lora_calls
from llm_autopilot.desired.lora_sync import (
    Action,
    Answer,
    PodView,
    Served,
    Updates,
    actions,
    lora_status,
    served_adapters,
    settled,
    updates_for,
    wanted,
)
from llm_autopilot.desired.world import AdapterReading
from llm_autopilot.planner.plan import Plan, PlanRequest
from llm_autopilot.planner.search import plan
from llm_autopilot.render import lora_volumes
from llm_autopilot.render.kubernetes import Owner, WorkloadInputs, deployment, plan_hash
from llm_autopilot.render.vllm_args import ServeOptions, render_vllm_args
from llm_autopilot.vllm.versions import VLLMVersion, behaviour_of
from tests.conftest import gpu, model
from tests.unit.fakes import Run

BASE = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4", "maxGPUs": 1},
        "serving": {"maxModelLen": 8192, "allowedKVCacheDtypes": ["auto", "fp8"]}}
TWO = [{"name": "sql", "source": "hf://org/sql"}, {"name": "bot", "source": "org/bot"}]


def spec(lora: dict[str, Any] | None = None, **rest: Any) -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate({**BASE, **rest, **({"lora": lora} if lora is not None else {})})


V032, V031 = VLLMVersion(0, 32, 0), VLLMVersion(0, 31, 0)

UPDATES = {
    "no lora": (spec(), V032, 1, None),
    "runtime off by default": (spec({"adapters": TWO}), V032, 1, "spec.lora.runtimeUpdates is off"),
    "a release not read for it": (spec({"adapters": TWO, "runtimeUpdates": True}), V031, 1,
                                  "vLLM 0.31.0 was not read for runtime LoRA updating (read: 0.32.0, 0.33.0)"),
    "a replica across nodes": (spec({"adapters": TWO, "runtimeUpdates": True}), V032, 2,
                               "a replica spans 2 nodes"),
    "several API servers, which vLLM refuses with it": (
        spec({"adapters": TWO, "runtimeUpdates": True}, vllm={"extraArgs": ["--api-server-count=2"]}), V032, 1,
        "extraArgs run 2 API servers"),
    "several API servers, the short flag": (
        spec({"adapters": TWO, "runtimeUpdates": True}, vllm={"extraArgs": ["-asc", "4"]}), V032, 1,
        "extraArgs run 4 API servers"),
    "one API server said explicitly": (
        spec({"adapters": TWO, "runtimeUpdates": True}, vllm={"extraArgs": ["--api-server-count", "1"]}), V032, 1,
        "RUNTIME, but maxLoras and maxLoraRank follow"),
    "runtime": (spec({"adapters": TWO, "runtimeUpdates": True, "maxLoras": 2, "maxLoraRank": 16}),
                VLLMVersion(0, 33, 0), 1, "RUNTIME"),
    "runtime, the defaults following the adapters": (spec({"adapters": TWO, "runtimeUpdates": True}), V032, 1,
                                                     "RUNTIME, but maxLoras and maxLoraRank follow"),
    "runtime, maxLoraRank following the adapters": (spec({"adapters": TWO, "runtimeUpdates": True, "maxLoras": 2}),
                                                    V032, 1, "RUNTIME, but maxLoraRank follows"),
}


@pytest.mark.parametrize("case", sorted(UPDATES))
def test_how_adapter_changes_are_applied(case: str) -> None:
    s, version, nodes, expected = UPDATES[case]
    got = updates_for(s, version, nodes=nodes)
    if expected is None:
        assert got is None
        return
    assert got is not None
    if expected.startswith("RUNTIME"):
        assert got.runtime and got.mode == "Runtime" and "without a rollout" in got.reason, got
        # a default that follows the adapters moves with them, and the slots are sized at start-up
        note = expected.removeprefix("RUNTIME")
        if note:
            assert f"{note} the adapters (unset) and a change of" in got.reason, got
            assert "is a rollout" in got.reason and len(got.reason) <= 300, got  # status.lora.reason's bound
        else:
            assert "rollout (" not in got.reason, got
    else:
        assert not got.runtime and got.mode == "Rollout" and got.reason.startswith(expected), got
        assert "a change rolls the pods" in got.reason


def test_the_version_support_is_the_releases_read() -> None:
    assert not behaviour_of(V031).runtime_lora_updating
    assert behaviour_of(V032).runtime_lora_updating and behaviour_of(VLLMVersion(0, 33, 0)).runtime_lora_updating


SQL, BOT, OLD = Served("sql", "org/sql"), Served("bot", "org/bot"), Served("old", "org/old")

ACTIONS = {
    "a fresh or restarted pod gets every adapter, in the spec's order": (
        [SQL, BOT], [], [Action("load", "sql", "org/sql"), Action("load", "bot", "org/bot")]),
    "a pod that serves the spec gets nothing": ([SQL, BOT], [BOT, SQL], []),
    "a dropped adapter is unloaded": ([SQL], [OLD, SQL], [Action("unload", "old")]),
    "an adapter from another path is reloaded in place": (
        [SQL], [Served("sql", "org/sql-v1")], [Action("load", "sql", "org/sql", inplace=True)]),
    "unloads come before loads": ([BOT], [OLD], [Action("unload", "old"), Action("load", "bot", "org/bot")]),
    "no adapters left: all unloaded": ([], [SQL, BOT], [Action("unload", "bot"), Action("unload", "sql")]),
}


@pytest.mark.parametrize("case", sorted(ACTIONS))
def test_what_to_load_and_unload_on_one_pod(case: str) -> None:
    want, served, expected = ACTIONS[case]
    assert list(actions(want, served)) == expected


def test_the_spec_adapters_have_the_path_vllm_loads() -> None:
    assert wanted(spec({"adapters": TWO})) == (SQL, BOT)
    assert wanted(spec()) == ()


def models(*adapters: Served) -> dict[str, Any]:
    """/v1/models as vLLM 0.32.0 answers it (show_available_models): the base model has no parent."""
    return {"object": "list", "data": [{"id": "Qwen/Qwen3-8B", "root": "Qwen/Qwen3-8B", "parent": None},
                                       *({"id": a.name, "root": a.path, "parent": "Qwen/Qwen3-8B"} for a in adapters)]}


def test_served_adapters_are_the_cards_with_a_parent() -> None:
    assert served_adapters(models(BOT, SQL)) == (BOT, SQL)
    assert served_adapters(models()) == ()
    assert served_adapters({"detail": "Not Found"}) is None and served_adapters([1]) is None


def test_the_status_says_where_each_adapter_is_served_and_why_not() -> None:
    runtime = Updates(True, "on")
    status = lora_status(runtime, [SQL, BOT], [
        PodView("p-0", (SQL, BOT)),
        PodView("p-1", (SQL, OLD), answers=(
            Answer("load", "bot", "org/bot", ok=False, refused=True,
                   text="/v1/load_lora_adapter: 404: No adapter found for org/bot"),
            Answer("load", "bot", "org/older-bot", ok=False, text="an older source's answer: not this one's"))),
        PodView("p-2", None, unreadable="/v1/models: timed out"),
    ])
    sql, bot = status.adapters
    assert (sql.name, sql.applied, sql.pods, sql.pending) == ("sql", "Runtime", ("p-0", "p-1"), ("p-2",))
    assert sql.message == "p-2: /v1/models: timed out"
    assert (bot.pods, bot.pending) == (("p-0",), ("p-1", "p-2"))
    assert bot.message == "p-1: /v1/load_lora_adapter: 404: No adapter found for org/bot; p-2: /v1/models: timed out"
    assert [(r.name, r.pods, r.pending) for r in status.removing] == [("old", ("p-1",), ())]
    assert not settled(status)
    done = lora_status(runtime, [SQL], [PodView("p-0", (SQL,))])
    assert settled(done) and done.model_dump(by_alias=True)["adapters"][0]["applied"] == "Runtime"
    assert settled(lora_status(Updates(False, "off"), [SQL], []))  # no Ready pod: nothing to wait for


# --- the pod template: runtime leaves the adapters out of it, so adding one does not roll the pods ----------


def rendered(s: LLMDeploymentSpec) -> tuple[list[str], dict[str, Any]]:
    result = plan(PlanRequest(model("Qwen/Qwen3-8B"), gpu("nvidia-l4"), behaviour_of(V032), convert.targets(s)))
    assert isinstance(result, Plan), result
    updates = updates_for(s, V032)
    runtime = updates is not None and updates.runtime
    args = render_vllm_args(result, ServeOptions(lora_modules=() if runtime else lora_volumes.modules(s, frozenset())))
    inputs = WorkloadInputs(Owner("x", "ns", "uid"), s, result, tuple(args), "vllm:0.32.0", (), lora_runtime=runtime)
    return args, {"hash": plan_hash(inputs), "template": deployment(inputs)["spec"]["template"]}


def test_runtime_pods_start_with_the_api_on_and_no_adapters_and_keep_their_template() -> None:
    lora = {"maxLoras": 2, "maxLoraRank": 16, "runtimeUpdates": True}
    args, two = rendered(spec({**lora, "adapters": TWO}))
    assert "--enable-lora" in args and "--lora-modules" not in args
    env = two["template"]["spec"]["containers"][0]["env"]
    assert {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "true"} in env
    _, three = rendered(spec({**lora, "adapters": [*TWO, {"name": "new", "source": "org/new"}]}))
    assert three == two  # same template, same plan hash: no rollout
    _, more_slots = rendered(spec({**lora, "maxLoras": 3, "adapters": TWO}))
    assert more_slots["hash"] != two["hash"]  # the slots are memory: a rollout


def test_rollout_pods_carry_the_adapters_and_roll_when_they_change() -> None:
    args, two = rendered(spec({"maxLoras": 2, "adapters": TWO}))
    assert args[args.index("--lora-modules"):][:3] == ["--lora-modules", "sql=org/sql", "bot=org/bot"]
    assert all(v["name"] != "VLLM_ALLOW_RUNTIME_LORA_UPDATING" for v in two["template"]["spec"]["containers"][0]["env"])
    _, three = rendered(spec({"maxLoras": 2, "adapters": [*TWO, {"name": "new", "source": "org/new"}]}))
    assert three["hash"] != two["hash"]


# --- the shell against a fake vLLM --------------------------------------------------------------------------


@dataclass
class FakeVLLM:
    """One vLLM server's served adapters and its runtime LoRA API, answering as vLLM 0.32.0 does (400 for a name
    already served without load_inplace, 404 for an unknown path or an unload of a name not served; without
    VLLM_ALLOW_RUNTIME_LORA_UPDATING the routes do not exist: FastAPI's 404 "Not Found")."""

    runtime_api: bool = True
    served: dict[str, str] = field(default_factory=dict)
    exists: set[str] = field(default_factory=lambda: {"org/sql", "org/bot", "org/old"})
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    down: bool = False

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        path = request.url.path
        if path == "/v1/models":
            return httpx.Response(200, json=models(*(Served(n, p) for n, p in self.served.items())))
        body = json.loads(request.content)
        self.calls.append((path, body))
        if not self.runtime_api:
            return httpx.Response(404, json={"detail": "Not Found"})
        name = body["lora_name"]
        if path == "/v1/load_lora_adapter":
            if name in self.served and not body.get("load_inplace"):
                return error(400, f"The lora adapter '{name}' has already been loaded. If you want to load the "
                                  "adapter in place, set 'load_inplace' to True.")
            if body["lora_path"] not in self.exists:
                return error(404, f"Loading lora {name} failed: No adapter found for {body['lora_path']}")
            self.served[name] = body["lora_path"]
            return httpx.Response(200, text=f"Success: LoRA adapter '{name}' added successfully.")
        if path == "/v1/unload_lora_adapter":
            if name not in self.served:
                return error(404, f"The lora adapter '{name}' cannot be found.")
            del self.served[name]
            return httpx.Response(200, text=f"Success: LoRA adapter '{name}' removed successfully.")
        return httpx.Response(404, json={"detail": "Not Found"})


def error(code: int, message: str) -> httpx.Response:
    return httpx.Response(code, json={"error": {"message": message, "type": "BadRequestError", "code": code}})


def clients(servers: dict[str, FakeVLLM]) -> Any:
    """A client factory: each pod's address reaches its own fake server."""
    return lambda base: VLLMAdapters(base, transport=httpx.MockTransport(servers[httpx.URL(base).host]))


RUNTIME = Updates(True, "on")
PODS = [ReadyPod("p-0", "10.0.0.1", "u-0"), ReadyPod("p-1", "10.0.0.2", "u-1")]


def sync(updates: Updates, want: list[Served], pods: list[ReadyPod], client: Any,
         store: LoRAAnswers | None = None) -> tuple[list[PodView], list[tuple[str, str, str]], LoRAStatus]:
    """Two passes as the operator makes them: the pods read, the status decided and the calls made (their
    answers kept), then the pods read again by the next pass, with the status and the Events it decides (the
    first pass's status as the one read)."""
    store = store if store is not None else LoRAAnswers()
    sources = {w.name: w.path for w in want}

    def read() -> list[PodView]:
        return read_pods(pods, {p.uid: store.of("o", p.uid) for p in pods}, client=client)

    before = read()
    for calls in lora_calls.pod_calls(updates, want, sources, before):
        for answer in call_pod(calls, client=client):
            store.record("o", calls.uid, answer)
    views = read()
    previous = lora_status(updates, want, before, sources=sources)
    return views, lora_calls.events(want, sources, views, previous), lora_status(updates, want, views,
                                                                                 sources=sources)


def test_the_shell_loads_onto_each_pod_then_does_nothing_until_something_changes() -> None:
    servers = {"10.0.0.1": FakeVLLM(), "10.0.0.2": FakeVLLM(served={"sql": "org/sql"})}
    store = LoRAAnswers()
    views, events, _ = sync(RUNTIME, [SQL, BOT], PODS, clients(servers), store)
    assert [v.served for v in views] == [(BOT, SQL), (BOT, SQL)]
    assert [c[1]["lora_name"] for c in servers["10.0.0.1"].calls] == ["sql", "bot"]
    assert [c[1]["lora_name"] for c in servers["10.0.0.2"].calls] == ["bot"]
    assert [r for _, r, _ in events] == ["LoRAAdapterLoaded"] * 3
    assert "loaded bot on p-1 at runtime (no restart)" in [m for _, _, m in events]
    for server in servers.values():
        server.calls.clear()
    views, events, _ = sync(RUNTIME, [SQL, BOT], PODS, clients(servers), store)
    assert not events and not any(s.calls for s in servers.values())  # idempotent
    servers["10.0.0.1"].served.clear()  # the container restarted: it serves no adapter
    sync(RUNTIME, [SQL, BOT], PODS, clients(servers), store)
    assert servers["10.0.0.1"].served == {"sql": "org/sql", "bot": "org/bot"}
    views, events, _ = sync(RUNTIME, [BOT], PODS, clients(servers), store)
    assert [v.served for v in views] == [(BOT,), (BOT,)] and [r for _, r, _ in events] == ["LoRAAdapterUnloaded"] * 2


def test_the_status_is_what_the_pods_answered_not_what_was_asked() -> None:
    servers = {"10.0.0.1": FakeVLLM(), "10.0.0.2": FakeVLLM(runtime_api=False), "10.0.0.3": FakeVLLM(down=True)}
    missing = Served("gone", "org/gone")
    pods = [*PODS, ReadyPod("p-2", "10.0.0.3", "u-2")]
    _, events, status = sync(RUNTIME, [SQL, missing], pods, clients(servers))
    sql, gone = status.adapters
    assert (sql.pods, sql.pending) == (("p-0",), ("p-1", "p-2"))
    assert "p-1: /v1/load_lora_adapter: 404: the server has no runtime LoRA API" in sql.message
    assert "p-2: /v1/models: connection refused" in sql.message
    assert gone.pods == () and "p-0: /v1/load_lora_adapter: 404: Loading lora gone failed: No adapter found for " \
                               "org/gone" in gone.message
    assert ("Warning", "LoRAAdapterFailed") in [(t, r) for t, r, _ in events] and not settled(status)


def test_a_refusal_kept_is_not_called_again_nor_said_again_and_a_restart_calls_once_more() -> None:
    """The answer is kept in the operator's memory: the next pass shows vLLM's text and makes no new call; an
    operator restarted (its memory empty) calls once more and hears the same refusal."""
    server = FakeVLLM()
    pods = [ReadyPod("p-0", "10.0.0.1", "u-0")]
    missing = Served("gone", "org/gone")
    store = LoRAAnswers()
    _, events, first = sync(RUNTIME, [missing], pods, clients({"10.0.0.1": server}), store)
    assert [r for _, r, _ in events] == ["LoRAAdapterFailed"] and len(server.calls) == 1
    assert "p-0: /v1/load_lora_adapter: 404: Loading lora gone failed" in first.adapters[0].message
    _, events, again = sync(RUNTIME, [missing], pods, clients({"10.0.0.1": server}), store)
    assert events == [] and again == first and len(server.calls) == 1  # kept: not called, not said again
    _, _, restarted = sync(RUNTIME, [missing], pods, clients({"10.0.0.1": server}), LoRAAnswers())
    assert restarted == first and len(server.calls) == 2  # called once more: the same refusal


def test_rollout_updates_only_read() -> None:
    servers = {"10.0.0.1": FakeVLLM(served={"old": "org/old"})}
    _, events, status = sync(Updates(False, "off"), [SQL], PODS[:1], clients(servers))
    assert not servers["10.0.0.1"].calls and not events
    assert status.adapters[0].pending == ("p-0",) and status.removing[0].pods == ("p-0",)
    assert status.updates == "Rollout"


def test_the_answers_are_kept_per_pod_and_dropped_with_it() -> None:
    store = LoRAAnswers()
    refused = Answer("load", "sql", "hf://org/sql", ok=False, refused=True, text="400: no")
    store.record("o", "u-0", refused)
    store.record("o", "u-1", Answer("load", "sql", "hf://org/sql", ok=True))
    store.record("other", "u-9", refused)
    assert store.of("o", "u-0") == (refused,) and len(store) == 3
    store.keep("o", ["u-1"])
    assert store.of("o", "u-0") == () and len(store) == 2
    store.forget_owner("other")
    assert len(store) == 1


def test_ready_pods_from_a_pod_or_the_pod_watch_summary() -> None:
    full = {"metadata": {"name": "b"}, "status": {"podIP": "10.0.0.2",
                                                   "conditions": [{"type": "Ready", "status": "True"}]}}
    summary = {"metadata": {"name": "a"}, "status": {"podIP": "10.0.0.1", "ready": "True"}}
    starting = {"metadata": {"name": "c"}, "status": {"podIP": "10.0.0.3", "ready": "False"}}
    leaving = {"metadata": {"name": "d", "deletionTimestamp": "x"}, "status": {"podIP": "10.0.0.4", "ready": "True"}}
    no_ip = {"metadata": {"name": "e"}, "status": {"ready": "True"}}
    assert ready_pods([full, summary, starting, leaving, no_ip]) == [ReadyPod("a", "10.0.0.1"),
                                                                     ReadyPod("b", "10.0.0.2")]


def test_the_reconcile_decides_status_lora_before_its_calls_and_the_next_pass_reads_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # no Hub here: the adapters' configs read as none to check, so they are accepted (without this, read_world
    # asks huggingface.co, which this machine cannot reach: ~24 s of huggingface_hub's retries per adapter)
    monkeypatch.setattr(world_reads, "read_adapter_configs", lambda *a, **k: AdapterReading())
    server = FakeVLLM()
    monkeypatch.setattr(lora_runtime, "VLLMAdapters",
                        lambda base: VLLMAdapters(base, transport=httpx.MockTransport(server)))
    run = Run({**BASE, "vllm": {"version": "0.32.0"},
               "lora": {"adapters": TWO, "maxLoras": 2, "maxLoraRank": 16, "runtimeUpdates": True}})
    run.cluster.pod_list = [{"metadata": {"name": "p-0", "uid": "u-0"}, "status": {
        "podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}}]
    first = run.once()
    # decided before the calls: pending on p-0, not served; the calls made after the apply, a pass asked for soon
    lora = run.status["lora"]
    assert [(a["name"], a.get("pods"), a["pending"]) for a in lora["adapters"]] == [
        ("sql", [], ["p-0"]), ("bot", [], ["p-0"])], lora
    assert server.served == {"sql": "org/sql", "bot": "org/bot"}
    assert first.retry and first.retry_delay == lora_calls.FOLLOW_UP_SECONDS and not first.settled
    assert "LoRAAdapterLoaded" not in run.reasons()
    out = run.once()
    lora = run.status["lora"]
    assert (lora["updates"], [(a["name"], a["pods"]) for a in lora["adapters"]]) == (
        "Runtime", [("sql", ["p-0"]), ("bot", ["p-0"])]), lora
    assert server.served == {"sql": "org/sql", "bot": "org/bot"} and out.settled
    assert "LoRAAdapterLoaded" in run.reasons()
    args = next(o for (kind, _), o in run.cluster.objects.items() if kind == "Deployment")
    assert "--lora-modules" not in args["spec"]["template"]["spec"]["containers"][0]["args"]
