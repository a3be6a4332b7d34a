"""The spellings vLLM's parser accepts for a flag (vllm/flags.py), and the flags the operator owns
(api/serve_flags.py's one table)."""

from __future__ import annotations

import pytest

from llm_autopilot.api.serve_flags import OWNED_FLAGS, owned_options
from llm_autopilot.render.vllm_args import conflicting_extra_args, unknown_flags
from llm_autopilot.vllm.flags import alias_groups, examined_versions, known_flags, named_options, normalise_flag
from llm_autopilot.vllm.versions import VLLMVersion

OPERATOR_OWNED_FLAGS = frozenset(OWNED_FLAGS)
#: the releases the owned list is complete for
OWNED_RANGE = [v for v in examined_versions() if VLLMVersion(0, 31, 0) <= v <= VLLMVersion(0, 33, 0)]


@pytest.mark.parametrize(("arg", "name"), [
    ("--max-model-len", "--max-model-len"),
    ("--max_model_len=4096", "--max-model-len"),
    ("--compilation-config.mode=3", "--compilation-config"),
    ("--compilation_config.cudagraph_capture_sizes+=8,16", "--compilation-config"),
    ("-cc.cudagraph_mode=FULL", "-cc"),
    ("-O3", "-O"), ("-O=3", "-O"), ("-Odecode", "-O"), ("-O", "-O"),
    ("-tp=2", "-tp"),
])
def test_normalise_flag_spells_an_option_as_vllms_parser_matches_it(arg: str, name: str) -> None:
    assert normalise_flag(arg) == name


def test_owned_flags_are_matched_in_every_spelling_vllm_accepts() -> None:
    extra = ["--max_model_len=4096", "--compilation-config.mode=3", "-O3", "-cc.cudagraph_mode=FULL",
             "--device-memory-utilization", "0.5", "--no-enforce-eager", "--kv_offloading_size", "4",
             "--data-parallel-size=2", "--dtype", "half", "--max-num-scheduled-tokens", "512",
             "--optimization-level", "0", "--cudagraph-capture-sizes", "[1, 2]", "--kv-cache-memory-bytes=1G",
             "--enable-prefix-caching", "--seed", "-1"]
    assert conflicting_extra_args(extra) == sorted([
        "--max_model_len", "--compilation-config.mode", "-O3", "-cc.cudagraph_mode", "--device-memory-utilization",
        "--no-enforce-eager", "--data-parallel-size", "--dtype",
        "--max-num-scheduled-tokens", "--optimization-level", "--cudagraph-capture-sizes",
        "--kv-cache-memory-bytes"])


def test_the_issues_name_these_owned_flags() -> None:
    named = ["--device-memory-utilization", "--max-num-scheduled-tokens", "-O", "--optimization-level",
             "--compilation-config", "--cudagraph-capture-sizes", "--kv-cache-memory-bytes",
             "--data-parallel-size", "--dtype",
             # issue 15: the multi-node flags the renderer sets, and what runs behind the plan
             "--nnodes", "--node-rank", "--headless", "--master-addr", "--master-port", "--kv-cache-dtype",
             "--config"]
    assert [f for f in named if not owned_options(f)] == []


def test_the_kv_offloading_size_is_not_owned_the_status_counts_it() -> None:
    # a host-memory extension of the prefix cache: the renderer adds it to the pod's memory (hostMemoryGiB)
    assert owned_options("--kv-offloading-size") == []


@pytest.mark.parametrize(("arg", "owned"), [
    ("--max-model", ["--max-model-len"]),  # argparse's allow_abbrev: an unambiguous prefix
    ("--max-model=1", ["--max-model-len"]),
    ("--max_model=1", ["--max-model-len"]),
    ("--tensor-parallel", ["--tensor-parallel-size"]),
    ("--kv-cache-dt=fp8", ["--kv-cache-dtype"]),
    ("--nnode", ["--nnodes"]),
    ("--headl", ["--headless"]),
    ("-n4", ["-n"]), ("-r1", ["-r"]), ("-qfp8", ["-q"]),  # a one-letter option with its value attached
    ("-t", ["-tp"]),  # a prefix of a single-dash option
    ("-tp=99", ["-tp"]),
    ("-O0", ["-O"]), ("-O3", ["-O"]), ("-cc.mode=0", ["-cc"]),
    ("--max-num", ["--max-num-batched-tokens", "--max-num-scheduled-tokens", "--max-num-seqs"]),  # ambiguous
])
def test_abbreviations_and_attached_values_name_the_owned_option(arg: str, owned: list[str]) -> None:
    assert owned_options(arg) == owned


def test_a_full_name_is_not_an_abbreviation_of_a_longer_one() -> None:
    # argparse takes an exact option before any prefix: --kv-cache-dtype is not --kv-cache-dtype-skip-layers
    assert named_options("--kv-cache-dtype") == {"--kv-cache-dtype"}
    assert owned_options("--enable-prefix-caching") == [] and owned_options("--seed") == []
    assert owned_options("--max-num-partial-prefills") == [] and owned_options("-1") == []


@pytest.mark.parametrize("version", OWNED_RANGE, ids=str)
def test_every_spelling_of_an_owned_option_is_owned(version: VLLMVersion) -> None:
    """An alias or negation left out would let extraArgs set a planned value unnoticed (``-dp 2``)."""
    missing = sorted(f for group in alias_groups(version) if group & OPERATOR_OWNED_FLAGS
                     for f in group - OPERATOR_OWNED_FLAGS)
    assert missing == []


#: owned spellings that only older releases have: --cuda-graph-sizes N, the CUDA-graph capture cap before 0.13
#: (the renderer writes it for 0.10.2, where --max-cudagraph-capture-size does not exist)
OWNED_BEFORE_0_31 = frozenset({"--cuda-graph-sizes"})


def test_every_owned_spelling_is_a_flag_of_0_31_to_0_33() -> None:
    known = set().union(*(known_flags(v) for v in OWNED_RANGE))
    assert sorted(OPERATOR_OWNED_FLAGS - known) == sorted(OWNED_BEFORE_0_31)
    older = set().union(*(known_flags(v) for v in examined_versions() if v < OWNED_RANGE[0]))
    assert older >= OWNED_BEFORE_0_31


def test_unknown_flags_accept_vllms_spellings_and_refuse_abbreviations() -> None:
    assert unknown_flags(["--max_num_seqs", "8", "--compilation-config.mode=3", "-O3", "-cc.mode=3"], "0.33.0") == []
    # argparse would take an unambiguous prefix; the operator asks for the full name
    assert unknown_flags(["--max-model", "8192"], "0.33.0") == ["--max-model"]
    assert unknown_flags(["--swap_space", "4"], "0.33.0") == ["--swap_space"]
