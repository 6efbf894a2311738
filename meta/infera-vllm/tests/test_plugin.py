"""register() through vLLM's own plugin loader, in fresh processes, with failing op wheels installed."""

import json

import pytest

from conftest import ops_by_name, reports, run_python

LOAD_TWICE = """
from vllm.plugins import load_general_plugins
load_general_plugins()
from infera_vllm import plugin
plugin.register()  # idempotent: a second call in the same process does nothing
from infera_fixture_ops import good
print("ACTIVATIONS", len(good.ACTIVATED_IN))
"""


@pytest.mark.cpu_build  # asserts the CPU build's verdicts (Triton ops decline there)
def test_failures_are_contained_and_each_has_its_reason(tmp_path):
    proc = run_python(LOAD_TWICE, env={"INFERA_VLLM_REPORT_DIR": str(tmp_path)})
    assert "ACTIVATIONS 1" in proc.stdout
    (report,) = reports(tmp_path)
    ops = ops_by_name(report)
    expected = {
        "fixture-good": ("active", ""),
        "fixture-import-raises": ("declined", "import-error"),
        "fixture-activate-raises": ("declined", "activate-error"),
        "fixture-missing-symbol": ("declined", "symbol-missing"),
        "fixture-signature": ("declined", "signature-changed"),
        "fixture-bad-range": ("declined", "vllm-version"),
        "fixture-bad-spec": ("declined", "spec-error"),
        "fixture-malformed-spec": ("declined", "spec-error"),  # sorted after fixture-bad-*: later ops still run
        "fixture-switches": ("active", ""),
        "fixture-bad-switch-declaration": ("declined", "spec-error"),
        # the real op wheels still reach their own verdicts beside the broken ones
        "norm": ("declined", "triton-interpreter-off"),  # real kernels: on the CPU only under the interpreter
        "attn-paged": ("declined", "triton-interpreter-off"),  # likewise
        "moe-decode": ("declined", "triton-interpreter-off"),  # likewise
        "linear-hipblaslt": ("declined", "not-requested"),
    }
    assert {k: (v["status"], v["reason"]) for k, v in ops.items()} == expected
    assert "libinfera_kernels.so" in ops["fixture-import-raises"]["detail"]
    assert "ptxas exited 255" in ops["fixture-activate-raises"]["detail"]
    assert "no_such_ir_op" in ops["fixture-missing-symbol"]["detail"]
    assert "renamed_away" in ops["fixture-signature"]["detail"]
    assert "triton = '3.4' is not a PEP 440" in ops["fixture-malformed-spec"]["detail"]
    # one startup line per op, at INFO, in vLLM's log
    for name in expected:
        assert f"infera-vllm: op {name} " in proc.stdout + proc.stderr
    assert report["counts"] == [{"op": "fixture-good", "route": "kernel", "reason": "", "bucket": "startup",
                                 "at": "plan", "count": 1}]


def test_disable_all_leaves_vllm_untouched(tmp_path):
    proc = run_python(LOAD_TWICE, env={"INFERA_VLLM_REPORT_DIR": str(tmp_path), "INFERA_VLLM_OPS_DISABLE": "1"})
    assert "ACTIVATIONS 0" in proc.stdout
    assert "INFERA_VLLM_OPS_DISABLE=1" in proc.stdout + proc.stderr
    assert reports(tmp_path) == []


@pytest.mark.cpu_build  # asserts the CPU build's verdicts (Triton ops decline there)
def test_allow_and_exclude_lists(tmp_path):
    run_python(LOAD_TWICE, env={"INFERA_VLLM_REPORT_DIR": str(tmp_path),
                                "INFERA_VLLM_OPS": "norm,fixture-good,linear-hipblaslt,ghost-op",
                                "INFERA_VLLM_OPS_EXCLUDE": "fixture-good"})
    ops = ops_by_name(reports(tmp_path)[0])
    assert ops["fixture-good"]["reason"] == "excluded"
    assert ops["norm"]["reason"] == "triton-interpreter-off"
    # an opt-in op that is named gets as far as the others
    assert ops["linear-hipblaslt"]["reason"] == "triton-interpreter-off"
    assert ops["ghost-op"]["reason"] == "not-installed"
    assert ops["attn-paged"]["reason"] == "not-requested"


def test_names_no_wheel_provides_are_warnings_that_list_the_installed_ops(tmp_path):
    proc = run_python(LOAD_TWICE, env={"INFERA_VLLM_REPORT_DIR": str(tmp_path), "INFERA_VLLM_OPS": "bogus-op,nrom",
                                       "INFERA_VLLM_OPS_EXCLUDE": "everything"})
    out = proc.stdout + proc.stderr
    lines = [ln for ln in out.splitlines() if "infera-vllm: op bogus-op " in ln]
    assert lines and all("WARNING" in ln and "installed: " in ln and "fixture-good" in ln for ln in lines), out[-3000:]
    assert any("WARNING" in ln and "INFERA_VLLM_OPS_EXCLUDE names 'everything'" in ln for ln in out.splitlines())
    # a typo of an installed op's name: the warning says which one was meant
    assert any("WARNING" in ln and "op nrom " in ln and "did you mean 'norm'?" in ln for ln in out.splitlines()), out
    # the op refusing what the user gave it (a tuning file, say) at activation: a WARNING, not an INFO line
    bad = run_python(LOAD_TWICE, env={"INFERA_VLLM_REPORT_DIR": str(tmp_path / "bad"),
                                      "INFERA_VLLM_OPS": "fixture-activate-raises"})
    assert any("WARNING" in ln and "op fixture-activate-raises" in ln and "activate-error" in ln
               for ln in (bad.stdout + bad.stderr).splitlines()), bad.stderr[-3000:]


@pytest.mark.cpu_build  # asserts the CPU build's verdicts (Triton ops decline there)
def test_strict_turns_declines_into_errors(tmp_path):
    proc = run_python(LOAD_TWICE, check=False, env={"INFERA_VLLM_REPORT_DIR": str(tmp_path), "INFERA_VLLM_STRICT": "1"})
    assert proc.returncode != 0
    assert "StrictDeclineError" in proc.stderr and "fixture-import-raises" in proc.stderr
    error = proc.stderr.split("StrictDeclineError: ")[1].split("\nINFO")[0]
    assert "op fixture-import-raises" in error and "op norm" in error
    assert "op fixture-good" not in error and "op linear-hipblaslt" not in error  # active / not requested


def test_strict_per_call_decline_raises():
    proc = run_python("""
from infera_vllm import coverage
coverage.configure(report_dir=None, strict=True, context={})
coverage.counter("norm", "kernel")()
coverage.counter("norm", "handover", "vllm-c-faster", "1")()  # by design: strict lets it through
print("HANDOVER COUNTED")
try:
    coverage.counter("norm", "fallback", "dtype", "1")()
except coverage.StrictDeclineError as exc:
    print("RAISED", exc)
try:
    coverage.counter("norm", "skipped")
except ValueError as exc:
    print("BAD ROUTE", exc)
""", fixture_ops=False)
    assert "HANDOVER COUNTED" in proc.stdout
    assert "RAISED INFERA_VLLM_STRICT=1: norm declined a call (dtype, 1)" in proc.stdout
    assert "BAD ROUTE route must be one of" in proc.stdout


def test_malformed_switch_is_a_clear_error(tmp_path):
    proc = run_python(LOAD_TWICE, check=False,
                      env={"INFERA_VLLM_REPORT_DIR": str(tmp_path), "INFERA_VLLM_OPS_DISABLE": "sometimes"})
    assert proc.returncode != 0 and "INFERA_VLLM_OPS_DISABLE='sometimes'" in proc.stderr


SPAWN = """
import multiprocessing as mp, os

def worker(q):
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from infera_fixture_ops import good
    q.put((os.getpid(), len(good.ACTIVATED_IN)))

if __name__ == "__main__":
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(q,), name=f"VllmWorker-{i}") for i in range(2)]
    for p in procs: p.start()
    got = [q.get(timeout=300) for _ in procs]
    for p in procs: p.join(300)
    print("CHILDREN", sorted(n for _, n in got), [p.exitcode for p in procs])
"""


@pytest.mark.cpu_build  # asserts the CPU build's verdicts (Triton ops decline there)
def test_spawned_processes_register_and_reports_merge(tmp_path):
    """No report dir is given: the first process makes one and hands it to its spawned children."""
    script = tmp_path / "spawn_main.py"
    script.write_text(SPAWN)
    env_dir = tmp_path / "tmpdir"
    env_dir.mkdir()
    proc = run_python("", args=(str(script),), env={"TMPDIR": str(env_dir)})
    assert "CHILDREN [1, 1] [0, 0]" in proc.stdout
    (report_dir,) = env_dir.glob("infera-vllm-report-*")
    assert f"coverage reports -> {report_dir}" in proc.stdout + proc.stderr  # printed at startup
    files = reports(report_dir)
    assert sorted(r["process"]["name"] for r in files) == ["MainProcess", "VllmWorker-0", "VllmWorker-1"]

    merged = json.loads(run_python("", args=("-m", "infera_vllm", "report", str(report_dir), "--json"),
                                   fixture_ops=False).stdout)
    assert len(merged["processes"]) == 3
    (good,) = [c for c in merged["counts"] if c["op"] == "fixture-good"]
    assert (good["count"], good["processes"]) == (3, 3)
    norm = [o for o in merged["ops"] if o["op"] == "norm"]
    assert norm == [{"op": "norm", "status": "declined", "reason": "triton-interpreter-off",
                     "detail": norm[0]["detail"], "processes": 3}]
    text = run_python("", args=("-m", "infera_vllm", "report", str(report_dir)), fixture_ops=False).stdout
    assert "infera-vllm coverage: 3 process(es)" in text and "triton-interpreter-off" in text and "3/3" in text


def test_forked_child_reports_only_its_own_calls(tmp_path):
    run_python("""
import os
from infera_vllm import coverage
coverage.configure(report_dir=os.environ["INFERA_VLLM_REPORT_DIR"], strict=False, context={})
coverage.record("norm", "kernel", bucket="1", n=5)
pid = os.fork()
if pid == 0:
    coverage.record("norm", "fallback", "dtype", "2")
    coverage.write_report()
    os._exit(0)
os.waitpid(pid, 0)
coverage.write_report()
""", fixture_ops=False, env={"INFERA_VLLM_REPORT_DIR": str(tmp_path)})
    by_pid = {r["process"]["pid"]: r["counts"] for r in reports(tmp_path)}
    assert len(by_pid) == 2
    assert sorted(len(c) for c in by_pid.values()) == [1, 1]
    assert sorted(c[0]["count"] for c in by_pid.values()) == [1, 5]


@pytest.mark.parametrize("module", ["infera_vllm.plugin", "infera_vllm.spec", "infera_vllm.switches", "infera_vllm"])
def test_plugin_entry_modules_are_import_light(module):
    from infera_vllm.testing import assert_import_light

    assert_import_light(module)


FORK = """
import multiprocessing as mp, os
from infera_vllm import coverage

def worker():
    coverage.record("norm", "kernel", bucket="1", n=3)  # leaves through os._exit(): no atexit

if __name__ == "__main__":
    coverage.configure(report_dir=os.environ["INFERA_VLLM_REPORT_DIR"], strict=False, context={})
    coverage.record("norm", "kernel", bucket="1", n=5)
    p = mp.get_context("fork").Process(target=worker, name="EngineCore")
    p.start(); p.join(60)
    print("CHILD", p.exitcode)
"""


def test_multiprocessing_fork_child_writes_its_report(tmp_path):
    script = tmp_path / "fork_main.py"
    script.write_text(FORK)
    out = tmp_path / "reports"
    proc = run_python("", args=(str(script),), fixture_ops=False, env={"INFERA_VLLM_REPORT_DIR": str(out)})
    assert "CHILD 0" in proc.stdout
    counts = {r["process"]["name"]: r["counts"][0]["count"] for r in reports(out)}
    assert counts == {"MainProcess": 5, "EngineCore": 3}
    assert proc.stderr.count("infera-vllm coverage (pid") == 2  # one exit summary per process, not two


@pytest.mark.parametrize("kind", ["under-proc", "a-regular-file"])
def test_unwritable_report_dir_is_one_warning_and_a_fallback(tmp_path, kind):
    target = "/proc/infera-no-such-dir" if kind == "under-proc" else str(tmp_path / "file")
    if kind == "a-regular-file":
        (tmp_path / "file").write_text("not a directory")
    proc = run_python(LOAD_TWICE, env={"INFERA_VLLM_REPORT_DIR": target, "INFERA_VLLM_OPS": "fixture-good"})
    out = proc.stdout + proc.stderr
    assert "ACTIVATIONS 1" in proc.stdout and "Traceback" not in out and "plugin failed" not in out, out[-3000:]
    (line,) = [ln for ln in out.splitlines() if "cannot be written" in ln]
    assert "WARNING" in line and target in line
    fallback = line.rsplit("coverage reports go to ", 1)[1].strip()
    (report,) = reports(fallback)  # the counts are kept, where the warning says
    assert ops_by_name(report)["fixture-good"]["status"] == "active"
    doctor = run_python("", args=("-m", "infera_vllm", "doctor"), env={"INFERA_VLLM_REPORT_DIR": target})
    assert "cannot be written" in doctor.stdout
