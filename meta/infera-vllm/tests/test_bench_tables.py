"""The benchmarks' shared table and plot (``benchmarks/_results.py``), and each benchmark's table and plot drawn
from the rows it recorded on the H200 (``benchmarks/results/h200/``): a benchmark that runs for minutes on the
GPU must not fail at its last step on a renamed key."""

import importlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "benchmarks"
if not (BENCH / "_results.py").is_file():
    pytest.skip("benchmarks/ is not here (tests run outside the repository)", allow_module_level=True)
pytest.importorskip("matplotlib")
sys.path.insert(0, str(BENCH))
results = importlib.import_module("_results")
H200 = BENCH / "results" / "h200"


def _recorded(path: str) -> dict:
    return json.loads((H200 / path).read_text())


def _png(path: Path) -> bytes:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, path
    return data


def test_table_aligns_columns_and_marks_missing_values():
    rows = [{"name": "a", "us": 1.234, "x": None}, {"name": "longer", "us": 123.0, "x": 2.0}]
    text = results.table(rows, [results.Column("name", "name", align="<"), results.Column("us", "us", ".1f"),
                                results.Column("x", lambda r: r["x"] and r["x"] * 2, ".2f")], "legend line")
    lines = text.splitlines()
    assert lines[0] == "legend line"
    assert lines[1].split() == ["name", "us", "x"] and set(lines[2]) == {"-"}
    assert lines[3].split() == ["a", "1.2", "-"] and lines[4].split() == ["longer", "123.0", "4.00"]
    assert len({len(line) for line in lines[1:4]}) == 1  # fixed width: the widest cell sets each column


def test_figure_draws_bars_lines_and_bad_marks(tmp_path):
    bars = [results.Series("ours", [1.0, None], bad=[False, True]), results.Series("theirs", [2.0, 3.0])]
    grid = [[results.Panel("bars", ["a", "b"], "us", bars=bars, lines=[results.Series("floor", [0.5, 0.5], "k--")],
                           logy=True)],
            [results.Panel("lines", [1, 2, 4], "TB/s", lines=[results.Series("ours", [1, 2, 3])], logx=True,
                           ceiling=(4.0, "ceiling")),
             results.Panel("more", [1, 2], "TB/s", lines=[results.Series("ours", [1, None])], ylim=(0, 5))]]
    results.figure(str(tmp_path / "f.png"), grid, "title")
    _png(tmp_path / "f.png")


def test_attn_paged_tables_and_plots_from_recorded_rows(tmp_path, capsys):
    bench = importlib.import_module("bench_attn_paged")
    prefill = importlib.import_module("bench_attn_paged_prefill")
    doc = _recorded("attn-paged/bench_attn_paged.json")
    assert bench.print_table(doc["rows"], doc["copy_ceiling_tb_s"]) == []  # every recorded row was ok
    bench.plot(doc["rows"], doc["copy_ceiling_tb_s"], str(tmp_path / "decode.png"))
    assert prefill.print_prefill_table(doc["prefill"]["rows"]) == []
    prefill.plot_prefill(doc["prefill"]["rows"], str(tmp_path / "prefill.png"))
    out = capsys.readouterr().out
    first = doc["rows"][0]
    assert f"{first['ours_us']:.1f}" in out and f"{first['speedup_vs_fa3']:.2f}" in out
    _png(tmp_path / "decode.png"), _png(tmp_path / "prefill.png")
    bad = dict(first, ours_ok=False, ours_error=None)
    assert bench.print_table([bad], doc["copy_ceiling_tb_s"]) == [(bad, "ours")]
    assert "WRONG/FAILED: ours" in capsys.readouterr().out


@pytest.mark.parametrize("module, recorded, args", [
    ("bench_moe_decode", "moe-decode/bench_moe_decode_per_shape.json", ("copy_ceiling_tb_s", "read_ceiling_tb_s")),
    ("bench_norm", "norm-final/bench_norm.json", ("copy_ceiling_tb_s",)),
    ("bench_linear", "linear-hipblaslt/bench_linear.json", ("copy_ceiling_tb_s",)),
])
def test_op_benchmark_table_and_plot_from_recorded_rows(module, recorded, args, tmp_path, capsys):
    bench = importlib.import_module(module)
    doc = _recorded(recorded)
    bench.print_table(doc["rows"], *(doc[a] for a in args))
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 + len(doc["rows"])  # legend, header, rule, a line per row
    plot_args = {"bench_moe_decode": (doc.get("read_ceiling_tb_s"),), "bench_norm": (doc["copy_ceiling_tb_s"],),
                 "bench_linear": ()}[module]
    bench.plot(doc["rows"], *plot_args, str(tmp_path / "p.png"))
    _png(tmp_path / "p.png")
