"""hack/vllm_flags.py, the static extractor behind vllm/data/flags.json, on small source trees shaped like
vLLM's (the drift test in tests/vllm/ runs it on a real one), and the shape of the table it writes."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from hack import vllm_flags

from llm_autopilot.vllm.flags import alias_groups, known_flags

_SERVE = """
    from vllm.entrypoints.cli.types import CLISubcommand
    from vllm.entrypoints.openai.cli_args import make_arg_parser

    class ServeSubcommand(CLISubcommand):
        def subparser_init(self, subparsers):
            serve_parser = subparsers.add_parser("serve")
            serve_parser = make_arg_parser(serve_parser)
            return serve_parser
"""
_CLI_ARGS = """
    from dataclasses import dataclass
    from vllm.engine.arg_utils import AsyncEngineArgs, get_kwargs

    @dataclass
    class BaseFrontendArgs:
        enable_auto_tool_choice: bool = False
        chat_template: str | None = None

        @classmethod
        def _customize_cli_kwargs(cls, frontend_kwargs):
            frontend_kwargs["chat_template"]["flags"] = ["-ct"]
            return frontend_kwargs

        @classmethod
        def add_cli_args(cls, parser):
            frontend_kwargs = get_kwargs(cls)
            frontend_kwargs = cls._customize_cli_kwargs(frontend_kwargs)
            group = parser.add_argument_group(title="Frontend")
            for key, value in frontend_kwargs.items():
                extra_flags = value.pop("flags", [])
                group.add_argument(*extra_flags, f"--{key.replace('_', '-')}", **value)
            return parser

    @dataclass
    class FrontendArgs(BaseFrontendArgs):
        port: int = 8000
        headless_probe: bool = False

        @classmethod
        def _customize_cli_kwargs(cls, frontend_kwargs):
            frontend_kwargs = super()._customize_cli_kwargs(frontend_kwargs)
            frontend_kwargs["headless_probe"]["action"] = "store_true"
            return frontend_kwargs

    def make_arg_parser(parser):
        parser.add_argument("model_tag", nargs="?")
        parser.add_argument("--api-server-count", "-asc", type=int)
        parser = FrontendArgs.add_cli_args(parser)
        parser = AsyncEngineArgs.add_cli_args(parser)
        return parser
"""
_CACHE = """
    from typing import TYPE_CHECKING, Literal

    CacheDType = Literal["auto", "fp8", "fp8_e5m2"]

    if TYPE_CHECKING:
        from vllm.model_executor.layers.quantization import QuantizationMethods
    else:
        QuantizationMethods = str

    class CacheConfig:
        cache_dtype: CacheDType = "auto"
        enable_prefix_caching: bool = True
        mode: bool | str | None = None

    class ModelConfig:
        quantization: QuantizationMethods | str | None = None
        enforce_eager: bool = False
"""
_QUANT = """
    from typing import Literal
    QuantizationMethods = Literal["awq", "fp8"]
"""
_ARG_UTILS = """
    import argparse
    from vllm.config.cache import CacheConfig, ModelConfig

    def get_kwargs(cls):
        if type_hints == {bool, str, type(None)}:
            pass

    class EngineArgs:
        @staticmethod
        def add_cli_args(parser):
            model_kwargs = get_kwargs(ModelConfig)
            model_group = parser.add_argument_group(title="ModelConfig")
            model_group.add_argument("--quantization", "-q", **model_kwargs["quantization"])
            model_group.add_argument("--enforce-eager", **model_kwargs["enforce_eager"])
            cache_kwargs = get_kwargs(CacheConfig)
            cache_group = parser.add_argument_group(title="CacheConfig")
            cache_group.add_argument("--kv-cache-dtype", **cache_kwargs["cache_dtype"])
            cache_group.add_argument("--enable-prefix-caching",
                                     **{**cache_kwargs["enable_prefix_caching"], "default": None})
            cache_group.add_argument("--mode", **cache_kwargs["mode"])
            if envs.SOMETHING:
                parser.add_argument("--only-sometimes", action=argparse.BooleanOptionalAction)
            return parser

    class AsyncEngineArgs(EngineArgs):
        @staticmethod
        def add_cli_args(parser, async_args_only=False):
            parser = EngineArgs.add_cli_args(parser)
            parser.add_argument("--enable-log-requests", action="store_true")
            return parser
"""
_ARGPARSE = """
    from argparse import ArgumentParser, BooleanOptionalAction

    class EnableDisableAction(BooleanOptionalAction):
        pass

    class FlexibleArgumentParser(ArgumentParser):
        def __init__(self):
            self.register("action", BooleanOptionalAction, EnableDisableAction)

        def parse_args(self, args):
            for arg in args:
                if arg.startswith("-O"):
                    pass
"""


def _tree(root: Path, *, enable_disable: bool) -> Path:
    files = {"vllm/__init__.py": "", "vllm/_version.py": "__version__ = '9.9.9'",
             "vllm/entrypoints/cli/serve.py": _SERVE, "vllm/entrypoints/cli/types.py": "class CLISubcommand: pass",
             "vllm/entrypoints/openai/cli_args.py": _CLI_ARGS, "vllm/engine/arg_utils.py": _ARG_UTILS,
             "vllm/config/cache.py": _CACHE, "vllm/model_executor/layers/quantization/__init__.py": _QUANT,
             "vllm/utils/argparse_utils.py": _ARGPARSE if enable_disable else
             _ARGPARSE.replace('self.register("action", BooleanOptionalAction, EnableDisableAction)', "pass")}
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def test_the_extractor_follows_the_parser_through_the_source(tmp_path: Path) -> None:
    entry = vllm_flags.extract(vllm_flags.SourceTree(_tree(tmp_path, enable_disable=False)))
    assert entry["flags"] == sorted([
        "--api-server-count", "-asc", "--enable-auto-tool-choice", "--no-enable-auto-tool-choice",
        "--chat-template", "-ct", "--port", "--headless-probe", "--quantization", "-q", "--enforce-eager",
        "--no-enforce-eager", "--kv-cache-dtype", "--enable-prefix-caching", "--no-enable-prefix-caching",
        "--mode", "--only-sometimes", "--no-only-sometimes", "--enable-log-requests", "-O"])
    assert "--headless-probe" in entry["no_value_flags"] and "--mode" not in entry["no_value_flags"]
    assert ["--quantization", "-q"] in entry["aliases"] and ["-ct", "--chat-template"] not in entry["aliases"]
    assert ["--chat-template", "-ct"] in entry["aliases"]
    assert entry["kv_cache_dtype_choices"] == ["auto", "fp8", "fp8_e5m2"]
    assert entry["kv_cache_dtype_enforced_by_argparse"] is True
    # the Literal a type checker sees; at run time the field is a str, so argparse does not enforce it
    assert entry["quantization_choices"] == ["awq", "fp8"]
    assert entry["quantization_enforced_by_argparse"] is False


def test_the_extractor_pairs_enable_and_disable_where_the_parser_does(tmp_path: Path) -> None:
    entry = vllm_flags.extract(vllm_flags.SourceTree(_tree(tmp_path, enable_disable=True)))
    assert {"--disable-prefix-caching", "--disable-auto-tool-choice", "--disable-log-requests"} & set(
        entry["flags"]) == {"--disable-prefix-caching", "--disable-auto-tool-choice"}


def test_the_extractor_refuses_a_tree_without_vllm_serve(tmp_path: Path) -> None:
    (tmp_path / "vllm").mkdir()
    with pytest.raises(vllm_flags.ExtractionError, match=r"has no vllm\.entrypoints\.cli\.serve"):
        vllm_flags.extract(vllm_flags.SourceTree(tmp_path))


def test_the_checked_in_table_is_what_the_extractor_writes() -> None:
    """Shape of the regenerated table (the drift test compares its content with a real vLLM)."""
    table = json.loads(vllm_flags.TABLE.read_text("utf-8"))
    assert table["source"] == vllm_flags.SOURCE_NOTE
    assert list(table["versions"]) == sorted(table["versions"], key=vllm_flags._version_key)
    for entry in table["versions"].values():
        assert set(entry) == {"flags", "no_value_flags", "aliases", "kv_cache_dtype_choices",
                              "kv_cache_dtype_enforced_by_argparse", "quantization_choices",
                              "quantization_enforced_by_argparse"}
        assert set(entry["no_value_flags"]) <= set(entry["flags"])


def test_the_table_records_alias_groups() -> None:
    groups = alias_groups("0.33.0")
    assert frozenset({"--tensor-parallel-size", "-tp"}) in groups
    assert frozenset({"--gpu-memory-utilization", "--device-memory-utilization"}) in groups
    assert frozenset({"--enforce-eager", "--no-enforce-eager"}) in groups
    assert "-O" in known_flags("0.12.0") and "--optimization-level" not in known_flags("0.11.2")
