from infera_vllm.spec import OpSpec, Symbol

_ANY = ("cpu", "sm80", "sm86", "sm89", "sm90", "sm100", "gfx942", "gfx950", "gfx1100", "gfx1151", "gfx1201")


def _spec(name, activate="infera_fixture_ops.good:activate", **kw):
    kw.setdefault("vllm", ">=0.24")
    return OpSpec(name=name, distribution="infera-fixture-ops", seam=f"{name} test seam", activate=activate,
                  gpu_families=_ANY, triton=None, **kw)


GOOD = _spec("fixture-good", sites=("rms_norm",))
IMPORT_RAISES = _spec("fixture-import-raises", activate="infera_fixture_ops.import_raises:activate")
ACTIVATE_RAISES = _spec("fixture-activate-raises", activate="infera_fixture_ops.good:activate_raises")
MISSING_SYMBOL = _spec("fixture-missing-symbol", requires=(Symbol("vllm.ir.ops", "no_such_ir_op"),))
SIGNATURE = _spec("fixture-signature",
                  requires=(Symbol("vllm.ir.ops", "rms_norm.register_impl", params=("provider", "renamed_away")),))
BAD_RANGE = _spec("fixture-bad-range", vllm="<0.1")
