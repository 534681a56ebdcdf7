"""Kill anywhere, resume exactly: `specdraft prepare --regenerate`, `capture` and `train` are run
as CLI subprocesses on a tiny target, SIGKILLed at seeded random points (several times per stage),
resumed, and their final outputs compared with an uninterrupted run's, byte for byte / bit for bit.

After every kill the partial outputs are checked too: whatever a reader would accept as finished
(prepare.json, a manifest entry, a checkpoint folder) must be complete and equal to the reference.

Kill points are relative to a measured uninterrupted run: each run's "work window" starts when it
first writes into its output folder (the ~10 s of importing torch before that is not interesting)
and lasts as long as it did in the reference run; the kill lands uniformly inside it.

The whole file takes about 2-3 minutes on 2 cores (the three kill chains run in parallel threads,
each subprocess on one torch thread). SPECDRAFT_KILLS sets the kills per stage (default 2), and
SPECDRAFT_KILL_SEED the seed.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

KILLS = int(os.environ.get("SPECDRAFT_KILLS", "2"))
SEED = int(os.environ.get("SPECDRAFT_KILL_SEED", "0"))
TIMEOUT = 240  # seconds any single CLI run may take before the test fails

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
       "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "COLUMNS": "200"}


# ----------------------------------------------------------------------------- commands

def prepare_cmd(target: Path, conv: Path, out: Path) -> list[str]:
    return ["prepare", "--model", target, "--conversations", conv, "--out", out, "--regenerate",
            "--max-new-tokens", "24", "--batch-size", "2"]


def capture_cmd(target: Path, data: Path, out: Path, resume: bool = False) -> list[str]:
    return ["capture", "--model", target, "--prepared", data, "--out", out, "--store-dtype", "float32",
            "--shard-tokens", "120", "--batch-tokens", "96"] + (["--resume"] if resume else [])


def train_cmd(target: Path, ws: Path, out: Path, resume: bool = False) -> list[str]:
    return ["train", "--model", target, "--store", ws / "hidden", "--vocab", ws / "vocab.safetensors",
            "--out", out, "--max-tokens", "64", "--epochs", "2", "--log-every", "1", "--save-every", "2",
            "--keep-step-checkpoints", "100", "--precision", "fp32", "--no-progress", "--warmup-steps", "2",
            "--lr", "2e-3", "--val-fraction", "0.2", "--val-every", "3"] + (["--resume"] if resume else [])


def argv(args: list) -> list[str]:
    return [sys.executable, "-m", "specdraft.cli", *map(str, args)]


def newest_write(folder: Path) -> float:
    """mtime of the newest FILE under `folder` (0 if none). Folders and the lock file do not count:
    a command creates and locks its --out before importing torch, and the import is not the work
    we want to interrupt."""
    times = [0.0]
    for root, _, names in os.walk(folder):   # os.walk skips a folder renamed away mid-walk; rglob raised there
        for name in names:
            try:
                if name != ".specdraft.lock":
                    times.append((Path(root) / name).stat().st_mtime)
            except FileNotFoundError:   # renamed away while we looked
                pass
    return max(times)


def launch(args: list, out: Path, log: Path, kill_after: float | None = None) -> dict:
    """Run the CLI; with kill_after, SIGKILL it that many seconds after it first writes into `out`.

    Returns {rc, killed, started (s to first write), seconds}."""
    begin = time.time()
    with open(log, "ab") as err:
        err.write(f"\n$ specdraft {' '.join(map(str, args))}\n".encode())
        err.flush()
        proc = subprocess.Popen(argv(args), env=ENV, stdout=err, stderr=err)
        started = None
        while proc.poll() is None:
            if started is None and newest_write(out) >= begin:
                started = time.time() - begin
            if kill_after is not None and started is not None and time.time() - begin >= started + kill_after:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return {"rc": proc.returncode, "killed": True, "started": started,
                        "seconds": time.time() - begin}
            if time.time() - begin > TIMEOUT:
                proc.kill()
                proc.wait()
                raise AssertionError(f"specdraft {args[0]} ran over {TIMEOUT} s; see {log}")
            time.sleep(0.03)
    return {"rc": proc.returncode, "killed": False, "started": started, "seconds": time.time() - begin}


def run_ok(args: list, out: Path, log: Path) -> dict:
    r = launch(args, out, log)
    assert r["rc"] == 0, f"specdraft {args[0]} failed (rc {r['rc']}):\n{log.read_text()[-3000:]}"
    return r


# ----------------------------------------------------------------------------- what "equal" means

def dataset_digest(data: Path) -> str:
    from specdraft.data.prepared import load_prepared

    ds, meta = load_prepared(data)
    h = hashlib.sha256()
    for col in ("input_ids", "loss_mask", "messages"):
        h.update(json.dumps(list(ds[col])).encode())
    h.update(json.dumps(meta["counts"], sort_keys=True).encode())
    return h.hexdigest()


def shard_hashes(store: Path) -> dict[str, str]:
    from specdraft.io import sha256_file

    return {p.name: sha256_file(p) for p in sorted(store.glob("shard-*.safetensors"))}


def metrics_lines(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def checkpoint_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def assert_same_tensors(a: dict, b: dict, where: str) -> None:
    assert a.keys() == b.keys(), where
    for k in a:
        assert torch.equal(a[k], b[k]), f"{where}: tensor {k} differs from the uninterrupted run"


# ----------------------------------------------------------------------------- reference run

@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted prepare -> capture -> vocab -> train, with each stage's work window timed."""
    from specdraft.testing import save_tiny_target

    root = tmp_path_factory.mktemp("reliability")
    target = save_tiny_target(root / "target")
    conv = root / "conversations.jsonl"
    topics = ["rivers", "prime numbers", "bread", "the moon", "chess", "rain", "maps", "bees"]
    with open(conv, "w") as f:
        for i in range(14):
            f.write(json.dumps({"messages": [
                {"role": "user", "content": f"Tell me about {topics[i % len(topics)]} ({i})."},
                {"role": "assistant", "content": "An answer the target will replace."}]}) + "\n")
    ws, log = root / "ref", root / "ref.log"
    windows = {}
    for stage, args, out in (("prepare", prepare_cmd(target, conv, ws / "data"), ws / "data"),
                             ("capture", capture_cmd(target, ws / "data", ws / "hidden"), ws / "hidden")):
        r = run_ok(args, out, log)
        windows[stage] = r["seconds"] - (r["started"] or 0.0)
    run_ok(["vocab", "build", "--prepared", ws / "data", "--size", "48", "--out", ws / "vocab.safetensors"],
           ws, log)
    r = run_ok(train_cmd(target, ws, ws / "runs" / "ref"), ws / "runs" / "ref", log)
    windows["train"] = r["seconds"] - (r["started"] or 0.0)
    return {"root": root, "target": target, "conv": conv, "ws": ws, "windows": windows, "log": log}


# ----------------------------------------------------------------------------- checks after a kill

def check_partial_prepare(out: Path, ref: dict) -> None:
    """prepare.json means finished: then the dataset must be the reference one. regen.jsonl may end
    in a cut line, but every complete line is a finished sample."""
    if (out / "prepare.json").exists():
        assert dataset_digest(out) == dataset_digest(ref["ws"] / "data")
    regen = out / "regen.jsonl"
    if regen.exists():
        text = regen.read_bytes()
        for line in text[:text.rfind(b"\n") + 1].splitlines():
            assert "messages" in json.loads(line)


def check_partial_capture(out: Path, ref: dict) -> None:
    """Every shard the manifest lists is whole and equal to the reference shard of that name."""
    from specdraft.data import store as st

    if not (out / st.MANIFEST).exists():
        return
    manifest = st.read_manifest(out)
    st.verify_shards(out, manifest)
    want = shard_hashes(ref["ws"] / "hidden")
    for entry in manifest["shards"]:
        assert entry["sha256"] == want[entry["file"]], entry["file"]
    if manifest.get("complete"):
        assert shard_hashes(out) == want


def check_partial_train(out: Path, ref: dict) -> None:
    """Every checkpoint the resume logic would pick is whole (weights, trainer state) and equal to
    the reference checkpoint of that name; every complete metrics line parses."""
    from specdraft.train import checkpoint as ckpt

    ref_run = ref["ws"] / "runs" / "ref"
    for _, _, folder in ckpt.list_checkpoints(out):
        ckpt.load_trainer_state(folder)
        assert_same_tensors(checkpoint_tensors(folder),
                            checkpoint_tensors(ref_run / "checkpoints" / folder.name), str(folder))
    metrics = out / "metrics.jsonl"
    if metrics.exists():
        text = metrics.read_text()
        for line in text[:text.rfind("\n") + 1].splitlines():
            json.loads(line)


# ----------------------------------------------------------------------------- kill chains

def kill_chain(stage: str, first: list, resume, out: Path, check, ref: dict, rng: random.Random) -> list[dict]:
    """Start, SIGKILL, check partial outputs, resume (`resume()` gives the next command) KILLS
    times, then resume to the end. Returns the record of each attempt."""
    log = ref["root"] / f"{stage}.log"
    window = ref["windows"][stage]
    attempts, args = [], first
    for attempt in range(KILLS):
        # a resumed run has less left to do: aim its kill into a shorter window
        delay = rng.uniform(0.0, 1.0) * window / (attempt + 1)
        r = launch(args, out, log, kill_after=delay)
        r["delay"] = round(delay, 2)
        attempts.append(r)
        if not r["killed"]:   # it finished (or refused) before the kill point
            assert r["rc"] == 0, f"{stage} failed before the kill:\n{log.read_text()[-3000:]}"
        check(out, ref)
        args = resume()
    attempts.append(run_ok(args, out, log))
    check(out, ref)
    return attempts


def test_kill_anywhere_resume_exactly(reference):
    ref, ws, target = reference, reference["ws"], reference["target"]
    rng = random.Random(SEED)
    seeds = {s: rng.randrange(2**32) for s in ("prepare", "capture", "train")}
    chains = ref["root"] / "chains"
    data_out, store_out, run_out = chains / "data", chains / "hidden", chains / "run"

    def train_resume():
        from specdraft.train import checkpoint as ckpt
        # --resume needs a checkpoint; before the first one a user starts over (--overwrite: the
        # killed run may have written config.yaml and metrics.jsonl, which train refuses to mix with)
        if ckpt.latest_checkpoint(run_out) is not None:
            return train_cmd(target, ws, run_out, resume=True)
        return train_cmd(target, ws, run_out) + ["--overwrite"]

    jobs = {
        "prepare": (prepare_cmd(target, ref["conv"], data_out), lambda: prepare_cmd(target, ref["conv"], data_out),
                    data_out, check_partial_prepare),
        "capture": (capture_cmd(target, ws / "data", store_out),
                    lambda: capture_cmd(target, ws / "data", store_out, resume=True), store_out,
                    check_partial_capture),
        "train": (train_cmd(target, ws, run_out), train_resume, run_out, check_partial_train),
    }
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        futures = {stage: pool.submit(kill_chain, stage, first, resume, out, check, ref, random.Random(seeds[stage]))
                   for stage, (first, resume, out, check) in jobs.items()}
        attempts = {stage: f.result() for stage, f in futures.items()}
    print("\nkill chains (seed %d, windows %s):" % (SEED, {k: round(v, 1) for k, v in ref["windows"].items()}))
    for stage, rows in attempts.items():
        print(f"  {stage:8s}", " | ".join(
            f"{'killed' if r['killed'] else 'rc ' + str(r['rc'])} at {r.get('delay', '-')}s into work "
            f"({r['seconds']:.1f}s)" for r in rows))

    # prepare: same rows, same counts
    assert dataset_digest(data_out) == dataset_digest(ws / "data")
    # capture: byte-identical shards, same manifest
    assert shard_hashes(store_out) == shard_hashes(ws / "hidden")
    assert json.loads((store_out / "manifest.json").read_text()) == json.loads((ws / "hidden" / "manifest.json").read_text())
    assert not list(store_out.glob(".*.tmp"))
    # train: the same metrics, line for line, and the same weights in every final checkpoint
    ref_run = ws / "runs" / "ref"
    assert metrics_lines(run_out) == metrics_lines(ref_run)
    for name in ("checkpoints/epoch-1", "checkpoints/epoch-2", "best"):
        assert_same_tensors(checkpoint_tensors(run_out / name), checkpoint_tensors(ref_run / name), name)
    # at least some kills must have landed while the stage was working, or the test proved nothing
    assert sum(r["killed"] for rows in attempts.values() for r in rows) >= KILLS


def test_store_reader_keeps_few_shards_mapped(tmp_path):
    """Reading every sample of a many-shard store keeps at most MAX_OPEN_SHARDS memory maps open
    (each keeps its read pages resident: RSS would grow with the store), and evicted shards
    read back the same."""
    from specdraft.data import store as st

    writer = st.StoreWriter(tmp_path, st.new_manifest({"id": "t"}, [0, 1, 2], "float32", 8))
    g = torch.Generator().manual_seed(0)
    expected = []
    for _ in range(st.MAX_OPEN_SHARDS + 3):
        lengths = [3, 5]
        n = sum(lengths)
        aux, last = torch.randn(n, 3, 8, generator=g), torch.randn(n, 8, generator=g)
        writer.write_shard(aux, last, torch.arange(n), torch.ones(n, dtype=torch.uint8),
                           torch.tensor([0, 3, 8]))
        expected += [aux[:3], aux[3:]]
    writer.save(complete=True)
    store = st.HiddenStore(tmp_path)
    for _ in range(2):   # the second pass re-opens evicted shards
        for i in range(len(store)):
            assert torch.equal(store[i]["aux"], expected[i])
            assert len(store._handles) <= st.MAX_OPEN_SHARDS
