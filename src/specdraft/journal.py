"""The decision journal: RUN/journal.md, timestamped markdown entries beside the run.

Why: the seed's lessons ("252/32000 positional matches", "plateau at 38% vs 74.7%") were
decided in chat and lost; a journal keeps hypotheses, results and decisions next to the numbers.
People add entries with `specdraft journal add`; stages (probe, baseline watch, plan) call
`record()` for automatic ones. Append-only: earlier entries are never rewritten; each append
writes old + new to a temp file and renames it over (atomic), under a lock file so two writers
do not lose each other's entries (filelock).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock

from specdraft import run_layout
from specdraft.errors import SpecdraftError
from specdraft.io import atomic_path, read_text

KINDS = ("hypothesis", "result", "decision", "warning", "probe")
HEADER = re.compile(r"^## (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC) · (\w+)(?: · (.+))?$")


@dataclass
class Entry:
    time: str        # "2025-11-29 15:40:12 UTC"
    kind: str        # one of KINDS
    text: str
    source: str = ""  # "" for people, else the stage that wrote it ("probe", "watch", ...)

    def markdown(self) -> str:
        head = f"## {self.time} · {self.kind}" + (f" · {self.source}" if self.source else "")
        # a text line that looks like an entry header would split the entry when read back
        body = "\n".join("\\" + ln if ln.startswith("## ") else ln for ln in self.text.strip().splitlines())
        return f"{head}\n\n{body}\n\n"


def journal_path(run: str | Path) -> Path:
    return Path(run) / run_layout.JOURNAL


LOCK = ".journal.lock"   # held while an entry is appended (filelock)


def add(run: str | Path, kind: str, text: str, source: str = "", now: datetime | None = None) -> Entry:
    """Append one entry to RUN/journal.md (created with a title on first use)."""
    run = Path(run)
    if kind not in KINDS:
        raise SpecdraftError(f"--kind {kind}: unknown; use one of {', '.join(KINDS)}")
    if not text.strip():
        raise SpecdraftError("journal entry: empty text; say what was hypothesised, found or decided")
    if run.exists() and not run.is_dir():
        raise SpecdraftError(f"{run}: not a run folder (a file exists there)")
    if not run.exists():
        if not run.parent.is_dir():
            raise SpecdraftError(f"{run}: neither the run folder nor its parent {run.parent} exists; "
                                 "check the path")
        run.mkdir()
    stamp = (now or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    entry = Entry(stamp, kind, text, source)
    path = journal_path(run)
    with FileLock(run / LOCK):
        old = path.read_text() if path.exists() else f"# Journal: {run.resolve().name}\n\n"
        with atomic_path(path) as tmp:
            tmp.write_text(old + entry.markdown())
    return entry


def record(run: str | Path | None, kind: str, text: str, source: str) -> Entry | None:
    """Automatic entry from a stage; a no-op when the stage was not given a run folder."""
    if run is None:
        return None
    return add(run, kind, text, source=source)


def read(run: str | Path) -> list[Entry]:
    """Entries of RUN/journal.md in order ([] when there is no journal yet)."""
    path = journal_path(run)
    if not path.exists():
        return []
    entries: list[Entry] = []
    body: list[str] = []
    for line in read_text(path, "journal").splitlines():
        m = HEADER.match(line)
        if m:
            if entries:
                entries[-1].text = _unescape(body)
            entries.append(Entry(m.group(1), m.group(2), "", m.group(3) or ""))
            body = []
        elif entries:
            body.append(line)
    if entries:
        entries[-1].text = _unescape(body)
    return entries


def _unescape(lines: list[str]) -> str:
    return "\n".join(ln[1:] if ln.startswith("\\## ") else ln for ln in lines).strip()
