from infera_vllm.spec import GPU_FAMILIES, OpSpec, Switch, Symbol


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
# one switch of each kind; activate_switches reports the values it was handed
SWITCHES = _spec("fixture-switches", activate="infera_fixture_ops.good:activate_switches", switches=(
    Switch("INFERA_FIXTURE_FAST", "flag", False, doc="a flag"),
    Switch("INFERA_FIXTURE_TOKENS", "int", 4, minimum=1, doc="an int of at least 1"),
    Switch("INFERA_FIXTURE_MODE", "choice", "auto", choices=("auto", "kernel", "off"), doc="a choice"),
    Switch("INFERA_FIXTURE_TABLE", "path", doc="a path"),
))
BAD_SWITCH_DECLARATION = _spec("fixture-bad-switch-declaration",
                               switches=(Switch("INFERA_FIXTURE_ROUTE", "choice", "fast", choices=("auto", "kernel")),))
