import os

ACTIVATED_IN: list[int] = []


def activate(ctx):
    ACTIVATED_IN.append(os.getpid())
    ctx.counter("kernel", bucket="startup", at="plan")()  # one counted decision, so reports carry a count
    return None


def activate_raises(ctx):
    raise RuntimeError("kernel build failed: ptxas exited 255")


def activate_switches(ctx):
    """Reports the switch values it was handed; they must be what the one accessor reads."""
    from infera_vllm.switches import op_value

    assert all(op_value(ctx.spec, name) == value for name, value in ctx.values.items())
    ctx.note = ", ".join(f"{name}={ctx.switch(name)!r}" for name in ctx.values)
    return None
