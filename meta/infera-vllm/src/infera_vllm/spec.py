"""What an operator wheel declares about itself, as plain data.

An op wheel's entry point in the ``infera_vllm.ops`` group targets an :class:`OpSpec` instance. Loading it
must stay cheap: this module imports only the standard library, and a spec module may import nothing else
but this one. Everything heavy (torch, triton, vLLM internals, the kernels) is named by dotted path and
imported only after the plugin's compatibility checks have passed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

ENTRY_POINT_GROUP = "infera_vllm.ops"

# The families the nox sessions know; "cpu" means the vLLM CPU build with Triton kernels under the
# interpreter (correctness in CI, not speed).
GPU_FAMILIES = ("cpu", "sm80", "sm86", "sm89", "sm90", "sm100", "gfx942", "gfx950", "gfx1100", "gfx1151", "gfx1201")


class Reason(str, enum.Enum):
    """Why an operator, or one call of it, did not run on an Infera kernel.

    The value is the stable reason code written into logs and coverage reports; ops may use their own
    codes for per-call declines (e.g. ``"dtype"``), and those are reported verbatim.
    """

    DISABLED = "disabled"  # INFERA_VLLM_OPS_DISABLE=1
    EXCLUDED = "excluded"  # named in INFERA_VLLM_OPS_EXCLUDE
    NOT_REQUESTED = "not-requested"  # an allow-list is set and does not name it, or an opt-in op not named
    NOT_INSTALLED = "not-installed"  # named in INFERA_VLLM_OPS, but no wheel provides it
    DUPLICATE = "duplicate"  # two installed wheels advertise the same op name
    SPEC_ERROR = "spec-error"  # the entry point did not load, or is not an OpSpec
    VLLM_MISSING = "vllm-missing"
    VLLM_VERSION = "vllm-version"  # installed vLLM outside the op's specifier
    SYMBOL_MISSING = "symbol-missing"  # a required module or attribute is absent
    SIGNATURE_CHANGED = "signature-changed"  # a required callable lacks parameters the op relies on
    PLATFORM = "platform-unsupported"  # GPU family (or CPU) not in the op's list
    TORCH_VERSION = "torch-version"
    TRITON_MISSING = "triton-missing"
    TRITON_VERSION = "triton-version"
    IMPORT_ERROR = "import-error"  # the op's own module raised on import
    ACTIVATE_ERROR = "activate-error"  # the op's activate() raised (kernel build error, ...)
    NOT_IMPLEMENTED = "not-implemented"  # placeholder op: the kernel has not landed yet
    BAD_SWITCH = "bad-switch"  # one of the op's own switches (OpSpec.switches) has a value its rules refuse

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Decline:
    """A typed, readable refusal: a stable ``code`` plus a human ``detail``."""

    code: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.code}: {self.detail}" if self.detail else str(self.code)


@dataclass(frozen=True)
class Symbol:
    """A vLLM symbol an op relies on.

    ``attr`` may be dotted (``"TritonExperts.apply"``). ``params`` are parameter names that must appear in
    ``inspect.signature`` of the attribute. ``vllm`` restricts the requirement to vLLM versions matching that
    PEP 440 specifier (the seam moved between releases), empty meaning every version the op supports.
    """

    module: str
    attr: str
    params: tuple[str, ...] = ()
    vllm: str = ""

    def __str__(self) -> str:
        return f"{self.module}:{self.attr}"


SWITCH_KINDS = ("flag", "int", "choice", "path")


@dataclass(frozen=True)
class Switch:
    """An environment switch of one op, declared in its spec and parsed by the plugin
    (``infera_vllm.switches.parse``) before the op's ``check``; the op reads the value through
    ``infera_vllm.switches.op_value(SPEC, name)``.

    ``kind``: ``"flag"`` (1/0, true/false, yes/no, on/off; ``default`` a bool), ``"int"`` (an integer of at least
    ``minimum`` when that is set), ``"choice"`` (one of ``choices``, compared case-insensitively; ``default``
    one of them), ``"path"`` (a file path, taken as given: the op's reader names a file it cannot use). Unset
    or empty means ``default``; ``None`` there means the switch is not set (an int or path with no default).
    ``doc`` is one line on what it does (``infera-vllm doctor --json`` carries it).
    """

    name: str
    kind: str
    default: bool | int | str | None = None
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    doc: str = field(default="", compare=False)


@dataclass(frozen=True)
class OpSpec:
    """One operator, as its wheel advertises it.

    ``activate`` names ``module:function``; the function takes an :class:`infera_vllm.activation.OpContext`
    and returns ``None`` once the seam is installed or a :class:`Decline`. ``plan`` (optional) names
    ``module:function`` taking one :class:`infera_vllm.model_sites.Site` and returning ``None`` (the op
    would take it) or a :class:`Decline`; ``infera-vllm doctor --model`` uses it on the ``sites`` kinds.
    ``tune`` (optional) names ``module:function`` taking the remaining command-line arguments (a list of
    strings) and returning an exit status: ``infera-vllm tune <op> ARGS...`` runs it (the op's offline tuner).
    ``switches`` declares the op's own environment switches (:class:`Switch`): a bad value declines the op
    ``bad-switch`` before its code is imported. ``self_check_bound``: the largest
    ``max |ours - vLLM's| / max |vLLM's|`` the numerics self-check accepts for this op's kernels (from their
    measured bf16 error; ``infera_vllm.self_check``); 0 means the op does not self-check.
    """

    name: str
    distribution: str
    seam: str  # human description of where the op plugs into vLLM
    vllm: str  # PEP 440 specifier of supported vLLM releases
    activate: str
    gpu_families: tuple[str, ...]
    requires: tuple[Symbol, ...] = ()
    default_on: bool = True
    torch: str = ">=2.9"
    triton: str | None = ">=3.4"  # None: the op does not use Triton
    sites: tuple[str, ...] = ()  # model-site kinds this op serves, e.g. ("rms_norm",)
    plan: str | None = None
    tune: str | None = None
    switches: tuple[Switch, ...] = ()
    self_check_bound: float = 0.0
