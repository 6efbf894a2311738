"""What every benchmark records beside its numbers: the machine, the software versions and the commit."""

from __future__ import annotations

import json
import os
import re
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:
        return None


def _commit() -> str | None:
    if os.environ.get("INFERA_COMMIT"):  # the GPU machine gets a copy of the tree without .git
        return os.environ["INFERA_COMMIT"]
    try:
        return subprocess.run(["git", "-C", HERE, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:
        return None


def describe_machine() -> dict:
    gpu = "cpu"
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name()
    except Exception:
        pass
    return {"gpu": gpu, "vllm": _version("vllm"), "torch": _version("torch"), "triton": _version("triton"),
            "infera_vllm": _version("infera_vllm"), "commit": _commit()}


def results_dir(machine: dict) -> str:
    """``benchmarks/results/<gpu>/``: ``h200`` for 'NVIDIA H200', ``cpu`` without a GPU."""
    name = machine["gpu"].lower().replace("nvidia", "").strip()
    short = re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "cpu"
    return os.path.join(HERE, "results", short)


def write_json(directory: str, name: str, doc: dict) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{name}.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    return path
