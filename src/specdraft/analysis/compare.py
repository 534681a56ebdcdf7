"""`specdraft compare RUN...`: validation metrics per epoch side by side (the seed's "38% vs
74.7%" table) and training curves aligned by tokens_seen, so runs of other batch sizes or
data sizes line up at equal work.

Runs are read with specdraft.metrics (the one reader of metrics.jsonl).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from specdraft import run_layout
from specdraft.errors import SpecdraftError
from specdraft.io import atomic_path
from specdraft.outputs import ensure_writable_dir
from specdraft.metrics import Run, curve, load_run
from specdraft.train.config import load_yaml
from specdraft.watch import WatchConfig, baseline_without_number, replay

DEFAULT_TABLE_METRICS = ("full_acc_0", "cond_acc_1", "accept_len", "loss_0")
STEP_METRIC = re.compile(r"^(loss|full_acc|cond_acc)_(\d+)$")


def unique_names(runs: list[Run]) -> list[Run]:
    """Two runs named alike (runs/a/x, runs/b/x) get their parent folder prefixed."""
    seen = [r.name for r in runs]
    for r in runs:
        if seen.count(r.name) > 1:
            r.name = f"{r.path.parent.name}/{r.name}"
    return runs


def steps_in(runs: list[Run], family: str) -> list[int]:
    ks = {int(m.group(2)) for r in runs for rec in r.records for key in rec
          if (m := STEP_METRIC.match(key)) and m.group(1) == family}
    return sorted(ks)


def epoch_table(runs: list[Run], metrics: tuple[str, ...] = DEFAULT_TABLE_METRICS) -> tuple[list[str], list[list[str]]]:
    """(header, rows): one row per epoch, one column per (run, metric), '-' where missing. Epochs are
    shown from 1, as the console, the journal and checkpoints/epoch-N count them (metrics.jsonl's
    `epoch` field is the 0-based index: epoch N there is `"epoch": N-1`)."""
    epochs = sorted({e for r in runs for e in r.val_by_epoch()})
    header = ["epoch"] + [f"{r.name} {m}" for r in runs for m in metrics]
    rows = []
    for e in epochs:
        row = [str(e + 1)]
        for r in runs:
            rec = r.val_by_epoch().get(e, {})
            row += [format_value(m, rec.get(m)) for m in metrics]
        rows.append(row)
    return header, rows


def format_value(metric: str, value) -> str:
    if value is None:
        return "-"
    if float(value) != float(value):
        return "NaN"
    if "acc" in metric and metric != "accept_len":
        return f"{100 * float(value):.1f}%"
    return f"{float(value):.3f}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def tokens_label(x: float, _pos=None) -> str:
    """An x tick in words that do not run together: 0, 75k, 1.25M (matplotlib printed 75000100000125000)."""
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


# config.yaml settings that name files or how a run is logged, not how it trains
NOT_SETTINGS = {"out", "store", "vocab", "data", "baseline", "progress", "overwrite", "resume", "report_to",
                "log_every", "val_every", "save_every", "keep_step_checkpoints", "stop_after"}


def settings_notes(runs: list[Run]) -> list[str]:
    """What makes the runs' numbers unlike: τ (accept_len) is over each run's own TTT steps, so runs
    of other --ttt-steps put τ at other K side by side; and the training settings that differ."""
    configs = {r.name: load_yaml(run_layout.config_file(r.path)) if run_layout.config_file(r.path).is_file() else {}
               for r in runs}
    notes = []
    steps = {name: cfg.get("ttt_steps") for name, cfg in configs.items()}
    if len(set(steps.values())) > 1:
        notes.append("τ (accept_len) is over each run's own TTT steps, so these are τ at different K ("
                     + ", ".join(f"{n}: K={k}" for n, k in steps.items())
                     + "); compare at one K: specdraft eval --drafter RUN --store WS/hidden -k K")
    keys = sorted({k for cfg in configs.values() for k in cfg} - NOT_SETTINGS)
    differ = [k for k in keys if len({json.dumps(cfg.get(k), default=str) for cfg in configs.values()}) > 1]
    if len(configs) > 1 and differ:
        notes.append("settings that differ: " + "; ".join(
            f"{k} " + " vs ".join(f"{n}={configs[n].get(k)}" for n in configs) for k in differ))
    return notes


def measured_lines(runs: list[Run]) -> dict[str, str]:
    """Per run that was benched, the measurement its report's headline and verdict read (measured_line)."""
    from specdraft.analysis.measured import measured_line

    return {r.name: line for r in runs if (line := measured_line(r.path)) is not None}


def plot_curves(runs: list[Run], out: str | Path, max_steps: int = 6, smooth: float = 0.9) -> Path | None:
    """curves.png: rows loss_k and cond_acc_k, one column per step k; train (EMA) lines and
    validation markers per run, x = tokens_seen. None when no run has any curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    ks = sorted(set(steps_in(runs, "loss")) | set(steps_in(runs, "cond_acc")))[:max_steps]
    if not ks:
        return None
    fig, axes = plt.subplots(2, len(ks), figsize=(3.2 * len(ks) + 1, 6), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, family in enumerate(("loss", "cond_acc")):
        for col, k in enumerate(ks):
            ax, metric = axes[row][col], f"{family}_{k}"
            for i, r in enumerate(runs):
                c = colors[i % len(colors)]
                x, y = curve(r, "train", metric, smooth)
                if len(x):
                    ax.plot(x, y, color=c, lw=1, alpha=0.8, label=f"{r.name} train")
                x, y = curve(r, "val", metric)
                if len(x):
                    ax.plot(x, y, "o--", color=c, ms=4, label=f"{r.name} val")
            ax.set_title(metric, fontsize=9)
            ax.set_xlabel("tokens seen", fontsize=8)
            ax.xaxis.set_major_locator(MaxNLocator(4))
            ax.xaxis.set_major_formatter(FuncFormatter(tokens_label))
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)

    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=90)
    plt.close(fig)
    return out


def compare(paths: list[str | Path], out: str | Path | None = None,
            metrics: tuple[str, ...] = DEFAULT_TABLE_METRICS, baseline: str | Path | None = None,
            margin: float = 0.05) -> dict:
    """Load the runs, build the table; with `out`, write compare.md and curves.png there; with
    `baseline`, replay the baseline watch over each run and report which ones stay behind."""
    if not paths:
        raise SpecdraftError("compare: pass at least one run folder")
    runs = unique_names([load_run(p) for p in paths])
    header, rows = epoch_table(runs, metrics)
    result = {"runs": [r.name for r in runs], "header": header, "rows": rows, "files": {}, "watch": {},
              "notes": settings_notes(runs), "measured": measured_lines(runs)}
    if baseline is not None:
        base = load_run(baseline)
        config = WatchConfig(margin=margin)
        unusable = baseline_without_number(base, config)   # NaN there: never "not behind", say why
        for r in runs:
            if r.path.resolve() != base.path.resolve():
                if unusable:
                    result["watch"][r.name] = f"no verdict: {unusable}"
                    continue
                verdict, _ = replay(r, base, config)
                result["watch"][r.name] = verdict.message if verdict else "not behind baseline"
    if out is not None:
        out = ensure_writable_dir(out)
        md = out / "compare.md"
        text = f"# Validation per epoch\n\n{markdown_table(header, rows)}"
        text += "".join(f"\n- {note}\n" for note in result["notes"])
        if result["measured"]:
            text += "\n## Measured decoding (the bench the verdict reads)\n\n" + "".join(
                f"- {k}: {v}\n" for k, v in result["measured"].items())
        if result["watch"]:
            text += "\n## Against the baseline\n\n" + "".join(f"- {k}: {v}\n" for k, v in result["watch"].items())
        with atomic_path(md) as tmp:
            tmp.write_text(text)
        result["files"]["markdown"] = str(md)
        png = plot_curves(runs, out / "curves.png")
        if png:
            result["files"]["curves"] = str(png)
    return result


def print_result(result: dict) -> None:
    """Rich table on stdout, then the watch verdicts and the files written."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="validation per epoch")
    for i, col in enumerate(result["header"]):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in result["rows"]:
        table.add_row(*row)
    console = Console(markup=False)   # run names and paths are never markup (a folder run[lr=3e-3])
    console.print(table)
    for note in result.get("notes", []):
        console.print(f"note: {note}", highlight=False, soft_wrap=True)
    for name, text in result.get("measured", {}).items():
        console.print(f"{name}: {text}", highlight=False, soft_wrap=True)
    for name, text in result["watch"].items():
        console.print(f"{name}: {text}", highlight=False)
    for kind, path in result["files"].items():
        console.print(f"{kind}: {path}", highlight=False)
