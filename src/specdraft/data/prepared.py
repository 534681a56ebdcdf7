"""The prepared-data folder (WS/data): the contract between `prepare` and everything after it.

    WS/data/dataset/      a `datasets` save_to_disk folder, one row per sample:
                          input_ids (list[int]), loss_mask (list[int], 1 on assistant tokens),
                          messages (str, JSON of the sample's conversation), turn (int, the index
                          in messages of its first trained assistant turn; data of older versions
                          lacks it)
    WS/data/prepare.json  source, target identity, template hash and arguments, thinking mode,
                          counts, tokens
"""

from __future__ import annotations

from pathlib import Path

from specdraft.errors import SpecdraftError
from specdraft.io import write_json
from specdraft.schemas.prepare import META, read_prepare_record

DATASET = "dataset"
TOKEN_COLUMNS = ("input_ids", "loss_mask")


def save_prepared(out: str | Path, rows: dict[str, list], meta: dict) -> None:
    """Write rows (columns input_ids, loss_mask, messages) then prepare.json last: a folder
    without prepare.json is an unfinished prepare and is never read. The rows go to a temp folder
    first, so a re-run that fails while writing them (disk full) leaves the previous result whole."""
    import shutil
    import sys

    import datasets

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / META
    ds = datasets.Dataset.from_dict(rows)
    tmp = out / (DATASET + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
        print(f"note: removed {tmp}, left by a prepare that stopped midway", file=sys.stderr)
    try:
        ds.save_to_disk(str(tmp))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if meta_path.exists():   # from here on the folder is unfinished until prepare.json is written again
        meta_path.unlink()
    final = out / DATASET
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    write_json(meta_path, meta)


def load_prepared(path: str | Path):
    """Return (datasets.Dataset, meta dict) or fail with one line naming the folder."""
    import datasets

    path = Path(path)
    if not path.exists():
        raise SpecdraftError(f"{path}: prepared data folder not found; run `specdraft prepare --out {path}` first")
    if not path.is_dir():
        raise SpecdraftError(f"{path}: expected the folder written by `specdraft prepare`, got a file")
    if not (path / META).exists():
        if (path / "manifest.json").exists():
            raise SpecdraftError(f"{path}: a hidden-state store (from `specdraft capture`), not prepared data; "
                                 "pass the folder `specdraft prepare` wrote (--prepared WS/data)")
        raise SpecdraftError(f"{path}: no {META} (prepare did not finish); re-run `specdraft prepare`")
    meta = read_prepare_record(path / META)
    try:
        ds = datasets.load_from_disk(str(path / DATASET))
    except (FileNotFoundError, ValueError, OSError) as e:    # pyarrow's errors are ValueError or OSError
        raise SpecdraftError(f"{path / DATASET}: unreadable dataset ({str(e).strip()[:160]}); re-run "
                             "`specdraft prepare`") from None
    for col in TOKEN_COLUMNS:
        if col not in ds.column_names:
            raise SpecdraftError(f"{path / DATASET}: missing column '{col}'; re-run `specdraft prepare`")
        dtype = getattr(getattr(ds.features[col], "feature", None), "dtype", "")
        if not str(dtype).startswith(("int", "uint")):
            raise SpecdraftError(f"{path / DATASET}: column '{col}' holds {ds.features[col]}, expected lists of "
                                 "token integers; re-run `specdraft prepare`")
    return ds, meta


def prepared_meta_of(manifest: dict | None) -> dict:
    """The prepare.json of the data a store was captured from (its manifest's data.path); {} where the store
    names none or the folder is gone (eval and doctor read its template settings)."""
    path = ((manifest or {}).get("data") or {}).get("path")
    return read_prepare_record(Path(path) / META) if path and (Path(path) / META).is_file() else {}


def check_prepared_for(meta: dict, target, data, use: str) -> None:
    """Refuse data whose prepare.json names another target: its tokens mean other things there."""
    from specdraft.targets import same_target   # here: this module stays torch-free (prepare refuses bad data first)

    prepared_for = meta.get("target") or {}
    if prepared_for.get("fingerprint") and not same_target(prepared_for["fingerprint"], target.identity):
        raise SpecdraftError(f"{data}: prepared for {prepared_for.get('id')} (fingerprint "
                             f"{prepared_for['fingerprint']}) but --model is {target.name} (fingerprint "
                             f"{target.identity['fingerprint']}); {use} with the target the data was "
                             "prepared for, or re-run prepare with this --model")


def parse_part(text: str | None, option: str = "--part") -> tuple[int, int] | None:
    """'I/N' -> (I, N), 1 <= I <= N: this node's share of the samples (None: all of them)."""
    if text is None:
        return None
    try:
        index, count = (int(x) for x in str(text).split("/"))
    except ValueError:
        index, count = 0, 0
    if not 1 <= index <= count:
        raise SpecdraftError(f"{option} {text}: must be I/N with 1 <= I <= N, e.g. {option} 2/4 (the second of 4 parts)")
    return index, count


def part_indices(num_samples: int, part: tuple[int, int]) -> list[int]:
    """The samples of part I/N: those whose index % N == I - 1, so N nodes split a set
    deterministically, each sample in exactly one part, and part I's sample j is sample (I-1) + j*N."""
    index, count = part
    return list(range(index - 1, num_samples, count))


def take_part(ds, meta: dict, part: tuple[int, int] | None, where) -> tuple[object, dict]:
    """The prepared dataset cut to part I/N (meta records it), or as it is when part is None.
    Data already cut by `prepare --part` cannot be cut again."""
    if part is None:
        return ds, meta
    if meta.get("part"):
        raise SpecdraftError(f"{where}: already part {meta['part'][0]}/{meta['part'][1]} of a larger set (prepare "
                             "--part); drop --part here, or prepare the whole set without --part")
    return ds.select(non_empty_part(len(ds), part, f"{where} holds")), {**meta, "part": list(part)}


def non_empty_part(num_samples: int, part: tuple[int, int], holding: str) -> list[int]:
    """part_indices, refused in one line when the part has no sample (more parts than samples)."""
    indices = part_indices(num_samples, part)
    if num_samples and not indices:
        raise SpecdraftError(f"--part {part[0]}/{part[1]}: no samples in this part ({holding} {num_samples}, and "
                             f"part I takes samples I-1, I-1+N, ...); split into at most {num_samples} parts")
    return indices
