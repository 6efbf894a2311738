"""benchmarks/gpu/run.py, the GPU machine's runner, on the CPU: every step's commands (dry run), and the
runner's own rules with real subprocesses: logs, time limits, failures kept, hidden lines."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("gpu_run", ROOT / "benchmarks" / "gpu" / "run.py")
run = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = run  # dataclasses look their module up there
spec.loader.exec_module(run)

STEPS = {  # each step with the options the docs use, and a command it must print
    "tests": ([], "-m 'not cpu_build' meta/infera-vllm/tests"),
    "attn": (["--tests", "--tune-args=--passes 3,5"], "tune_attn_paged.py --budget-s 180 --prefill-budget-s 100"
                                                      " --out . --passes 3,5"),
    "attn-kv-quant": (["--bench-args=--kv-dtypes fp8"], "bench_attn_paged_kv_quant.py --out . --kv-dtypes fp8"),
    "attn-e2e": (["--models", "qwen3-8b"], "validate --preset attn-paged-h200 --models qwen3-8b --out "
                                           "attn-paged-h200.json"),
    "step-probe": (["--backends", "FLASH_ATTN,CUSTOM"], "e2e_step_probe.py --model /tmp/models/llama-3-8b "
                                                       "--backends FLASH_ATTN,CUSTOM"),
    "moe": (["--tune", "--tune-args=--forms split", "--tests"], "tune_moe_decode.py --out"),
    "moe-fp8": (["--tokens", "1,2"], "bench_moe_decode.py --out . --fp8 tensor --dims mixtral --tokens 1,2"),
    "norm": (["--tune"], "tune_norm.py"),
    "norm-numerics": ([], "validate --preset norm-smollm2-h200"),
    "norm-e2e": ([], "validate --preset norm-smollm2-h200"),
    "linear": (["--tune", "--e2e"], "validate --preset linear-llama3-h200"),
    "foundation": ([], "validate --preset smollm2 --out smollm2.json"),
    "self-check": ([], "validate --dummy /tmp/qwen3-moe-cut --self-check-cost"),
    "validate": (["--models", "qwen3-8b"], "validate --matrix benchmarks/validation/matrix.json --models qwen3-8b"),
    "parallel": ([], "validate --preset parallel-h200x2 --out parallel-h200x2.json"),
    "linear-norm-x2": ([], "validate --preset norm-qwen3-h200"),
    "aot-check": (["load x.pkl y.json"], "h200_aot_check.py load x.pkl y.json"),
}


def test_every_step_is_covered():
    assert set(STEPS) == set(run.STEPS)


@pytest.mark.parametrize("step", sorted(STEPS))
def test_dry_run_prints_the_steps_commands(step, capsys):
    args, expect = STEPS[step]
    assert run.main(["--out", ".", "--dry-run", step, *args]) == 0  # --out: $OUT is set where the device runs it
    assert expect in capsys.readouterr().out


def test_attn_e2e_on_an_fp8_cache_runs_its_preset(capsys):
    assert run.main(["--out", ".", "--dry-run", "attn-e2e", "--models", "llama-3-8b", "--kv-cache-dtype", "fp8"]) == 0
    assert "validate --preset attn-paged-fp8-h200 --models llama-3-8b" in capsys.readouterr().out


def test_tests_step_selects_within_a_package(capsys):
    assert run.main(["--out", ".", "--dry-run", "tests", "--packages", "infera-attn-paged", "--select", "fa3"]) == 0
    (cmd,) = [line for line in capsys.readouterr().out.splitlines() if "pytest" in line]
    assert "-k fa3 packages/infera-attn-paged/tests" in cmd and "meta/infera-vllm" not in cmd


def test_runner_logs_hides_fails_and_stops_at_the_limit(tmp_path, capsys):
    r = run.Runner(tmp_path, dry_run=False)
    r.env["INFERA_COMMIT"] = "abc"
    r.run([sys.executable, "-c", "print('INFO noise'); print('kept')"], log="a.txt", header="commit abc")
    out = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("+ ")]  # not the echo
    assert out == ["kept"]  # vLLM's INFO lines stay out of the console
    assert (tmp_path / "a.txt").read_text().splitlines() == ["commit abc", "INFO noise", "kept", "exit 0"]
    assert r.failed == []
    r.run([sys.executable, "-c", "raise SystemExit(3)"], log="b.txt")
    r.run([sys.executable, "-c", "import time; time.sleep(30)"], timeout=1)
    assert len(r.failed) == 2 and r.failed[0].endswith("exit 3") and r.failed[1].endswith("past its 1 s limit")
    r.run([sys.executable, "-c", "print('\\n'.join(map(str, range(10))))"], tail=2)
    assert capsys.readouterr().out.splitlines()[-2:] == ["8", "9"]


def test_a_command_past_its_limit_is_interrupted_first_so_its_summary_is_kept(tmp_path, monkeypatch):
    summary = ("import time\ntry:\n    time.sleep(30)\nexcept KeyboardInterrupt:\n"
               "    print('FAILED test_x - the reason', flush=True)\n    raise SystemExit(2)")
    r = run.Runner(tmp_path, dry_run=False)
    r.run([sys.executable, "-c", summary], log="a.txt", timeout=1)
    assert "FAILED test_x - the reason" in (tmp_path / "a.txt").read_text()
    assert r.failed[-1].endswith("past its 1 s limit")
    monkeypatch.setattr(run, "INTERRUPT_GRACE_S", 1)
    stubborn = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(30)"
    r.run([sys.executable, "-c", stubborn], timeout=1)  # one that ignores the interrupt is killed after the grace
    assert len(r.failed) == 2


def test_a_failed_command_fails_the_step_after_the_rest_ran(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(run.Runner, "setup", lambda self: self.env.update(INFERA_COMMIT="abc"))
    monkeypatch.setattr(run, "py", lambda script, *a: [sys.executable, "-c", "raise SystemExit(1)"]
                        if "tune_attn_paged" in script else [sys.executable, "-c", "print('ran')"])
    monkeypatch.setattr(run, "ATTN_TUNING", str(tmp_path / "t.json"))
    (tmp_path / "attn_paged_sm90.json").write_text("{}")
    assert run.main(["--out", str(tmp_path), "attn"]) == 1  # the tuner failed
    captured = capsys.readouterr()
    assert "ran" in captured.out  # the benchmark still ran
    assert "FAILED" in captured.err and "tune_attn_paged.log" in captured.err


def test_validate_continues_from_the_file_the_machine_kept(tmp_path, monkeypatch, capsys):
    """A validate call writes its results in $OUT, starting from the copy the machine kept after its last call
    (/tmp/infera-validate/), else from the checkout's file, and keeps its own for the next call."""
    monkeypatch.setattr(run, "KEPT", tmp_path / "kept")
    out = tmp_path / "out"
    assert run.main(["--out", str(out), "--dry-run", "validate", "--models", "qwen3-8b"]) == 0
    printed = capsys.readouterr().out
    checkout = run.ROOT / "benchmarks/results/h200/validation/validation.json"
    assert f"+ cp {checkout} {out / 'validation.json'}" in printed
    assert f"--out {out / 'validation.json'}" in printed
    assert f"+ cp {out / 'validation.json'} {tmp_path / 'kept' / 'validation.json'}" in printed
    # the runs' logs come back as one file (the device call returns at most 8)
    assert f"+ tar -czf {out / 'validation-logs'}.tar.gz -C {out} validation-logs" in printed
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "validation.json").write_text("{}")
    assert run.main(["--out", str(out), "--dry-run", "validate", "--models", "qwen3-8b"]) == 0
    assert f"+ cp {tmp_path / 'kept' / 'validation.json'} {out / 'validation.json'}" in capsys.readouterr().out
