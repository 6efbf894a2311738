"""Sweep infera-norm's launch parameters on one GPU, against vllm_c, to choose ``launch_config``'s rules.

For each op, hidden size and token count it times every candidate ``LaunchConfig`` (rows per block,
warps, one program per block or persistent with 2 stages) and vLLM's ``vllm_c`` kernel in two modes,
both replayed from a CUDA graph so the host launch is not in the figure:

- ``warm``: the same tensors every call (decode under CUDA graphs: the input was just written by a GEMM
  and sits in L2);
- ``cold``: calls cycle over enough tensor sets to exceed L2 several times (every byte from HBM; what
  "% of copy bandwidth" means).

A second part times the host side: back-to-back eager calls at M = 1 (the GPU idles, so the figure is
the launch path: vllm_c's C++ op, our launcher, the torch custom op around it, Triton's raw launch).

    python benchmarks/tune_norm.py       # on a GPU with vLLM; table + JSON under results/<gpu>/ (or --out DIR)

Not a test and not run in CI: it informs the heuristic in ``infera_ops/norm/kernels.py``, which records
the chosen rules and the figures behind them.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _results import L2_BYTES, arguments, describe_machine, graph_us, results_dir, write_json  # noqa: E402

HS = (576, 2048, 4096, 7168, 8192)
MS = (16, 256, 1024, 4096, 16384)
EPS = 1e-6
REP_MS = 10


def cycle_us(call, sets) -> float:
    """µs per call of ``call(*s)`` for each of ``sets`` in turn, from CUDA-graph replays (_results.graph_us;
    REP_MS each: the sweep makes thousands of these)."""
    return graph_us([lambda s=s: call(*s) for s in sets], REP_MS)


def tensor_sets(op: str, M: int, H: int, cold: bool):
    tensors = 2  # x and the residual (or x and y): the in-place fused add touches two tensors too
    per_set = tensors * M * H * 2
    n = max(2, min(256, -(-4 * L2_BYTES // per_set))) if cold else 1
    w = torch.randn(H, dtype=torch.bfloat16, device="cuda")
    sets = []
    for _ in range(n):
        x = torch.randn(M, H, dtype=torch.bfloat16, device="cuda")
        other = (torch.randn(M, H, dtype=torch.bfloat16, device="cuda") if op == "fused_add_rms_norm"
                 else torch.empty_like(x))
        sets.append((x, other, w))
    return sets


def candidates(M: int, H: int, num_sms: int):
    import triton

    from infera_ops.norm.launch import LaunchConfig

    block_h = triton.next_power_of_2(H)
    out = []
    for rows in (1, 2, 4, 8, 16):
        if rows > M or rows * block_h > 16384 or (rows > 1 and rows * block_h < 1024 and rows != 16):
            continue
        tile = rows * block_h
        blocks = triton.cdiv(M, rows)
        for warps in (4, 8, 16, 32):
            per_thread = tile / (32 * warps)
            if not 4 <= per_thread <= 32:
                continue
            out.append(LaunchConfig(block_h, rows, warps, blocks, 1))
            if blocks > 8 * num_sms:  # persistent: 4 programs per SM, each looping with 2 stages
                out.append(LaunchConfig(block_h, rows, warps, 4 * num_sms, 2))
    return out


def _compile_one(job):
    """In a worker process: launch once on small tensors with the sweep's specialisation (pointers
    16-byte aligned, M and strides multiples of 16), which fills Triton's on-disk cache."""
    op, H, cfg = job
    from infera_ops.norm import launch
    from infera_ops.norm.launch import LaunchConfig

    cfg = LaunchConfig(**cfg)._replace(programs=1)
    x = torch.randn(16, H, dtype=torch.bfloat16, device="cuda")
    r, w = torch.randn_like(x), torch.randn(H, dtype=torch.bfloat16, device="cuda")
    if op == "fused_add_rms_norm":
        launch._launch(x, r, r, w, x, EPS, config=cfg)
    else:
        launch._launch(x, None, None, w, torch.empty_like(x), EPS, config=cfg)
    torch.cuda.synchronize()
    return 1


def precompile(num_sms: int, workers: int = 12) -> None:
    """Compile every candidate in parallel processes first (ptxas and MLIR passes are CPU-bound; one
    process would spend most of the sweep compiling); the timing process then loads from the cache."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    jobs = {}
    for op in ("rms_norm", "fused_add_rms_norm"):
        for H in HS:
            for M in MS:
                for cfg in candidates(M, H, num_sms):
                    key = (op, H, cfg.block_h, cfg.rows, cfg.num_warps, cfg.num_stages)
                    jobs.setdefault(key, (op, H, cfg._asdict()))
    t0 = time.time()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = sum(pool.map(_compile_one, jobs.values()))
    print(f"precompiled {done} kernels in {time.time() - t0:.0f} s", flush=True)


def sweep(num_sms: int):
    from vllm import _custom_ops as vllm_ops

    from infera_ops.norm import launch
    from infera_ops.norm.launch import launch_config

    rows_out = []
    for op in ("rms_norm", "fused_add_rms_norm"):
        fused = op == "fused_add_rms_norm"
        for H in HS:
            for M in MS:
                nbytes = (4 if fused else 2) * M * H * 2
                sets = {mode: tensor_sets(op, M, H, mode == "cold") for mode in ("warm", "cold")}
                if fused:
                    def vllm_call(x, r, w):
                        vllm_ops.fused_add_rms_norm(x, r, w, EPS)
                else:
                    def vllm_call(x, y, w):
                        vllm_ops.rms_norm(y, x, w, EPS)
                base = {mode: cycle_us(vllm_call, s) for mode, s in sets.items()}
                results = []
                for cfg in candidates(M, H, num_sms):
                    if fused:
                        def call(x, r, w, cfg=cfg):
                            launch._launch(x, r, r, w, x, EPS, config=cfg)
                    else:
                        def call(x, y, w, cfg=cfg):
                            launch._launch(x, None, None, w, y, EPS, config=cfg)
                    t = {mode: cycle_us(call, s) for mode, s in sets.items()}
                    results.append((cfg, t))
                current = launch_config(M, H, fused, num_sms)

                def score(item):  # both modes matter: normalise each by its best and add
                    return sum(item[1][m] / min(r[1][m] for r in results) for m in ("warm", "cold"))

                best_cfg, best_t = min(results, key=score)
                cur_t = next((t for c, t in results if c == current), None)
                row = {"op": op, "H": H, "M": M, "bytes": nbytes, "vllm_c_warm_us": base["warm"],
                       "vllm_c_cold_us": base["cold"], "best": best_cfg._asdict(), "best_warm_us": best_t["warm"],
                       "best_cold_us": best_t["cold"], "current": current._asdict(),
                       "current_warm_us": cur_t and cur_t["warm"], "current_cold_us": cur_t and cur_t["cold"],
                       "all": [{"cfg": c._asdict(), **t} for c, t in results]}
                rows_out.append(row)
                cur = f"{cur_t['warm']:6.2f}/{cur_t['cold']:7.2f}" if cur_t else "   n/a"
                print(f"{op:<19} H={H:<5} M={M:<6} vllm_c warm {base['warm']:6.2f} cold {base['cold']:7.2f} | "
                      f"current {cur} | best {best_t['warm']:6.2f}/{best_t['cold']:7.2f} "
                      f"(x{base['warm'] / best_t['warm']:.2f}/x{base['cold'] / best_t['cold']:.2f}, "
                      f"cold {nbytes / best_t['cold'] / 1e6:.2f} TB/s) rows={best_cfg.rows} warps={best_cfg.num_warps} "
                      f"programs={best_cfg.programs} stages={best_cfg.num_stages}", flush=True)
                del sets
    return rows_out


def host_overhead(n: int = 3000):
    """Microseconds per back-to-back eager call at M = 1, H = 4096 (host-bound: the kernels take ~2 us)."""
    from vllm import _custom_ops as vllm_ops

    from infera_ops.norm import launch, seam  # noqa: F401  (registers torch.ops.infera.*)
    from infera_ops.norm.kernels import _rms_norm_fwd_kernel

    x = torch.randn(1, 4096, dtype=torch.bfloat16, device="cuda")
    r = torch.randn_like(x)
    w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)

    def raw():
        _rms_norm_fwd_kernel[(1,)](x, 4096, x, 0, y, 0, w, y, 4096, 1, 4096, EPS, BLOCK_H=4096, ROWS=1,
                                   FUSED_ADD=False, HAS_WEIGHT=True, num_warps=4)

    paths = {
        "vllm_c rms_norm (torch.ops._C)": lambda: vllm_ops.rms_norm(y, x, w, EPS),
        "vllm_c fused_add (torch.ops._C)": lambda: vllm_ops.fused_add_rms_norm(x, r, w, EPS),
        "triton raw launch": raw,
        "infera launch.rms_norm (launcher)": lambda: launch.rms_norm(x, w, EPS, out=y),
        "infera launch.fused_add_rms_norm": lambda: launch.fused_add_rms_norm(x, r, w, EPS, out=x, residual_out=r),
        "infera torch.ops.infera.rms_norm": lambda: torch.ops.infera.rms_norm(x, w, EPS),
        "infera torch.ops.infera.fused_add_rms_norm_": lambda: torch.ops.infera.fused_add_rms_norm_(x, r, w, EPS),
        "torch.empty_like alone": lambda: torch.empty_like(x),
    }
    out = {}
    for name, fn in paths.items():
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        out[name] = (time.perf_counter() - t0) / n * 1e6
        print(f"host  {name:<45} {out[name]:6.2f} us/call", flush=True)
    return out


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--skip-sweep", action="store_true", help="the host overhead only")
    args = parser.parse_args()
    machine = describe_machine()
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    host = host_overhead()
    rows = []
    if not args.skip_sweep:
        precompile(num_sms)
        rows = sweep(num_sms)
    out_dir = args.out or results_dir(machine)
    path = write_json(out_dir, "tune_norm", {"benchmark": "tune_norm", "machine": machine, "num_sms": num_sms,
                                             "host_us_per_call": host, "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
