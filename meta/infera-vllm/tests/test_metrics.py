"""The coverage collector (infera_vllm.metrics) over report directories, and where it lands: the registry vLLM's
own ``/metrics`` router serves, with one API server (prometheus_client's global registry) and in multiprocess
mode (PROMETHEUS_MULTIPROC_DIR: a registry holding only a MultiProcessCollector). The serving test is
test_e2e_metrics_serve.py."""

import importlib.util
import json

import pytest

from conftest import run_python
from infera_vllm import coverage, metrics, report

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402


def _write(directory, pid, ops, counts, **extra):
    doc = {"format": coverage.REPORT_FORMAT, "process": {"pid": pid, "name": f"p{pid}", "host": "h"},
           "environment": {"gpu_family": "cpu", "vllm": "0.32.0"}, "ops": ops, "counts": counts, **extra}
    (directory / f"infera-h-{pid}.json").write_text(json.dumps(doc))


def _op(op, status="active", reason="", detail=""):
    return {"op": op, "status": status, "reason": reason, "detail": detail}


def _count(op, route, n, reason="", bucket="1", at="call"):
    return {"op": op, "route": route, "reason": reason, "bucket": bucket, "at": at, "count": n}


def _scrape(directory) -> dict[str, dict[tuple, float]]:
    """family name -> {labels as sorted (name, value) pairs: value}, through the text format /metrics sends."""
    registry = prometheus_client.CollectorRegistry()
    metrics.add_collector(registry, str(directory))
    text = prometheus_client.generate_latest(registry).decode()
    return {f.name: {tuple(sorted(s.labels.items())): s.value for s in f.samples}
            for f in text_string_to_metric_families(text)}


def test_a_scrape_is_the_merged_report(tmp_path):
    _write(tmp_path, 1, [_op("norm"), _op("moe", "declined", "not-tuned", "sm90 only")],
           [_count("norm", "kernel", 5), _count("norm", "fallback", 2, "dtype", "3-4", "trace")])
    _write(tmp_path, 2, [_op("norm"), _op("moe", "declined", "not-tuned", "another detail")],
           [_count("norm", "kernel", 7)])
    got = _scrape(tmp_path)
    merged = report.merge(report.load(str(tmp_path)))
    assert got["infera_calls"] == {
        (("bucket", c["bucket"]), ("counted_at", c["at"]), ("op", c["op"]), ("reason", c["reason"]),
         ("route", c["route"])): c["count"] for c in merged["counts"]}
    assert got["infera_calls"][(("bucket", "1"), ("counted_at", "call"), ("op", "norm"), ("reason", ""),
                                ("route", "kernel"))] == 12
    # verdicts per op/status/reason, summed over the detail texts, which are no labels
    assert got["infera_op_processes"] == {(("op", "moe"), ("reason", "not-tuned"), ("status", "declined")): 2,
                                       (("op", "norm"), ("reason", ""), ("status", "active")): 2}
    assert got["infera_report_processes"] == {(): 2}
    assert got["infera_report_skipped_files"] == {(): 0}
    assert ("infera_self_check" in got) == ("self_check" in merged)


def test_bad_and_missing_reports_leave_the_scrape_working(tmp_path):
    assert _scrape(tmp_path / "none-yet")["infera_report_processes"] == {(): 0}
    (tmp_path / "infera-h-9.json").write_text("{truncated")
    got = _scrape(tmp_path)  # only a bad file: nothing merged, the file counted
    assert got["infera_report_processes"] == {(): 0} and got["infera_report_skipped_files"] == {(): 1}
    _write(tmp_path, 1, [_op("norm")], [_count("norm", "kernel", 3)])
    got = _scrape(tmp_path)
    assert got["infera_report_processes"] == {(): 1} and got["infera_report_skipped_files"] == {(): 1}
    assert sum(got["infera_calls"].values()) == 3


def test_a_collector_that_fails_yields_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(metrics.report, "merge", lambda reports: 1 / 0)
    assert _scrape(tmp_path) == {}  # /metrics still answers with vLLM's own metrics


def test_self_check_section_is_exported_when_the_merged_report_has_one():
    merged = {"self_check": [{"op": "norm", "bucket": "1", "checked": 3, "passed": 2, "failed": 1, "max_error": 0.5,
                              "unchecked_at_capture": 0, "processes": 2}]}
    assert metrics.self_check_results(merged) == {("norm", "1", "passed"): 2, ("norm", "1", "failed"): 1,
                                                  ("norm", "1", "unchecked_at_capture"): 0}
    assert metrics.self_check_results({"counts": []}) is None


def test_one_collector_per_registry(tmp_path):
    registry = prometheus_client.CollectorRegistry()
    assert metrics.add_collector(registry, str(tmp_path)) is not None
    assert metrics.add_collector(registry, str(tmp_path)) is None


def test_importing_the_plugin_imports_no_prometheus_client():
    run_python("import sys, infera_vllm.plugin, infera_vllm.metrics\n"
               "assert 'prometheus_client' not in sys.modules, 'prometheus_client imported'", fixture_ops=False)


# vLLM's own /metrics router on a bare FastAPI app, in a fresh interpreter (prometheus_client picks its value
# store from PROMETHEUS_MULTIPROC_DIR when imported). A vLLM-named counter stands for vLLM's metrics: /metrics
# must show it and the coverage collector from one registry.
SERVE_METRICS = r"""
import sys
from infera_vllm import coverage, metrics

directory = sys.argv[1]
coverage.configure(report_dir=directory, strict=False, context={})
coverage.record_op("norm", distribution="infera-norm", version="0", seam="ir", decline=None)
coverage.record("norm", "kernel", bucket="1", n=4)
coverage.write_report()
assert metrics.install(directory)
assert metrics.install(directory)  # once per process

import prometheus_client
from fastapi import FastAPI
from starlette.testclient import TestClient
from vllm.entrypoints.serve.instrumentator.metrics import attach_router

prometheus_client.Counter("vllm:probe", "stands for vLLM's own metrics").inc()
app = FastAPI()
attach_router(app)
client = TestClient(app)
for i, path in enumerate(("/metrics", "/metrics/")):  # the instrumentator's handler; the mount of vLLM's registry
    response = client.get(path)
    assert response.status_code == 200, (path, response.status_code)
    with open(f"{sys.argv[2]}/scrape{i}.txt", "w") as f:  # a file: vLLM's log lines share stdout on some platforms
        f.write(response.text)
"""


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM")
@pytest.mark.parametrize("multiprocess", [False, True], ids=["one-api-server", "multiprocess"])
def test_collector_lands_in_the_registry_vllm_serves(tmp_path, multiprocess):
    reports = tmp_path / "reports"
    env = {"INFERA_VLLM_REPORT_DIR": str(reports)}
    if multiprocess:
        (tmp_path / "prom").mkdir()
        env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path / "prom")
    run_python(SERVE_METRICS, env=env, fixture_ops=False, args=(str(reports), str(tmp_path)))
    for scrape in (tmp_path / f"scrape{i}.txt" for i in range(2)):
        scrape = scrape.read_text()
        families = {f.name: f for f in text_string_to_metric_families(scrape)}
        assert "vllm:probe" in families  # the registry vLLM serves ...
        assert scrape.count("# TYPE infera_calls_total counter") == 1  # ... carries the coverage, once
        (calls,) = families["infera_calls"].samples
        assert calls.value == 4 and calls.labels["op"] == "norm" and calls.labels["route"] == "kernel"
    if multiprocess:  # vLLM's counter came through the multiprocess files, not the global registry
        assert any(p.name.endswith(".db") for p in (tmp_path / "prom").iterdir())
