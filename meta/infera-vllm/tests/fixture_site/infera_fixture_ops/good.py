import os

ACTIVATED_IN: list[int] = []


def activate(ctx):
    ACTIVATED_IN.append(os.getpid())
    ctx.counter("kernel", bucket="startup", at="plan")()  # one counted decision, so reports carry a count
    return None


def activate_raises(ctx):
    raise RuntimeError("kernel build failed: ptxas exited 255")
