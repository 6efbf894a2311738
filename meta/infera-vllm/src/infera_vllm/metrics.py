"""The coverage counters on vLLM's Prometheus ``/metrics`` endpoint, merged over every process of the server.

vLLM's OpenAI app answers ``GET /metrics`` with prometheus-fastapi-instrumentator's handler, which exports
the registry ``vllm.v1.metrics.prometheus.get_prometheus_registry()`` returned while the app was built
(prometheus_client's global ``REGISTRY`` with one API server), except in multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR`` set: ``--api-server-count`` > 1 sets it, a user may), where the handler builds
a new registry per scrape that holds only a ``MultiProcessCollector``; paths under ``/metrics/`` go to a
mount of the first registry. None of these registries is reachable once the app is built, so ``install()``
wraps ``get_prometheus_registry``: the registry it returns also carries one ``CoverageCollector``, and,
once vLLM asks for it (building ``/metrics``), the handler's ``generate_latest`` is wrapped too: for a
registry without the collector, the collector's output follows. It runs in each front-end process, where
plugins load before the app is built, and not in vLLM's engine cores and workers, which serve no HTTP.

The collector holds no counts of its own. At each scrape it merges the report directory with
``report.load``/``report.merge``, the files every process of the server (API servers, engine cores, workers)
writes there, so a scrape shows what ``infera-vllm report DIR`` prints for the same directory, as of the
last report each process wrote (at most ``coverage.FLUSH_EVERY_S`` old while calls are counted). Any API
server answers a scrape with the same numbers, since they all read one directory.

Exported (docs/metrics.md):

- ``infera_calls_total{op,route,reason,bucket,counted_at}``: the merged ``counts``; ``counted_at`` is the
  report's ``at`` (``trace``/``plan`` count decisions, not runs).
- ``infera_op_processes{op,status,reason}``: how many processes gave the op that startup verdict.
- ``infera_report_processes``: the process reports merged; ``infera_report_skipped_files``: files in the
  directory that are not mergeable reports.
- ``infera_self_check_total{op,bucket,result}`` and ``infera_self_check_max_error{op,bucket}``: only when the
  merged report has a ``self_check`` section.
"""

from __future__ import annotations

import glob
import multiprocessing
import os
import sys
import weakref
from collections.abc import Iterator

from infera_vllm import log, report

PROMETHEUS_MODULE = "vllm.v1.metrics.prometheus"
INSTRUMENTATOR_MODULE = "prometheus_fastapi_instrumentator.instrumentation"  # serves GET /metrics in vLLM's app
# vLLM's own processes that never serve HTTP (names from vllm.v1.engine.utils and multiproc_executor)
_NOT_SERVING = ("EngineCore", "VllmWorker")
_registries: weakref.WeakSet = weakref.WeakSet()  # the registries that carry a collector already
_collect_failed = False  # log a failing scrape once, not every 15 s
SELF_CHECK_RESULTS = ("passed", "failed", "unchecked_at_capture")


class CoverageCollector:
    """A prometheus_client custom collector over one report directory, merged at each ``collect()``."""

    def __init__(self, directory: str):
        self.directory = directory

    def describe(self) -> list:
        # No names claimed in the registry, and no collect() (a directory read) when registering.
        return []

    def collect(self) -> Iterator:
        global _collect_failed
        try:
            families = self._families()
        except Exception:  # a scrape must never turn vLLM's /metrics into an error
            if not _collect_failed:
                _collect_failed = True
                log.logger.exception("infera-vllm: could not export coverage from %s to /metrics", self.directory)
            return iter(())
        return iter(families)

    def _families(self) -> list:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        problems: list[tuple[str, str]] = []
        try:
            reports = report.load(self.directory, problems)
            skipped_files = len(problems)
        except FileNotFoundError:  # nothing written yet
            reports, skipped_files = [], 0
        except ValueError:  # no file is a mergeable report
            reports, skipped_files = [], len(glob.glob(os.path.join(self.directory, "infera-*.json")))
        merged = report.merge(reports)

        processes = GaugeMetricFamily("infera_report_processes",
                                      "vLLM processes whose infera-vllm coverage report was merged")
        processes.add_metric([], len(reports))
        skipped = GaugeMetricFamily("infera_report_skipped_files",
                                    "Files in the report directory that are not mergeable coverage reports")
        skipped.add_metric([], skipped_files)

        calls = CounterMetricFamily(
            "infera_calls", "Op calls routed by the infera-vllm plugin, summed over the server's processes "
            "(counted_at trace or plan: decisions while compiling or capturing graphs, not runs)",
            labels=["op", "route", "reason", "bucket", "counted_at"])
        for c in merged["counts"]:
            calls.add_metric([c["op"], c["route"], c["reason"], c["bucket"], c["at"]], c["count"])

        verdicts: dict[tuple[str, str, str], int] = {}
        for o in merged["ops"]:  # one entry per detail text: summed over details, which are not labels
            key = (o["op"], o["status"], o["reason"])
            verdicts[key] = verdicts.get(key, 0) + o["processes"]
        active = GaugeMetricFamily("infera_op_processes", "Processes in which the op has this startup verdict "
                                   "(status active or declined; reason: why declined)",
                                   labels=["op", "status", "reason"])
        for (op, status, reason), n in sorted(verdicts.items()):
            active.add_metric([op, status, reason], n)

        families = [processes, skipped, calls, active]
        checks = self_check_results(merged)
        if checks is not None:  # reports that carry the self-check
            results = CounterMetricFamily(
                "infera_self_check", "Op self-checks against vLLM's implementation on the same inputs, per shape "
                "bucket, summed over the server's processes (unchecked_at_capture: buckets first reached "
                "under graph capture)", labels=["op", "bucket", "result"])
            for (op, bucket, result), n in sorted(checks.items()):
                results.add_metric([op, bucket, result], n)
            worst = GaugeMetricFamily("infera_self_check_max_error", "Largest self-check error seen, "
                                      "max |kernel - vLLM's| / max |vLLM's|, over the server's processes",
                                      labels=["op", "bucket"])
            for c in merged["self_check"]:
                if "max_error" in c:
                    worst.add_metric([str(c["op"]), str(c.get("bucket", ""))], float(c["max_error"]))
            families += [results, worst]
        return families


def self_check_results(merged: dict) -> dict[tuple[str, str, str], int] | None:
    """(op, bucket, result) -> count from the merged report's ``self_check`` entries (per op and bucket:
    ``passed``, ``failed``, ``unchecked_at_capture``); None when the merged report has no such section."""
    if "self_check" not in merged:
        return None
    return {(str(c["op"]), str(c.get("bucket", "")), result): int(c[result])
            for c in merged["self_check"] for result in SELF_CHECK_RESULTS if result in c}


def serves_http() -> bool:
    """False in vLLM's engine-core and worker processes; any other process may build the OpenAI app."""
    return not multiprocessing.current_process().name.startswith(_NOT_SERVING)


def install(directory: str | None = None) -> bool:
    """Make what vLLM serves on ``/metrics`` in this process carry a collector over ``directory`` (default:
    INFERA_VLLM_REPORT_DIR, which activation exports). True when installed; never raises."""
    directory = directory or os.environ.get("INFERA_VLLM_REPORT_DIR")
    if not directory or not serves_http():
        return False
    try:
        return _install(directory)
    except Exception as exc:  # another vLLM layout, say: /metrics stays vLLM's, the reports have everything
        log.info("infera-vllm: coverage not exported to /metrics (%s: %s)", type(exc).__name__, exc)
        return False


def _install(directory: str) -> bool:
    import importlib

    prometheus = importlib.import_module(PROMETHEUS_MODULE)
    original = prometheus.get_prometheus_registry
    if getattr(original, "infera_directory", None) is not None:
        return True  # installed in this process already
    wrapped = _registry_with_collector(original, directory)
    prometheus.get_prometheus_registry = wrapped
    # Modules that imported the function by name before this (the app's metrics router, or the server module
    # itself in older vLLM, also as __main__) get the wrapped one too.
    for name, module in list(sys.modules.items()):
        if (name.startswith("vllm.") or name in ("__main__", "__mp_main__")) and \
                getattr(module, "get_prometheus_registry", None) is original:
            module.get_prometheus_registry = wrapped
    return True


def _registry_with_collector(original, directory: str):
    """vLLM's ``get_prometheus_registry``, which it calls while building ``/metrics``: the registry it returns
    carries the collector (the one served with one API server, and the one mounted under ``/metrics/``), and
    the instrumentator's handler is made to add the collector's output in multiprocess mode."""

    def get_prometheus_registry():
        registry = original()
        try:
            add_collector(registry, directory)
            _wrap_instrumentator_output(directory)
        except Exception:  # vLLM's metrics come first
            log.logger.exception("infera-vllm: could not add coverage to vLLM's /metrics")
        return registry

    get_prometheus_registry.infera_directory = directory
    get_prometheus_registry.__wrapped__ = original
    return get_prometheus_registry


def _wrap_instrumentator_output(directory: str) -> None:
    """The instrumentator's ``/metrics`` handler (the route vLLM's app matches first) exports the registry vLLM
    gave it, except in multiprocess mode, where each scrape builds a new registry that holds only a
    ``MultiProcessCollector``. Its ``generate_latest`` is wrapped: for a registry without the collector, the
    collector's families follow what it wrote."""
    import importlib

    try:
        instrumentation = importlib.import_module(INSTRUMENTATOR_MODULE)
        original = instrumentation.generate_latest
    except (ImportError, AttributeError) as exc:
        log.info("infera-vllm: coverage not added to multiprocess /metrics (%s: %s)", type(exc).__name__, exc)
        return
    if getattr(original, "infera_directory", None) is not None:
        return
    from prometheus_client import CollectorRegistry

    only_coverage = CollectorRegistry()
    add_collector(only_coverage, directory)

    def generate_latest(registry, *args, **kwargs):
        out = original(registry, *args, **kwargs)
        return out if registry in _registries else out + original(only_coverage, *args, **kwargs)

    generate_latest.infera_directory = directory
    generate_latest.__wrapped__ = original
    instrumentation.generate_latest = generate_latest


def add_collector(registry, directory: str) -> CoverageCollector | None:
    """Register a ``CoverageCollector`` on ``registry`` once; returns it, or None when one is there already."""
    if registry in _registries:
        return None
    collector = CoverageCollector(directory)
    registry.register(collector)
    _registries.add(registry)
    return collector
