import pytest

from infera_vllm import switches
from infera_vllm.spec import OpSpec, Reason
from infera_vllm.switches import SwitchError, Switches


def _spec(name="norm", default_on=True):
    return OpSpec(name=name, distribution=f"infera-{name}", seam="-", vllm=">=0", activate="m:f",
                  gpu_families=("cpu",), default_on=default_on)


def test_defaults_select_default_on_ops_only():
    s = Switches.from_env({})
    assert s.selection(_spec()) is None
    assert s.selection(_spec("linear-hipblaslt", default_on=False)).code == Reason.NOT_REQUESTED


def test_disable_wins_over_everything():
    s = Switches.from_env({"INFERA_VLLM_OPS_DISABLE": "1", "INFERA_VLLM_OPS": "norm"})
    assert s.selection(_spec()).code == Reason.DISABLED


def test_allow_list_names_ops_and_turns_on_opt_in():
    s = Switches.from_env({"INFERA_VLLM_OPS": " norm , linear-hipblaslt ,"})
    assert s.allow == {"norm", "linear-hipblaslt"}
    assert s.selection(_spec()) is None
    assert s.selection(_spec("linear-hipblaslt", default_on=False)) is None
    assert s.selection(_spec("attn-paged")).code == Reason.NOT_REQUESTED
    assert s.requested_explicitly("norm") and not s.requested_explicitly("attn-paged")


def test_exclude_applies_after_allow():
    s = Switches.from_env({"INFERA_VLLM_OPS": "norm,attn-paged", "INFERA_VLLM_OPS_EXCLUDE": "attn-paged"})
    assert s.selection(_spec("attn-paged")).code == Reason.EXCLUDED
    assert s.selection(_spec()) is None
    assert not s.requested_explicitly("attn-paged")


@pytest.mark.parametrize("value", ["maybe", "2", "enabled"])
def test_unparseable_flag_is_a_clear_error(value):
    with pytest.raises(SwitchError, match="INFERA_VLLM_STRICT"):
        Switches.from_env({"INFERA_VLLM_STRICT": value})


@pytest.mark.parametrize("value, expected",
                         [("1", True), ("TRUE", True), ("on", True), ("0", False), ("", False), ("no", False)])
def test_flag_spellings(value, expected):
    assert Switches.from_env({"INFERA_VLLM_STRICT": value}).strict is expected


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", "on", "yes", "y", "0", "false", "off", "", "2"])
def test_triton_interpreter_reads_the_switch_as_triton_does(monkeypatch, raw):
    """The ops decline, or pick FP32_DOT, by whether Triton's interpreter runs: read as Triton reads it."""
    import triton

    monkeypatch.setenv("TRITON_INTERPRET", raw)
    assert switches.triton_interpreter() == bool(triton.knobs.runtime.interpret)


def test_op_names_are_read_in_any_case():
    s = Switches.from_env({"INFERA_VLLM_OPS": "NORM, Linear-HipBLASLt", "INFERA_VLLM_OPS_EXCLUDE": "Attn-Paged"})
    assert s.selection(_spec()) is None and s.selection(_spec("linear-hipblaslt", default_on=False)) is None
    assert s.requested_explicitly("Norm")
    assert Switches.from_env({"INFERA_VLLM_OPS_EXCLUDE": "Attn-Paged"}).selection(_spec("attn-paged")).code == (
        Reason.EXCLUDED)
    assert s.unknown_names({"norm", "linear-hipblaslt", "attn-paged"}) == []
    assert s.unknown_names({"norm", "linear-hipblaslt", "attn-pages"}) == [
        "INFERA_VLLM_OPS_EXCLUDE names 'attn-paged', which no installed wheel provides (did you mean 'attn-pages'?)"]
