"""Installs infera-linear-hipblaslt: vLLM's unquantized GEMM dispatch wrapped (gemm.py), serving the shapes
of the family's tuning table (table.py).

Declines at startup, with its reason: on the CPU without ``TRITON_INTERPRET=1`` (``triton-interpreter-off``);
a family without a table (``not-tuned``: run ``infera-vllm tune linear`` on that GPU); an unreadable table or
switch (``bad-tuning``). ``plan`` answers ``infera-vllm doctor --model`` per linear layer.
"""

from infera_vllm.platform import interpreter_off
from infera_vllm.spec import Decline


def _table(family: str):
    from infera_ops.linear_hipblaslt import table

    try:
        found = table.load(family)
    except table.TableError as exc:
        return None, Decline("bad-tuning", str(exc))
    if found is None:
        return None, Decline("not-tuned", f"no tuning table for {family}: run `infera-vllm tune linear --model CONFIG` "
                                          "on that GPU (or set INFERA_LINEAR_TUNING)")
    return found, None


def check(ctx) -> Decline | None:
    return interpreter_off(ctx.env.gpu_family, "vLLM's CPU GEMM") or _table(ctx.env.gpu_family or "unknown")[1]


def activate(ctx) -> Decline | None:
    """Installs the seam; the plugin calls it only once ``check(ctx)`` passed."""
    found, _ = _table(ctx.env.gpu_family or "unknown")
    from infera_ops.linear_hipblaslt import gemm

    gemm.install(ctx.spec.name, found, cpu=ctx.env.gpu_family == "cpu")
    ctx.note = f"{len(found)} tuned shapes ({found.source})"
    # which shapes go to infera::linear is decided while Dynamo traces: another table is another graph
    ctx.compile_key = found.digest()
    return None


def plan(site) -> Decline | None:
    """Would the op take this linear layer (``doctor --model``)? Tokens are not known here: a tuned shape
    is taken, and its buckets decide per call."""
    if site.attrs.get("lm_head"):
        return Decline("lm-head", "the LM head calls vLLM's GEMM through its own reference; counted, not served")
    from infera_vllm.platform import detect_gpu_family

    found, decline = _table(detect_gpu_family()[0] or "unknown")
    if decline is not None:
        return decline
    if found.buckets(site.attrs["n"], site.attrs["k"], site.attrs.get("dtype", "bfloat16"), False) is None:
        return Decline("untuned", f"N={site.attrs['n']} K={site.attrs['k']} is not in {found.source}")
    return None
