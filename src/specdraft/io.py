"""Small file helpers shared by every stage: atomic writes, leftovers of a stopped run, JSON and pydantic
reading with one-line errors, OS errors as one line, hashing. Where a command may write is outputs.py."""

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


def check_file_target(path: str | os.PathLike) -> Path:
    """A file about to be written must not be a folder; commands check it before their long work."""
    path = Path(path)
    if path.is_dir():
        raise SpecdraftError(f"{path}: is a directory; pass the path of a file to write, not a folder")
    return path


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
