"""How close the memory model comes to each golden case (prints a Markdown table; `make golden`), and the KV-cache
error per vLLM release with the releases that have no golden log (`make bench-accuracy`)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tests.golden import TOLERANCES, compare, load_cases

SHORT = {"weights_gib": "weights", "activation_peak_gib": "activation", "non_torch_gib": "non-torch",
         "cuda_graph_estimated_gib": "graphs", "kv_cache_gib": "KV GiB", "kv_cache_tokens": "KV tokens",
         "max_concurrency": "concurrency"}
#: the releases the accuracy is asked for (issue #30): 0.11 to 0.33, one line each
RELEASES = tuple(f"0.{minor}" for minor in range(11, 34))
UNRECORDED = "not recorded"


@dataclass(frozen=True)
class ReleaseError:
    release: str
    cases: int
    mean_abs_percent: float
    max_abs_percent: float


def release_of(version: str | None) -> str:
    """A log's release as major.minor (its patch level does not change the memory model), or UNRECORDED."""
    if not version:
        return UNRECORDED
    return ".".join(version.split(".")[:2])


def per_release(errors: Iterable[tuple[str | None, float]]) -> list[ReleaseError]:
    """(the log's vLLM version, its KV-cache error in percent) -> one row per release, oldest first, the logs
    whose release was not recorded last."""
    grouped: dict[str, list[float]] = {}
    for version, error in errors:
        grouped.setdefault(release_of(version), []).append(abs(error))

    def order(release: str) -> tuple[int, ...]:
        return (1_000_000,) if release == UNRECORDED else tuple(int(p) for p in release.split("."))

    return [ReleaseError(r, len(e), sum(e) / len(e), max(e)) for r, e in sorted(grouped.items(),
                                                                                  key=lambda kv: order(kv[0]))]


def without_logs(rows: Iterable[ReleaseError], releases: Iterable[str] = RELEASES) -> list[str]:
    seen = {row.release for row in rows}
    return [r for r in releases if r not in seen]


def kv_errors(versions: Mapping[str, str | None]) -> list[tuple[str | None, float]]:
    """Each replayable case's KV-cache error (percent of vLLM's figure), with its log's vLLM version."""
    found = []
    for case in load_cases()[0]:
        compared = compare(case)
        if "kv_cache_gib" in compared:
            printed, ours = compared["kv_cache_gib"]
            found.append((versions.get(case.id), (ours - printed) / printed * 100 if printed else 0.0))
    return found


def table() -> None:
    cases, _ = load_cases()
    print("| case | " + " | ".join(SHORT[f] for f in TOLERANCES) + " |")
    print("|---|" + "---|" * len(TOLERANCES))
    worst_kv = 0.0
    for case in cases:
        compared = compare(case)
        cells = []
        for field in TOLERANCES:
            if field not in compared:
                cells.append("")
                continue
            printed, ours = compared[field]
            error = (ours - printed) / printed * 100 if printed else 0.0
            if field == "kv_cache_gib":
                worst_kv = max(worst_kv, abs(error))
            value = f"{printed:,.0f}" if field == "kv_cache_tokens" else f"{printed:g}"
            cells.append(f"{value} ({error:+.1f}%)")
        print(f"| [{case.id}]({case.source_url}) | " + " | ".join(cells) + " |")
    print(f"\n{len(cases)} cases; largest KV-cache error {worst_kv:.1f}%")


def releases() -> None:
    _, raw = load_cases()
    rows = per_release(kv_errors({c["id"]: c.get("vllm_version") for c in raw}))
    print("| vLLM release | golden GPU logs | mean abs KV-cache error | largest |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row.release} | {row.cases} | {row.mean_abs_percent:.2f}% | {row.max_abs_percent:.2f}% |")
    missing = without_logs(rows)
    print(f"\nReleases {RELEASES[0]} to {RELEASES[-1]} with no golden GPU log: {', '.join(missing) or 'none'}")


if __name__ == "__main__":
    releases() if sys.argv[1:] == ["releases"] else table()
