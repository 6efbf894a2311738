"""Per-process coverage: which calls ran on an Infera kernel, which fell back to vLLM's, and why.

Hot path: an op asks once for a ``counter(...)`` and calls it per routed call. The key tuple is built at
that time, so a hit is one dict update: no string formatting, no locks (a lost increment under free
threading is acceptable for a coverage count). Calls that CUDA graphs replay or that torch.compile traces
are not visible at run time; ops count those where they are decided (``at="trace"`` or ``at="plan"``) and
the report shows the column, so a count there means "decided N times", not "ran N times".

Each process writes ``infera-<host>-<pid>.json`` into the report directory at startup, every
``FLUSH_EVERY_S`` seconds while its counts change, and at exit; ``infera-vllm report`` merges them (see
docs/report-format.md). The periodic write is there because vLLM does not always let a process exit: the
front end gives the engine core a few seconds after SIGTERM and then kills it, and workers may still be
shutting down when the server process is gone, so an exit-only report can be missing or late.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable

from infera_vllm import log
from infera_vllm.spec import Decline

REPORT_FORMAT = "infera-vllm-report/1"
# kernel: an Infera kernel ran. fallback: it could not serve the call (a capability limit; strict mode
# raises). handover: it could, but vLLM's kernel is measured faster there, so that one ran by design.
KERNEL, FALLBACK, HANDOVER = "kernel", "fallback", "handover"
ROUTES = (KERNEL, FALLBACK, HANDOVER)
AT = ("call", "trace", "plan")
# Routes an op declares for calls it gives to another library's kernel by choice, because that one is faster
# there (attn-paged's "fa3": FlashAttention-3 through vLLM). Counted like a handover, under their own name.
_op_routes: set[str] = set()


_counts: dict[tuple[str, str, str, str, str], int] = {}
_self_checks: dict[tuple[str, str], dict[str, float]] = {}  # (op, bucket) -> infera_vllm.self_check's record
_ops: dict[str, dict[str, object]] = {}
_context: dict[str, object] = {}
_strict = False
_report_dir: str | None = None
_started = time.time()
_exit_hook_installed = False
_exit_report_written = False
FLUSH_EVERY_S = 5.0  # a killed process loses at most this much of its counts; a write is one small JSON file
_write_lock = threading.Lock()
_flusher_pid: int | None = None  # the process whose flusher thread runs (threads do not survive a fork)


class StrictDeclineError(RuntimeError):
    """Raised instead of a fallback when ``INFERA_VLLM_STRICT=1``."""


def configure(*, report_dir: str | None, strict: bool, context: dict[str, object]) -> None:
    """Set where this process reports, and install the exit hook once per process."""
    global _report_dir, _strict, _exit_hook_installed
    _report_dir, _strict = report_dir, strict
    _context.update(context)
    if report_dir is not None and not _exit_hook_installed:
        atexit.register(_at_exit)
        # A child that multiprocessing forks (vLLM's engine core and workers on CUDA) leaves through
        # os._exit(), which skips atexit; multiprocessing runs its finalizers first, so each forked child
        # registers one (the registry is cleared in the child, then after-fork hooks run).
        import multiprocessing.util

        multiprocessing.util.register_after_fork(_HOOK_OWNER, _install_child_finalizer)
        _exit_hook_installed = True


def counter(op: str, route: str, reason: str = "", bucket: str = "", at: str = "call") -> Callable[[], None]:
    """A zero-argument function that counts one routed call with this key."""
    if (route not in ROUTES and route not in _op_routes) or at not in AT:
        raise ValueError(f"route must be one of {ROUTES + tuple(sorted(_op_routes))} and at one of {AT}, "
                         f"got {route!r}, {at!r}")
    key = (op, route, str(reason), bucket, at)
    _ensure_flusher()  # here, where counters are made, not in hit(): the hot path stays one dict update
    if route == FALLBACK and _strict:

        def refuse() -> None:
            raise StrictDeclineError(f"INFERA_VLLM_STRICT=1: {op} declined a call ({reason}, {bucket or 'any shape'})")

        return refuse
    counts = _counts

    def hit() -> None:
        counts[key] = counts.get(key, 0) + 1

    return hit


def record(op: str, route: str, reason: str = "", bucket: str = "", at: str = "call", n: int = 1) -> None:
    """Count ``n`` calls at once (for callers that are not on a hot path)."""
    hit = counter(op, route, reason, bucket, at)
    for _ in range(n):
        hit()


class CallCounts:
    """Per-call routing counts of one op, for kernels' hot paths: ``counts(reason, tokens, at)`` with reason
    None = kernel, a reason in ``handovers`` = handover, a name in ``routes`` = that route (reason empty), any
    other = fallback; tokens None = "dynamic" (decided on symbolic shapes). Each key's counter is made once;
    a call costs a dict lookup."""

    def __init__(self, op: str, handovers: tuple[str, ...] = (), routes: tuple[str, ...] = ()):
        self.op, self.handovers, self.routes, self._hits = op, handovers, routes, {}
        _op_routes.update(routes)

    def __call__(self, reason: str | None, tokens: int | None, at: str = "call") -> None:
        bucket = "dynamic" if tokens is None else bucket_of(tokens)
        key = (reason, bucket, at)
        hit = self._hits.get(key)
        if hit is None:
            if reason in self.routes:
                route, reason = reason, None
            else:
                route = KERNEL if reason is None else HANDOVER if reason in self.handovers else FALLBACK
            hit = self._hits[key] = counter(self.op, route, reason or "", bucket, at)
        hit()


def self_check_entry(op: str, bucket: str) -> dict[str, float]:
    """The self-check record of (op, bucket), made on first use (infera_vllm.self_check updates it)."""
    entry = _self_checks.get((op, bucket))
    if entry is None:
        _ensure_flusher()
        entry = _self_checks[(op, bucket)] = {"checked": 0, "passed": 0, "failed": 0, "max_error": 0.0,
                                               "unchecked_at_capture": 0, "seconds": 0.0}
    return entry


def bucket_of(tokens: int) -> str:
    """The bucket CallCounts files a call of ``tokens`` under (ops key their self-check by it too): a table
    lookup, no formatting, since hot paths ask for it on every call."""
    return _BUCKETS[(tokens - 1).bit_length()] if tokens > 0 else "0"


def bucket_tokens(n: int) -> str:
    """Coarse power-of-two bucket of a token count: 1, 2, 3-4, 5-8, ..., so reports stay one screen."""
    if n <= 2:
        return str(n)
    hi = 1 << (n - 1).bit_length()
    return f"{hi // 2 + 1}-{hi}"


_BUCKETS = [bucket_tokens(1 << k) for k in range(64)]  # bucket of a count in (2^(k-1), 2^k]


def record_op(name: str, *, distribution: str, version: str, seam: str, decline: Decline | None,
              note: str = "") -> None:
    """Record an op's startup verdict (one entry per op per process)."""
    _ops[name] = {
        "op": name,
        "distribution": distribution,
        "version": version,
        "seam": seam,
        "status": "active" if decline is None else "declined",
        "reason": "" if decline is None else str(decline.code),
        "detail": note if decline is None else decline.detail,
    }


def snapshot() -> dict[str, object]:
    import multiprocessing

    return {
        "format": REPORT_FORMAT,
        "process": {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "name": multiprocessing.current_process().name,
            "argv": sys.argv[:3],
            "host": socket.gethostname(),
            "run": os.environ.get("INFERA_VLLM_RUN"),  # one id per server: its processes inherit it
            "started": _started,
            "written": time.time(),
        },
        **_context,
        "ops": sorted(_ops.values(), key=lambda o: str(o["op"])),
        # a copy: the flusher thread reads while calls are counted (dict() of a dict holds the GIL throughout)
        "counts": [
            {"op": op, "route": route, "reason": reason, "bucket": bucket, "at": at, "count": count}
            for (op, route, reason, bucket, at), count in sorted(dict(_counts).items())
        ],
        "self_check": [
            {"op": op, "bucket": bucket, **entry} for (op, bucket), entry in sorted(dict(_self_checks).items())
        ],
    }


def write_report(directory: str | None = None) -> str | None:
    """Write this process's report; returns its path, or ``None`` when no directory is configured."""
    directory = directory or _report_dir
    if directory is None:
        return None
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"infera-{socket.gethostname()}-{os.getpid()}.json")
    tmp = f"{path}.tmp"
    with _write_lock, open(tmp, "w") as f:  # the lock: the flusher and the exit hook share the .tmp name
        json.dump(snapshot(), f, indent=1)
        f.close()
        os.replace(tmp, path)  # a reader never sees half a file
    return path


def summary_lines() -> list[str]:
    """The one-screen summary logged at exit."""
    lines = [f"{o['op']}: {o['status']}" + (f" ({o['reason']}: {o['detail']})" if o["reason"] else "")
             for o in _ops.values()]
    per_route: dict[tuple[str, str, str], int] = {}
    for (op, route, reason, _bucket, at), count in _counts.items():
        k = (op, route if not reason else f"{route}/{reason}", at)
        per_route[k] = per_route.get(k, 0) + count
    lines += [f"{op} {route} x{count} (counted at {at})" for (op, route, at), count in sorted(per_route.items())]
    return lines[:20]


def _ensure_flusher() -> None:
    """Start this process's flusher thread once (again in a forked child: the parent's thread is not there)."""
    global _flusher_pid
    if _report_dir is None or _flusher_pid == os.getpid():
        return
    _flusher_pid = os.getpid()
    threading.Thread(target=_flush_while_counting, name="infera-vllm-report", daemon=True).start()


def _flush_while_counting() -> None:
    pid, written = os.getpid(), None
    while os.getpid() == pid and not _exit_report_written:
        time.sleep(FLUSH_EVERY_S)
        now = (dict(_counts), repr(sorted(_self_checks.items())))
        if now != written and not _exit_report_written:
            try:
                write_report()
                written = now
            except Exception:  # a full disk must not take the server down; the exit write will log it
                pass


class _HookOwner:  # register_after_fork keeps its owner by weak reference
    pass


_HOOK_OWNER = _HookOwner()


def _install_child_finalizer(_owner: object) -> None:
    import multiprocessing.util

    multiprocessing.util.Finalize(None, _at_exit, exitpriority=0)


def _at_exit() -> None:
    global _exit_report_written
    if _exit_report_written:  # atexit and a multiprocessing finalizer can both fire in one process
        return
    _exit_report_written = True
    try:
        path = write_report()
        if _ops or _counts or _self_checks:
            log.info("infera-vllm coverage (pid %d) -> %s\n  %s", os.getpid(), path, "\n  ".join(summary_lines()))
    except Exception:  # exit must never fail because of a report
        log.logger.exception("infera-vllm: could not write the coverage report")


def _reset_in_child() -> None:
    # A forked worker inherits the parent's counts; its own report must hold only its own calls.
    # Activation verdicts stay: the seams installed in the parent are in the child's memory too.
    global _started, _exit_report_written, _write_lock
    _counts.clear()
    _self_checks.clear()
    _started = time.time()
    _exit_report_written = False
    _write_lock = threading.Lock()  # the parent's flusher may have held it at the fork
    if _flusher_pid is not None:  # the parent made its counters before the fork; the child makes none anew
        _ensure_flusher()


os.register_at_fork(after_in_child=_reset_in_child)
