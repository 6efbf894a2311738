"""Infera's part of vLLM's torch.compile cache key.

vLLM keys its compile caches (Inductor's artifacts, and from torch 2.10 on, by default, the AOT-compiled
Dynamo graph itself: ``VLLM_USE_AOT_COMPILE``) by its config and by every environment variable it knows
(``vllm.envs.compile_factors()`` hashes ``vllm.envs.environment_variables``), not by plugins. A seam that
Dynamo traces into the graph (a patched Python function, such as infera-linear-hipblaslt's GEMM dispatch)
would then be silently skipped whenever a graph compiled without it (plugin off, another table) is on disk:
vLLM loads that graph, and the op never runs, with nothing in the log. Measured on the H200 (vLLM 0.26,
torch 2.11): a plugin-on run after a plugin-off one counted no call of the patched linear layers.

So each process adds one entry to that table: every active op with its version and whatever its seam bakes
into the graph (``ctx.compile_key``, e.g. a tuning table's digest). A different set of active ops is a
different graph, compiled (and cached) on its own; the same set reuses its own cache.
"""

from __future__ import annotations

from infera_vllm import seams

FACTOR = "INFERA_VLLM_COMPILED_OPS"  # not a VLLM_* name: vLLM warns about unknown VLLM_* variables
CHANGED_BY = "infera-vllm"  # the name the factor's entry has in infera_vllm.seams

_entries: dict[str, str] = {}


def value() -> str:
    return ";".join(f"{name}={key}" for name, key in sorted(_entries.items()))


def install(entries: dict[str, str]) -> str | None:
    """Put ``entries`` (op name -> version and seam key) into vLLM's compile factors; returns None, or why it
    could not (this vLLM has no such table: the caller logs it, since a stale graph may then be reused)."""
    _entries.clear()
    _entries.update(entries)
    try:
        import vllm.envs as envs
    except Exception as exc:  # vLLM missing: nothing compiles, nothing to key
        return f"vllm.envs not importable ({type(exc).__name__})"
    table = getattr(envs, "environment_variables", None)
    if not isinstance(table, dict) or not callable(getattr(envs, "compile_factors", None)):
        return "vllm.envs has no environment_variables/compile_factors: vLLM's compile cache is not keyed by infera ops"
    if entries:  # through seams, as the ops' changes: undo_all() leaves vLLM's table as it was
        seams.register(CHANGED_BY, envs, "environment_variables", FACTOR, lambda: table.__setitem__(FACTOR, value))
    else:
        seams.undo(CHANGED_BY)  # no active op: the key is vLLM's own, caches shared with plugin-off runs
    return None
