"""How close the memory model comes to each golden case (prints a Markdown table; `make golden`)."""

from __future__ import annotations

from tests.golden import TOLERANCES, compare, load_cases

SHORT = {"weights_gib": "weights", "activation_peak_gib": "activation", "non_torch_gib": "non-torch",
         "cuda_graph_estimated_gib": "graphs", "kv_cache_gib": "KV GiB", "kv_cache_tokens": "KV tokens",
         "max_concurrency": "concurrency"}


def main() -> None:
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


if __name__ == "__main__":
    main()
