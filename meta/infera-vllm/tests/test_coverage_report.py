import json
import os

import pytest

from infera_vllm import coverage, report
from infera_vllm.spec import Decline


@pytest.fixture(autouse=True)
def _fresh_registry():
    saved = dict(coverage._counts), dict(coverage._ops)
    coverage._counts.clear()
    coverage._ops.clear()
    yield
    coverage._counts.clear(), coverage._ops.clear()
    coverage._counts.update(saved[0]), coverage._ops.update(saved[1])


def test_counter_counts_per_key():
    hit = coverage.counter("norm", "kernel", bucket="1")
    miss = coverage.counter("norm", "fallback", "dtype", "3-4", at="trace")
    for _ in range(3):
        hit()
    miss()
    counts = {(c["route"], c["reason"], c["bucket"], c["at"]): c["count"] for c in coverage.snapshot()["counts"]}
    assert counts == {("kernel", "", "1", "call"): 3, ("fallback", "dtype", "3-4", "trace"): 1}


@pytest.mark.parametrize("route, at", [("gpu", "call"), ("kernel", "sometimes")])
def test_counter_rejects_unknown_route_or_time(route, at):
    with pytest.raises(ValueError):
        coverage.counter("norm", route, at=at)


def test_call_counts_routes_an_op_declares(monkeypatch):
    """A reason an op declares as a route of its own (attn-paged's "fa3") is counted under that route, with no
    reason, and strict mode lets it through like a handover; other reasons keep their routes."""
    monkeypatch.setattr(coverage, "_strict", True)
    counts = coverage.CallCounts("attn-demo", handovers=("by-design",), routes=("other-lib",))
    counts("other-lib", 3)
    counts(None, 1)
    counts("by-design", 2)
    got = {(c["route"], c["reason"], c["bucket"]): c["count"] for c in coverage.snapshot()["counts"]}
    assert got == {("other-lib", "", "3-4"): 1, ("kernel", "", "1"): 1, ("handover", "by-design", "2"): 1}
    with pytest.raises(coverage.StrictDeclineError):
        counts("no-capability", 1)  # a fallback: strict mode refuses it


@pytest.mark.parametrize("n, bucket", [(1, "1"), (2, "2"), (3, "3-4"), (4, "3-4"), (5, "5-8"), (8, "5-8"), (9, "9-16"),
                                       (1000, "513-1024"), (1025, "1025-2048")])
def test_bucket_tokens(n, bucket):
    assert coverage.bucket_tokens(n) == bucket


def _write(tmp_path, pid, name, ops, counts, run="r1", host="h"):
    doc = {"format": coverage.REPORT_FORMAT, "process": {"pid": pid, "name": name, "host": host, "run": run},
           "environment": {"gpu_family": "cpu", "vllm": "0.32.0"}, "ops": ops, "counts": counts}
    (tmp_path / f"infera-{host}-{pid}.json").write_text(json.dumps(doc))


def test_reports_of_other_runs_or_hosts_are_flagged_not_merged_silently(tmp_path):
    active = {"op": "norm", "status": "active", "reason": "", "detail": ""}
    row = {"op": "norm", "route": "kernel", "reason": "", "bucket": "1", "at": "call", "count": 2}
    _write(tmp_path, 1, "MainProcess", [active], [row])
    _write(tmp_path, 2, "EngineCore", [active], [row])
    assert "WARNING" not in report.render(report.merge(report.load(str(tmp_path))))  # one server's processes
    _write(tmp_path, 3, "MainProcess", [active], [row], run="r2")  # a later server, same directory
    _write(tmp_path, 4, "MainProcess", [active], [row], host="other")
    text = report.render(report.merge(report.load(str(tmp_path))))
    assert "WARNING: these reports come from 3 runs (" in text and "run r2 on h: 1 process(es)" in text
    assert "run r1 on other" in text and "give each run its own INFERA_VLLM_REPORT_DIR" in text


def test_an_active_op_without_calls_is_named_and_declined_ops_are_not_blamed(tmp_path):
    norm = {"op": "norm", "status": "active", "reason": "", "detail": ""}
    moe = {"op": "moe-decode", "status": "active", "reason": "", "detail": ""}
    _write(tmp_path, 1, "MainProcess", [norm, moe], [{"op": "norm", "route": "kernel", "reason": "", "bucket": "1",
                                                      "at": "call", "count": 3}])
    text = report.render(report.merge(report.load(str(tmp_path))))
    assert "moe-decode: active, no call counted" in text and "norm: active, no call" not in text
    assert "declined ops route nothing" not in text
    _write(tmp_path, 1, "MainProcess", [dict(norm, status="declined", reason="not-requested")], [])
    assert "none: no op is active, and declined ops route nothing" in report.render(
        report.merge(report.load(str(tmp_path))))


def test_merge_sums_counts_and_groups_verdicts(tmp_path):
    active = {"op": "norm", "status": "active", "reason": "", "detail": ""}
    declined = {"op": "attn-paged", "status": "declined", "reason": "platform-unsupported", "detail": "cpu"}
    row = {"op": "norm", "route": "kernel", "reason": "", "bucket": "1", "at": "call"}
    _write(tmp_path, 1, "MainProcess", [active, declined], [{**row, "count": 2}])
    _write(tmp_path, 2, "EngineCore", [active, declined], [{**row, "count": 5},
                                                           {**row, "route": "fallback", "reason": "dtype", "count": 1}])
    merged = report.merge(report.load(str(tmp_path)))
    assert [p["name"] for p in merged["processes"]] == ["MainProcess", "EngineCore"]
    assert {(o["op"], o["processes"]) for o in merged["ops"]} == {("norm", 2), ("attn-paged", 2)}
    by_route = {(c["route"], c["reason"]): (c["count"], c["processes"]) for c in merged["counts"]}
    assert by_route == {("kernel", ""): (7, 2), ("fallback", "dtype"): (1, 1)}
    text = report.render(merged)
    assert "2 process(es)" in text and "platform-unsupported" in text and "2/2" in text


def test_trace_time_counts_are_explained(tmp_path):
    _write(tmp_path, 1, "MainProcess", [], [{"op": "norm", "route": "kernel", "reason": "", "bucket": "",
                                             "at": "trace", "count": 4}])
    assert "replays are not counted" in report.render(report.merge(report.load(str(tmp_path))))


def test_load_refuses_empty_dir_and_foreign_format(tmp_path):
    with pytest.raises(FileNotFoundError):
        report.load(str(tmp_path))
    (tmp_path / "infera-x-1.json").write_text(json.dumps({"format": "other/9"}))
    with pytest.raises(ValueError, match="other/9"):
        report.load(str(tmp_path))


def test_bad_files_beside_good_ones_are_named_and_skipped(tmp_path):
    import subprocess
    import sys

    coverage.record_op("norm", distribution="infera-norm", version="0.1.0", seam="ir", decline=None)
    coverage.record("norm", "kernel", "", "1", n=3)
    good = coverage.write_report(str(tmp_path))
    text = open(good).read()
    (tmp_path / "infera-truncated-1.json").write_text(text[: len(text) // 2])
    (tmp_path / "infera-list-2.json").write_text("[1, 2]")
    (tmp_path / "infera-keys-3.json").write_text(json.dumps({"format": coverage.REPORT_FORMAT, "ops": []}))
    problems = []
    merged = report.merge(report.load(str(tmp_path), problems))
    assert [c["count"] for c in merged["counts"]] == [3] and len(merged["processes"]) == 1  # the good one
    assert {os.path.basename(p): why.split(" (")[0] for p, why in problems} == {
        "infera-truncated-1.json": "not readable as JSON", "infera-list-2.json": "a JSON list, not a report object",
        "infera-keys-3.json": "no 'process' with pid, name and host"}
    with pytest.raises(ValueError, match="infera-truncated-1.json"):
        report.load(str(tmp_path))  # without a problems list: refused, naming the file
    proc = subprocess.run([sys.executable, "-m", "infera_vllm", "report", str(tmp_path)], capture_output=True,
                          text=True)
    assert proc.returncode == 0 and "norm" in proc.stdout, proc.stderr
    assert proc.stderr.count("skipped ") == 3 and "infera-list-2.json" in proc.stderr
    one = str(tmp_path / "infera-list-2.json")  # a report file given: one line naming the directory to give
    proc = subprocess.run([sys.executable, "-m", "infera_vllm", "report", one], capture_output=True, text=True)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"is a file: give the directory that holds the infera-*.json reports ({str(tmp_path)!r})" in proc.stderr


def test_write_report_round_trips_through_merge(tmp_path):
    coverage.record_op("norm", distribution="infera-norm", version="0.1.0", seam="ir",
                       decline=Decline("not-implemented", "later"))
    coverage.record("norm", "fallback", "not-implemented", "1", n=2)
    path = coverage.write_report(str(tmp_path))
    merged = report.merge(report.load(str(tmp_path)))
    assert path.endswith(".json")
    assert merged["ops"][0]["reason"] == "not-implemented"
    assert merged["counts"][0]["count"] == 2
    assert any("norm: declined (not-implemented: later)" == line for line in coverage.summary_lines())


KILLED = r"""
import multiprocessing, os, signal, sys, time
from infera_vllm import coverage

coverage.FLUSH_EVERY_S = 0.2
coverage.configure(report_dir=sys.argv[1], strict=False, context={})
hit = coverage.counter("norm", "kernel", bucket="1")  # made before the fork, as vLLM's workers inherit them

def killed_after(n):
    for _ in range(n):
        hit()
    time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)  # no atexit, no finalizer: only the periodic write can have run

if __name__ == "__main__":
    child = multiprocessing.get_context("fork").Process(target=killed_after, args=(5,))
    child.start()
    child.join()
    print("CHILD", child.pid)
    killed_after(3)
"""


def test_a_killed_process_leaves_its_counts(tmp_path):
    """vLLM's front end kills an engine core that does not exit within seconds of SIGTERM, and workers can
    outlive the server: the counts written while the process ran must be there without an exit hook."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9, proc.stderr  # the parent killed itself too
    child = int(proc.stdout.split("CHILD")[1])
    docs = {json.load(open(p))["process"]["pid"]: json.load(open(p)) for p in tmp_path.glob("*.json")}
    counts = {pid: sum(c["count"] for c in doc["counts"]) for pid, doc in docs.items()}
    assert counts[child] == 5  # the forked child's own calls only, written by its own flusher
    assert sorted(counts.values()) == [3, 5], counts
