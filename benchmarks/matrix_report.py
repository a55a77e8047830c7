"""The benchmark matrix's printout (``matrix.py``): its table, then the issue's targets as
verdicts."""

from __future__ import annotations

import statistics
from typing import Any

from matrix_cells import BASELINE, CROSS_SOURCES, EARLY, HELD, STREAMING


def paired(slower: dict[str, Any], faster: dict[str, Any]) -> float:
    """The median over repeats of ``slower``'s step time over ``faster``'s in the same repeat."""
    pairs = zip(slower["repeat_step_times_s"], faster["repeat_step_times_s"], strict=True)
    return statistics.median(a / b for a, b in pairs)


def print_matrix(result: dict[str, Any]) -> None:
    header = (
        f"{'workload':<13}{'mode':<21}{'step':>8}{'T_sync/T':>9}{'T*/T':>7}{'strict':>7}"
        f"{'learner':>8}{'engine':>7}{'accum':>7}{'sim':>8}{'err':>7}{'x-sync':>8}{'x-strm':>8}"
    )
    print(header)
    print(
        f"{'':<34}{'(s)':>8}{'':>9}{'':>7}{'':>7}{'idle':>8}{'idle':>7}{'(×θ)':>7}{'(s)':>8}"
        f"{'':>7}{'err':>8}{'err':>8}"
    )
    for name, row in result["workloads"].items():
        for mode, c in row["modes"].items():
            eff = f"{c['efficiency']:.3f}" if "efficiency" in c else "-"
            strict = f"{c['efficiency_strict']:.3f}" if "efficiency_strict" in c else "-"
            sim = c["simulated"]
            print(
                f"{name:<13}{mode:<21}{c['step_time_s']:>8.3f}{c['speedup_vs_sync']:>9.2f}"
                f"{eff:>7}{strict:>7}{c['learner_idle']:>8.0%}{c['engine_idle']:>7.0%}"
                f"{c['peak_accumulators']:>7.1f}{sim['predicted_step_time_s']:>8.3f}"
                f"{sim['error']:>+7.0%}{cross_error(c, BASELINE):>8}{cross_error(c, STREAMING):>8}"
            )
        per_token, per_item = row.get("strict_cost_per_token_s"), row["strict_cost_per_item_s"]
        charge = f"{per_item * 1000:.1f} ms per item"
        charge = f"{per_token * 1e6:.1f} us per token" if per_token is not None else charge
        print(
            f"{'':<13}makespan / L_sync {row['makespan_over_learner']:.2f}; strict bound "
            f"charges {charge}"
        )
        if result.get("repeats", 1) > 1:
            ratios = "; ".join(
                f"{mode} " + ", ".join(f"{x:.2f}" for x in c["repeat_speedups"])
                for mode, c in row["modes"].items()
                if mode != BASELINE
            )
            print(f"{'':<13}T_sync/T per repeat: {ratios}")
    if "budget" in result:
        b = result["budget"]
        print(
            f"budget: streaming under --buffer-budget-bytes {b['budget_bytes']}: peak "
            f"{b['peak_buffer_bytes']} bytes ({b['peak_accumulators']:.1f} copies), step "
            f"{b['step_time_s']:.3f} s"
        )
    print_verdicts(result)


def cross_error(c: dict[str, Any], source: str) -> str:
    predicted = c.get("cross", {}).get(source)
    return f"{predicted['error']:+.0%}" if isinstance(predicted, dict) else "-"


def print_verdicts(result: dict[str, Any]) -> None:
    """The issue's targets (issue 17), each with the measured value."""
    rows = result["workloads"]
    lines = []

    def best_streaming(row: dict[str, Any]) -> dict[str, Any]:
        candidates = [row["modes"][m] for m in (STREAMING, EARLY) if m in row["modes"]]
        return max(candidates, key=lambda c: c["speedup_vs_sync"])

    if "balanced" in rows:
        best, ceiling = best_streaming(rows["balanced"]), ""
        if "strict_bound_s" in best:  # what any exact schedule could reach on these batches
            limit = rows["balanced"]["modes"][BASELINE]["step_time_s"] / best["strict_bound_s"]
            ceiling = f"; the strict bound allows {limit:.2f}"
        lines.append(
            f"balanced T_sync/T_streaming {best['speedup_vs_sync']:.2f} (target >= 1.9{ceiling})"
        )
    for name, row in rows.items():
        for mode in (STREAMING, EARLY, HELD):
            c = row["modes"].get(mode)
            if c and "efficiency" in c:
                lines.append(
                    f"{name} {mode} T*/T {c['efficiency']:.3f} (>= 0.97), strict "
                    f"{c.get('efficiency_strict', float('nan')):.3f} (>= 0.9)"
                )
    if "long-grading" in rows:
        modes = rows["long-grading"]["modes"]
        if STREAMING in modes and EARLY in modes:
            gain = paired(modes[STREAMING], modes[EARLY])
            lines.append(f"long-grading early start {gain:.2f}x reward-triggered (>= 1.2)")
        if STREAMING in modes and HELD in modes:
            c = modes[HELD]
            gain = paired(modes[STREAMING], c)
            lines.append(
                f"long-grading early start holding every piece {gain:.2f}x reward-triggered, "
                f"at {c['peak_accumulators']:.1f} copies"
            )
    if "no-overlap" in rows:
        modes = rows["no-overlap"]["modes"]
        ratio = paired(best_streaming(rows["no-overlap"]), modes[BASELINE])
        lines.append(f"no-overlap T_streaming/T_sync {ratio:.3f} (<= 1.05)")
    for name, row in rows.items():
        for mode, c in row["modes"].items():
            if c.get("buffer_budget_bytes"):  # a set budget is the bound
                over = c["peak_buffer_bytes"] > c["buffer_budget_bytes"]
                lines.append(f"{name} {mode} budget held: {not over}")
            elif c["peak_accumulators"] > c["open_groups_bound"]:
                lines.append(
                    f"{name} {mode} accumulators {c['peak_accumulators']:.1f} copies "
                    f"(bound {c['open_groups_bound']})"
                )
    if "budget" in result:
        b = result["budget"]
        held = b["peak_buffer_bytes"] <= b["budget_bytes"]
        lines.append(f"budget held: {held}")
    errors = [abs(c["simulated"]["error"]) for row in rows.values() for c in row["modes"].values()]
    if errors:
        lines.append(f"simulator worst error {max(errors):.1%} (target <= 10%)")
    for source in CROSS_SOURCES:
        crossed = [
            abs(p["error"])
            for row in rows.values()
            for c in row["modes"].values()
            if isinstance(p := c.get("cross", {}).get(source), dict)
        ]
        if crossed:
            lines.append(
                f"predicted from the {source} run: worst error {max(crossed):.1%} over "
                f"{len(crossed)} cells (target <= 10%)"
            )
    for line in lines:
        print(f"matrix: {line}")
