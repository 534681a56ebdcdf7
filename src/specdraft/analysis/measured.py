"""The measurement a run's verdict reads, for every command that shows it (report, compare, doctor): the natural
bench's τ with its K and prompts and the drafter against plain decoding in specdraft's loop (card.tau_measurements,
card.headline_text), and the export in vLLM against vLLM's plain decoding (RUN/bench_vllm.json)."""

from __future__ import annotations

from pathlib import Path

from specdraft import run_layout
from specdraft.formats import card
from specdraft.schemas.bench_vllm import read_report
from specdraft.schemas.exports import exports_of


def served_row(run: Path) -> tuple[str, str]:
    """The export in vLLM against vLLM's plain decoding (RUN/bench_vllm.json), or why it is unknown."""
    from specdraft.infer import served

    report = read_report(run / run_layout.BENCH_VLLM)
    row = served.drafter_row(report, served_k(run)) if report else None
    if row is None:
        return "unknown", f"no {run_layout.BENCH_VLLM} (specdraft bench --engine vllm --drafter EXPORT --out ...)"
    x1 = row["batches"]["1"].get("x_plain")
    return (f"{x1:.2f}x vLLM's plain decoding" if isinstance(x1, (int, float)) else "unknown"), served.verdict(report)


def served_k(run: Path) -> int | None:
    """The K the run's latest export serves (its export.json), None when not exported."""
    exports = exports_of(run)
    return exports[-1].num_speculative_tokens if exports else None


def measured_line(run: Path) -> str | None:
    """The run's headline τ and speed from its benches, with vLLM's verdict where served; None where the run
    was never benched (validation accuracy alone does not say how fast a drafter decodes)."""
    taus = [t for t in card.tau_measurements(run) if t["source"].startswith("bench")]
    if not taus:
        return None
    served, why = served_row(run)
    return card.headline_text(taus, served_k(run)) + (f"; {why}" if served != "unknown" else "")
