"""Triton kernels compiled ahead of time for a named GPU family, without its GPU, and what the compiled code
uses: registers, spills, shared memory (LDS) and occupancy. For the op wheels' compile tests and
``benchmarks/aot_resources.py`` only: nothing here runs in vLLM, and triton is imported inside the functions.

Triton compiles for a ``GPUTarget`` without the hardware or its driver: for NVIDIA through its bundled ptxas,
for AMD through its bundled LLVM (no ROCm needed). So a kernel's lowering, its register allocation and its
shared-memory use are known on any machine, which is what lets CI reject a launch configuration that would
fail (shared memory over the limit) or spill on a GPU family nobody has at hand.

Where the numbers come from:

- AMD (``hip``): the code object's metadata in ``compiled.asm["amdgcn"]`` (``.vgpr_count``, ``.agpr_count``,
  ``.sgpr_count``, ``.vgpr_spill_count``, ``.sgpr_spill_count``, ``.private_segment_fixed_size``,
  ``.group_segment_fixed_size``) and LLVM's ``; Occupancy:`` comment (waves per SIMD allowed by registers and
  static LDS). Triton's shared memory is dynamic LDS (``metadata.shared``, passed at launch), which LLVM's
  figure does not see: the occupancy here also bounds it by the workgroups whose LDS fits in a CU (a WGP on
  RDNA, Triton's default ``wgp`` mode).
- NVIDIA (``cuda``): ``cuobjdump -res-usage`` on the cubin (Triton bundles it beside ptxas): registers per
  thread and local memory (stack frame included: where ptxas puts spilled registers), the attributes
  Triton's driver reads at load time (``n_regs``, and ``n_spills`` = local bytes / 4); shared memory is
  ``metadata.shared``, what Triton checks against the device's per-block maximum. Occupancy is the usual
  calculator's: blocks per SM by registers (256-register warp granules), shared memory (1 KiB reserved per
  block) and warps, expressed per SM sub-partition (a scheduler, 16 warps at most) to sit beside AMD's waves
  per SIMD. On the H200 these match the driver's figures for every sm90 case of the ops' compile tests
  (``benchmarks/gpu/h200_aot_check.py``; its result under ``benchmarks/results/h200/aot/``).
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, fields
from typing import Iterable, Mapping

ENV_VAR = "INFERA_AOT_FAMILY"


@dataclass(frozen=True)
class Family:
    """A GPU family's compile target and the per-unit limits that decide whether and how often a program
    fits (unit: an SM on NVIDIA, a CU on CDNA, a WGP on RDNA)."""

    name: str
    backend: str  # "cuda" or "hip"
    arch: int | str  # compute capability x 10, or the gfx name
    warp_size: int
    max_shared: int  # bytes of shared memory / LDS one program may use
    unit_shared: int  # bytes of shared memory / LDS per unit
    simds: int  # SIMDs per unit (AMD), schedulers per SM (NVIDIA)
    max_waves: int  # waves per SIMD / warps per scheduler at most

    def target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, self.warp_size)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("sm90", "cuda", 90, 32, max_shared=232448, unit_shared=233472, simds=4, max_waves=16),  # H100/H200
    Family("gfx942", "hip", "gfx942", 64, max_shared=65536, unit_shared=65536, simds=4, max_waves=8),  # MI300
    Family("gfx950", "hip", "gfx950", 64, max_shared=163840, unit_shared=163840, simds=4, max_waves=8),  # MI355
    Family("gfx1100", "hip", "gfx1100", 32, max_shared=65536, unit_shared=131072, simds=4, max_waves=16),  # RX 7900
    Family("gfx1151", "hip", "gfx1151", 32, max_shared=65536, unit_shared=131072, simds=4, max_waves=16),  # Strix Halo
    Family("gfx1201", "hip", "gfx1201", 32, max_shared=65536, unit_shared=131072, simds=4, max_waves=16),  # RX 9070
)}


def selected_families(default: Iterable[str] = tuple(FAMILIES)) -> list[str]:
    """The families ``INFERA_AOT_FAMILY`` names (comma-separated, or ``all``); unset or empty: ``default``.
    The nox session of a family sets it, so that session compiles for its own family only."""
    raw = os.environ.get(ENV_VAR, "").strip()
    if not raw:
        return list(default)
    if raw == "all":
        return list(FAMILIES)
    names = [n.strip() for n in raw.split(",") if n.strip()]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise ValueError(f"{ENV_VAR}={raw!r}: {', '.join(unknown)} not one of {', '.join(FAMILIES)} (or all)")
    return names


def family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown GPU family {name!r}: one of {', '.join(FAMILIES)}") from None


def compile_kernel(kernel, family_name: str, *, pointers: Mapping[str, str], constexprs: Mapping[str, object],
                   floats: Iterable[str] = (), divisible: Iterable[str] = (), unaligned: Iterable[str] = (),
                   num_warps: int = 4, num_stages: int = 2, **options):
    """``kernel`` (a ``@triton.jit`` function) compiled for the family's GPU; returns Triton's CompiledKernel
    (``.asm``, ``.metadata``); a compile error raises as Triton raises it.

    The signature comes from the kernel's argument names: ``pointers`` maps pointer arguments to their
    element type (``"*bf16"``, ``"*i32"``...), ``constexprs`` gives every ``tl.constexpr`` its value,
    ``floats`` names the fp32 scalars; every other argument is an i32. As Triton specialises them at launch
    for vLLM's tensors (allocations and row strides that are multiples of 16 elements), the pointers, the
    arguments named ``*_stride`` and those in ``divisible`` are marked divisible by 16, which is what lets
    the compiler vectorise and pipeline the loads; ``unaligned`` names those a launch passes with values
    that are not (Triton then marks nothing on them). ``options``: further Triton compile options
    (``waves_per_eu``, ``matrix_instr_nonkdim``, ``launch_pdl``...)."""
    import triton
    from triton.compiler import ASTSource

    fam = family(family_name)
    names = list(inspect.signature(kernel.fn).parameters)
    floats, divisible, unaligned = set(floats), set(divisible), set(unaligned)
    missing = [n for n in names if n not in constexprs and _is_constexpr(kernel, n)]
    if missing:
        raise ValueError(f"{kernel.fn.__name__}: no value for the constexprs {', '.join(missing)}")
    signature = {n: "constexpr" if n in constexprs else pointers.get(n, "fp32" if n in floats else "i32")
                 for n in names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
               if n not in constexprs and n not in unaligned
               and (n in pointers or n.endswith("_stride") or n in divisible)}
    src = ASTSource(fn=kernel, signature=signature, constexprs=dict(constexprs), attrs=aligned)
    return triton.compile(src, target=fam.target(),
                          options={"num_warps": num_warps, "num_stages": num_stages, **options})


def _is_constexpr(kernel, name: str) -> bool:
    params = getattr(kernel, "params", None)
    if params is None:
        return False
    return any(p.name == name and p.is_constexpr for p in params)


@dataclass(frozen=True)
class Resources:
    """What one compiled kernel uses per thread (lane) and per program. ``registers``: VGPRs on AMD
    (architectural + accumulation), 32-bit registers on NVIDIA; ``agprs``: AMD's accumulation VGPRs
    (included in ``registers``; 0 where the family has none); ``sgprs``: AMD's scalar registers (None on
    NVIDIA); ``vgpr_spills`` / ``sgpr_spills``: registers LLVM spilled (AMD; SGPRs spill to VGPR lanes);
    ``scratch_bytes``: per-lane private / local memory (spilled registers on NVIDIA, spills and stack on
    AMD); ``shared_bytes``: LDS / shared memory per program; ``occupancy``: waves per SIMD (AMD) or warps per
    SM scheduler (NVIDIA) the resources allow, out of ``max_waves``, limited by ``limit``."""

    family: str
    kernel: str
    num_warps: int
    registers: int
    agprs: int
    sgprs: int | None
    vgpr_spills: int
    sgpr_spills: int
    scratch_bytes: int
    shared_bytes: int
    occupancy: int
    max_waves: int
    limit: str

    @property
    def spills(self) -> int:
        """Spilled registers (AMD), or 4-byte words of local memory (NVIDIA, as Triton's ``n_spills``)."""
        return self.vgpr_spills + self.sgpr_spills + (self.scratch_bytes // 4 if self.sgprs is None else 0)

    def problems(self) -> list[str]:
        """Why this launch configuration should not ship on the family: registers spilled to memory (VGPR
        spills, or any scratch / local memory: what Triton's ``n_spills`` counts), more shared memory than a
        program may have (Triton would raise OutOfResources at launch), no occupancy. SGPR spills alone are
        not a problem: LLVM spills SGPRs into VGPR lanes (``v_writelane``), no memory traffic; once those
        lanes run out they go to scratch, which counts."""
        fam = FAMILIES[self.family]
        found = []
        if self.vgpr_spills:
            found.append(f"spills {self.vgpr_spills} VGPRs")
        if self.scratch_bytes:
            found.append(f"uses {self.scratch_bytes} bytes of scratch memory per lane (spilled registers)")
        if self.shared_bytes > fam.max_shared:
            found.append(f"needs {self.shared_bytes} bytes of shared memory, the family allows {fam.max_shared}")
        if self.occupancy < 1:
            found.append(f"no program fits in a unit ({self.limit})")
        return found

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def resources(compiled) -> Resources:
    """The resource summary of a CompiledKernel from :func:`compile_kernel` (or ``triton.compile``)."""
    meta = compiled.metadata
    target = meta.target
    name = next((f.name for f in FAMILIES.values() if f.backend == target.backend and f.arch == target.arch), None)
    if name is None:
        raise ValueError(f"no family for target {target}")
    if target.backend == "hip":
        return _hip_resources(FAMILIES[name], compiled)
    return _cuda_resources(FAMILIES[name], compiled)


def _yaml_int(asm: str, key: str, default: int | None = 0) -> int | None:
    found = re.search(rf"^\s*\.{re.escape(key)}:\s+(\d+)\s*$", asm, re.MULTILINE)
    return int(found.group(1)) if found else default


def _hip_resources(fam: Family, compiled) -> Resources:
    asm = compiled.asm["amdgcn"]
    num_warps = compiled.metadata.num_warps
    vgprs = _yaml_int(asm, "vgpr_count")
    agprs = _yaml_int(asm, "agpr_count")
    # gfx90a and later (CDNA3/4) allocate architectural and accumulation VGPRs from one file; the metadata's
    # vgpr_count counts only the architectural ones there, LLVM's TotalNumVgprs comment both
    total = re.search(r"^\s*; TotalNumVgprs:\s+(\d+)", asm, re.MULTILINE)
    registers = int(total.group(1)) if total else vgprs
    static_lds = _yaml_int(asm, "group_segment_fixed_size")
    shared = static_lds + (compiled.metadata.shared or 0)
    llvm_occ = re.search(r"^\s*; Occupancy:\s+(\d+)", asm, re.MULTILINE)
    occupancy, limit = (int(llvm_occ.group(1)), "registers") if llvm_occ else (fam.max_waves, "waves")
    if occupancy >= fam.max_waves:
        occupancy, limit = fam.max_waves, "waves"
    if shared:
        by_lds = (fam.unit_shared // shared) * num_warps // fam.simds if shared <= fam.max_shared else 0
        if by_lds < occupancy:
            occupancy, limit = by_lds, "lds"
    return Resources(fam.name, compiled.metadata.name, num_warps, registers, agprs, _yaml_int(asm, "sgpr_count"),
                     _yaml_int(asm, "vgpr_spill_count"), _yaml_int(asm, "sgpr_spill_count"),
                     _yaml_int(asm, "private_segment_fixed_size"), shared, occupancy, fam.max_waves, limit)


def _cuda_resources(fam: Family, compiled) -> Resources:
    from triton import knobs

    cuobjdump = os.path.join(os.path.dirname(knobs.nvidia.ptxas.path), "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    usage = dict(re.findall(r"\b(REG|STACK|LOCAL):(\d+)", out))
    regs, local = int(usage.get("REG", 0)), int(usage.get("LOCAL", 0)) + int(usage.get("STACK", 0))
    num_warps = compiled.metadata.num_warps
    # Triton's kernels declare only dynamic shared memory (its launch checks metadata.shared against the
    # device's per-block maximum); the cubin's SHARED figure is the 1 KiB the driver reserves per block
    shared = compiled.metadata.shared or 0
    per_warp = -(-max(regs, 1) * fam.warp_size // 256) * 256
    limits = {"warps": min(32, fam.max_waves * fam.simds // num_warps),
              "registers": 65536 // (per_warp * num_warps)}
    if shared:
        limits["shared"] = fam.unit_shared // (-(-(shared + 1024) // 128) * 128) if shared <= fam.max_shared else 0
    limit = min(limits, key=limits.get)
    occupancy = limits[limit] * num_warps // fam.simds
    return Resources(fam.name, compiled.metadata.name, num_warps, regs, 0, None, 0, 0, local, shared,
                     min(occupancy, fam.max_waves), fam.max_waves, "waves" if limit == "warps" else limit)


def compile_resources(kernel, family_name: str, **kwargs) -> Resources:
    """:func:`compile_kernel`, then :func:`resources`."""
    return resources(compile_kernel(kernel, family_name, **kwargs))


def assert_fits(res: Resources, what: str = "") -> None:
    """AssertionError naming the kernel, the family and each of :meth:`Resources.problems`."""
    found = res.problems()
    assert not found, f"{res.kernel}{' ' + what if what else ''} on {res.family}: {'; '.join(found)}"


@dataclass(frozen=True)
class Case:
    """One kernel at one launch configuration, as its op launches it on a family: what an op's compile test
    lists (``compile_cases(family) -> list[Case]``) and ``benchmarks/aot_resources.py`` tabulates.
    ``label``: the shape or variant (``D=128 G=4 split``); ``launch``: the launch configuration the op picks
    there (``BLOCK_N=32 w4 s2``); ``args``: :func:`compile_kernel`'s keywords; ``must_fit``: False for a
    configuration that is only compiled and reported (one a tuner drops where it does not fit);
    ``known_misfit``: why a configuration the op does launch is known not to fit (it still must compile):
    :func:`parametrize` marks it a strict xfail, so the test fails once it fits and the note is stale."""

    kernel: object
    label: str
    launch: str
    args: dict
    must_fit: bool = True
    known_misfit: str | None = None

    def compile(self, family_name: str):
        return compile_kernel(self.kernel, family_name, **self.args)


# Compiles run on a few threads ahead of the test that needs them: Triton's compiler releases the GIL in its
# MLIR and LLVM passes (its own async compile mode uses a thread pool too), so on CI's two cores the compile
# tests take about 0.6x the time. Only a short window runs ahead, so a run stopped early (-x) does not wait
# for the whole queue at exit.
_QUEUE: list[tuple[str, Case]] = []  # every (family, case) parametrize listed, in test order
_POSITION: dict[tuple[int, str], int] = {}
_FUTURES: dict[tuple[int, str], object] = {}
_POOL: list = []
_WORKERS = max(1, os.cpu_count() or 1)


def _submit(family_name: str, case: Case) -> None:
    key = (id(case), family_name)
    if key not in _FUTURES:
        if not _POOL:
            from concurrent.futures import ThreadPoolExecutor

            _POOL.append(ThreadPoolExecutor(_WORKERS, thread_name_prefix="aot-compile"))
        _FUTURES[key] = _POOL[0].submit(case.compile, family_name)


def _compiled(case: Case, family_name: str):
    key = (id(case), family_name)
    _submit(family_name, case)
    if key in _POSITION:
        at = _POSITION[key] + 1
        for ahead in _QUEUE[at:at + 2 * _WORKERS]:
            _submit(*ahead)
    return _FUTURES.pop(key).result()


def check(case: Case, family_name: str):
    """(CompiledKernel, Resources) of the case on the family: a compile error raises; AssertionError if a case
    that must fit spills, uses scratch memory or more shared memory than the family allows
    (:meth:`Resources.problems`)."""
    compiled = _compiled(case, family_name)
    res = resources(compiled)
    if case.must_fit:
        assert_fits(res, f"[{case.label}, {case.launch}]")
    return compiled, res


def parametrize(compile_cases):
    """``@aot.parametrize(compile_cases)``: a test over ``(family, case)`` for every family
    :func:`selected_families` names and every case ``compile_cases(family)`` lists, ids ``family-label``.

        pytestmark = pytest.mark.aot_compile

        @aot.parametrize(compile_cases)
        def test_compiles_without_spills(family, case):
            aot.check(case, family)
    """
    import pytest

    def param(family_name: str, case: Case):
        marks = [pytest.mark.xfail(reason=case.known_misfit, raises=AssertionError, strict=True)] \
            if case.known_misfit and case.must_fit else []
        return pytest.param(family_name, case, id=f"{family_name}-{case.label}", marks=marks)

    listed = [(f, c) for f in selected_families() for c in compile_cases(f)]
    for pair in listed:
        _POSITION[(id(pair[1]), pair[0])] = len(_QUEUE)
        _QUEUE.append(pair)
    return pytest.mark.parametrize("family,case", [param(f, c) for f, c in listed])


COLUMNS = ("kernel", "config", "family", "warps", "regs", "agprs", "sgprs", "spills", "scratch", "LDS", "occupancy")


def markdown_table(rows: Iterable[tuple[str, Resources]]) -> str:
    """A Markdown table of (config label, Resources) rows: registers (VGPRs on AMD, of which AGPRs),
    SGPRs, spilled registers, scratch bytes per lane, LDS / shared bytes, occupancy (limiting resource)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for label, r in rows:
        spills = f"{r.vgpr_spills} / {r.sgpr_spills}" if r.sgprs is not None else str(r.spills)
        cells = (f"`{r.kernel}`", label, r.family, r.num_warps, r.registers, r.agprs if r.sgprs is not None else "-",
                 r.sgprs if r.sgprs is not None else "-", spills, r.scratch_bytes, r.shared_bytes,
                 f"{r.occupancy}/{r.max_waves} ({r.limit})")
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)
