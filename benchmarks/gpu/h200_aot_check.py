"""Checks infera_vllm.aot's sm90 figures against the CUDA driver on the H200: for every sm90 case of the ops'
compile tests, the registers, local memory (spills) and occupancy that aot reads from the cubin
(cuobjdump) and computes, beside what the driver reports once the cubin is loaded (Triton's ``load_binary``:
``n_regs``, ``n_spills``; ``cuOccupancyMaxActiveBlocksPerMultiprocessor``; ``cuFuncGetAttribute``).

    python benchmarks/gpu/h200_aot_check.py compile OUT.json           # cases compiled by this machine's Triton
    python benchmarks/gpu/h200_aot_check.py save CUBINS.pkl            # (anywhere) cubins + aot's figures
    python benchmarks/gpu/h200_aot_check.py load CUBINS.pkl OUT.json   # (on the GPU, the pickle carried) checked

Run with the checkout's sources on PYTHONPATH (meta/infera-vllm/src, packages/*/src) and TRITON_INTERPRET
unset. Exits 1 when any figure differs.
"""

from __future__ import annotations

import ctypes
import json
import os
import pickle
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
OPS = tuple(os.environ.get("AOT_OPS", "attn-paged,norm,linear-hipblaslt,moe-decode").split(","))  # AOT_OPS: a subset
CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, CU_FUNC_ATTRIBUTE_NUM_REGS = 1, 3, 4


def sm90_builds():
    """(op, case label, launch, CompiledKernel-like dict, aot Resources dict) for every sm90 case."""
    from aot_resources import compile_test_module

    from infera_vllm import aot

    for op in OPS:
        module, _ = compile_test_module(op)
        for case in module.compile_cases("sm90") + getattr(module, "report_cases", lambda f: [])("sm90"):
            compiled = case.compile("sm90")
            res = aot.resources(compiled)
            yield {"op": op, "label": case.label, "launch": case.launch, "name": compiled.metadata.name,
                   "cubin": compiled.asm["cubin"], "shared": compiled.metadata.shared,
                   "num_warps": compiled.metadata.num_warps, "aot": res.as_dict()}


def driver_figures(build: dict) -> dict:
    """What the driver says of the loaded cubin: registers, local bytes, static shared bytes, blocks per SM."""
    import torch
    from triton.runtime import driver

    device = torch.cuda.current_device()
    _, function, n_regs, n_spills, _ = driver.active.utils.load_binary(build["name"], build["cubin"], build["shared"],
                                                                      device)
    cuda = ctypes.CDLL("libcuda.so.1")
    value = ctypes.c_int()
    attrs = {}
    for key, attr in (("static_shared", CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
                      ("local_bytes", CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES), ("num_regs", CU_FUNC_ATTRIBUTE_NUM_REGS)):
        assert cuda.cuFuncGetAttribute(ctypes.byref(value), attr, ctypes.c_void_p(function)) == 0
        attrs[key] = value.value
    blocks = ctypes.c_int()
    rc = cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(blocks), ctypes.c_void_p(function),
                                                          build["num_warps"] * 32, ctypes.c_size_t(build["shared"]))
    return {"n_regs": n_regs, "n_spills": n_spills, **attrs,
            "blocks_per_sm": blocks.value if rc == 0 else None,
            "occupancy": blocks.value * build["num_warps"] // 4 if rc == 0 else None}


def compare(build: dict, drv: dict) -> list[str]:
    a = build["aot"]
    diffs = []
    if a["registers"] != drv["n_regs"]:
        diffs.append(f"registers aot {a['registers']} driver {drv['n_regs']}")
    if a["scratch_bytes"] // 4 != drv["n_spills"]:
        diffs.append(f"spills aot {a['scratch_bytes'] // 4} driver {drv['n_spills']}")
    if a["shared_bytes"] <= 232448 and drv["occupancy"] is not None and a["occupancy"] != min(drv["occupancy"], 16):
        diffs.append(f"occupancy aot {a['occupancy']} driver {drv['occupancy']} ({drv['blocks_per_sm']} blocks)")
    return diffs


def check(builds, out: str) -> int:
    import triton

    rows, bad = [], 0
    for b in builds:
        try:
            drv = driver_figures(b)
        except Exception as exc:  # e.g. more shared memory than a block may have: not loadable, as aot says
            drv = {"error": f"{type(exc).__name__}: {exc}"}
        diffs = compare(b, drv) if "error" not in drv else []
        bad += bool(diffs)
        rows.append({k: v for k, v in b.items() if k != "cubin"} | {"driver": drv, "diffs": diffs})
        a = b["aot"]
        print(f"{b['op']:18} {b['label']:30} aot regs {a['registers']:3} spills {a['scratch_bytes'] // 4:3} "
              f"occ {a['occupancy']:2} | driver {drv}{'  DIFF ' + '; '.join(diffs) if diffs else ''}", flush=True)
    with open(out, "w") as f:
        json.dump({"triton": triton.__version__, "rows": rows, "cases_differing": bad}, f, indent=1)
    print(f"{len(rows)} cases, {bad} differing -> {out}")
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["compile"]:
        return check(sm90_builds(), argv[1])
    if argv[:1] == ["save"]:
        import triton

        builds = list(sm90_builds())
        with open(argv[1], "wb") as f:
            pickle.dump({"triton": triton.__version__, "builds": builds}, f)
        print(f"{len(builds)} cubins (Triton {triton.__version__}) -> {argv[1]}")
        return 0
    if argv[:1] == ["load"]:
        with open(argv[1], "rb") as f:
            saved = pickle.load(f)
        print(f"cubins from Triton {saved['triton']}")
        return check(saved["builds"], argv[2])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
