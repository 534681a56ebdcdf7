"""Small file helpers shared by every stage: atomic writes, json, hashing."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

from specdraft import run_layout
from specdraft.errors import SpecdraftError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success fsync and rename it over `path`.

    A reader never sees a half-written file: either the old file or the new one.
    """
    path = check_file_target(path)
    clean_leftovers(path.parent)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path.name), suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise SpecdraftError(os_error_line(path, e)) from None
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        # mkstemp makes 0600, and so does a writer that replaces the file (safetensors' save_file):
        # outputs are shared like any file, so a serving container running as another user reads them
        os.chmod(tmp, with_umask(0o666))
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except Exception as e:
        line = os_error_line(path, e)
        if line is None:
            raise
        raise SpecdraftError(line) from e
    finally:
        if tmp.exists():
            tmp.unlink()


def temp_prefix(name: str) -> str:
    """The start of a temp sibling's name (.NAME.PID-): it carries the writer's pid, so a later run
    tells a killed writer's leftovers from a live writer's files."""
    return f".{name}.{os.getpid()}-"


LEFTOVER = re.compile(r"^\..+\.(\d+)-[A-Za-z0-9_]+\.(tmp|old)$")


def clean_leftovers(parent: Path) -> list[Path]:
    """Remove the temp siblings (.NAME.PID-XXXX.tmp, file or folder) and set-aside folders
    (.NAME.PID-XXXX.old) that a writer killed midway left in `parent`; an .old folder whose NAME is
    missing holds the previous complete result (the kill came between the two renames of a swap) and
    is moved back first. Files of a live writer are left alone. Says what it did in one line."""
    done, restored = [], []
    with contextlib.suppress(OSError):
        for p in sorted(Path(parent).iterdir()):
            m = LEFTOVER.match(p.name)
            if not m or _alive(int(m.group(1))):
                continue
            if m.group(2) == "old" and p.is_dir() and not p.is_symlink():
                for kept in p.iterdir():
                    if not (Path(parent) / kept.name).exists():
                        os.replace(kept, Path(parent) / kept.name)
                        restored.append(kept.name)
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            done.append(p)
    if done:
        back = f"; put back {', '.join(restored)} (the previous complete result)" if restored else ""
        print(f"note: removed {len(done)} leftover(s) of a specdraft run that stopped midway in {parent} "
              f"({', '.join(p.name for p in done[:3])}{', ...' if len(done) > 3 else ''}){back}", file=sys.stderr)
    return done


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True   # another user's process: alive
    return True


def check_file_target(path: str | os.PathLike) -> Path:
    """A file about to be written must not be a folder; commands check it before their long work."""
    path = Path(path)
    if path.is_dir():
        raise SpecdraftError(f"{path}: is a directory; pass the path of a file to write, not a folder")
    return path


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


# What to do about the OS errors a writer meets; anything else gets the OS's own words.
OS_ERROR_FIXES = {
    errno.ENOSPC: "free disk space or choose another --out; files written before are intact",
    errno.EDQUOT: "free space under your disk quota or choose another --out; files written before are intact",
    errno.EACCES: "this user may not write there; choose another --out or fix its permissions",
    errno.EPERM: "this user may not write there; choose another --out or fix its permissions",
    errno.EROFS: "the file system is read-only; choose another --out",
    errno.EISDIR: "a folder is in the way; pass a file path",
    errno.ENOTDIR: "a file is in the way; pass a folder path",
    errno.EFBIG: "the file is larger than this system allows (ulimit -f?); split the work or raise the limit",
}


def os_error_line(path: str | os.PathLike | None, e: BaseException) -> str | None:
    """The one-line message for an OS error met while writing `path`, or None if `e` is not one.

    safetensors reports I/O errors as SafetensorError("... (os error 28)"), so the errno is also
    read from the message of an error that is not an OSError."""
    code = e.errno if isinstance(e, OSError) else None
    if code is None and not isinstance(e, SpecdraftError):
        match = re.search(r"os error (\d+)", str(e))
        code = int(match.group(1)) if match else None
    if code is None:
        return None
    name = errno.errorcode.get(code, str(code))
    fix = OS_ERROR_FIXES.get(code, "check the path and try again")
    return f"{path or 'output'}: {os.strerror(code).lower()} ({name}); {fix}"


def with_umask(mode: int) -> int:
    """`mode` as the umask leaves it (0o777 -> 0o755 under umask 022): what a plain mkdir or open
    gives, for files and folders that mkstemp/mkdtemp create private (0600/0700)."""
    mask = os.umask(0)
    os.umask(mask)
    return mode & ~mask


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def read_text(path: str | os.PathLike, what: str = "file") -> str:
    """A text file that must be UTF-8: other bytes are one line naming the file and the byte's place."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise SpecdraftError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); re-create the {what} "
                             "or save it as UTF-8") from None


def read_json(path: str | os.PathLike, what: str = "file") -> dict:
    """A JSON file that must hold one object (every JSON file specdraft reads does)."""
    path = Path(path)
    if not path.exists():
        raise SpecdraftError(f"{path}: {what} not found")
    if path.is_dir():
        raise SpecdraftError(f"{path}: is a directory, expected a JSON {what}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpecdraftError(f"{path}: not valid JSON ({e}); re-create the {what}") from None
    if not isinstance(data, dict):
        raise SpecdraftError(f"{path}: expected a JSON object {{...}}, got {type(data).__name__}; "
                             f"re-create the {what}")
    found = non_finite_field(data)
    if found is not None:
        raise SpecdraftError(f"{path}: field '{found[0]}' is {found[1]}, expected a finite number; fix or "
                             f"re-create the {what}")
    return data


def non_finite_field(data, where: str = "") -> tuple[str, float] | None:
    """The dotted name and value of the first NaN or +-Infinity in parsed JSON (Python's json reads
    them), or None."""
    if isinstance(data, float) and not math.isfinite(data):
        return where, data
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        found = non_finite_field(value, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def read_model(path: str | os.PathLike, model, what: str, fix: str):
    """A JSON file read into a pydantic `model` (strict types, unknown fields ignored): the first
    field of the wrong type or missing is one line naming the file, the field and `fix`."""
    return check_model(read_json(path, what), model, path, fix)


UNION_TAGS = {"int", "float", "str", "bool"}    # the member of a union that pydantic names in an error's place


def check_model(data: dict, model, path, fix: str):
    """`data` (a JSON object read from `path`) validated into the pydantic `model`, as read_model does."""
    from pydantic import ValidationError

    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = [part for part in err["loc"] if part not in UNION_TAGS]        # k: int | str -> 'k', not 'k.int'
        field = ".".join(map(str, loc)) or "(top)"
        given = "missing" if err["type"] == "missing" else f"{json.dumps(err['input'], default=str)[:80]}"
        raise SpecdraftError(f"{path}: field '{field}' is {given} ({err['msg'].lower()}); {fix}") from None


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


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
