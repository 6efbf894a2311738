from infera_vllm.spec import GPU_FAMILIES, OpSpec, Symbol



def _spec(name, activate="infera_fixture_ops.good:activate", **kw):
    kw.setdefault("vllm", ">=0.24")
    kw.setdefault("triton", None)
    return OpSpec(name=name, distribution="infera-fixture-ops", seam=f"{name} test seam", activate=activate,
                  gpu_families=GPU_FAMILIES, **kw)


GOOD = _spec("fixture-good", sites=("rms_norm",))
IMPORT_RAISES = _spec("fixture-import-raises", activate="infera_fixture_ops.import_raises:activate")
ACTIVATE_RAISES = _spec("fixture-activate-raises", activate="infera_fixture_ops.good:activate_raises")
MISSING_SYMBOL = _spec("fixture-missing-symbol", requires=(Symbol("vllm.ir.ops", "no_such_ir_op"),))
SIGNATURE = _spec("fixture-signature",
                  requires=(Symbol("vllm.ir.ops", "rms_norm.register_impl", params=("provider", "renamed_away")),))
BAD_RANGE = _spec("fixture-bad-range", vllm="<0.1")
MALFORMED = _spec("fixture-malformed-spec", triton="3.4")  # not PEP 440 (meant ">=3.4")
