"""From discovered specs to installed seams, one op at a time, each failure contained.

Order per op, owned here (a template method, as OpenTelemetry's instrumentors): switches -> the op's own
switches (``OpSpec.switches``, parsed by ``switches.op_values``; a refused value is ``bad-switch``) ->
compatibility checks (versions, platform, vLLM symbols) -> import the op's seam module -> its ``check(ctx)``
(the op's own conditions: platform, tuning file; no side effects) -> its ``activate(ctx)`` (installs the
seam; only once check passed). ``doctor`` runs the same order without the last step, so it gives the verdict
serving will give. Only the last three touch the op's own code; an exception there becomes a decline with
its reason and never reaches vLLM (unless ``INFERA_VLLM_STRICT=1``).
"""

from __future__ import annotations

import importlib
import os
import tempfile
import uuid
from dataclasses import dataclass, field

from infera_vllm import compat, compile_key, coverage, discovery, log, self_check
from infera_vllm.spec import Decline, OpSpec, Reason
from infera_vllm.switches import SwitchError, Switches, did_you_mean, op_values, triton_interpreter

# Declines that are the user's own choice, not a failure: strict mode does not turn them into errors.
CHOSEN = {Reason.DISABLED.value, Reason.EXCLUDED.value, Reason.NOT_REQUESTED.value}
# Declines that mean something the user (or an op's packager) gave is wrong, logged at WARNING: a value of
# one of the op's switches its rules refuse (bad-switch), a tuning file the op refused (activate-error,
# bad-tuning), a spec that cannot be used, a name no wheel has.
NEEDS_ATTENTION = {Reason.BAD_SWITCH.value, Reason.ACTIVATE_ERROR.value, Reason.SPEC_ERROR.value,
                   Reason.NOT_INSTALLED.value, "bad-tuning"}


@dataclass
class OpContext:
    """What an op's ``check(ctx)`` and ``activate(ctx)`` get: its spec, the environment, the plugin's switches,
    the op's own switch values (parsed from ``spec.switches`` before ``check``), and counters; and what
    ``activate`` sets for the plugin: ``note`` and ``compile_key`` (see :class:`Verdict`)."""

    spec: OpSpec
    env: compat.Environment
    switches: Switches
    values: dict[str, object] = field(default_factory=dict)  # switch name -> parsed value (op_values)
    note: str = ""
    compile_key: str = ""

    def switch(self, name: str):
        """The parsed value of one of the op's declared switches (``ctx.switch("INFERA_NORM_PER_HEAD_KERNEL")``)."""
        if name not in self.values:
            raise LookupError(f"op {self.spec.name!r} declares no switch {name!r} "
                              f"(declared: {', '.join(self.values) or 'none'})")
        return self.values[name]

    def counter(self, route: str, reason: str = "", bucket: str = "", at: str = "call"):
        return coverage.counter(self.spec.name, route, reason, bucket, at)


@dataclass(frozen=True)
class Verdict:
    name: str
    distribution: str
    version: str
    seam: str
    decline: Decline | None
    note: str = ""  # how activate() installed the op (ctx.note): the startup line and the report show it
    compile_key: str = ""  # what its seam bakes into compiled graphs (ctx.compile_key), see compile_key.py

    @property
    def active(self) -> bool:
        return self.decline is None

    def line(self) -> str:
        where = f"{self.distribution} {self.version}"
        if self.decline is None:
            note = f" [{self.note}]" if self.note else ""
            return f"infera-vllm: op {self.name} ({where}) activated: {self.seam}{note}"
        return f"infera-vllm: op {self.name} ({where}) declined: {self.decline}"


def load_callable(path: str):
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def evaluate(found: discovery.Found, env: compat.Environment, switches: Switches, *, install: bool) -> Verdict:
    """The verdict for one op; with ``install`` the op's seam is put in place when everything passes."""
    spec = found.spec
    if spec is None:
        return Verdict(found.name, found.distribution, found.version, "?", found.problem)
    decline = switches.selection(spec)
    values: dict[str, object] = {}
    if decline is None:
        try:
            values = op_values(spec)
        except SwitchError as exc:
            decline = Decline(Reason.BAD_SWITCH, str(exc))
    decline = decline or compat.check(spec, env)
    ctx = OpContext(spec, env, switches, values)
    if decline is None:
        try:
            activate = load_callable(spec.activate)
            check = getattr(importlib.import_module(spec.activate.partition(":")[0]), "check", None)
        except Exception as exc:
            decline = Decline(Reason.IMPORT_ERROR, f"{spec.activate}: {type(exc).__name__}: {exc}")
        else:
            try:
                decline = check(ctx) if check is not None else None
                if decline is None and install:
                    decline = activate(ctx)
            except Exception as exc:
                decline = Decline(Reason.ACTIVATE_ERROR, f"{type(exc).__name__}: {exc}")
    return Verdict(spec.name, found.distribution, found.version, spec.seam, decline, ctx.note, ctx.compile_key)


def evaluate_isolated(found: discovery.Found, env: compat.Environment, switches: Switches, *,
                      install: bool) -> Verdict:
    """``evaluate``, with anything it raises (a check tripping over an odd spec, say) turned into this op's
    decline: one op never stops the evaluation of the others."""
    try:
        return evaluate(found, env, switches, install=install)
    except Exception as exc:  # noqa: BLE001  (contained by design; the verdict carries it)
        seam = found.spec.seam if found.spec is not None else "?"
        return Verdict(found.name, found.distribution, found.version, seam,
                       Decline(Reason.SPEC_ERROR, f"evaluating the op failed: {type(exc).__name__}: {exc}"))


def report_dir_problem(directory: str) -> str | None:
    """Why reports cannot be written into ``directory`` (created if missing), or None."""
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".infera-probe-"):
            pass
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


def report_dir(switches: Switches) -> str:
    """The report directory, created once and handed to child processes through the environment. One that
    cannot be written is replaced by a new temporary directory, with a WARNING naming both, so vLLM serves
    and no count is lost."""
    if switches.report_dir:
        problem = report_dir_problem(switches.report_dir)
        if problem is None:
            return switches.report_dir
        directory = tempfile.mkdtemp(prefix="infera-vllm-report-")
        log.warning("infera-vllm: INFERA_VLLM_REPORT_DIR=%s cannot be written (%s); coverage reports go to %s",
                    switches.report_dir, problem, directory)
    else:
        directory = tempfile.mkdtemp(prefix="infera-vllm-report-")
    os.environ["INFERA_VLLM_REPORT_DIR"] = directory  # spawned/forked workers inherit it
    return directory


def not_installed(switches: Switches, installed) -> list[Verdict]:
    """A NOT_INSTALLED verdict for each op INFERA_VLLM_OPS names that no installed wheel provides (and the
    exclude-list does not drop), its detail naming a close installed op where there is one (a typo)."""
    return [Verdict(name, "-", "-", "-", Decline(Reason.NOT_INSTALLED, "no installed wheel provides it"
                                                 + did_you_mean(name, installed)))
            for name in sorted((switches.allow or frozenset()) - set(installed) - switches.exclude)]


def activate_all(switches: Switches) -> list[Verdict]:
    # the run's id: made by the first process of a server, inherited by the processes it starts, so the
    # report tells one server's processes from another's sharing the directory
    os.environ.setdefault("INFERA_VLLM_RUN", uuid.uuid4().hex[:12])
    directory = report_dir(switches)
    env = compat.Environment.detect()
    coverage.configure(
        report_dir=directory,
        strict=switches.strict,
        context={"environment": env.__dict__.copy(), "switches": switches.describe()},
    )
    self_check.configure(mode=switches.self_check, rate=switches.self_check_rate,
                         perturb=switches.self_check_perturb, strict=switches.strict)
    log.info("infera-vllm: %s on %s (vLLM %s); coverage reports -> %s",
                "strict mode" if switches.strict else "loading ops", env.gpu_family, env.vllm, directory)
    if env.gpu_family == "cpu" and triton_interpreter():
        # the kernels' CPU validation: Triton's interpreter rounds bf16 results as GPUs do (triton_dot)
        from infera_vllm import triton_dot

        triton_dot.round_bf16_like_gpus()
    verdicts = [evaluate_isolated(f, env, switches, install=True) for f in discovery.discover()]
    installed = {v.name for v in verdicts}
    verdicts += not_installed(switches, installed)
    # an allow-list name no wheel provides gets its NOT_INSTALLED verdict, logged below
    for line in switches.unknown_names(installed, lists=("INFERA_VLLM_OPS_EXCLUDE",)):
        log.warning("infera-vllm: %s (installed: %s)", line, ", ".join(sorted(installed)) or "none")
    for v in verdicts:
        if v.decline is not None and str(v.decline.code) in NEEDS_ATTENTION:
            extra = (f" (installed: {', '.join(sorted(installed)) or 'none'})"
                     if v.decline.code == Reason.NOT_INSTALLED else "")
            log.warning("%s%s", v.line(), extra)
        else:
            log.info("%s", v.line())
        coverage.record_op(v.name, distribution=v.distribution, version=v.version, seam=v.seam, decline=v.decline,
                           note=v.note)
    if not verdicts:
        log.info("infera-vllm: no operator wheels installed (pip install infera-norm, ...)")
    problem = compile_key.install({v.name: f"{v.version}{':' + v.compile_key if v.compile_key else ''}"
                                   for v in verdicts if v.active})
    if problem:
        log.info("infera-vllm: %s", problem)
    coverage.write_report()  # the startup verdicts survive even if the process is killed later
    failed = [v for v in verdicts if v.decline is not None and str(v.decline.code) not in CHOSEN]
    if switches.strict and failed:
        raise coverage.StrictDeclineError(
            "INFERA_VLLM_STRICT=1 and some ops declined:\n  " + "\n  ".join(v.line() for v in failed))
    return verdicts
