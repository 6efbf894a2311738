"""Compatibility checks against the vLLM actually installed (0.32 CPU in CI, 0.26 on the GPU machine)."""

import dataclasses

import pytest

from infera_vllm import compat
from infera_vllm.spec import OpSpec, Reason, Symbol


@pytest.fixture(scope="module")
def env():
    return compat.Environment.detect()


def _spec(**kw):
    base = dict(name="t", distribution="infera-t", seam="-", vllm=">=0.24", activate="m:f",
                gpu_families=(), triton=None)
    base.update(kw)
    return OpSpec(**base)


def test_environment_is_detected(env):
    assert env.vllm and env.torch
    assert env.gpu_family is not None, env.gpu_detail


def test_family_check(env):
    assert compat.check_platform(_spec(gpu_families=(env.gpu_family,)), env) is None
    decline = compat.check_platform(_spec(gpu_families=("gfx1201",) if env.gpu_family != "gfx1201" else ("sm90",)), env)
    assert decline.code == Reason.PLATFORM and env.gpu_family in decline.detail


def test_vllm_version_out_of_range(env):
    decline = compat.check_versions(_spec(vllm="<0.1"), env)
    assert decline.code == Reason.VLLM_VERSION and env.vllm in decline.detail


def test_vllm_missing_and_bad_specifier(env):
    assert compat.check_versions(_spec(), dataclasses.replace(env, vllm=None)).code == Reason.VLLM_MISSING
    assert compat.check_versions(_spec(vllm="version two"), env).code == Reason.SPEC_ERROR


@pytest.mark.parametrize("field, kw", [
    ("vllm", {"vllm": "0.26"}), ("torch", {"torch": "two"}), ("triton", {"triton": "3.4"}),
    ("requires[0]", {"requires": (Symbol("vllm.config", "VllmConfig", vllm="0.26"),)}),
    ("activate", {"activate": "module_without_attribute"}), ("gpu_families", {"gpu_families": ()}),
])
def test_spec_problems_name_the_field(field, kw):
    decline = compat.spec_problem(_spec(**{"gpu_families": ("cpu",), **kw}))
    assert decline.code == Reason.SPEC_ERROR and decline.detail.startswith(field), decline
    assert compat.spec_problem(_spec(gpu_families=("cpu",), triton=">=3.4",
                                     requires=(Symbol("vllm.config", "VllmConfig", vllm=">=0.26"),))) is None


def test_torch_and_triton_too_old(env):
    assert compat.check_versions(_spec(torch=">=99"), env).code == Reason.TORCH_VERSION
    assert compat.check_versions(_spec(triton=">=99"), env).code in (Reason.TRITON_VERSION, Reason.TRITON_MISSING)
    no_triton = dataclasses.replace(env, triton=None)
    assert compat.check_versions(_spec(triton=">=3"), no_triton).code == Reason.TRITON_MISSING


@pytest.mark.parametrize("version, spec, ok", [
    ("0.32.0+cpu", ">=0.24,<0.33", True),
    ("0.26.0", ">=0.24,<0.33", True),
    ("0.33.0rc1.dev12", ">=0.24,<0.33", False),
    ("0.24.0.dev3+g123", ">=0.24", True),
    ("0.23.9", ">=0.24", False),
])
def test_version_in_treats_local_and_dev_as_their_release(version, spec, ok):
    assert compat.version_in(version, spec) is ok


def test_symbol_present_on_installed_vllm(env):
    symbol = Symbol("vllm.ir.ops", "rms_norm.register_impl", params=("provider", "supports_args"))
    assert compat.check_symbol(symbol, env.vllm) is None


def test_symbol_missing_module_and_attribute(env):
    d = compat.check_symbol(Symbol("vllm.no_such_module", "x"), env.vllm)
    assert d.code == Reason.SYMBOL_MISSING and "vllm.no_such_module" in d.detail
    d = compat.check_symbol(Symbol("vllm.ir.ops", "rms_norm.no_such_attr"), env.vllm)
    assert d.code == Reason.SYMBOL_MISSING and "no_such_attr" in d.detail


def test_signature_changed(env):
    d = compat.check_symbol(Symbol("vllm.ir.ops", "rms_norm.register_impl", params=("provider", "renamed")), env.vllm)
    assert d.code == Reason.SIGNATURE_CHANGED and "renamed" in d.detail


def test_version_scoped_symbol_is_only_checked_in_its_range(env):
    gone = Symbol("vllm.no_such_module", "x", vllm="<0.1")
    assert compat.check_symbol(gone, env.vllm) is None
    assert compat.check_symbol(dataclasses.replace(gone, vllm=">=0.1"), env.vllm).code == Reason.SYMBOL_MISSING


def test_checks_run_cheapest_first(env):
    # A bad version range declines before any vLLM module is looked up.
    spec = _spec(vllm="<0.1", gpu_families=(env.gpu_family,), requires=(Symbol("vllm.no_such_module", "x"),))
    assert compat.check(spec, env).code == Reason.VLLM_VERSION
