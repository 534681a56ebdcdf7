"""Issue 38, long context: τ by context position (eval, bench, report), the long prompt set, the
doctor's context_decay, long rows in training."""

from __future__ import annotations

import json

import pytest
import torch

from specdraft.errors import SpecdraftError
from specdraft.metrics import (CONTEXT_EDGES, by_context_text, context_buckets, parse_context_buckets,
                               rounds_by_context)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_context_buckets_default_parse_and_refuse():
    assert parse_context_buckets(None) == CONTEXT_EDGES == (512, 2048, 4096, 8192)
    assert [b[0] for b in context_buckets(CONTEXT_EDGES)] == ["<512", "512-2K", "2K-4K", "4K-8K", ">=8K"]
    assert parse_context_buckets("512,2048,4096") == (512, 2048, 4096)
    for bad in ("512,256", "a,b", "0,10", ""):
        with pytest.raises(SpecdraftError, match="--context-buckets"):
            parse_context_buckets(bad)


def test_rounds_fall_in_the_bucket_of_their_context_length():
    section = rounds_by_context([10, 600, 700, 5000, 511], [2, 1, 0, 3, 0], (512, 2048, 4096), 3)
    b = section["buckets"]
    assert section["k"] == 3 and section["unit"] == "rounds" and list(b) == ["<512", "512-2K", "2K-4K", ">=4K"]
    assert (b["<512"]["tau"], b["<512"]["rounds"]) == (2.0, 2)          # (2 + 0 + 2 rounds) / 2
    assert (b["512-2K"]["tau"], b["512-2K"]["rounds"]) == (1.5, 2)
    assert (b["2K-4K"]["tau"], b["2K-4K"]["rounds"]) == (None, 0)
    assert (b[">=4K"]["tau"], b[">=4K"]["rounds"]) == (4.0, 1)
    line = by_context_text(section, "natural", 5)
    assert line == "τ by context at K=3 on 5 natural prompts: <512 2.00 (2 rounds) · 512-2K 1.50 (2 rounds) · >=4K 4.00 (1 rounds)"


def test_bench_records_tau_by_context_per_drafting_method(tiny_target, tmp_path, capsys):
    from specdraft.infer.bench import run_bench
    from specdraft.infer.bench_output import print_report
    from specdraft.infer.prompts import prompt_ids
    from specdraft.targets import load_target

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "say one two one two"}) + "\n")
    L = len(prompt_ids(load_target(str(tiny_target)).tokenizer, [{"role": "user", "content": "say one two one two"}]))
    edges = f"{L},{L + 12}"                                     # 24 new tokens cross the second
    report = run_bench(str(tiny_target), "untrained:64", str(prompts), "greedy,ngram,eagle3", 24, 3, None,
                       1, None, (1, 3), None, "cpu", "float32", False, None, edges)
    assert report["config"]["context_buckets"] == [L, L + 12]
    assert "by_context" not in report["methods"]["greedy"]
    for name in ("ngram", "eagle3"):
        m = report["methods"][name]
        section = m["by_context"]
        assert section["k"] == 3 and section["edges"] == [L, L + 12]
        assert section["buckets"][f"<{L}"]["rounds"] == 0   # no round before the prompt's end
        rows = [b for b in section["buckets"].values() if b["rounds"]]
        rounds = sum(b["rounds"] for b in rows)
        # every verify round is in one bucket, and the buckets' τ average back to the method's τ
        assert rounds == m["target_forwards"] - 1              # one prefill
        assert sum(b["tau"] * b["rounds"] for b in rows) / rounds == pytest.approx(m["accept_len"])
        assert len(rows) == 2, section
    print_report(report, as_json=False)
    out = capsys.readouterr().out
    assert f"eagle3: τ by context at K=3 on 1 of your prompts ({prompts}):" in out


def test_generation_records_the_context_of_each_round(tiny_target):
    from specdraft.infer.ngram import NgramProposer
    from specdraft.infer.speculative import generate
    from specdraft.targets import load_target

    target = load_target(str(tiny_target))
    prompt = list(range(5, 25))
    g = generate(target.model, prompt, NgramProposer(3, 3, 1), max_new_tokens=20, eos_token_ids=set())
    assert len(g.contexts) == len(g.accepted) > 0
    assert g.contexts[0] == len(prompt) + 1                    # the prompt and the prefill's token
    for before, after, taken in zip(g.contexts, g.contexts[1:], g.accepted):
        assert after == before + taken + 1


def test_eval_metrics_by_context_split_the_positions(tiny_target):
    from specdraft.analysis.probe import drafter_metrics_by_context, sample_batch, target_hidden
    from specdraft.targets import load_target
    from specdraft.testing import tiny_drafter_for

    target = load_target(str(tiny_target))
    net = tiny_drafter_for(target.model, [1, 4, 6]).eval()
    g = torch.Generator().manual_seed(0)
    row = torch.randint(10, 200, (96,), generator=g).tolist()
    aux, last = target_hidden(target, [row], [1, 4, 6])
    mask = [0] * 8 + [1] * 88

    def batches():
        yield sample_batch(row, aux, last, mask)

    whole, one = drafter_metrics_by_context(net, target.model, batches(), 2, (1000,))
    assert one[0][1] == 88 and one[1] is None
    assert one[0][0] == whole                                  # one bucket: the whole measurement
    whole2, two = drafter_metrics_by_context(net, target.model, batches(), 2, (40, 70))
    assert whole2 == whole and [b[1] for b in two] == [32, 30, 26]
    # each bucket is measured on its own positions: the same as a store whose loss mask keeps only them
    from specdraft.analysis.probe import drafter_metrics
    for (low, high), (metrics, _) in zip([(0, 40), (40, 70), (70, 96)], two):
        cut = [m if low <= t < high else 0 for t, m in enumerate(mask)]
        assert metrics == drafter_metrics(net, target.model, [sample_batch(row, aux, last, cut)], 2)
    assert len({b[0]["loss"] for b in two}) == 3              # not one number copied to every bucket


def test_report_plots_tau_against_context_length(tmp_path):
    from specdraft.analysis import report

    run = tmp_path / "run"
    run.mkdir()
    ev = {"cond_acc": [0.5], "full_acc": [0.5], "accept_len_by_k": [1.0, 1.5], "accept_len": 1.5, "split": "val",
          "drafter": "d", "k": 1, "samples": 4, "split_name": "held-out",
          "by_context": rounds_by_context([100, 3000], [1, 0], (512, 2048), 1) | {"unit": "rounds"}}
    (run / "eval.json").write_text(json.dumps(ev))
    page = report.build([run]).read_text()
    assert "τ by context length" in page and 'alt="τ against context length"' in page
    assert "τ by context at K=1 on 4 held-out store samples: &lt;512 2.00 (1 rounds) · &gt;=2K 1.00 (1 rounds)" in page
    (run / "eval.json").write_text(json.dumps({k: v for k, v in ev.items() if k != "by_context"}))
    assert "τ by context length" not in report.build([run]).read_text()   # nothing measured, no section


def byte_count(text: str) -> int:
    return len(text.encode("utf-8"))


def test_long_prompts_spread_up_to_the_bound_from_the_standard_library():
    from specdraft.data.documents import MIN_TOKENS, PROMPT_ROOM, TASKS, long_prompts, stdlib_files

    convs = long_prompts(6, 3000, byte_count)
    assert convs == long_prompts(6, 3000, byte_count)                  # deterministic
    texts = [c[0]["content"] for c in convs]
    assert all(len(c) == 1 and c[0]["role"] == "user" for c in convs)
    sizes = [byte_count(t) for t in texts]
    assert sizes == sorted(sizes) and MIN_TOKENS * 0.5 <= sizes[0] <= MIN_TOKENS
    assert (3000 - PROMPT_ROOM) * 0.85 <= sizes[-1] <= 3000 - PROMPT_ROOM   # reaches the bound, room left
    assert [t.split()[0] for t in texts] == ["Summarize", "Read", "Continue"] * 2 and len(TASKS) == 3
    names = {p.name for p in stdlib_files()}
    files = [line.removeprefix("# file: ") for t in texts for line in t.splitlines() if line.startswith("# file: ")]
    assert files and all(f in names or f == "LICENSE.txt" or "/" not in f for f in files)
    assert "\n\nQuestion: " in texts[1] and "Question: What does `" in texts[4] and "def " in texts[4]


def test_long_prompts_refuse_a_bound_too_small():
    from specdraft.data.documents import long_prompts

    with pytest.raises(SpecdraftError, match="--max-context"):
        long_prompts(2, 200, byte_count)


def test_bench_prompts_long_on_a_tiny_target(tiny_target):
    from specdraft.infer.bench import run_bench
    from specdraft.infer.prompts import read_prompts

    report = run_bench(str(tiny_target), None, "long", "greedy,ngram", 8, None, None, 1, None, (1, 3), 2,
                       "cpu", "float32", False, None, "400,600", 700)
    assert report["config"]["prompts"] == "long" and report["config"]["num_prompts"] == 2
    buckets = report["methods"]["ngram"]["by_context"]["buckets"]
    assert buckets["<400"]["rounds"] > 0 and buckets["400-600"]["rounds"] > 0   # ~200- and ~500-token prompts
    assert buckets[">=600"]["rounds"] == 0                              # 700 - answer - a round's room
    assert report["methods"]["ngram"]["identical_to_greedy"] is True
    with pytest.raises(SpecdraftError, match="--max-context 9000: .* 4096 tokens at most"):
        run_bench(str(tiny_target), None, "long", "greedy", 8, None, None, 1, None, (1, 3), 2,
                  "cpu", "float32", False, None, None, 9000)
    with pytest.raises(SpecdraftError, match="--max-context 700: bounds the long-context prompt set only"):
        run_bench(str(tiny_target), None, "natural", "greedy", 8, None, None, 1, None, (1, 3), 2,
                  "cpu", "float32", False, None, None, 700)
    with pytest.raises(SpecdraftError, match="--prompts long: .*specdraft bench --prompts long"):
        read_prompts("long")


def test_doctor_context_decay_holds_when_tau_falls_at_long_context(tmp_path):
    from specdraft.analysis import doctor

    run = tmp_path / "run"
    run.mkdir()
    d = doctor.Doctor(run)
    assert "skipped" in doctor.check_context_decay(d).evidence            # nothing measured by context
    decayed = rounds_by_context([100] * 10 + [5000] * 10, [2] * 10 + [0] * 10, CONTEXT_EDGES, 3)   # 3.0 -> 1.0
    held = rounds_by_context([100] * 10 + [5000] * 10, [2] * 10 + [2] * 9 + [1], CONTEXT_EDGES, 3)  # 3.0 -> 2.9
    bench = {"config": {"family": "eagle3"}, "methods": {"greedy": {}, "eagle3": {"by_context": decayed}}}
    (run / "bench_long.json").write_text(json.dumps(bench))
    found = doctor.check_context_decay(d)
    assert found.holds and found.estimated_tau_loss == pytest.approx(2.0)
    assert found.evidence["shortest"] == "<512" and found.evidence["longest"] == "4K-8K"
    assert "--max-tokens 8192" in found.fix and "τ 1.00 at context 4K-8K vs 3.00 at <512" in found.summary
    from test_doctor import ids
    assert ids({"causes": [{"id": found.id, "fix": found.fix}]}) == ["context_decay"]   # the fix's command parses
    bench["methods"]["eagle3"]["by_context"] = held
    (run / "bench_long.json").write_text(json.dumps(bench))
    found = doctor.check_context_decay(d)
    assert not found.holds and found.estimated_tau_loss is None         # within 10% (and a quarter token)
    # the measurement reaching the longest context counts: an eval whose positions stop at 2K does not
    (run / "eval.json").write_text(json.dumps({"by_context": rounds_by_context([10, 1000], [0, 2], CONTEXT_EDGES, 3)}))
    assert doctor.check_context_decay(d).evidence["file"] == "bench_long.json"


def test_sliding_window_ttt_mask():
    from specdraft.model.eagle3.module import ttt_mask

    doc = torch.tensor([[0, 0, 0, 0, 0, 0, 1, 1]])
    full, slid = ttt_mask(doc, 0)[0, 0], ttt_mask(doc, 0, window=3)[0, 0]
    assert full[5].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 5]
    assert slid[5].nonzero().flatten().tolist() == [3, 4, 5]             # the last 3 positions, itself included
    assert slid[7].nonzero().flatten().tolist() == [6, 7]                # never across a document
    step1 = ttt_mask(doc, 1, window=3)[0, 0]                              # the query sits at position i + 1
    assert step1[5, :8].nonzero().flatten().tolist() == [4, 5] and step1[5, 8:].nonzero().flatten().tolist() == [5]
    assert torch.equal(ttt_mask(doc, 2, window=100), ttt_mask(doc, 2))   # a window past the row is full attention


@pytest.mark.parametrize("window", [0, 3])
@pytest.mark.parametrize("step", [0, 1, 3])
def test_ttt_attention_by_query_blocks_equals_the_dense_mask(step, window):
    """TTTBlocks attends block by block to the keys a block can see; the result is the dense ttt_mask's
    (packed documents and padding included), and bit for bit where one block holds every query."""
    from specdraft.model.eagle3.module import TTTBlocks, ttt_mask

    g = torch.Generator().manual_seed(step + window)
    doc = torch.tensor([[0] * 7 + [1] * 9 + [2] * 3 + [-1] * 3, [0] * 13 + [1] * 9])     # B=2, T=22
    T = doc.shape[1]
    q = torch.randn(2, 4, T, 8, generator=g)
    k, v = (torch.randn(2, 2, (step + 1) * T, 8, generator=g) for _ in range(2))
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=ttt_mask(doc, step, window),
                                                             enable_gqa=True)
    for block in (1, 4, 5, 64):
        blocked = TTTBlocks(doc, step, window, block).attend(q, k, v)
        assert torch.allclose(blocked, dense, atol=1e-6), block
    assert torch.equal(TTTBlocks(doc, step, window, T).attend(q, k, v), dense)


def test_chunked_kl_equals_autograds_kl_in_value_gradient_and_argmax(monkeypatch):
    """ChunkKL (the default loss, chunk by chunk, gradient by hand) gives the KL, gradient and argmax that
    autograd gives over log_softmax, for float32 and bfloat16 logits, held or chunked teacher rows."""
    from specdraft.train import objective as O

    g = torch.Generator().manual_seed(0)
    R, N = 37, 50
    teacher = O.TeacherHead(torch.ones(16), torch.randn(N, 16, generator=g), 1e-5)
    last = torch.randn(60, 16, generator=g)
    t_rows = torch.randint(0, 60, (R,), generator=g)
    weight = torch.rand(R, generator=g)
    for dtype in (torch.float32, torch.bfloat16):
        base = torch.randn(R, N, generator=g).to(dtype)
        ref = base.clone().requires_grad_()
        t_logp = teacher.log_probs(last)[t_rows]
        expected = O.position_loss(torch.log_softmax(ref.float(), -1), t_logp, t_logp.argmax(-1), "kl")
        (expected * weight).sum().backward()
        for chunk, hold in ((8, 60), (512, 60), (8, 5)):                 # loss chunks; teacher rows held or not
            monkeypatch.setattr(O, "LOSS_CHUNK", chunk)
            monkeypatch.setattr(O, "TEACHER_HOLD_BYTES", hold * 4 * N)
            rows = O.TeacherRows(teacher, {"last": last[None]}, torch.ones(1, 60, dtype=torch.bool))
            mine = base.clone().requires_grad_()
            kl, top = O.chunked_position_loss(mine, rows, t_rows, t_logp.argmax(-1), "kl")
            (kl * weight).sum().backward()
            assert torch.allclose(kl, expected.detach(), atol=1e-5), (dtype, chunk, hold)
            assert torch.allclose(mine.grad.float(), ref.grad.float(), atol=1e-2 if dtype == torch.bfloat16 else 1e-6)
            assert torch.equal(top, base.float().argmax(-1))


def test_rows_of_8k_tokens_store_offsets_and_ttt(tmp_path):
    """An 8K-token sample beside short ones: the store's offsets give every sample back whole, a packed
    8K row keeps it uncut, and the TTT unroll with a sliding window trains every position of it."""
    from specdraft.data.store import HiddenStore, StoreWriter, new_manifest
    from specdraft.model.eagle3.objective import ttt_forward
    from specdraft.testing import tiny_drafter_for, tiny_llama
    from specdraft.train.batches import StoreBatches
    from specdraft.train.objective import TeacherHead

    lengths, H = [8192, 300, 7000], 64
    n, g = sum(lengths), torch.Generator().manual_seed(0)
    ids = torch.randint(10, 250, (n,), generator=g)
    mask = (torch.rand(n, generator=g) > 0.3).to(torch.uint8)
    writer = StoreWriter(tmp_path / "hidden", new_manifest({"id": "tiny"}, [1, 4, 6], "bfloat16", H))
    writer.write_shard(torch.randn(n, 3, H, generator=g), torch.randn(n, H, generator=g), ids, mask,
                       torch.tensor([0, 8192, 8492, n]))
    writer.save(complete=True)
    store = HiddenStore(tmp_path / "hidden")
    assert store.sample_lengths == lengths
    assert torch.equal(store[2]["input_ids"], ids[8492:]) and torch.equal(store[0]["loss_mask"], mask[:8192])
    rows = StoreBatches(store, [0, 1, 2], max_tokens=8192, shuffle=False)
    assert rows.rows(0) == [[0], [1, 2]]                                 # the 8K sample alone in its row, whole
    batch = next(iter(rows.batches(0)))
    assert batch["position_ids"][0, -1] == 8191 and torch.equal(batch["input_ids"][0], ids[:8192])

    target = tiny_llama()
    net = tiny_drafter_for(target, [1, 4, 6]).eval()
    net.config.sliding_window = 512
    with torch.no_grad():
        loss, sums = ttt_forward(net, TeacherHead.from_target(target, net.d2t), batch, steps=2)
    assert torch.isfinite(loss)
    for k in range(2):       # every trained position of the 8K row is measured, none lost to the mask or offsets
        assert int(sums[f"count_{k}"]) == int(mask[k + 2:8192].sum())


def test_sliding_window_is_exported_where_vllm_reads_it_and_refused_where_no_engine_serves_it():
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    from specdraft.families import family
    from specdraft.model.eagle3 import checkpoint, sglang
    from specdraft.testing import tiny_llama
    from specdraft.train.config import RunConfig

    target = tiny_llama()
    cfg = family("eagle3").new_config(target.config, 64, [1, 4, 6], "tiny", RunConfig(sliding_window=2048))
    assert cfg.sliding_window == 2048
    config = checkpoint.build_config(cfg, "float32", 3, ["LlamaForCausalLM"])
    read = SpeculatorsConfig.extract_transformers_pre_trained_config(json.loads(json.dumps(config)))
    assert read["layer_types"] == ["sliding_attention"] and read["sliding_window"] == 2048
    foreign = {k: v for k, v in config.items() if k != "specdraft"}      # a speculators file not written by us
    assert checkpoint.parse_config(foreign, "d").sliding_window == 2048
    plain = checkpoint.build_config(family("eagle3").new_config(target.config, 64, [1, 4, 6], "tiny", RunConfig()),
                                    "float32", 3, ["LlamaForCausalLM"])
    assert "layer_types" not in plain["transformer_layer_config"]          # full attention: nothing added
    foreign["transformer_layer_config"]["sliding_window"] = None
    with pytest.raises(SpecdraftError, match="sliding_window is None"):
        checkpoint.parse_config(foreign, "d")
    with pytest.raises(SpecdraftError, match="sliding window of 2048 .* SGLang"):
        sglang.build_config(cfg, "float32", "out")
    for other in ("dflash", "dspark"):
        with pytest.raises(SpecdraftError, match="--sliding-window 2048"):
            family(other).new_config(target.config, 64, [1, 4, 6], "tiny", RunConfig(family=other, sliding_window=2048))


@pytest.mark.parametrize("family_name", ["eagle3", "dflash"])
def test_chunked_teacher_gives_the_same_loss_and_never_holds_a_long_rows_logits(monkeypatch, family_name):
    from specdraft.families import family
    from specdraft.testing import tiny_drafter_for, tiny_llama
    from specdraft.train import objective as O
    from specdraft.train.config import RunConfig

    target = tiny_llama()
    net = tiny_drafter_for(target, [1, 4, 6], family=family_name)
    T, g = 96, torch.Generator().manual_seed(1)
    batch = {"input_ids": torch.randint(10, 250, (1, T), generator=g), "aux": torch.randn(1, T, 3, 64, generator=g),
             "last": torch.randn(1, T, 64, generator=g), "loss_mask": (torch.rand(1, T, generator=g) > 0.2).to(torch.uint8),
             "doc_ids": torch.tensor([[0] * 60 + [1] * 36]), "position_ids": torch.tensor([list(range(60)) + list(range(36))])}
    run = RunConfig(family=family_name, ttt_steps=2)

    def measure():
        torch.manual_seed(0)
        objective = family(family_name).objective(net, O.TeacherHead.from_target(target, net.d2t), run).eval()
        loss, sums = objective(batch)
        loss.backward()
        grad = net.fc.weight.grad.clone()
        net.zero_grad()
        return loss.detach(), sums, grad

    whole = measure()
    seen = []
    real = O.TeacherHead.log_probs
    monkeypatch.setattr(O.TeacherHead, "log_probs", lambda self, last: seen.append(len(last)) or real(self, last))
    monkeypatch.setattr(O, "TEACHER_HOLD_BYTES", 16 * 4 * len(net.d2t))       # 16 rows of the draft vocab
    chunked = measure()
    assert seen and max(seen) <= 16                                       # no more than a chunk's rows at once
    assert torch.allclose(whole[0], chunked[0], atol=1e-5) and torch.allclose(whole[2], chunked[2], atol=1e-5)
    assert {k: float(v) for k, v in whole[1].items()} == pytest.approx({k: float(v) for k, v in chunked[1].items()})


def test_the_recipes_max_tokens_keeps_long_samples_for_long_rows(tmp_path):
    from test_doctor import assert_parses

    from specdraft.pipeline import load_recipe, prepare_args, recipe_file

    quick = load_recipe(recipe_file("quick"))
    assert quick.max_tokens == 512 and "--max-length" not in prepare_args("default", "builtin", quick, "hf", tmp_path)
    long_file = tmp_path / "long.yaml"
    long_file.write_text(recipe_file("quick").read_text().replace("max_tokens: 512", "max_tokens: 8192"))
    long = load_recipe(long_file)
    args = prepare_args("default", "builtin", long, "hf", tmp_path / "data")
    assert long.max_tokens == 8192 and args[args.index("--max-length") + 1] == "8192"
    assert_parses(" ".join(args), {"id": "recipe"})                       # the real CLI takes it


def test_our_proposer_drafts_with_the_window_it_was_trained_with():
    """A sliding-window drafter drafts in our loop as vLLM serves it: the query at position q sees keys
    q - window + 1 .. q only. Keys and values of the one decoder layer depend on their own position's
    input alone and RoPE on relative positions, so with a window W the last position's draft equals the
    draft over the last W positions alone (catch-up, then each chain step, then the tree); without the
    window it does not (the check can fail)."""
    from specdraft.infer.sampling import Sampling
    from specdraft.infer.tree import TreeShape
    from specdraft.model.common.chain import causal_chunk_mask
    from specdraft.model.eagle3.config import DrafterConfig
    from specdraft.model.eagle3.module import Eagle3Drafter
    from specdraft.model.eagle3.proposer import EagleProposer
    from specdraft.testing import tiny_llama

    assert causal_chunk_mask(5, 1, "cpu") is None and causal_chunk_mask(3, 1, "cpu", window=4) is None
    m = causal_chunk_mask(4, 2, "cpu", window=3)[0, 0]                       # queries at positions 4, 5
    assert m.tolist() == [[False, False, True, True, True, False], [False, False, False, True, True, True]]
    torch.manual_seed(0)
    target = tiny_llama(vocab_size=100, hidden_size=32, num_layers=8, num_heads=4, num_kv_heads=2)
    W, P = 6, 20
    aux = torch.randn(P, 3, 32)
    tokens = torch.randint(3, 100, (P + 1,)).tolist()

    def drafts(window: int, last: int, tree=None):
        cfg = DrafterConfig.from_target(target.config, draft_vocab_size=100, aux_layer_ids=[2, 4, 5],
                                        sliding_window=window)
        torch.manual_seed(1)
        proposer = EagleProposer(Eagle3Drafter(cfg), k=4, tree=tree)
        proposer.observe(aux[-last:])
        logits, hidden = proposer.catch_up(tokens[-last - 1:])
        chain = [logits]
        for step in range(3):
            logits, hidden = proposer.step(logits.argmax(), hidden, last + step)
            chain.append(logits)
        proposer.reset()
        proposer.observe(aux[-last:])
        draft = proposer.propose(tokens[-last - 1:], 8, Sampling(), torch.Generator())
        return torch.stack(chain), draft.tokens

    windowed, windowed_tree = drafts(W, P, TreeShape(depth=3, topk=2, total=5))
    alone, alone_tree = drafts(W, W, TreeShape(depth=3, topk=2, total=5))
    full, _ = drafts(0, P)
    assert torch.allclose(windowed[0], alone[0], atol=1e-5)                  # catch-up's last position
    assert torch.allclose(windowed, alone, atol=1e-4)                        # each chain step (window 6 > K)
    assert windowed_tree == alone_tree
    assert not torch.allclose(full[0], alone[0], atol=1e-3)                  # the whole context differs


def test_long_conversations_train_on_files_the_long_bench_never_reads(tiny_target, tmp_path):
    """`prepare --conversations long`: continuations of standard-library source spread up to --max-length
    tokens, kept whole, from files that no document of `bench --prompts long` reads; refused in a
    mixture and under a --max-length that leaves no long document, in one line each."""
    from specdraft.data.documents import BENCH_CHARS, concatenated, long_conversations, stdlib_files, training_files
    from specdraft.data.prepare import prepare
    from specdraft.data.prepared import load_prepared

    files, pool = stdlib_files(), training_files()
    bench_reads = {p for i in range(8) for p in concatenated(files[(i * 37) % len(files):] + files, BENCH_CHARS)[1]}
    assert bench_reads and not bench_reads & {str(f) for f in pool} and len(pool) >= 100
    chars = len                                                            # a counter: one token per character
    convs = long_conversations(4, 4096, chars)
    lengths = [chars(c[0]["content"]) for c in convs]
    assert lengths == sorted(lengths) and lengths[-1] > 3000 and all(c[1]["content"] for c in convs)
    assert all(len(c[1]["content"]) <= 256 for c in convs)                # the answer: what follows, cut
    meta = prepare(str(tiny_target), "long", tmp_path / "long", limit=3, max_length=2048)
    ds, _ = load_prepared(tmp_path / "long")
    assert meta["counts"]["samples"] == 3 and max(len(x) for x in ds["input_ids"]) > 1500   # byte tokenizer
    assert max(len(x) for x in ds["input_ids"]) <= 2048 and meta["counts"]["dropped"]["too_long"] == 0
    with pytest.raises(SpecdraftError, match="^--max-length 512: --conversations long"):
        prepare(str(tiny_target), "long", tmp_path / "short", limit=3, max_length=512)
    with pytest.raises(SpecdraftError, match="^--conversations long: long documents are cut"):
        prepare(str(tiny_target), "long:1,pydoc:1", tmp_path / "mixed", limit=3, max_length=2048)
