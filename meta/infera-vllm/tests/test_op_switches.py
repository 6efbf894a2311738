"""An op's own switches: declared in its spec, parsed by the plugin with one set of rules before the op's
check, a refused value declining only that op ``bad-switch``; doctor shows them and gives the same verdict."""

import json
import re
from pathlib import Path

import pytest

from conftest import ops_by_name, reports, run_python
from infera_vllm import compat, discovery
from infera_vllm.spec import OpSpec, Reason, Switch
from infera_vllm.switches import SwitchError, allowed_values, default_text, op_value, op_values, parse

FLAG = Switch("INFERA_T_FLAG", "flag", False)
INT = Switch("INFERA_T_INT", "int", None, minimum=0)
ANY_INT = Switch("INFERA_T_ANY_INT", "int", 3)
CHOICE = Switch("INFERA_T_CHOICE", "choice", "auto", choices=("auto", "fa3", "kernel"))
PATH = Switch("INFERA_T_PATH", "path")
FIXTURE_SWITCHES = {"INFERA_FIXTURE_FAST", "INFERA_FIXTURE_TOKENS", "INFERA_FIXTURE_MODE", "INFERA_FIXTURE_TABLE"}


def _spec(*switches, name="t-op"):
    return OpSpec(name=name, distribution=f"infera-{name}", seam="-", vllm=">=0", activate="m:f",
                  gpu_families=("cpu",), switches=switches)


@pytest.mark.parametrize("switch, raw, expected", [
    (FLAG, None, False), (FLAG, "", False), (FLAG, "  ", False), (FLAG, "1", True), (FLAG, "TRUE", True),
    (FLAG, " yes ", True), (FLAG, "on", True), (FLAG, "0", False), (FLAG, "false", False), (FLAG, "No", False),
    (FLAG, "off", False),
    (INT, None, None), (INT, "", None), (INT, "0", 0), (INT, " 512 ", 512), (INT, "+8", 8),
    (ANY_INT, None, 3), (ANY_INT, "-2", -2),
    (CHOICE, None, "auto"), (CHOICE, "", "auto"), (CHOICE, "kernel", "kernel"), (CHOICE, " FA3 ", "fa3"),
    (PATH, None, None), (PATH, "", None), (PATH, " /tmp/t.json ", "/tmp/t.json"),
])
def test_good_values_per_kind(switch, raw, expected):
    assert parse(switch, raw) == expected and type(parse(switch, raw)) is type(expected)


@pytest.mark.parametrize("switch, raw, allowed", [
    (FLAG, "maybe", "1/0, true/false, yes/no or on/off"), (FLAG, "2", "1/0, true/false, yes/no or on/off"),
    (INT, "lots", "an integer >= 0"), (INT, "-1", "an integer >= 0"), (INT, "1.5", "an integer >= 0"),
    (INT, "1_000", "an integer >= 0"), (ANY_INT, "x", "an integer"),
    (CHOICE, "sometimes", "one of auto, fa3, kernel"), (CHOICE, "0", "one of auto, fa3, kernel"),
])
def test_bad_values_name_the_switch_the_value_and_what_it_accepts(switch, raw, allowed):
    with pytest.raises(SwitchError) as err:
        parse(switch, raw)
    assert str(err.value) == f"{switch.name}={raw!r}: expected {allowed}"
    assert allowed_values(switch) == allowed


def test_flags_take_exactly_the_plugin_switches_spellings():
    from infera_vllm.switches import _FALSE, _TRUE, Switches

    for raw in sorted(_TRUE | _FALSE):
        assert parse(FLAG, raw) is Switches.from_env({"INFERA_VLLM_STRICT": raw}).strict


def test_defaults_as_users_write_them():
    assert [default_text(s) for s in (FLAG, Switch("X_ON", "flag", True), INT, ANY_INT, CHOICE, PATH)] == \
        ["0", "1", "unset", "3", "auto", "unset"]


def test_op_values_lists_every_refused_value_and_op_value_reads_one():
    spec = _spec(FLAG, INT, CHOICE, PATH)
    assert op_values(spec, {}) == {"INFERA_T_FLAG": False, "INFERA_T_INT": None, "INFERA_T_CHOICE": "auto",
                                   "INFERA_T_PATH": None}
    with pytest.raises(SwitchError) as err:
        op_values(spec, {"INFERA_T_FLAG": "maybe", "INFERA_T_CHOICE": "x", "INFERA_T_INT": "7"})
    assert str(err.value) == ("INFERA_T_FLAG='maybe': expected 1/0, true/false, yes/no or on/off; "
                              "INFERA_T_CHOICE='x': expected one of auto, fa3, kernel")
    assert op_value(spec, "INFERA_T_INT", {"INFERA_T_INT": "7"}) == 7
    with pytest.raises(LookupError, match="declares no switch 'INFERA_T_OTHER'"):
        op_value(spec, "INFERA_T_OTHER")


def test_op_value_reads_this_process_environment_each_time(monkeypatch):
    spec = _spec(CHOICE)
    monkeypatch.setenv("INFERA_T_CHOICE", "kernel")
    assert op_value(spec, "INFERA_T_CHOICE") == "kernel"
    monkeypatch.setenv("INFERA_T_CHOICE", "Fa3")
    assert op_value(spec, "INFERA_T_CHOICE") == "fa3"


@pytest.mark.parametrize("switches, message", [
    ((Switch("INFERA_T_X", "number", 1),), "kind 'number' is not one of flag, int, choice, path"),
    ((Switch("INFERA_T_X", "flag", "0"),), "a flag's default must be True or False"),
    ((Switch("INFERA_T_X", "int", "8"),), "an int switch's default must be an int or None"),
    ((Switch("INFERA_T_X", "int", -1, minimum=0),), "default -1 is below its minimum 0"),
    ((Switch("INFERA_T_X", "choice", "auto"),), "a choice switch needs its choices"),
    ((Switch("INFERA_T_X", "choice", "fast", choices=("auto", "kernel")),), "default 'fast' is not among"),
    ((Switch("INFERA_T_X", "choice", "auto", choices=["auto"]),), "must be hashable"),
    ((Switch("infera_t_x", "flag", False),), "must be an upper-case environment variable"),
    ((Switch("INFERA_VLLM_X", "flag", False),), "outside INFERA_VLLM_*"),
    ((FLAG, FLAG), "INFERA_T_FLAG is declared twice"),
    (("INFERA_T_X",), "is not a Switch"),
])
def test_unusable_declarations_are_spec_errors(switches, message):
    decline = compat.spec_problem(_spec(*switches))
    assert decline is not None and decline.code == Reason.SPEC_ERROR and message in decline.detail, decline


def test_a_good_declaration_passes():
    assert compat.spec_problem(_spec(FLAG, INT, ANY_INT, CHOICE, PATH)) is None


LOAD = """
from vllm.plugins import load_general_plugins
load_general_plugins()
"""


@pytest.mark.cpu_build  # asserts the CPU build's verdicts of the real op wheels (Triton ops decline there)
def test_a_bad_value_declines_only_its_op_at_warning(tmp_path):
    proc = run_python(LOAD, env={"INFERA_VLLM_REPORT_DIR": str(tmp_path), "INFERA_FIXTURE_MODE": "sometimes"})
    ops = ops_by_name(reports(tmp_path)[0])
    assert (ops["fixture-switches"]["status"], ops["fixture-switches"]["reason"]) == ("declined", "bad-switch")
    assert ops["fixture-switches"]["detail"] == "INFERA_FIXTURE_MODE='sometimes': expected one of auto, kernel, off"
    assert ops["fixture-good"]["status"] == "active"  # the other ops reach their own verdicts
    assert ops["norm"]["reason"] == "triton-interpreter-off" and ops["attn-paged"]["reason"] == "triton-interpreter-off"
    assert ops["fixture-bad-switch-declaration"]["reason"] == "spec-error"
    assert "default 'fast' is not among its choices" in ops["fixture-bad-switch-declaration"]["detail"]
    (line,) = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "op fixture-switches " in ln]
    assert "WARNING" in line and "bad-switch" in line and "INFERA_FIXTURE_MODE" in line and "auto, kernel, off" in line


def test_good_values_reach_the_op_parsed(tmp_path):
    run_python(LOAD, env={"INFERA_VLLM_REPORT_DIR": str(tmp_path), "INFERA_VLLM_OPS": "fixture-switches",
                          "INFERA_FIXTURE_FAST": "yes", "INFERA_FIXTURE_TOKENS": " 8 ",
                          "INFERA_FIXTURE_MODE": "KERNEL"})
    (op,) = [o for o in reports(tmp_path)[0]["ops"] if o["op"] == "fixture-switches"]
    assert op["status"] == "active"
    assert op["detail"] == ("INFERA_FIXTURE_FAST=True, INFERA_FIXTURE_TOKENS=8, INFERA_FIXTURE_MODE='kernel', "
                            "INFERA_FIXTURE_TABLE=None")


def test_a_switch_of_an_op_not_selected_is_not_judged(tmp_path):
    run_python(LOAD, env={"INFERA_VLLM_REPORT_DIR": str(tmp_path), "INFERA_VLLM_OPS_EXCLUDE": "fixture-switches",
                          "INFERA_FIXTURE_TOKENS": "0"})
    assert ops_by_name(reports(tmp_path)[0])["fixture-switches"]["reason"] == "excluded"


def _strict_failures(env) -> list[str]:
    proc = run_python(LOAD, check=False, env={**env, "INFERA_VLLM_STRICT": "1"})
    assert proc.returncode != 0 and "StrictDeclineError: " in proc.stderr  # the fixture wheel's broken specs
    error = proc.stderr.split("StrictDeclineError: ")[1]
    return [ln for ln in error.splitlines() if ln.startswith("  infera-vllm: op ")]


def test_strict_mode_raises_on_a_bad_value(tmp_path):
    env = {"INFERA_VLLM_REPORT_DIR": str(tmp_path), "INFERA_VLLM_OPS": "fixture-switches,fixture-good"}
    failed = [ln for ln in _strict_failures({**env, "INFERA_FIXTURE_TOKENS": "0"}) if "op fixture-switches " in ln]
    assert len(failed) == 1 and "bad-switch: INFERA_FIXTURE_TOKENS='0': expected an integer >= 1" in failed[0]
    assert not [ln for ln in _strict_failures({**env, "INFERA_FIXTURE_TOKENS": "1"}) if "op fixture-switches " in ln]


def _doctor(env, *args, fixture_ops=True):
    return run_python("", args=("-m", "infera_vllm", "doctor", *args), env=env, fixture_ops=fixture_ops, check=False)


def test_doctor_shows_the_switches_and_gives_serving_verdict(tmp_path):
    env = {"INFERA_VLLM_OPS": "fixture-switches,fixture-good", "INFERA_FIXTURE_MODE": "sometimes",
           "INFERA_FIXTURE_FAST": "on"}
    proc = _doctor(env, "--json")
    assert proc.returncode == 1  # an op named in INFERA_VLLM_OPS would decline
    ops = {o["op"]: o for o in json.loads(proc.stdout)["ops"]}
    mine = ops["fixture-switches"]
    assert (mine["verdict"], mine["reason"]) == ("declined", "bad-switch")
    rows = {r["switch"]: r for r in mine["switches"]}
    assert set(rows) == FIXTURE_SWITCHES
    assert rows["INFERA_FIXTURE_MODE"] == {
        "switch": "INFERA_FIXTURE_MODE", "kind": "choice", "value": "sometimes", "default": "auto",
        "allowed": "one of auto, kernel, off", "doc": "a choice",
        "problem": "INFERA_FIXTURE_MODE='sometimes': expected one of auto, kernel, off"}
    assert (rows["INFERA_FIXTURE_FAST"]["value"], rows["INFERA_FIXTURE_FAST"]["problem"]) == ("on", "")
    assert (rows["INFERA_FIXTURE_TOKENS"]["value"], rows["INFERA_FIXTURE_TOKENS"]["default"]) == (None, "4")
    assert ops["fixture-good"]["verdict"] == "would activate" and ops["fixture-good"]["switches"] == []
    # serving, in the same environment, declines it with the same code and message
    run_python(LOAD, env={**env, "INFERA_VLLM_REPORT_DIR": str(tmp_path)})
    served = ops_by_name(reports(tmp_path)[0])["fixture-switches"]
    assert (served["reason"], served["detail"]) == (mine["reason"], mine["detail"])
    text = _doctor(env).stdout
    assert "declined [bad-switch] INFERA_FIXTURE_MODE='sometimes'" in text
    assert "INFERA_FIXTURE_MODE = 'sometimes' (default auto; one of auto, kernel, off)  <- refused" in text
    assert "INFERA_FIXTURE_TOKENS = unset (default 4; an integer >= 1)" in text


def _installed_switches() -> dict[str, tuple[str, Switch]]:
    """Every switch the installed op wheels declare (the test-only fixture wheel is not on this path)."""
    return {s.name: (f.spec.name, s) for f in discovery.discover() if f.spec is not None for s in f.spec.switches}


DOC = Path(__file__).resolve().parents[3] / "docs" / "switches.md"


def test_switches_doc_lists_exactly_the_declared_switches():
    if not DOC.is_file():
        pytest.skip(f"{DOC} is not here (tests run outside the repository)")
    declared = _installed_switches()
    assert declared, "no installed op wheel declares a switch"
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`(INFERA_[A-Z0-9_]+)(=[^`]*)?`", cells[0]) if line.startswith("|") else None
        if match and not match.group(1).startswith("INFERA_VLLM_"):
            rows[match.group(1)] = cells
    assert set(rows) == set(declared), f"in the doc only: {set(rows) - set(declared)}; " \
                                       f"declared only: {set(declared) - set(rows)}"
    for name, (op, switch) in declared.items():
        assert rows[name][1:4] == [op, allowed_values(switch), default_text(switch)], (name, rows[name][1:4])


def test_each_real_op_declines_a_bad_value_of_its_switches():
    """One refused value per installed op wheel: doctor declines each op bad-switch, naming the switch (before
    the platform checks, so on every platform)."""
    bad = {}
    for name, (op, switch) in _installed_switches().items():
        if switch.kind != "path" and op not in {o for o, _ in bad.values()}:
            bad[name] = (op, "sometimes")
    assert {op for op, _ in bad.values()} == {"norm", "attn-paged", "moe-decode", "linear-hipblaslt"}
    env = {name: value for name, (_, value) in bad.items()}
    proc = _doctor({**env, "INFERA_VLLM_OPS": ",".join(op for op, _ in bad.values())}, "--json", fixture_ops=False)
    assert proc.returncode == 1
    ops = {o["op"]: o for o in json.loads(proc.stdout)["ops"]}
    for name, (op, value) in bad.items():
        assert ops[op]["reason"] == "bad-switch", ops[op]
        assert ops[op]["detail"].startswith(f"{name}={value!r}: expected"), ops[op]
