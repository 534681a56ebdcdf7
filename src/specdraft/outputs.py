"""Where a command may write: a file --out that is not a folder and not another command's input or result, a
folder --out of the command's own kind, and the lock a command holds on its output folder while it writes it."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Iterator

from specdraft import run_layout
from specdraft.errors import SpecdraftError
from specdraft.io import check_file_target, clean_leftovers, os_error_line


# Files that specdraft's folders (prepared data, store, run, checkpoint, export) and model folders are
# made of: a single-file --out never replaces one (`eval --out RUN/metrics.jsonl` replaced the run's
# log). Outputs a command re-writes on purpose (RUN/eval.json, bench.json, plan.json, report.html) are
# not in it.
OWNED_FILES = {"manifest.json", "prepare.json", "regen.jsonl", "questions.jsonl", run_layout.METRICS, run_layout.CONFIG,
               "config.json", "progress.json", "trainer_state.pt", "inputs.json", "model.safetensors",
               "model.safetensors.index.json", run_layout.JOURNAL, run_layout.PROVENANCE, run_layout.REMAP, "val.json",
               "stages.json", ".specdraft.lock", ".journal.lock", "export.json", "tokenizer.json", "tokenizer_config.json",
               "generation_config.json", "special_tokens_map.json"}
# The kinds of folder a command writes, by the files that mark each (any one of them),
# and the commands that own the kind: an --out folder of another kind is refused before any work (`prepare
# --out WS/hidden` wrote prepared data into a store). Checked in own_folder, which every folder writer holds.
FOLDER_KINDS = (("prepared data", ("prepare.json",), {"prepare"}),
                ("a hidden-state store", ("manifest.json",), {"capture", "store convert"}),
                ("a training run", (run_layout.METRICS, run_layout.CONFIG), {"train"}),
                ("a recipe workspace", ("stages.json", "recipe.log"), {"recipe"}),
                ("a drafter or model folder", ("config.json",), {"export", "import"}))
FOLDER_WRITERS = {command for _, _, owners in FOLDER_KINDS for command in owners}


def folder_kind(path: Path) -> tuple[str, set[str]] | None:
    """(the kind of specdraft or model folder `path` is, the commands that write it), None for any other."""
    for kind, markers, owners in FOLDER_KINDS:
        if any((path / name).is_file() for name in markers):
            return kind, owners
    return None


def check_folder_kind(path: Path, command: str) -> None:
    """Refuse `command` writing into a folder that another command wrote (its files would mix with ours)."""
    found = folder_kind(path) if path.is_dir() else None
    if found is not None and command in FOLDER_WRITERS and command not in found[1]:
        writers = " or ".join(f"`specdraft {c}`" for c in sorted(found[1]))
        raise SpecdraftError(f"--out {path}: holds {found[0]}, which {writers} writes, and {command} would write its "
                             "own files among them; choose another --out (a new folder)")


OWNED_PATTERN = re.compile(r"^(shard-\d+\.safetensors|model-\d+-of-\d+\.safetensors)$")
# an existing file of these kinds is data (weights, a vocab, a store, conversations, a config), never
# the result of a command that writes another kind
DATA_SUFFIXES = {".safetensors", ".pt", ".bin", ".gguf", ".jsonl", ".parquet", ".yaml", ".yml",
                 ".json"}   # a result another command wrote (RUN/eval.json): report --out never replaces it


def check_output_file(path: str | os.PathLike, inputs=(), writes: str | None = None,
                      option: str = "--out") -> Path:
    """A single-file output, checked before the command's work: not a folder, not a symbolic link
    specdraft did not make, not one of the command's `inputs` (files or folders), not a file that a
    specdraft or model folder is made of (OWNED_FILES), and not an existing data file of another kind
    than the `writes` suffix. Each refusal is one line naming the file and the fix."""
    path = check_file_target(path)
    fix = f"choose another {option} (a new file)"
    if path.is_symlink():
        raise SpecdraftError(f"{option} {path}: is a symbolic link (to {os.readlink(path)}) that specdraft did not "
                             f"make; it never writes through links: remove the link or {fix}")
    resolved = path.resolve()
    for given in inputs:
        if given is None or not Path(given).exists():
            continue
        source = Path(given).resolve()
        if source == resolved:
            raise SpecdraftError(f"{option} {path}: is also an input of this command ({given}); writing it would "
                                 f"replace it: {fix}")
    name = path.name
    owned = name in OWNED_FILES or OWNED_PATTERN.match(name)
    parent_owned = path.parent.is_dir() and any((path.parent / n).is_file() for n in OWNED_FILES)
    if owned and (path.exists() or parent_owned):
        raise SpecdraftError(f"{option} {path}: {name} is a file specdraft (or a model folder) is made of; writing "
                             f"it would replace it: {fix}")
    if writes and path.is_file() and path.suffix.lower() in DATA_SUFFIXES and path.suffix.lower() != writes:
        raise SpecdraftError(f"{option} {path}: is an existing {path.suffix} file (data or a result: weights, a vocab, "
                             f"conversations, a config?) and this command writes {writes}: {fix}")
    return path


def ensure_writable_dir(path: str | os.PathLike) -> Path:
    """Create `path` (and parents) or fail with one line saying why."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise SpecdraftError(f"{path}: exists and is not a directory; pass a folder for --out")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SpecdraftError(f"{path}: cannot create output folder ({e.strerror})") from None
    if not os.access(path, os.W_OK):
        raise SpecdraftError(f"{path}: output folder is not writable; choose another --out")
    return path


LOCK_NAME = ".specdraft.lock"   # inside an output folder while a command writes it; removed when it ends


@contextlib.contextmanager
def own_folder(path: str | os.PathLike, command: str) -> Iterator[Path]:
    """Create output folder `path` and hold an exclusive lock on it while the block runs.

    Two commands writing one folder would mix their files (a store of two captures, two runs'
    metrics), so a second writer fails at once with one line naming the holder. The lock is an
    fcntl.flock on PATH/.specdraft.lock: the kernel drops it when the holder dies, so a killed
    run never leaves the folder locked, only a stale file that the next holder reuses. Not filelock
    (the journal's lock): the refused writer names the holder from the pid and command
    the holder wrote into the lock file, which filelock's lock does not carry."""
    import fcntl

    path = Path(path)
    if not path.exists() and path.parent.is_dir():
        clean_leftovers(path.parent)   # a swap killed between its renames: put the previous result back first
    check_folder_kind(path, command)
    created = not path.exists()
    ensure_writable_dir(path)
    lock = path / LOCK_NAME
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)   # never through a planted link
        except OSError as e:
            raise SpecdraftError(f"{path}: cannot create its lock file {LOCK_NAME} ({e.strerror}); "
                                 "choose another --out") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").split()
            os.close(fd)
            who = f"pid {holder[0]}, {' '.join(holder[1:])}" if holder else "pid unknown"
            raise SpecdraftError(f"{path}: in use by another specdraft process ({who}); wait for it to "
                                 "finish or choose another --out") from None
        if _same_file(fd, lock):
            break
        os.close(fd)   # the previous holder removed the file between our open and our lock: retry
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {command}\n".encode())
        yield path
    except Exception as e:   # a full disk (or the like) met by any writer of this folder: name it
        line = os_error_line(getattr(e, "filename", None) or path, e)
        if line is None:
            raise
        raise SpecdraftError(line) from e
    finally:
        if _same_file(fd, lock):
            with contextlib.suppress(OSError):
                lock.unlink()
        os.close(fd)
        if created:   # a command refused before writing leaves no empty folder behind
            with contextlib.suppress(OSError):
                path.rmdir()


def _same_file(fd: int, path: Path) -> bool:
    """Whether `path` still names the file open as `fd` (a finished holder unlinks its lock file)."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False
