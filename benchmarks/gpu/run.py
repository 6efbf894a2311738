"""The GPU machine's runner: one command per step, each sized for one 10-minute device call.

On the GPU machine, after vLLM 0.26.0 is staged (into /tmp/site, by the lent machine's staging kit; with SmolLM2 for the
steps that use it) and with ``dist/`` carried (wheels and ``dist/COMMIT``, built by ``nox -s wheels``)::

    python3 benchmarks/gpu/run.py STEP [options]      # python3 benchmarks/gpu/run.py --help lists the steps

Every step first installs this checkout's wheels over the staged vLLM (``/tmp/site``) and sets the
environment its commands share: ``PYTHONPATH=/tmp/site``, FlashInfer's sampler off (not staged),
``INFERA_COMMIT`` from ``dist/COMMIT`` (the commit results record). Results go to ``$OUT`` (the device
tool's folder; ``--out`` elsewhere). A tuning step leaves its file in /tmp, where later steps on the same
machine pick it up (``/tmp/attn_paged_tuning.json``, ``/tmp/sm90.json`` for moe-decode,
``/tmp/sm90_linear.json``). Each command's whole output goes to a log in ``$OUT``; the console shows it
without vLLM's INFO/WARNING lines. The exit status is non-zero when any command of the step failed or ran
past its time limit, so a failed command is never hidden behind a later success.

``--dry-run`` prints the commands without running them (no GPU needed; the CPU tests use it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEPT = Path("/tmp/infera-validate")  # each validate results file as this machine's last call left it
SITE = Path("/tmp/site")
SMOLLM2 = "/tmp/models/smollm2-135m"
ATTN_TUNING = "/tmp/attn_paged_tuning.json"
MOE_TUNING = "/tmp/sm90.json"
LINEAR_TUNING = "/tmp/sm90_linear.json"
INTERRUPT_GRACE_S = 20  # a command past its limit gets SIGINT, then SIGKILL this much later
VLLM_NOISE = r"^(\(.*\) )?(INFO|WARNING|DEBUG)|Capturing|it/s\]|s/it\]|socket\.cpp"


class Runner:
    """Runs a step's commands: each with a time limit, its output teed to a log in ``out``, failures kept."""

    def __init__(self, out: Path, dry_run: bool):
        self.out, self.dry_run, self.failed = out, dry_run, []
        self.env = dict(os.environ)

    def setup(self) -> None:
        """The staged vLLM and this checkout's wheels on the path, the shared environment set."""
        commit = (ROOT / "dist" / "COMMIT").read_text().strip() if (ROOT / "dist" / "COMMIT").exists() else "unknown"
        self.env.update(PYTHONPATH=str(SITE), VLLM_USE_FLASHINFER_SAMPLER="0", PYTHONUNBUFFERED="1",
                        INFERA_COMMIT=self.env.get("INFERA_COMMIT", commit))
        if self.dry_run:
            return
        if not (SITE / "vllm").is_dir():
            sys.exit(f"run.py: no staged vLLM in {SITE} (stage vLLM 0.26.0 into it on this machine first)")
        wheels = sorted(str(p) for p in (ROOT / "dist").glob("*.whl"))
        if not wheels:
            sys.exit("run.py: no wheels in dist/ (build them with 'nox -s wheels' and carry dist)")
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                               "--no-cache-dir", "--upgrade", "--target", str(SITE), *wheels],
                              capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"run.py: installing dist/*.whl failed:\n{done.stdout}{done.stderr}")

    def use_tuning(self, variable: str, path: str) -> None:
        """An earlier tuning step's file on this machine, if there is one, for the commands that follow."""
        if Path(path).exists() or self.dry_run:
            self.env.setdefault(variable, path)

    def run(self, cmd: list[str], *, log: str | None = None, timeout: float | None = None, hide: str = VLLM_NOISE,
            env: dict | None = None, tail: int | None = None, background: bool = False, header: str = ""):
        """Run ``cmd`` from the checkout's root; its output to ``out/log`` (whole, after ``header``) and the
        console (lines not matching ``hide``; the last ``tail`` of them if set). Recorded as failed on a
        non-zero exit or a timeout; past ``timeout`` it is interrupted (SIGINT: pytest still prints which tests
        failed and why) and killed INTERRUPT_GRACE_S later. ``background``: returns the thread, joined by
        :meth:`wait`."""
        shown = " ".join(shlex.quote(c) for c in cmd)
        print(f"+ {shown}" + (f"  > {log}" if log else "") + (f"  (limit {timeout:.0f} s)" if timeout else ""),
              flush=True)
        if self.dry_run:
            return None
        if background:
            thread = threading.Thread(target=self._run, args=(cmd, log, timeout, hide, env, tail, shown, header))
            thread.start()
            return thread
        self._run(cmd, log, timeout, hide, env, tail, shown, header)
        return None

    def _run(self, cmd, log, timeout, hide, env, tail, shown, header) -> None:
        pattern = re.compile(hide) if hide else None
        kept: list[str] = []
        sink = open(self.out / log, "w") if log else None
        if sink and header:
            sink.write(header + "\n")
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**self.env, **(env or {})}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace")
        killed = []

        def interrupt():  # pytest prints its failures and a script its traceback on SIGINT: keep them in the log
            killed.append(True)
            proc.send_signal(signal.SIGINT)
            last = threading.Timer(INTERRUPT_GRACE_S, proc.kill)
            last.daemon = True
            last.start()

        timer = threading.Timer(timeout, interrupt) if timeout else None
        if timer:
            timer.start()
        for line in proc.stdout:
            if sink:
                sink.write(line)
            if pattern is None or not pattern.search(line):
                if tail:
                    kept = (kept + [line])[-tail:]
                else:
                    print(line, end="", flush=True)
        rc = proc.wait()
        if timer:
            timer.cancel()
        if sink:
            sink.write(f"exit {rc}\n" if header else "")
            sink.close()
        print("".join(kept), end="", flush=True)
        if rc:
            self.failed.append(f"{shown}{f' (log {log})' if log else ''}: "
                               + (f"past its {timeout:.0f} s limit" if killed else f"exit {rc}"))

    def wait(self, *threads) -> None:
        for t in threads:
            if t is not None:
                t.join()

    def pytest(self, target: list[str], report: str, *, timeout: float, select: str | None = None,
               marker: str | None = None, tail: int = 25) -> None:
        """pytest on ``target`` with its summary (the last ``tail`` lines, the commit first) in ``out/report``."""
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", *target]
        cmd += ["-k", select] if select else []
        cmd += ["-m", marker] if marker else []
        log = report + ".log"
        self.run(cmd, log=log, timeout=timeout, tail=3)
        if not self.dry_run:
            lines = (self.out / log).read_text().splitlines()[-tail:]
            (self.out / report).write_text(f"commit {self.env['INFERA_COMMIT']}  {' '.join(target)}  "
                                           f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n"
                                           + "\n".join(lines) + "\n")
            (self.out / log).unlink()


def py(script: str, *args) -> list[str]:
    return [sys.executable, script, *[str(a) for a in args]]


def vllm_cli(*args) -> list[str]:
    return [sys.executable, "-m", "infera_vllm", *[str(a) for a in args]]


# ---- the steps --------------------------------------------------------------------------------------------

def step_tests(r: Runner, a) -> None:
    """Every package's tests that can run on a GPU (all but those marked cpu_build), one pytest per package,
    the meta package beside the op packages (it mostly starts CPU-side processes); each summary in
    pytest_<package>.txt. The compile tests compile for this GPU's family with its Triton."""
    r.env.update(INFERA_GPU_FAMILY="sm90", INFERA_AOT_FAMILY="sm90")
    r.use_tuning("INFERA_ATTN_PAGED_TUNING", ATTN_TUNING)  # the tests run what serves
    deadline = time.monotonic() + a.budget_s
    dirs = [d for d in sorted((ROOT / "packages").glob("infera-*")) if (d / "pyproject.toml").exists()]
    dirs = [ROOT / "meta" / "infera-vllm"] + dirs
    if a.packages:
        dirs = [d for d in dirs if d.name in a.packages]
    meta = None
    select = getattr(a, "select", None)  # the other steps that run a package's tests select none
    for d in dirs:
        left = max(10.0, deadline - time.monotonic())
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs", "-m", "not cpu_build",
               *(["-k", select] if select else []), str(d.relative_to(ROOT) / "tests")]
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        header = f"commit {r.env['INFERA_COMMIT']}  package {d.name}  {now}" + (f"  -k {select!r}" if select else "")
        thread = r.run(cmd, log=f"pytest_{d.name}.txt", timeout=left, tail=1, background=d.name == "infera-vllm",
                       header=header)
        meta = thread if d.name == "infera-vllm" else meta
    r.wait(meta)


def step_attn(r: Runner, a) -> None:
    """infera-attn-paged: tune the decode and prefill launches for this GPU (the file to attn_paged_sm90.json
    and /tmp), the decode and prefill tables against vLLM's FA3 and Triton with that tuning, and with
    --tests the package's GPU tests."""
    if a.tune:
        r.run(py("benchmarks/tune_attn_paged.py", "--budget-s", a.tune_budget_s, "--prefill-budget-s",
                 a.prefill_budget_s, "--out", r.out, *shlex.split(a.tune_args)), log="tune_attn_paged.log",
              timeout=a.tune_timeout)
        r.run(["cp", str(r.out / "attn_paged_sm90.json"), ATTN_TUNING])
    r.use_tuning("INFERA_ATTN_PAGED_TUNING", ATTN_TUNING)
    if a.bench:
        r.run(py("benchmarks/bench_attn_paged.py", "--out", r.out, *(["--sweep"] if a.sweep else []),
                 *shlex.split(a.bench_args)), log="bench_attn_paged.log", timeout=a.bench_timeout)
    if a.tests:
        a.packages, a.budget_s = ["infera-attn-paged"], a.tests_budget_s
        step_tests(r, a)


def step_attn_kv_quant(r: Runner, a) -> None:
    """infera-attn-paged on quantized KV caches: the decode table per KV-cache dtype (fp8 per tensor, int8 and
    fp8 per token-head) against vLLM's FA3 (fp8 queries) and Triton on the same cache, our bf16 time and the
    quantized pages' stream floor (bench_attn_paged_kv_quant.py), then the package's tests of the quantized
    paths on this GPU (-k quantized)."""
    r.use_tuning("INFERA_ATTN_PAGED_TUNING", ATTN_TUNING)
    if a.bench:
        r.run(py("benchmarks/bench_attn_paged_kv_quant.py", "--out", r.out, *shlex.split(a.bench_args)),
              log="bench_attn_paged_kv_quant.log", timeout=a.bench_timeout)
    if a.tests:
        a.packages, a.budget_s, a.select = ["infera-attn-paged"], a.tests_budget_s, "quantized"
        step_tests(r, a)


def step_attn_e2e(r: Runner, a) -> None:
    """FLASH_ATTN vs CUSTOM end to end: `infera-vllm validate --preset attn-paged-h200` (dummy-weight
    Llama-3-8B, Qwen3-8B and gpt-oss-20b shapes; results accumulate in attn-paged-h200.json, a model per call);
    --smollm2 adds SmolLM2's real-weight agreement (`validate --preset smollm2`: off, off2, TRITON_ATTN,
    attn-paged). ``--kv-cache-dtype fp8``: the attn-paged-fp8-h200 preset instead (the dense models, every run on an
    fp8 cache: FLASH_ATTN's FA3 with fp8 queries against our kernels with bf16 queries)."""
    r.use_tuning("INFERA_ATTN_PAGED_TUNING", ATTN_TUNING)
    validate_preset(r, "attn-paged-fp8-h200" if a.kv_cache_dtype == "fp8" else "attn-paged-h200", a.models, None,
                    a.budget_s)
    if a.smollm2:
        validate_preset(r, "smollm2", None, None, 300, ["--runs", "off2,off-triton,attn-paged", "--rounds", "1"],
                        log="validate_smollm2.txt", env={"INFERA_SMOLLM2_DIR": SMOLLM2})


def step_step_probe(r: Runner, a) -> None:
    """Where a short generation's wall time goes per attention backend (benchmarks/e2e_step_probe.py: prefill-only
    and full generations timed, prefill-only ones profiled) on a matrix model's config with dummy weights."""
    model = write_config(a.model, f"/tmp/models/{a.model}", r.dry_run)
    r.run(py("benchmarks/e2e_step_probe.py", "--model", model, "--backends", a.backends, "--kernels", "--out", r.out,
             "--timeout", a.timeout / max(1, len(a.backends.split(","))), *shlex.split(a.probe_args)),
          log="e2e_step_probe.log", timeout=a.timeout + 30)


def step_moe(r: Runner, a) -> None:
    """infera-moe-decode: with --tune the tuning sweep (the file to sm90.json and /tmp), with --tests the
    kernel tests at GPU sizes, then the kernels against vLLM's fused_experts with that tuning."""
    if a.tune:
        r.run(py("benchmarks/tune_moe_decode.py", "--out", r.out, *shlex.split(a.tune_args)),
              log="tune_moe_decode.log", timeout=a.tune_timeout)
        r.run(["cp", str(r.out / "sm90.json"), MOE_TUNING])
    r.use_tuning("INFERA_MOE_DECODE_TUNING", MOE_TUNING)
    if a.tests:
        r.pytest(["packages/infera-moe-decode/tests"], "pytest_moe_decode_sm90.txt", timeout=a.tests_timeout,
                 select=a.tests_k)
    if a.bench:
        r.run(py("benchmarks/bench_moe_decode.py", "--out", r.out, *shlex.split(a.bench_args)),
              log="bench_moe_decode.log", timeout=a.bench_timeout)


def step_moe_fp8(r: Runner, a) -> None:
    """infera-moe-decode on FP8 experts: the FP8 kernel tests at GPU sizes (-k fp8), then the kernels against
    vLLM's Triton FP8 experts (bench_moe_decode.py --fp8): block FP8 at Qwen3-30B-A3B and DeepSeek-V3 dims,
    per-tensor FP8 at Mixtral dims, M 1-16, every FP8 form timed where the tuning has no FP8 section. With
    --tune the FP8 sweep instead (tune_moe_decode.py --fp8: the family's file with its fp8 section, to
    sm90.json and /tmp for the next call; merged into an earlier call's /tmp file if there is one)."""
    r.use_tuning("INFERA_MOE_DECODE_TUNING", MOE_TUNING)
    if a.tune:
        r.run(py("benchmarks/tune_moe_decode.py", "--fp8", "--out", r.out, *shlex.split(a.tune_args)),
              log="tune_moe_decode_fp8.log", timeout=a.tune_timeout)
        r.run(["cp", str(r.out / "sm90.json"), MOE_TUNING])
        return
    if a.tests:
        r.pytest(["packages/infera-moe-decode/tests"], "pytest_moe_decode_fp8.txt", timeout=a.tests_timeout,
                 select="fp8 and not vllm")
    if a.bench:
        for fp8, dims in (("block", "qwen3-30b-a3b,deepseek-v3"), ("tensor", "mixtral")):
            r.run(py("benchmarks/bench_moe_decode.py", "--out", r.out, "--fp8", fp8, "--dims", dims,
                     "--tokens", a.tokens, *shlex.split(a.bench_args)),
                  log=f"bench_moe_decode_fp8_{fp8}.log", timeout=a.bench_timeout)


def step_norm(r: Runner, a) -> None:
    """infera-norm's tests, then its kernels against vllm_c and compiled native (benchmarks/bench_norm.py);
    --tune runs the launch sweep (benchmarks/tune_norm.py) instead of the benchmark."""
    r.pytest(["packages/infera-norm/tests"], "pytest_norm_sm90.txt", timeout=a.tests_timeout)
    script = "benchmarks/tune_norm.py" if a.tune else "benchmarks/bench_norm.py"
    r.run(py(script, "--out", r.out), log=Path(script).stem + ".log")


def step_norm_numerics(r: Runner, a) -> None:
    """Bit-level numerics of every norm provider, and SmolLM2 end to end with norm and with vLLM's vllm_c
    provider (`validate --preset norm-smollm2-h200`)."""
    r.pytest(["packages/infera-norm/tests/test_norm_seam.py"], "pytest_norm_symbolic_sm90.txt", timeout=120,
             select="symbolic")
    r.run(py("benchmarks/norm_numerics.py", "--out", r.out), log="norm_numerics.log")
    validate_preset(r, "norm-smollm2-h200", None, None, 480, log="validate_norm_smollm2.txt",
                    env={"INFERA_SMOLLM2_DIR": a.model})


def step_norm_e2e(r: Runner, a) -> None:
    """SmolLM2 with infera-norm first in the IR priority and plugin off, alternating rounds
    (`validate --preset norm-smollm2-h200 --runs off2,norm`), and the report of the first norm run."""
    work = "/tmp/validate-norm-e2e"
    validate_preset(r, "norm-smollm2-h200", None, None, 540, ["--runs", "off2,norm", "--rounds", str(a.rounds),
                                                              "--work", work],
                    log="validate_norm_e2e.txt", env={"INFERA_SMOLLM2_DIR": a.model})
    where = f"{work}/smollm2-135m/norm-r0/report"
    r.run(vllm_cli("report", where), log="report-on-norm.txt")
    r.run(vllm_cli("report", where, "--json"), log="report-on-norm.json", hide=".")


def step_linear(r: Runner, a) -> None:
    """infera-linear-hipblaslt: its kernel tests and benchmarks/bench_linear.py; --tune the table for a
    Llama-3-8B-shaped model (to sm90.json and /tmp); --e2e `infera-vllm validate --preset linear-llama3-h200`
    with that table."""
    if a.bench:
        r.pytest(["packages/infera-linear-hipblaslt/tests"], "pytest_linear_sm90.txt", timeout=60, select="kernels",
                 tail=5)
        r.run(py("benchmarks/bench_linear.py", "--out", r.out, *(["--tokens", a.tokens] if a.tokens else [])),
              log="bench_linear.log", timeout=a.bench_timeout)
    if a.tune:
        model = write_config("llama-3-8b", "/tmp/llama-3-8b")
        r.run(vllm_cli("tune", "linear", "--model", model, "--out", LINEAR_TUNING), log="tune_linear.log",
              timeout=a.tune_timeout)
        r.run(["cp", LINEAR_TUNING, str(r.out / "sm90.json")])
    if a.e2e:
        r.use_tuning("INFERA_LINEAR_TUNING", LINEAR_TUNING)
        validate_preset(r, "linear-llama3-h200", None, None, a.e2e_timeout - 20, timeout=a.e2e_timeout)


def step_foundation(r: Runner, a) -> None:
    """doctor (plain, --json, --model), SmolLM2 end to end with the plugin's default ops and off
    (`validate --preset smollm2 --runs off2,default`), and the merged report of the default run."""
    r.run(vllm_cli("doctor"), log="doctor.txt")
    r.failed = [f for f in r.failed if "doctor" not in f]  # doctor exits 1 where an op declines: recorded, not failed
    r.run(vllm_cli("doctor", "--json"), log="doctor.json", hide=".")
    r.run(vllm_cli("doctor", "--model", a.model), log="doctor-model.txt")
    r.failed = [f for f in r.failed if "doctor" not in f]
    work = "/tmp/validate-foundation"
    validate_preset(r, "smollm2", None, None, 400, ["--runs", "off2,default", "--rounds", "1", "--work", work],
                    log="validate_foundation.txt",
                    env={"INFERA_SMOLLM2_DIR": a.model})
    r.run(vllm_cli("report", f"{work}/smollm2-135m/default-r0/report"), log="report-on.txt")
    r.run(vllm_cli("report", f"{work}/smollm2-135m/default-r0/report", "--json"), log="report-on.json", hide=".")


def step_self_check(r: Runner, a) -> None:
    """The self-check's cost and outcome at startup (docs/self-check.md): `infera-vllm validate
    --self-check-cost` on SmolLM2 (real weights; norm and attn-paged) and on a Qwen3-30B-A3B-shaped
    dummy-weight model cut to --moe-layers layers (norm, attn-paged, moe-decode: the expert dims are the full
    model's, so moe-decode serves its tuned shape). Each runs off, every-op (check on), every-op-nocheck,
    then the rest as its budget allows; a budget of 0 skips that model."""
    r.use_tuning("INFERA_ATTN_PAGED_TUNING", ATTN_TUNING)
    common = ["--self-check-cost", "--rounds", 1, "--batches", "1,16", "--work", "/tmp/self_check_work",
              *shlex.split(a.validate_args)]
    if a.smollm2_budget_s:
        r.run(vllm_cli("validate", SMOLLM2, *common, "--ops", "norm,attn-paged", "--budget-s", a.smollm2_budget_s,
                       "--out", r.out / "validate_smollm2.json"), log="validate_smollm2.txt", tail=60)
    if a.moe_budget_s:
        model = write_config("qwen3-30b-a3b", "/tmp/qwen3-moe-cut", num_hidden_layers=a.moe_layers,
                             dry_run=r.dry_run)
        r.run(vllm_cli("validate", "--dummy", model, *common, "--ops", "norm,attn-paged,moe-decode", "--budget-s",
                       a.moe_budget_s, "--out", r.out / "validate_qwen3_moe_cut.json"),
              log="validate_qwen3_moe_cut.txt", tail=60)


def step_validate(r: Runner, a) -> None:
    """`infera-vllm validate --matrix benchmarks/validation/matrix.json` (or ``--preset NAME``, the plugin's
    preset of that name) for the named models (results accumulate model by model across calls, in $OUT's
    validation.json or <preset>.json, kept on the machine between calls: :func:`validate_preset`; a model
    measured at this commit is not rerun)."""
    for variable, path in (("INFERA_ATTN_PAGED_TUNING", ATTN_TUNING), ("INFERA_MOE_DECODE_TUNING", MOE_TUNING)):
        r.use_tuning(variable, path)
    validate_preset(r, a.preset, a.models, a.results, a.budget_s, shlex.split(a.validate_args))


def validate_preset(r: Runner, preset: str | None, models: str | None, results: str | None, budget_s: float,
                    more: list[str] = (), machine: str = "h200", log: str = "validate.txt", **run_args):
    """`infera-vllm validate --preset PRESET` (the matrix when None), its results accumulating in ``results``
    (default benchmarks/results/<machine>/validation/<preset or validation>.json). The command writes $OUT's
    copy of that file (after every run, so a call cut short still brings back each finished run; the plot is
    drawn beside it), starting from the copy this machine kept at the end of its previous call
    (/tmp/infera-validate/), else from the checkout's: the next call on the same machine continues where
    this one stopped without the file being carried back first."""
    source = ["--preset", preset] if preset else ["--matrix", "benchmarks/validation/matrix.json"]
    results = results or f"benchmarks/results/{machine}/validation/{preset or 'validation'}.json"
    live, kept = r.out / Path(results).name, KEPT / Path(results).name
    seed = kept if kept.exists() else ROOT / results
    if r.dry_run or seed.exists():
        r.run(["cp", str(seed), str(live)])
    job = r.run(vllm_cli("validate", *source, *(["--models", models] if models else []), "--out", str(live),
                         "--budget-s", budget_s, *more), log=log, tail=80, **run_args)
    if not run_args.get("background"):
        keep(r, live)
    return job


def keep(r: Runner, live: Path) -> None:
    """A validate call's results file (in $OUT) kept in /tmp/infera-validate/ for the machine's next call, and
    its runs' logs (validate writes them to ``<name>-logs/`` beside the file) packed into one
    ``<name>-logs.tar.gz``: the device call brings back at most 8 files, fewer than a model's runs' logs
    and the results together."""
    r.run(["mkdir", "-p", str(KEPT)])
    r.run(["cp", str(live), str(KEPT / live.name)])
    logs = live.with_name(live.stem + "-logs")
    if r.dry_run or logs.is_dir():
        r.run(["tar", "-czf", f"{logs}.tar.gz", "-C", str(live.parent), logs.name])
        r.run(["rm", "-rf", str(logs)])


def step_parallel(r: Runner, a) -> None:
    """Two GPUs: doctor on each (the same output expected), then `infera-vllm validate --preset PRESET`
    (parallel-h200x2: tensor and expert parallel; parallel-random-h200x2: agreement at TP 2)."""
    model = write_config("qwen3-30b-a3b", "/tmp/doctor-model", dry_run=r.dry_run)
    for gpu in (0, 1):
        r.run(vllm_cli("doctor", "--model", model), log=f"doctor_gpu{gpu}.txt", timeout=120,
              env={"CUDA_VISIBLE_DEVICES": str(gpu)}, tail=1)
    r.failed = [f for f in r.failed if "doctor" not in f]
    validate_preset(r, a.preset, a.models, None, a.budget_s, machine="h200x2")


def step_linear_norm_x2(r: Runner, a) -> None:
    """Two GPUs at once: infera-linear's table tuned on GPU 0 while the norm-qwen3-h200 preset runs on GPU 1."""
    job = validate_preset(r, "norm-qwen3-h200", None, None, 500, log="validate_norm.txt", timeout=540,
                          env={"CUDA_VISIBLE_DEVICES": "1"}, background=True)
    model = write_config("llama-3-8b", "/tmp/llama-3-8b", dry_run=r.dry_run)
    r.run(vllm_cli("tune", "linear", "--model", model, "--out", LINEAR_TUNING), log="tune_linear.log", timeout=500,
          env={"CUDA_VISIBLE_DEVICES": "0"})
    r.run(["cp", LINEAR_TUNING, str(r.out / "sm90.json")])
    r.wait(job)
    keep(r, r.out / "norm-qwen3-h200.json")


def step_aot_check(r: Runner, a) -> None:
    """Load on this GPU the kernels compiled ahead of time on the CPU machine (benchmarks/gpu/h200_aot_check.py)
    and compare their resources with what this machine's Triton compiles."""
    r.run(py("benchmarks/gpu/h200_aot_check.py", *shlex.split(a.aot_args)), log="aot_check.log")


def write_config(name: str, directory: str, dry_run: bool = False, **overrides) -> str:
    """A config-only model directory for vLLM's dummy weights: benchmarks/validation/matrix.json's config of
    ``name`` with ``overrides``; its path."""
    if not dry_run:
        matrix = json.loads((ROOT / "benchmarks" / "validation" / "matrix.json").read_text())
        config = next(m["config"] for m in matrix["models"] if m["name"] == name)
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / "config.json").write_text(json.dumps({**config, **overrides}))
    return directory


STEPS = {
    "tests": step_tests, "attn": step_attn, "attn-kv-quant": step_attn_kv_quant, "attn-e2e": step_attn_e2e,
    "step-probe": step_step_probe, "moe": step_moe, "moe-fp8": step_moe_fp8,
    "norm": step_norm, "norm-numerics": step_norm_numerics, "norm-e2e": step_norm_e2e, "linear": step_linear,
    "foundation": step_foundation, "self-check": step_self_check, "validate": step_validate,
    "parallel": step_parallel, "linear-norm-x2": step_linear_norm_x2, "aot-check": step_aot_check,
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="results folder (default: $OUT)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    sub = p.add_subparsers(dest="step", required=True, metavar="STEP")

    def step(name):
        doc = " ".join((STEPS[name].__doc__ or "").split())
        return sub.add_parser(name, help=doc.split(": ")[0].split(". ")[0], description=doc)

    def switch(s, name, default, help):
        s.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=default, help=help)

    s = step("tests")
    s.add_argument("--packages", nargs="*", help="only these (infera-vllm is the meta package)")
    s.add_argument("--select", help="pytest -k selection within each package, e.g. 'fa3 or platform_default'")
    s.add_argument("--budget-s", type=float, default=560, help="for all packages together")
    s = step("attn")
    switch(s, "tune", True, "tune first (else the packaged or an earlier tuning)")
    s.add_argument("--tune-args", default="", help="more tune_attn_paged.py arguments, e.g. '--passes 3,5'")
    s.add_argument("--tune-budget-s", type=float, default=180)
    s.add_argument("--prefill-budget-s", type=float, default=100)
    s.add_argument("--tune-timeout", type=float, default=330, help="the tuner writes its file at the end")
    switch(s, "bench", True, "the decode and prefill tables")
    s.add_argument("--sweep", action="store_true", help="the benchmark's own per-row launch sweep")
    s.add_argument("--bench-timeout", type=float, default=120)
    s.add_argument("--bench-args", default="", help="more bench_attn_paged.py arguments, e.g. '--no-prefill "
                                                    "--rows 16:320,64:320 --merge-max-slices 8'")
    switch(s, "tests", False, "the package's GPU tests afterwards")
    s.add_argument("--tests-budget-s", type=float, default=170)
    s = step("attn-kv-quant")
    switch(s, "bench", True, "the decode table per KV-cache dtype")
    s.add_argument("--bench-timeout", type=float, default=420)
    s.add_argument("--bench-args", default="", help="more bench_attn_paged_kv_quant.py arguments, e.g. "
                                                    "'--kv-dtypes fp8 --configs llama3-8b'")
    switch(s, "tests", True, "the package's tests of the quantized paths afterwards")
    s.add_argument("--tests-budget-s", type=float, default=150)
    s = step("attn-e2e")
    s.add_argument("--models", help="e.g. qwen3-8b (one model fits a call)")
    s.add_argument("--budget-s", type=float, default=540)
    s.add_argument("--smollm2", action="store_true", help="also SmolLM2's agreement run")
    s.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto", help="fp8: the fp8-cache preset")
    s = step("step-probe")
    s.add_argument("--model", default="llama-3-8b", help="a model of benchmarks/validation/matrix.json")
    s.add_argument("--backends", default="FLASH_ATTN,TRITON_ATTN,CUSTOM,CUSTOM-kernel")
    s.add_argument("--timeout", type=float, default=520, help="for every backend together")
    s.add_argument("--probe-args", default="", help="more e2e_step_probe.py arguments, e.g. '--batches 1'")
    s = step("moe")
    switch(s, "tune", False, "the tuning sweep first")
    s.add_argument("--tune-args", default="", help="more tune_moe_decode.py arguments")
    s.add_argument("--tune-timeout", type=float, default=540)
    switch(s, "tests", False, "the kernel tests at GPU sizes")
    s.add_argument("--tests-k", default="not vllm", help="pytest -k selection")
    s.add_argument("--tests-timeout", type=float, default=300)
    switch(s, "bench", True, "the kernels against vLLM's fused_experts")
    s.add_argument("--bench-args", default="", help="more bench_moe_decode.py arguments, e.g. '--dims mixtral'")
    s.add_argument("--bench-timeout", type=float, default=480)  # every row also times four traffic floors
    s = step("moe-fp8")
    switch(s, "tune", False, "the FP8 tuning sweep (alone: one call)")
    s.add_argument("--tune-args", default="", help="more tune_moe_decode.py arguments, e.g. '--tokens 1,2,4'")
    s.add_argument("--tune-timeout", type=float, default=560)
    switch(s, "tests", True, "the FP8 kernel tests at GPU sizes first")
    s.add_argument("--tests-timeout", type=float, default=150)
    switch(s, "bench", True, "the FP8 kernels against vLLM's FP8 experts")
    s.add_argument("--tokens", default="1,2,4,8,16")
    s.add_argument("--bench-args", default="")
    s.add_argument("--bench-timeout", type=float, default=200, help="per FP8 scheme")
    s = step("norm")
    s.add_argument("--tune", action="store_true", help="the launch sweep instead of the benchmark")
    s.add_argument("--tests-timeout", type=float, default=300)
    for name in ("norm-numerics", "norm-e2e", "foundation"):
        s = step(name)
        s.add_argument("--model", default=SMOLLM2)
        if name == "norm-e2e":
            s.add_argument("--rounds", type=int, default=2)
    s = step("linear")
    switch(s, "bench", True, "kernel tests and bench_linear.py")
    s.add_argument("--tokens", help="bench_linear.py --tokens")
    s.add_argument("--bench-timeout", type=float, default=240)
    switch(s, "tune", False, "the table for a Llama-3-8B-shaped model")
    s.add_argument("--tune-timeout", type=float, default=400)
    switch(s, "e2e", False, "the h200-linear e2e preset")
    s.add_argument("--e2e-timeout", type=float, default=560)
    s = step("self-check")
    s.add_argument("--smollm2-budget-s", type=float, default=260, help="0: skip SmolLM2")
    s.add_argument("--moe-budget-s", type=float, default=260, help="0: skip the MoE model")
    s.add_argument("--moe-layers", type=int, default=4)
    s.add_argument("--validate-args", default="", help="more `infera-vllm validate` arguments (e.g. fewer batches)")
    s = step("validate")
    s.add_argument("--models", help="matrix model names, comma-separated (a preset's: all of them by default)")
    s.add_argument("--preset", help="a preset of `infera-vllm validate` instead of the matrix (its --help lists "
                                    "them: meta/infera-vllm/src/infera_vllm/presets/)")
    s.add_argument("--results", help="the JSON that accumulates across calls (default benchmarks/results/h200/"
                                     "validation/validation.json, or <preset>.json): written in $OUT under its "
                                     "name, from the copy the machine kept after its last call, else this one")
    s.add_argument("--budget-s", type=float, default=540)
    s.add_argument("--validate-args", default="", help="more `infera-vllm validate` arguments")
    s = step("parallel")
    s.add_argument("--preset", default="parallel-h200x2")
    s.add_argument("--models")
    s.add_argument("--budget-s", type=float, default=480)
    step("linear-norm-x2")
    s = step("aot-check")
    s.add_argument("aot_args", help="h200_aot_check.py's arguments, quoted: 'load CUBINS.pkl OUT.json'")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out = Path(args.out)
    if not args.dry_run:
        out.mkdir(parents=True, exist_ok=True)
    runner = Runner(out, args.dry_run)
    runner.setup()
    STEPS[args.step](runner, args)
    for failure in runner.failed:
        print(f"run.py {args.step}: FAILED {failure}", file=sys.stderr)
    return 1 if runner.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
