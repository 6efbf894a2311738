"""REPLACE_ME: the vLLM side of the operator (the classes or functions vLLM calls) and how it is installed.
Imported only after the plugin's spec checks passed, so heavy imports (torch, vLLM) are fine at the top.

``check(ctx)``: the op's own conditions (platform, tuning file), no side effects; the plugin calls it first,
in serving and in ``infera-vllm doctor`` alike (a raise is an ``activate-error`` decline). The switches
declared in spec.py are parsed before it (a refused value is a ``bad-switch`` decline): ``ctx.switch(name)``
here, ``infera_vllm.switches.op_value(SPEC, name)`` in code that runs later, never ``os.environ``.
``activate(ctx)``: called only once ``check`` passed: install the seam and return ``None``, or return a
``Decline``. Every change to vLLM's objects goes through ``infera_vllm.seams`` (``seams.wrap(ctx.spec.name,
owner, "attr", make)`` for a function or method, ``seams.register(ctx.spec.name, owner, "registry", key,
install)`` for a registry entry), so it is made once per process and can be undone. ``ctx.note``: one
line on how it was installed (the startup log and the report show it); ``ctx.compile_key``: what the seam
bakes into torch.compile graphs beyond the op's version (a tuning table's digest), if anything. Per call, route
through counters made once here: ``kernel = ctx.counter("kernel", bucket=...)``,
``fallback = ctx.counter("fallback", "dtype")``.
"""

from infera_vllm.spec import Decline, Reason


def check(ctx) -> Decline | None:
    return Decline(Reason.NOT_IMPLEMENTED, "REPLACE_ME")


def activate(ctx) -> Decline | None:
    return None  # install the seam here
