"""The operator's egress policy: every spelling of an address, the allowlist, the checked transport (one lookup,
the checked address connected to, Host and SNI kept), the webhook's refusals and S3 errors that never echo a
body."""

from __future__ import annotations

import ipaddress
from typing import Any

import httpx
import pytest

from llm_autopilot.api.spec import S3Options
from llm_autopilot.controller.admission import review
from llm_autopilot.controller.burn_in_load import run_load
from llm_autopilot.controller.lora_runtime import ReadyPod, call_pod, read_pods
from llm_autopilot.controller.pod_reads import read_vllm_version
from llm_autopilot.controller.settings import OperatorSettings, SettingsError
from llm_autopilot.controller.sources import s3_client
from llm_autopilot.desired import lora_sync
from llm_autopilot.desired.lora_calls import LoRACall, LoRAPodCalls
from llm_autopilot.domain import egress
from llm_autopilot.domain.burn_in import BurnInLoad
from llm_autopilot.domain.egress import Kind
from llm_autopilot.storage.egress_http import CheckedTransport, EgressRefused
from llm_autopilot.storage.s3 import S3Client, S3Error
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION

METADATA = ipaddress.IPv4Address("169.254.169.254")


@pytest.mark.parametrize("host, address", [
    ("169.254.169.254", "169.254.169.254"),
    ("2852039166", "169.254.169.254"),  # decimal
    ("0251.0376.0251.0376", "169.254.169.254"),  # octal
    ("0xa9.0xfe.0xa9.0xfe", "169.254.169.254"),  # hex parts
    ("0xA9FEA9FE", "169.254.169.254"),  # one hex number
    ("169.254.43518", "169.254.169.254"),  # a.b.c, the last part fills two bytes
    ("169.16689662", "169.254.169.254"),  # a.b
    ("169.254.169.254.", "169.254.169.254"),  # trailing dot
    ("127.1", "127.0.0.1"),
    ("0", "0.0.0.0"),
    ("[::ffff:a9fe:a9fe]", "::ffff:a9fe:a9fe"),
    ("::ffff:169.254.169.254", "::ffff:a9fe:a9fe"),
    ("fe80::1%eth0", "fe80::1"),  # zone id
    ("fe80::1%25eth0", "fe80::1"),  # zone id as a URL writes it
    ("FD00:EC2::254", "fd00:ec2::254"),
])
def test_every_spelling_of_an_address_is_that_address(host: str, address: str) -> None:
    assert egress.parse_address(host) == ipaddress.ip_address(address)


@pytest.mark.parametrize("host", ["s3.amazonaws.com", "seaweedfs.storage", "1.2.3.4.5", "256.1.1.1", "08.1.1.1",
                                  "0x.0x.0x.0xg", "", "1..1", "example.com.", "a9fe"])
def test_names_are_not_addresses(host: str) -> None:
    assert egress.parse_address(host) is None


@pytest.mark.parametrize("address, kind", [
    ("169.254.169.254", Kind.LINK_LOCAL),
    ("fd00:ec2::254", Kind.LINK_LOCAL),
    ("fe80::1", Kind.LINK_LOCAL),
    ("::ffff:a9fe:a9fe", Kind.LINK_LOCAL),  # IPv4-mapped
    ("::a9fe:a9fe", Kind.LINK_LOCAL),  # IPv4-compatible
    ("64:ff9b::a9fe:a9fe", Kind.LINK_LOCAL),  # NAT64
    ("64:ff9b::34d8:1a2b", Kind.PUBLIC),  # DNS64's answer for a public store on an IPv6-only cluster
    ("64:ff9b::a00:1", Kind.PRIVATE),
    ("2002:a9fe:a9fe::", Kind.LINK_LOCAL),  # 6to4
    ("127.0.0.1", Kind.LOOPBACK),
    ("127.255.0.9", Kind.LOOPBACK),
    ("::1", Kind.LOOPBACK),
    ("::ffff:127.0.0.1", Kind.LOOPBACK),
    ("0.0.0.0", Kind.UNSPECIFIED),
    ("0.1.2.3", Kind.UNSPECIFIED),
    ("::", Kind.UNSPECIFIED),
    ("224.0.0.1", Kind.MULTICAST),
    ("ff02::1", Kind.MULTICAST),
    ("240.0.0.1", Kind.RESERVED),
    ("255.255.255.255", Kind.RESERVED),
    ("10.0.0.1", Kind.PRIVATE),
    ("172.16.5.4", Kind.PRIVATE),
    ("192.168.1.1", Kind.PRIVATE),
    ("100.64.0.1", Kind.PRIVATE),  # CGNAT, common for cluster ranges
    ("fd12:3456::1", Kind.PRIVATE),
    ("::ffff:10.0.0.1", Kind.PRIVATE),
    ("52.216.1.1", Kind.PUBLIC),
    ("2600:1f18::1", Kind.PUBLIC),
])
def test_classify(address: str, kind: Kind) -> None:
    assert egress.classify(ipaddress.ip_address(address)) is kind


ALLOW = egress.parse_allowlist("10.96.0.0/12, seaweedfs.storage 127.0.0.1 0.0.0.0/0")


@pytest.mark.parametrize("host, address, allowed", [
    ("s3.example.com", "52.216.1.1", True),  # public: no entry needed
    ("10.100.0.5", "10.100.0.5", True),  # in 10.96.0.0/12
    ("seaweedfs.storage", "10.0.0.9", True),  # a named host
    ("other.storage", "192.168.0.9", True),  # 0.0.0.0/0 covers private
    ("127.0.0.1", "127.0.0.1", True),  # loopback named itself
    ("localhost", "127.0.0.2", False),  # 0.0.0.0/0 does not open loopback
    ("seaweedfs.storage", "169.254.169.254", False),  # never, even for an allowed name (rebinding)
    ("x", "0.0.0.0", False),
    ("x", "fd00:ec2::254", False),
    ("x", "::ffff:169.254.169.254", False),
])
def test_the_allowlist_opens_private_addresses_only(host: str, address: str, allowed: bool) -> None:
    assert (egress.refusal(host, ipaddress.ip_address(address), ALLOW) is None) is allowed


def test_without_an_allowlist_private_and_loopback_are_refused_and_the_message_says_what_opens_them() -> None:
    message = egress.refusal("minio.storage", ipaddress.ip_address("10.0.0.9"), egress.Allowlist())
    assert message is not None and "egress.allow" in message and egress.ALLOW_ENV in message
    assert "minio.storage resolves to 10.0.0.9" in message
    assert egress.refusal("127.0.0.1", ipaddress.ip_address("127.0.0.1"), egress.Allowlist()) is not None


@pytest.mark.parametrize("value", ["10.0.0.0/33", "http://x", "a b/c", "300.1.1.1/8"])
def test_a_malformed_allowlist_stops_the_operator_at_start(value: str) -> None:
    with pytest.raises(SettingsError, match=egress.ALLOW_ENV):
        OperatorSettings.from_env({egress.ALLOW_ENV: value})


def test_the_allowlist_setting() -> None:
    settings = OperatorSettings.from_env({egress.ALLOW_ENV: "10.0.0.0/8,minio.storage"})
    assert settings.egress_allow.hosts == ("minio.storage",)
    assert OperatorSettings.from_env({}).egress_allow == egress.Allowlist()


@pytest.mark.parametrize("endpoint, refused", [
    ("http://169.254.169.254", "never connects"),
    ("http://169.254.169.254:80/latest", "never connects"),
    ("http://2852039166", "spelled another way"),
    ("http://0251.0376.0251.0376", "spelled another way"),
    ("http://127.1:8333", "spelled another way"),
    ("http://169.254.169.254.", "spelled another way"),
    ("http://[::ffff:a9fe:a9fe]", "never connects"),
    ("http://[fd00:ec2::254]", "never connects"),
    ("http://[fe80::1%25eth0]", "spelled another way"),
    ("http://0.0.0.0:8333", "never connects"),
    ("http://[::]:8333", "never connects"),
    ("http://224.0.0.1", "never connects"),
    ("http://10.0.0.5:8333", None),  # private: the allowlist decides, where the operator connects
    ("http://127.0.0.1:8333", None),
    ("https://s3.eu-west-1.amazonaws.com", None),
    ("http://seaweedfs.storage:8333", None),
])
def test_the_webhook_refuses_what_it_can_tell(endpoint: str, refused: str | None) -> None:
    if refused is None:
        assert S3Options(endpoint=endpoint).endpoint == endpoint
    else:
        with pytest.raises(ValueError, match=refused):
            S3Options(endpoint=endpoint)


# --- the transport ------------------------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(200, text="ok")


def transport(answers: dict[str, list[str]], allow: str = "") -> tuple[CheckedTransport, Recorder, list[str]]:
    asked: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        asked.append(host)
        return answers[host]

    recorder = Recorder()
    return (CheckedTransport(egress.parse_allowlist(allow), field="spec.model.s3.endpoint", resolver=resolver,
                             inner=httpx.MockTransport(recorder)), recorder, asked)


def test_the_checked_address_is_the_one_connected_to_with_host_and_sni_kept() -> None:
    checked, recorder, asked = transport({"store.example.com": ["52.216.1.1", "52.216.1.2"]})
    with httpx.Client(transport=checked) as client:
        assert client.get("https://store.example.com:8443/bucket/key").status_code == 200
    sent = recorder.requests[0]
    assert asked == ["store.example.com"]  # one lookup
    assert sent.url.host == "52.216.1.1" and sent.url.port == 8443 and sent.url.path == "/bucket/key"
    assert sent.headers["host"] == "store.example.com:8443"
    assert sent.extensions["sni_hostname"] == "store.example.com"


@pytest.mark.parametrize("answers", [["169.254.169.254"], ["52.216.1.1", "127.0.0.1"], ["10.0.0.9"],
                                     ["::ffff:169.254.169.254"], ["fd00:ec2::254"]])
def test_a_name_that_resolves_anywhere_refused_is_not_contacted(answers: list[str]) -> None:
    checked, recorder, _ = transport({"rebind.example.com": answers})
    with httpx.Client(transport=checked) as client, pytest.raises(EgressRefused, match=r"spec\.model\.s3\.endpoint"):
        client.get("http://rebind.example.com/bucket")
    assert recorder.requests == []


@pytest.mark.parametrize("url", ["http://2852039166/", "http://0xa9fea9fe/", "http://[::ffff:a9fe:a9fe]/",
                                 "http://10.0.0.9:8333/"])
def test_literal_addresses_are_checked_without_a_lookup(url: str) -> None:
    checked, recorder, asked = transport({})
    with httpx.Client(transport=checked) as client, pytest.raises(EgressRefused):
        client.get(url)
    assert asked == [] and recorder.requests == []


def test_an_allowed_private_store_is_reached() -> None:
    checked, recorder, _ = transport({"seaweedfs.storage": ["10.0.0.9"]}, allow="10.0.0.0/8")
    with httpx.Client(transport=checked) as client:
        assert client.get("http://seaweedfs.storage:8333/b").status_code == 200
    assert recorder.requests[0].url.host == "10.0.0.9"
    assert recorder.requests[0].headers["host"] == "seaweedfs.storage:8333"


def test_a_refused_s3_endpoint_becomes_a_message_naming_the_field_and_the_allowlist() -> None:
    checked, _, _ = transport({"minio.storage": ["10.0.0.9"]})
    s3 = S3Client("http://minio.storage:9000", "us-east-1", transport=checked, field="spec.lora.s3")
    with pytest.raises(S3Error) as raised:
        s3.head("bucket", "config.json")
    assert "spec.model.s3.endpoint" in str(raised.value) and "egress.allow" in str(raised.value)


@pytest.mark.parametrize("status, body", [
    (500, "<Error><Code>ami-id\ni-0abc secret</Code></Error>"),
    (503, "root:x:0:0:root:/root:/bin/bash"),
    (418, "<Error><Code>" + "A" * 500 + "</Code></Error>"),
])
def test_s3_errors_never_echo_the_body(status: int, body: str) -> None:
    s3 = S3Client("http://s3.example.com", "us-east-1",
                  transport=httpx.MockTransport(lambda _: httpx.Response(status, text=body)))
    with pytest.raises(S3Error) as raised:
        s3.get("bucket", "config.json")
    assert "secret" not in str(raised.value) and "root" not in str(raised.value)
    assert "AAAA" not in str(raised.value) and str(status) in str(raised.value)


def test_a_protocol_error_does_not_quote_what_the_endpoint_sent() -> None:
    def banner(_: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("illegal status line: bytearray(b'SSH-2.0-OpenSSH_9.6 secret-banner')")

    s3 = S3Client("http://s3.example.com", "us-east-1", transport=httpx.MockTransport(banner))
    with pytest.raises(S3Error) as raised:
        s3.get("bucket", "config.json")
    assert "RemoteProtocolError" in str(raised.value) and "secret-banner" not in str(raised.value)


def test_a_listing_that_is_not_xml_is_an_s3_error() -> None:
    s3 = S3Client("http://s3.example.com", "us-east-1",
                  transport=httpx.MockTransport(lambda _: httpx.Response(200, text="not xml")))
    with pytest.raises(S3Error, match="not S3's XML"):
        s3.list("bucket", "prefix")


# --- pod addresses: in-cluster by design, never loopback or metadata ---------------------------------------

@pytest.mark.parametrize("address, refused", [("10.244.1.7", False), ("fd00:10:244::7", False),
                                              ("100.64.3.2", False), ("127.0.0.1", True), ("169.254.169.254", True),
                                              ("fd00:ec2::254", True), ("::ffff:127.0.0.1", True),
                                              ("2852039166", True), ("vllm.example.com", True), ("0.0.0.0", True),
                                              ("240.10.0.5", False)])  # GKE's Class E pod ranges
def test_pod_addresses(address: str, refused: bool) -> None:
    assert (egress.pod_address_problem(address) is not None) is refused


def test_pods_at_a_refused_address_are_not_contacted() -> None:
    contacted: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        contacted.append(request)
        return httpx.Response(200, json={"version": "0.33.0"})

    assert read_vllm_version("169.254.169.254", transport=httpx.MockTransport(handler)) is None
    load = BurnInLoad(model="m", requests=2, max_tokens=4, prompt_tokens=4, timeout_seconds=5, port=8000)
    measured = run_load("127.0.0.1", load, transport=httpx.MockTransport(handler))
    assert measured.completed == 0 and "loopback" in measured.first_error
    views = read_pods([ReadyPod("p-0", "169.254.169.254")], {}, client=lambda _: pytest.fail("contacted"))
    assert views[0].unreadable and "link-local" in views[0].unreadable
    calls = LoRAPodCalls("p-0", "u-0", "169.254.169.254",
                         (LoRACall(lora_sync.Action("load", "a", "org/a"), "org/a"),))
    assert call_pod(calls, client=lambda _: pytest.fail("contacted")) == []
    assert contacted == []


# --- the webhook, with the allowlist the operator runs with ---------------------------------------------------

def s3_spec(endpoint: str, *, lora: bool = False) -> dict[str, Any]:
    s3 = {"endpoint": endpoint}
    if lora:
        return {"model": {"name": "Qwen/Qwen3-8B", "cache": {"enabled": True}}, "gpu": {"product": "nvidia-l4"},
                "lora": {"adapters": [{"name": "a", "source": "s3://adapters/a"}], "s3": s3}}
    return {"model": {"name": "Qwen/Qwen3-8B", "source": "s3://models/qwen3-8b", "s3": s3,
                      "cache": {"enabled": True}}, "gpu": {"product": "nvidia-l4"}}


@pytest.mark.parametrize("endpoint, allow, allowed", [
    ("http://10.0.0.5:8333", "", False),
    ("http://10.0.0.5:8333", "10.0.0.0/8", True),
    ("http://127.0.0.1:8333", "", False),
    ("http://127.0.0.1:8333", "10.0.0.0/8", False),
    ("http://127.0.0.1:8333", "127.0.0.1", True),
    ("http://[fd12::5]:8333", "", False),
    ("http://seaweedfs.storage:8333", "", True),  # a name: judged where the operator connects
    ("https://52.216.1.1", "", True),
])
@pytest.mark.parametrize("lora", [False, True], ids=["model", "lora"])
def test_the_webhook_judges_a_literal_address_with_the_operators_allowlist(
        monkeypatch: pytest.MonkeyPatch, endpoint: str, allow: str, allowed: bool, lora: bool) -> None:
    monkeypatch.setenv(egress.ALLOW_ENV, allow)
    verdict = review(s3_spec(endpoint, lora=lora), str(DEFAULT_VLLM_VERSION))
    assert verdict.allowed is allowed, verdict.message
    if not allowed:
        assert ("spec.lora.s3.endpoint" if lora else "spec.model.s3.endpoint") in verdict.message
        assert "egress.allow" in verdict.message


@pytest.mark.parametrize("variable", ["HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy"])
def test_the_s3_client_does_not_use_a_proxy_from_the_environment(
        monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    """A proxy would connect to an address the egress check never judged: the operator's S3 client ignores
    HTTPS_PROXY and its kin (docs/security.md). The spec's endpoint is reached through the checked transport."""
    monkeypatch.setenv(variable, "http://proxy.example.com:3128")
    client = s3_client(S3Options(endpoint="https://store.example.com"), lambda *_: "", timeout=1.0)
    with client:
        assert not client._http._mounts, f"{variable} mounted a proxy transport"
        assert isinstance(client._http._transport, CheckedTransport)
