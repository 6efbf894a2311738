"""The numerics self-check's rules (infera_vllm.self_check), its switch, and its place in the coverage report.
The same check on a real op under a real vLLM engine: packages/infera-moe-decode/tests/test_moe_decode_vllm.py."""

import pytest
import torch

from infera_vllm import coverage, report, self_check
from infera_vllm.switches import SwitchError, Switches


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    saved = dict(coverage._self_checks)
    coverage._self_checks.clear()
    self_check.configure(mode="first", rate=0.0, perturb="", strict=False)
    yield
    coverage._self_checks.clear()
    coverage._self_checks.update(saved)
    self_check.configure(mode="first", rate=0.0, perturb="", strict=False)


def _pair(error: float, n: int = 64):
    theirs = torch.randn(n, generator=torch.Generator().manual_seed(n)) + 3.0
    ours = theirs.clone()
    ours[n // 2] += error * float(theirs.abs().max())
    return ours, theirs


def test_first_eager_call_per_bucket_is_checked_then_not():
    check = self_check.Checker("demo", bound=1e-2)
    assert check.wants("1", capturing=False)
    assert check.judge("1", *_pair(1e-3))
    assert not check.wants("1", capturing=False)  # checked once: later calls run unchecked
    assert check.wants("3-4", capturing=False)  # another bucket: its own first check
    [entry] = [e for e in coverage.snapshot()["self_check"] if e["bucket"] == "1"]
    assert entry["checked"] == entry["passed"] == 1 and entry["failed"] == 0
    assert entry["max_error"] == pytest.approx(1e-3, rel=1e-3)


def test_mismatch_declines_the_bucket_and_says_so(caplog):
    check = self_check.Checker("demo", bound=1e-2)
    with caplog.at_level("WARNING", logger="infera_vllm"):
        assert not check.judge("5-8", *_pair(0.2), shape=(7, 16))
    assert check.declined("5-8") and not check.declined("1")
    assert not check.wants("5-8", capturing=False)
    assert any("demo self-check failed for 5-8 tokens (shape (7, 16))" in r.getMessage() for r in caplog.records)
    [entry] = coverage.snapshot()["self_check"]
    assert (entry["checked"], entry["passed"], entry["failed"]) == (1, 0, 1)


def test_nan_and_zero_outputs():
    check = self_check.Checker("demo", bound=1e-2)
    ours, theirs = _pair(0.0)
    ours[3] = float("nan")
    assert not check.judge("1", ours, theirs)
    assert not check.judge("3-4", torch.ones(8), torch.zeros(8))


def test_all_zero_outputs_prove_nothing_and_the_next_eager_call_is_checked():
    check = self_check.Checker("demo", bound=1e-2)
    assert check.wants("2", capturing=False)
    assert check.judge("2", torch.zeros(8), torch.zeros(8))  # agrees, but is not counted as a check
    assert check.wants("2", capturing=False)
    assert not check.wants("2", capturing=True)  # captured before a conclusive check: counted unchecked
    [entry] = [e for e in coverage.snapshot()["self_check"] if e["bucket"] == "2"]
    assert entry["checked"] == 0 and entry["unchecked_at_capture"] == 1
    assert check.judge("2", *_pair(1e-3)) and not check.wants("2", capturing=False)


def test_strict_mode_makes_a_mismatch_an_error():
    self_check.configure(mode="first", rate=0.0, perturb="", strict=True)
    with pytest.raises(self_check.SelfCheckMismatch, match="INFERA_VLLM_STRICT"):
        self_check.Checker("demo", bound=1e-2).judge("1", *_pair(0.5))


def test_capture_before_any_eager_call_is_counted_unchecked():
    check = self_check.Checker("demo", bound=1e-2)
    assert not check.wants("9-16", capturing=True)
    assert not check.wants("9-16", capturing=True)
    [entry] = coverage.snapshot()["self_check"]
    assert entry["unchecked_at_capture"] == 2 and entry["checked"] == 0
    assert check.wants("9-16", capturing=False)


def test_off_and_ops_without_a_bound_never_check():
    self_check.configure(mode="off", rate=0.0, perturb="", strict=False)
    assert not self_check.Checker("demo", bound=1e-2).wants("1", capturing=False)
    self_check.configure(mode="first", rate=0.0, perturb="", strict=False)
    assert not self_check.Checker("demo", bound=0.0).wants("1", capturing=False)


def test_rate_samples_later_calls():
    self_check.configure(mode="0.25", rate=0.25, perturb="", strict=False)
    check = self_check.Checker("demo", bound=1e-2)
    check.judge("1", *_pair(0.0))
    sampled = sum(check.wants("1", capturing=False) for _ in range(4000))
    assert 800 < sampled < 1200


def test_perturb_scales_only_the_named_op():
    self_check.configure(mode="first", rate=0.0, perturb="demo", strict=False)
    out = torch.ones(4)
    self_check.Checker("demo", bound=1e-2).perturb(out)
    assert torch.equal(out, torch.full((4,), self_check.PERTURB_SCALE))
    self_check.Checker("other", bound=1e-2).perturb(out)
    assert torch.equal(out, torch.full((4,), self_check.PERTURB_SCALE))


@pytest.mark.parametrize("raw, mode, rate", [
    ("", "first", 0.0), ("FIRST", "first", 0.0), ("1", "first", 0.0), ("true", "first", 0.0), ("On", "first", 0.0),
    ("yes", "first", 0.0), ("off", "off", 0.0), ("0", "off", 0.0), ("false", "off", 0.0), ("no", "off", 0.0),
    ("None", "off", 0.0), ("every", "every", 1.0), ("0.01", "0.01", 0.01), (" 0.5 ", "0.5", 0.5)])
def test_switch_values(raw, mode, rate):
    """Flag values read as every other flag (on: the default check, first); every call is spelled every."""
    switches = Switches.from_env({"INFERA_VLLM_SELF_CHECK": raw})
    assert (switches.self_check, switches.self_check_rate) == (mode, rate)


@pytest.mark.parametrize("raw, hint", [("always", ""), ("1.0", "every call: every"), ("1.5", "every call: every"),
                                       ("-0.1", ""), ("nan", ""), ("0.0", "")])
def test_bad_switch_values_name_the_switch(raw, hint):
    with pytest.raises(SwitchError, match=r"INFERA_VLLM_SELF_CHECK=.*first, every, or a rate in \(0, 1\)") as exc:
        Switches.from_env({"INFERA_VLLM_SELF_CHECK": raw})
    assert hint in str(exc.value)


def test_report_merges_and_renders_self_checks(tmp_path):
    check = self_check.Checker("demo", bound=1e-2)
    check.judge("1", *_pair(1e-3))
    check.judge("2", *_pair(0.3))
    coverage.write_report(str(tmp_path))
    merged = report.merge(report.load(str(tmp_path)))
    rows = {c["bucket"]: c for c in merged["self_check"]}
    assert rows["1"]["passed"] == 1 and rows["2"]["failed"] == 1 and rows["2"]["processes"] == 1
    text = report.render(merged)
    assert "self-check" in text and "3.00e-01" in text


def test_idle_only_when_off_and_nothing_declined():
    """``idle`` lets an op skip its per-call bucket bookkeeping: only with the check off and no bucket
    declined (a bucket declined before the check was turned off still needs its key looked up)."""
    check = self_check.Checker("demo", bound=1e-2)
    assert not check.idle  # mode first: calls need their bucket
    assert not check.judge("1", *_pair(1.0))  # a mismatch declines "1"
    self_check.configure(mode="off", rate=0.0, perturb="", strict=False)
    assert not check.idle and check.declined("1")
    assert self_check.Checker("other", bound=1e-2).idle
