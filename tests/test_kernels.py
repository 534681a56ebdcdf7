"""Kernel paths chosen by measurement (issue 23): a faked timing table picks the path it should, the
choice is cached per machine, and every path computes F.linear's result."""

import json

import pytest
import torch

from specdraft import dtypes, kernels
from specdraft.infer.speculative import few_row_matmul


@pytest.fixture(autouse=True)
def fresh_tables(monkeypatch, tmp_path):
    """Each test starts with no table in this process and an empty cache folder, and times the real
    paths (conftest's SPECDRAFT_KERNEL_PATH=linear removed)."""
    monkeypatch.setattr(kernels, "_TABLES", {})
    monkeypatch.setattr(kernels, "KERNEL_SPENT", {"s": 0.0})
    monkeypatch.setattr(kernels, "DEFERRED", set())
    monkeypatch.setenv("SPECDRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECDRAFT_KERNEL_PATH", raising=False)


def faked(mm_wins: dict[tuple[int, int], set[int]], calls: list | None = None):
    """A timer where mm(W, x^T) takes 0.5 ms and F.linear 1 ms at the row counts listed per shape,
    and the other way round everywhere else."""
    def timer(shape, rows):
        if calls is not None:
            calls.append((shape, rows))
        wins = rows in mm_wins.get(shape, set())
        return {"mm": 0.5 if wins else 1.0, "linear": 1.0 if wins else 0.5}
    return timer


def test_pick_needs_a_clear_win_for_mm():
    assert kernels.pick({"linear": 1.0, "mm": 0.5}) == "mm"
    assert kernels.pick({"linear": 1.0, "mm": 0.97}) == "linear"      # within the noise margin: the default
    assert kernels.pick({"linear": 0.5, "mm": 1.0}) == "linear"


def test_a_faked_timing_table_picks_the_faster_path_per_shape_and_rows():
    up, lm_head = (24, 40), (24, 96)
    table = kernels.kernel_table([up, lm_head], timer=faked({up: {2, 3, 4, 5}, lm_head: {12, 16}}))
    flags = table.use_mm(up)
    assert [n for n in range(len(flags)) if flags[n]] == [2, 3, 4, 5]
    flags = table.use_mm(lm_head)
    # 10 and 11 rows are not timed: they take 12's choice; 13-16 take 16's; nothing past the last
    assert [n for n in range(len(flags)) if flags[n]] == [10, 11, 12, 13, 14, 15, 16]
    assert table.use_mm(lm_head, max_rows=40)[33:] == (False,) * 8
    mm_rows = {row["shape"]: row["mm_rows"] for row in table.summary()}
    assert mm_rows == {"24x40": [2, 3, 4, 5], "24x96": [12, 16]}
    assert kernels.where_mm(mm_rows["24x40"]) == "mm(W, x^T) at 2-5 rows, F.linear elsewhere"
    assert kernels.where_mm(mm_rows["24x96"]) == "mm(W, x^T) at 12-16 rows, F.linear elsewhere"
    assert kernels.where_mm([]) == "F.linear at every row count"


def test_the_table_is_measured_once_per_machine_and_read_back_from_the_cache(tmp_path):
    shape = (24, 40)
    calls = []
    kernels.kernel_table([shape], timer=faked({shape: {2}}, calls))
    assert len(calls) == len(kernels.ROWS)                          # both paths at every row count
    saved = json.loads(kernels.cache_file(kernels.machine_key(torch.float32)).read_text())
    assert saved["machine"]["cpu"] and saved["timings_ms"]["24x40"]["2"] == {"linear": 1.0, "mm": 0.5}

    def no_timing(*args):
        raise AssertionError("measured again")
    assert kernels.kernel_table([shape], timer=no_timing).use_mm(shape)[2]          # this process
    kernels._TABLES.clear()
    assert kernels.kernel_table([shape], timer=no_timing).use_mm(shape)[2]          # the cache file
    kernels._TABLES.clear()
    calls.clear()
    kernels.kernel_table([shape, (40, 24)], timer=faked({}, calls))                  # only the new shape
    assert {c[0] for c in calls} == {(40, 24)}
    # another dtype is another table (bf16 weights take other kernels)
    assert kernels.machine_key(torch.bfloat16) != kernels.machine_key(torch.float32)


def test_a_damaged_cache_file_is_measured_again():
    shape = (24, 40)
    path = kernels.cache_file(kernels.machine_key(torch.float32))
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    calls = []
    assert kernels.kernel_table([shape], timer=faked({shape: {3}}, calls)).use_mm(shape)[3]
    assert calls and json.loads(path.read_text())["timings_ms"]["24x40"]


def test_time_paths_times_both_paths():
    timed = kernels.time_paths((64, 160), 3, repeats=2)
    assert set(timed) == {"linear", "mm"} and all(ms > 0 for ms in timed.values())


def test_measured_paths_run_inside_few_row_matmul_and_match_linear():
    """With the real timer on this machine, whatever it picks computes F.linear's output."""
    layer = torch.nn.Linear(64, 160)
    model = torch.nn.Sequential(layer)
    described = kernels.describe(model)
    assert [row["shape"] for row in described["shapes"]] == ["64x160"]
    assert "kernel paths on" in kernels.format_paths(described)
    for rows in (1, 2, 4, 9, 40):
        x = torch.randn(1, rows, 64)
        with few_row_matmul(model):
            got = model(x)
        torch.testing.assert_close(got, torch.nn.functional.linear(x, layer.weight, layer.bias))


@pytest.mark.parametrize("tie", [False, True])
def test_streamed_weight_bytes_count_a_tied_head_once_and_skip_an_untied_embedding(tie):
    """The floor's numerator: what one forward reads. A lookup reads one row of an untied embedding."""
    from specdraft.bandwidth import streamed_weight_bytes, weight_floor
    from specdraft.testing import tiny_llama

    model = tiny_llama(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64, seed=0, tie=tie)
    embed = model.get_input_embeddings().weight
    every = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    assert (model.get_output_embeddings().weight.data_ptr() == embed.data_ptr()) == tie
    expected = sum(every.values()) - (0 if tie else embed.numel() * embed.element_size())
    assert streamed_weight_bytes(model) == expected
    floor = weight_floor(model, bandwidth_gbs=10.0)
    assert floor["floor_ms"] == pytest.approx(expected / 10e9 * 1e3) and floor["bandwidth_gbs"] == 10.0


def test_kernel_path_linear_skips_the_timing_and_anything_else_is_one_line(monkeypatch):
    from specdraft.errors import SpecdraftError

    monkeypatch.setenv("SPECDRAFT_KERNEL_PATH", "linear")
    layer = torch.nn.Linear(64, 160)
    assert not any(kernels.kernel_table([(64, 160)]).use_mm((64, 160)))         # F.linear at every row count
    assert not kernels.cache_file(kernels.machine_key(torch.float32)).exists()   # nothing timed, nothing cached
    assert "SPECDRAFT_KERNEL_PATH=linear" in kernels.describe(torch.nn.Sequential(layer))["cache"]
    monkeypatch.setenv("SPECDRAFT_KERNEL_PATH", "mm")
    with pytest.raises(SpecdraftError, match="SPECDRAFT_KERNEL_PATH=mm: use linear"):
        kernels.kernel_table([(64, 160)])


def test_faster_dtype_needs_a_clear_win_and_is_timed_once_per_machine(tmp_path, monkeypatch):
    """Regeneration's 'auto' dtype (issue 33): another dtype replaces float32 only when it beats it by
    DTYPE_MARGIN over the forward's Linears, and the timing is cached, not repeated."""
    monkeypatch.setenv("SPECDRAFT_CACHE", str(tmp_path))
    shapes = {(64, 128): 3, (128, 64): 1}
    speed = {torch.float32: 1.0, torch.bfloat16: 0.9}
    timed = []

    def timer(shape, rows, dtype):
        timed.append((shape, rows, dtype))
        return speed[dtype]

    dtype, ms = dtypes.faster_dtype(shapes, 64, timer=timer)
    assert dtype == "float32" and ms == {"float32": 4.0, "bfloat16": 3.6}          # 10% faster: not enough
    assert len(timed) == 4
    speed[torch.bfloat16] = 0.5
    dtype, ms = dtypes.faster_dtype(shapes, 32, timer=timer)
    assert dtype == "bfloat16" and ms["bfloat16"] == 2.0
    monkeypatch.setattr(dtypes, "time_paths", lambda *a, **k: pytest.fail("timed again"))
    assert dtypes.faster_dtype(shapes, 32) == (dtype, ms)                          # read from the cache


def test_the_whole_forward_picks_its_path_per_row_count_and_the_runner_runs_it(monkeypatch):
    """Issue 35: measure_costs times the loop's verify with the per-Linear table's paths, with F.linear
    everywhere and with mm(W, x^T) everywhere; the choice per row count is cached, and a new TargetRunner
    runs it; the verify curve measure_costs returns is the chosen path's."""
    from specdraft.infer import auto, speculative
    from specdraft.testing import tiny_llama

    model = tiny_llama(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64, seed=3)
    linears = kernels.target_linears(model)
    table = [tuple([False, True] + [False] * 31) for _ in linears]        # the table: mm at 1 row only
    monkeypatch.setattr(kernels, "mm_flags", lambda ls, timer=None: list(table))
    monkeypatch.setattr(speculative, "mm_flags", lambda ls, timer=None: list(table))
    costs = auto.measure_costs(model, None, 3, 8, rounds=1, repeats=1)
    whole = costs["whole_forward"]
    assert set(whole["ms"]) == set(whole["choice"]) == {1, 2, 3}
    assert all(set(t) == {"table", "linear", "mm"} for t in whole["ms"].values())
    assert costs["verify_ms"] == [whole["ms"][n][whole["choice"][n]] for n in (1, 2, 3)]
    assert {"verify_1", "linear_verify_1", "mm_verify_1"} <= set(costs["samples"])
    # the rule: the fastest path where it beats F.linear by 5%, else F.linear
    choice = kernels.record_whole_forward(linears, {1: {"table": 1.0, "linear": 2.0, "mm": 1.5},
                                                    2: {"table": 0.97, "linear": 1.0, "mm": 0.98},
                                                    3: {"table": 2.0, "linear": 2.0, "mm": 1.0}})
    assert choice == {1: "table", 2: "linear", 3: "mm"}
    kernels.record_whole_forward(linears, {5: {"table": 1.0, "linear": 1.0, "mm": 0.5}})   # more rows: kept beside
    saved = json.loads(kernels.forward_file(linears).read_text())
    assert saved["choice"] == {"1": "table", "2": "linear", "3": "mm", "5": "mm"} and set(saved["ms"]) == set(saved["choice"])
    flags = speculative.TargetRunner(model, None, speculative.Profile(), rows=3, max_len=16).mm_flags
    assert all(f[1] and not f[2] and f[3] and not f[4] for f in flags)     # 4 rows: unmeasured, the table's
    monkeypatch.setenv("SPECDRAFT_KERNEL_PATH", "linear")                # the suite's setting: nothing measured
    assert kernels.whole_forward_flags(linears, table) == table
    assert auto.measure_costs(model, None, 2, 8, rounds=1, repeats=1)["whole_forward"] is None


def test_kernel_timing_stops_at_its_budget_and_the_next_process_times_the_rest(monkeypatch, capsys):
    """Issue 56: a new target's first generate spent minutes timing kernels without a word. The largest shapes
    are timed first, for at most budget_s per process (a drafter's table and the target's share it: the first generate
    with an untrained drafter on a 0.5B Qwen3 shape timed 12 + 14 s); the others run F.linear now and are timed by the
    next process."""
    clock = [0.0]
    monkeypatch.setattr(kernels.time, "perf_counter", lambda: clock[0])
    shapes = [(24, 40), (24, 96), (64, 160)]
    calls = []

    def slow(shape, rows):                     # 1 s per row count: 13 s per shape
        clock[0] += 1.0
        return faked({s: {2} for s in shapes}, calls)(shape, rows)

    table = kernels.kernel_table(shapes, timer=slow, budget_s=20)
    assert list(table.timings) == ["64x160", "24x96"]                      # largest first, two within 20 s
    assert not any(table.use_mm((24, 40)))                                 # the third: F.linear for now
    assert "2 of 3 shape(s) timed in 26 s; the other 1 run F.linear in this process and are timed by the next" \
        in capsys.readouterr().err
    drafter = [(16, 24)]                                                    # another table, same process:
    assert not any(kernels.kernel_table(drafter, timer=slow, budget_s=20).use_mm((16, 24)))   # budget spent
    assert "0 of 1 shape(s) timed" in capsys.readouterr().err
    for _ in range(3):                     # a bench asks again per run: the shapes left over are said once
        assert not any(kernels.kernel_table(drafter + shapes, timer=slow, budget_s=20).use_mm((16, 24)))
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(kernels, "_TABLES", {})                            # the next process
    monkeypatch.setattr(kernels, "KERNEL_SPENT", {"s": 0.0})
    monkeypatch.setattr(kernels, "DEFERRED", set())
    calls.clear()
    assert kernels.kernel_table(shapes, timer=slow, budget_s=20).use_mm((24, 40))[2]
    assert {shape for shape, _ in calls} == {(24, 40)}


def test_dtype_timing_is_bounded_in_rows_and_seconds(tmp_path, monkeypatch):
    """Issue 56: a small Qwen3's capture spent 110-120 s timing float32 vs bf16 at its 2048-row batches before a
    2-second capture. Rows are capped (DTYPE_ROWS_MAX) and shapes are timed, the most work first, only while the
    budget lasts; the ratio over the shapes timed decides."""
    monkeypatch.setenv("SPECDRAFT_CACHE", str(tmp_path))
    clock = [0.0]
    monkeypatch.setattr(dtypes.time, "perf_counter", lambda: clock[0])
    timed = []

    def timer(shape, rows, dtype):
        timed.append((shape, rows))
        clock[0] += 10.0                                    # 10 s per shape and dtype
        return 1.0 if dtype == torch.float32 else 0.5

    shapes = {(64, 4096): 1, (64, 128): 30, (64, 64): 2}   # work: 262144, 245760, 8192
    dtype, ms = dtypes.faster_dtype(shapes, 2048, timer=timer, budget_s=25)
    assert {rows for _, rows in timed} == {dtypes.DTYPE_ROWS_MAX}
    assert [shape for shape, _ in timed] == [(64, 4096)] * 2 + [(64, 128)] * 2   # largest work first; then over budget
    assert dtype == "bfloat16" and ms == {"float32": 31.0, "bfloat16": 15.5}
