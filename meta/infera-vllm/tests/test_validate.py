"""``infera-vllm validate``: the verdict rule on synthetic numbers, the table and markdown, the results JSON and
its skip/continue rule (with the engine runs stood in for), the matrix file and docs/results.md's generated
section; then one real run through vLLM's CPU engine on a tiny random-weight Llama (agreement and routing)."""

import importlib.util
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from infera_vllm import cli, model_sites, validate

ROOT = Path(__file__).resolve().parents[3]
VERDICTS = {"faster", "neutral", "slower", "disagrees", "agrees", "unjudged", "error", "pending"}


def _wall(pre, full) -> validate.Timings:
    return validate.Timings(list(pre), list(full), [None] * len(pre), [None] * len(full), [None] * len(pre))


def test_throughput_is_the_fastest_repeat_so_a_stall_does_not_count():
    """Wall clock only (no engine timestamps): two of three repeats stalled (one prefill-only generation by
    1 s, one full generation by 0.7 s): the estimate is that of the clean repeat, every repeat's figures are
    kept, and a repeat whose full generation did not outlast its prefill gives no decode figure of its own."""
    got = validate.timed_throughput(4, 32, 128, _wall([0.05, 1.05, 0.05], [0.55, 0.55, 1.25]))
    assert got["timing"] == "wall" and got["prefill"] == pytest.approx(4 * 32 / 0.05)
    assert got["decode"] == pytest.approx(4 * 128 / 0.5) == got["decode_wall"]
    assert got["prefill_all"] == pytest.approx([4 * 32 / 0.05, 4 * 32 / 1.05, 4 * 32 / 0.05])
    assert got["decode_all"] == pytest.approx([4 * 128 / 0.5, 4 * 128 / 1.2])
    assert (got["prefill_s_all"], got["full_s_all"]) == ([0.05, 1.05, 0.05], [0.55, 0.55, 1.25])
    assert validate.timed_throughput(1, 8, 8, _wall([0.3], [0.2]))["decode"] is None


def test_engine_timestamps_leave_the_front_ends_time_out():
    """With the engine's timestamps the estimates are the fastest engine-timed prefill and decode; the wall
    estimate (here inflated by 40 ms of front-end time per generation, which varies between repeats) is kept
    beside them. One repeat without timestamps puts the whole batch on the wall clock."""
    t = validate.Timings(pre_wall=[0.06, 0.09, 0.05], full_wall=[0.56, 0.60], pre_engine=[0.02, 0.021, 0.0205],
                         decode_engine=[0.45, 0.44], pre_steps=[1, 2, 1])
    got = validate.timed_throughput(16, 256, 64, t)
    assert got["timing"] == "engine"
    assert got["prefill"] == pytest.approx(16 * 256 / 0.02) and got["decode"] == pytest.approx(16 * 64 / 0.44)
    assert got["prefill_wall"] == pytest.approx(16 * 256 / 0.05)
    assert got["decode_wall"] == pytest.approx(16 * 64 / (0.56 - 0.06))
    assert got["decode_all"] == pytest.approx([16 * 64 / 0.45, 16 * 64 / 0.44])
    assert got["prefill_engine_s_all"] == [0.02, 0.021, 0.0205] and got["decode_engine_s_all"] == [0.45, 0.44]
    assert got["prefill_steps_all"] == [1, 2, 1]
    partial = t._replace(decode_engine=[0.45, None])
    assert validate.timed_throughput(16, 256, 64, partial)["timing"] == "wall"


class _Stats:
    def __init__(self, scheduled, first, last):
        self.scheduled_ts, self.first_token_ts, self.last_token_ts = scheduled, first, last


class _Out:
    def __init__(self, *ts):
        self.metrics = _Stats(*ts) if ts else None


def test_the_clock_of_an_entry_is_named():
    entry = _entry(_runs(norm=([_round(101.0)], {})))
    assert validate.clock(entry) == "wall clock"
    for run in entry["runs"].values():
        for r in run["rounds"]:
            for b in r["batches"].values():
                b["timing"] = "engine"
    assert validate.clock(entry) == "engine timestamps"
    entry["runs"]["norm"]["rounds"][0]["batches"]["16"]["timing"] = "wall"
    assert validate.clock(entry) == "mixed clocks"


def test_engine_seconds_span_every_prefill_step_and_the_median_decode():
    """Prefill: first request scheduled to last first token (the third request reached the engine a step
    later: two steps); decode: the median request's first to last token. Outputs without stats (vLLM's stats
    off) give no figure."""
    outs = [_Out(10.0, 10.02, 10.50), _Out(10.0, 10.02, 10.52), _Out(10.02, 10.04, 10.55)]
    prefill, decode, steps = validate.engine_seconds(outs)
    assert prefill == pytest.approx(0.04) and decode == pytest.approx(0.50) and steps == 2
    assert validate.engine_seconds([_Out(10.0, 10.02, 10.5), _Out()]) == (None, None, None)
    assert validate.engine_seconds([_Out(10.0, 10.02, 10.02)]) == (pytest.approx(0.02), None, 1)  # one token


def test_kernel_compiles_logged_during_a_batchs_timed_repeats_are_counted_for_it():
    """vLLM's JIT monitor lines (its log format: local time to the second, no year) inside a batch's timed
    window, a second of slack either side, count for that batch; those before (warm-up) or between do not."""
    begin = time.mktime((2026, 12, 4, 20, 1, 10, 0, 0, -1))

    def line(offset, kernel, level="WARNING"):
        stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(begin + offset))
        return (f"(EngineCore pid=7) {level} {stamp} [jit_monitor.py:135] Triton kernel JIT compilation during "
                f"inference: {kernel}. This causes a latency spike; consider extending warmup to cover this "
                "shape/config.")

    log = "\n".join([line(-5, "_compute_slot_mapping_kernel"), line(0, "fused_moe_kernel"),
                     "INFO 12-04 20:01:12 [loggers.py:310] Engine 000: Avg prompt throughput: 3583.0 tokens/s",
                     line(3, "fused_moe_kernel (constants: BLOCK_SIZE_M=16)"), line(4, "triton_poi_fused_0"),
                     line(20, "fused_moe_kernel"), line(41, "fused_moe_kernel")])
    result = {"measured_at": begin - 30, "batches": {"1": {"timed_at": [begin - 20, begin - 8]},
                                                     "16": {"timed_at": [begin + 0.5, begin + 6.0]},
                                                     "64": {"timed_at": [begin + 30.0, begin + 40.2]}}}
    assert validate.jit_in_timing(log, result) == {"16": {"fused_moe_kernel": 2, "triton_poi_fused_0": 1},
                                                  "64": {"fused_moe_kernel": 1}}
    assert validate.jit_in_timing(log, {"batches": {"1": {}}}) == {}  # no windows recorded: nothing to say


class _Clock:
    """A fake engine whose generations take the given seconds, in order, on a fake clock; with ``engine``
    its outputs carry engine timestamps: the prefill at 0.4 of a generation's time when it is one token,
    the decode at 0.9 of it otherwise."""

    def __init__(self, seconds, engine=False):
        self.now, self.seconds, self.engine = 0.0, list(seconds), engine

    def generate(self, prompts, params, use_tqdm=False):
        took = self.seconds.pop(0)
        start, self.now = self.now, self.now + took
        if not self.engine:
            return None
        if params == "prefill":
            return [_Out(start + 1.0, start + 1.0 + 0.4 * took, start + 1.0 + 0.4 * took)]
        return [_Out(start + 1.0, start + 1.0, start + 1.0 + 0.9 * took)]


@pytest.mark.parametrize("max_repeats, seconds, calls, pre, full", [
    # two repeats, both clean: nothing more
    (4, [9, 9, 1.0, 5.0, 1.01, 5.1], 6, [1.0, 1.01], [5.0, 5.1]),
    # a stalled full generation: a third pair, whose fastest agrees with the clean one
    (4, [9, 9, 1.0, 5.0, 1.0, 6.2, 1.0, 5.05], 8, [1.0, 1.0, 1.0], [5.0, 6.2, 5.05]),
    # stalls to the end: at most max_repeats pairs
    (3, [9, 9, 1.0, 6.0, 1.0, 5.0, 1.0, 7.0], 8, [1.0, 1.0, 1.0], [6.0, 5.0, 7.0]),
    # without max_repeats exactly the repeats
    (None, [9, 9, 1.0, 6.0, 1.0, 5.0], 6, [1.0, 1.0], [6.0, 5.0]),
])
@pytest.mark.parametrize("engine", [False, True])
def test_generations_are_repeated_until_two_agree(monkeypatch, max_repeats, seconds, calls, pre, full, engine):
    """After the warm-ups (9 s each, not timed) the repeats; with max_repeats, more until the two fastest
    prefill-only and the two fastest full generations each agree within 5% (by the engine's timestamps where
    the outputs carry them, which here scale with the wall times), so the fastest is not a stalled one."""
    clock = _Clock(seconds, engine)
    monkeypatch.setattr(validate.time, "perf_counter", lambda: clock.now)
    monkeypatch.setattr(validate.time, "time", lambda: clock.now)
    got = validate.time_generations(clock, [], "prefill", "full", 2, max_repeats)
    assert (got.pre_wall, got.full_wall) == (pytest.approx(pre), pytest.approx(full))
    assert got.timed_at == pytest.approx([18.0, 18.0 + sum(pre) + sum(full)])  # after the warm-ups, to the end
    assert validate.timed_throughput(1, 10, 10, got)["timed_at"] == got.timed_at
    assert len(seconds) - len(clock.seconds) == calls
    if engine:
        assert got.pre_engine == pytest.approx([0.4 * p for p in pre]) and got.pre_steps == [1] * len(pre)
        assert got.decode_engine == pytest.approx([0.9 * f for f in full])
    else:
        assert got.pre_engine == got.pre_steps == [None] * len(pre) and got.decode_engine == [None] * len(full)


def test_prefill_only_generations_follow_until_a_second_is_sampled(monkeypatch):
    """Short prefills (0.1 s) get prefill-only repeats after the pairs until PREFILL_WINDOW_S of them is timed;
    the decode estimate takes the pairs' prefill times only, the prefill's fastest all of them."""
    clock = _Clock([9, 9, 0.2, 5.0, 0.15, 5.1] + [0.1] * 8 + [0.05])
    monkeypatch.setattr(validate.time, "perf_counter", lambda: clock.now)
    t = validate.time_generations(clock, [], "prefill", "full", 2)
    assert t.pre_wall == pytest.approx([0.2, 0.15] + [0.1] * 7) and t.full_wall == pytest.approx([5.0, 5.1])
    got = validate.timed_throughput(1, 10, 10, t)
    assert got["prefill"] == pytest.approx(10 / 0.1) and got["decode"] == pytest.approx(10 / (5.0 - 0.15))


def _round(decode: float, prefill: float = 100.0, batches=(1, 16)) -> dict:
    return {"batches": {str(b): {"decode": decode, "prefill": prefill} for b in batches}, "seconds": 1.0}


def _entry(runs: dict, *, meaningful: bool = True, weights: str = "real") -> dict:
    return {"model": "m", "weights": weights, "environment": {"gpu_family": "sm90"}, "commit": "c",
            "options": {"batches": [1, 16], "rounds": 2}, "throughput_meaningful": meaningful, "skipped": {},
            "runs": {label: {"rounds": rounds, **extra} for label, (rounds, extra) in runs.items()}}


def _agree(x: float) -> dict:
    return {"agreement": {"agreement": x, "positions": 1000, "disagreements": []}}


def _runs(**ops) -> dict:
    """off and off2 at 100 and 104 tok/s (spread 4%), agreement 1.0; then the given op runs."""
    return {"off": ([_round(100.0), _round(102.0)], {}), "off2": ([_round(104.0), _round(101.0)], _agree(1.0)), **ops}


def test_verdicts_against_the_off_vs_off_spread():
    j = validate.judge(_entry(_runs(
        fast=([_round(110.0), _round(112.0)], _agree(0.99)),       # +9.6%: beyond the 4% spread
        same=([_round(103.0), _round(99.0)], _agree(0.999)),       # within it
        slow=([_round(94.0), _round(95.0)], _agree(1.0)),          # -6.9%
        wrong=([_round(120.0), _round(120.0)], _agree(0.95)),      # fast but below 1.0 - 0.025
        broken=([{"error": "exit 1: boom", "seconds": 3.0}], {}),
        later=([], {}),                                            # planned, its call's budget ended first
    )))
    rows = {r["run"]: r for r in j["rows"]}
    assert {k: r["verdict"] for k, r in rows.items()} == {"fast": "faster", "same": "neutral", "slow": "slower",
                                                          "wrong": "disagrees", "broken": "error",
                                                          "later": "pending"}
    assert j["noise"]["decode"]["1"] == pytest.approx(4 / 101.5)  # (max - min) / median of off and off2 rounds
    assert rows["fast"]["ratios"]["decode"]["16"] == pytest.approx(111 / 101.5)
    assert j["thresholds"] == {"min_effect": 0.02, "agreement_tolerance": 0.025, "agreement_floor": 0.975,
                               "attention_agreement_floor": 0.975}
    assert "boom" in rows["broken"]["note"]
    assert "not run yet" in rows["later"]["note"]


def test_min_effect_applies_when_plugin_off_is_quiet_and_slower_outranks_faster():
    quiet = {"off": ([_round(100.0)], {}), "off2": ([_round(100.0)], _agree(1.0))}
    mixed = {"batches": {"1": {"decode": 101.5, "prefill": 130.0}, "16": {"decode": 90.0, "prefill": 100.0}}}
    j = validate.judge(_entry({**quiet, "small": ([_round(101.5)], {}), "mixed": ([mixed], {})}))
    assert [r["verdict"] for r in j["rows"]] == ["neutral", "slower"]  # 1.5% < 2%; one batch 10% slower


def test_attention_is_judged_against_vllms_other_attention_backend_too():
    runs = _runs(**{"off-triton": ([_round(90.0)], _agree(0.96)), "attn-paged": ([_round(101.0)], _agree(0.965)),
                    "norm": ([_round(101.0)], _agree(0.965))})
    rows = {r["run"]: r["verdict"] for r in validate.judge(_entry(runs))["rows"]}
    assert rows == {"attn-paged": "neutral", "norm": "disagrees"}  # TRITON_ATTN itself agrees only 0.96


def test_greedy_continuations_count_the_tokens_before_the_first_difference():
    ref = [[5, 6, 7, 8], [1, 2, 3, 4]]
    assert validate.greedy_agreement(ref, ref) == {"tokens": 8, "matched": [4, 4], "share": 1.0}
    got = validate.greedy_agreement(ref, [[5, 6, 9, 8], [7, 2, 3, 4]])  # later matches after a difference: none
    assert got == {"tokens": 8, "matched": [2, 0], "share": 0.25}
    assert validate.greedy_tokens(1500) == 256 and validate.greedy_tokens(256) == 64 and validate.greedy_tokens(2) == 1
    runs = {"off": ([_round(100.0)], {}), "off2": ([_round(100.0)], _agree(1.0)),
            "norm": ([_round(100.0)], _agree(0.99))}
    entry = _entry(runs)
    entry["runs"]["off2"]["greedy_agreement"] = {"tokens": 8, "matched": [4, 4], "share": 1.0}
    entry["runs"]["norm"]["greedy_agreement"] = got
    assert validate.judge(entry)["greedy_vs_off"] == {"off2": 1.0, "norm": 0.25}
    assert "greedy decode vs off" in validate.render({"models": [entry]}) and "norm 0.250" in validate.render(
        {"models": [entry]})


def test_without_meaningful_throughput_only_agreement_is_judged():
    runs = _runs(norm=([_round(500.0)], _agree(1.0)), bad=([_round(100.0)], _agree(0.5)))
    assert [r["verdict"] for r in validate.judge(_entry(runs, meaningful=False))["rows"]] == ["agrees", "disagrees"]
    dummy = {"off": ([_round(100.0)], {}), "off2": ([_round(100.0)], {}), "norm": ([_round(100.0)], {})}
    assert validate.judge(_entry(dummy, meaningful=False, weights="dummy"))["rows"][0]["verdict"] == "unjudged"


def test_speed_is_not_judged_where_plugin_off_ran_once():
    once = {"off": ([_round(100.0)], {}), "off2": ([], _agree(1.0))}  # a budget that ended before off2 measured
    j = validate.judge(_entry({**once, "norm": ([_round(60.0)], _agree(1.0)), "bad": ([_round(60.0)], _agree(0.5))}))
    rows = {r["run"]: r for r in j["rows"]}
    assert {k: r["verdict"] for k, r in rows.items()} == {"norm": "agrees", "bad": "disagrees"}
    assert "speed not judged" in rows["norm"]["note"] and rows["norm"]["ratios"]["decode"]["1"] == 0.6
    assert j["noise"]["decode"]["1"] is None
    no_agreement = {"off": ([_round(100.0)], {}), "norm": ([_round(60.0)], {})}
    assert validate.judge(_entry(no_agreement, weights="dummy"))["rows"][0]["verdict"] == "unjudged"


def test_an_op_that_served_nothing_is_noted():
    cov = {"norm": {"active": True, "verdicts": ["active x2"], "counts": {"call": {"handover eager-launch-cost": 9}},
                    "share": {"call": {"handover eager-launch-cost": 1.0}}}}
    entry = _entry(_runs(norm=([_round(101.0)], {**_agree(1.0), "coverage": cov})))
    (row,) = validate.judge(entry)["rows"]
    assert row["verdict"] == "neutral" and row["note"] == "norm served no call on its kernel"
    text = validate.render({"models": [entry]})
    assert "norm: handover eager-launch-cost 100%" in text and "served no call" in text


def test_a_run_where_no_op_took_a_call_widens_the_spread():
    """The default set on a model none of whose layers it takes did plugin off's work in another process: its
    rounds join off and off2 in the spread (two plugin-off processes underestimate the noise between
    processes), so it is neutral itself and a run within that wider spread is too. A run whose ops handed
    calls over did change the path (another provider) and is judged on its numbers."""
    idle = {op: {"active": op != "attn-paged", "verdicts": ["active x2"], "counts": {}, "share": {}}
            for op in ("attn-paged", "norm")}
    handed = {"norm": {"active": True, "verdicts": ["active x2"], "counts": {"call": {"handover vllm-c-faster": 9}},
                       "share": {"call": {"handover vllm-c-faster": 1.0}}}}
    entry = _entry(_runs(default=([_round(112.0)], {"coverage": idle}), norm=([_round(85.0)], {"coverage": handed}),
                         near=([_round(92.0)], {}), quiet=([_round(101.0)], {"coverage": idle})))
    j = validate.judge(entry)
    rows = {r["run"]: r for r in j["rows"]}
    assert j["noise"]["decode"]["1"] == pytest.approx((112 - 100) / 101.5)  # off 100-104, the idle runs 101, 112
    assert rows["default"]["verdict"] == "neutral" and rows["default"]["note"].startswith("no op took a call")
    assert rows["quiet"]["verdict"] == "neutral" and rows["quiet"]["note"].startswith("no op took a call")
    assert rows["near"]["verdict"] == "neutral"  # 0.906: beyond off-vs-off's 3.9%, within the 11.8%
    assert rows["norm"]["verdict"] == "slower" and rows["norm"]["note"] == "norm served no call on its kernel"


def test_repeats_that_scatter_within_a_plugin_off_process_widen_the_spread():
    """A round's figure is its fastest repeat; where one plugin-off process's repeats scatter (its fastest 20%
    above the next), two processes that both caught a fast repeat agree by luck: the threshold takes that
    margin, so a run 12% below off is neutral there, while a point whose repeats agree is judged as before."""
    def at(decode_all, prefill_all):
        return {"batches": {b: {"decode": max(decode_all), "decode_all": decode_all, "prefill": max(prefill_all),
                                "prefill_all": prefill_all} for b in ("1", "16")}, "seconds": 1.0}

    tight = [100.0, 99.9, 99.8]
    runs = {"off": ([at(tight, [100.0, 80.0, 79.0, 2.0])], {}), "off2": ([at([101.0, 100.9], [101.0, 99.0, 98.0])], {}),
            "op": ([at([90.0, 89.9], [88.0, 87.0])], {})}
    j = validate.judge(_entry(runs, weights="dummy"))
    assert j["noise"]["prefill"]["1"] == pytest.approx(0.2)  # off's 100 -> 80 without its fastest repeat
    assert j["noise"]["decode"]["1"] == pytest.approx(1 / 100.5)  # its repeats agree: the spread between processes
    assert j["rows"][0]["verdict"] == "slower"  # decode 0.896, beyond 2%; its prefill 0.88 alone would be neutral
    assert validate._fastest_margin({"batches": {"1": {"prefill": 5.0}}}, 1, "prefill") == 0.0  # no repeats kept
    runs["op"] = ([at([100.5, 100.4], [88.0, 87.0])], {})
    assert validate.judge(_entry(runs, weights="dummy"))["rows"][0]["verdict"] == "neutral"


def test_runs_that_took_the_same_routes_widen_the_spread():
    """The default set and moe-decode alone, the default set's only op that took calls here, routed every call
    alike (call counts differ with the repeats timed, plan counts do not): two processes doing the plugin's
    same work, 0.94 and 1.06 of plugin off at batch 16, so that 12% is noise and both are neutral there; a
    run that took other routes, or a preset's run with other switches, is not pooled."""
    def moe(calls, kernel=480):
        counts = {"call": {"handover tokens-above-threshold": calls, "kernel": kernel},
                  "plan": {"handover tokens-above-threshold": 1200, "kernel": kernel}}
        return {"moe-decode": {"active": True, "verdicts": ["active x1"], "counts": counts, "share": {}},
                "norm": {"active": False, "verdicts": [], "counts": {}, "share": {}}}

    def at(b1, b16):
        return {"batches": {"1": {"decode": b1, "prefill": 100.0}, "16": {"decode": b16, "prefill": 100.0}},
                "seconds": 1.0}

    runs = {"off": ([at(100.0, 100.0)], {}), "off2": ([at(101.0, 101.0)], {}),
            "default": ([at(110.0, 94.0)], {"coverage": moe(3264)}),
            "moe-decode": ([at(110.0, 106.0)], {"coverage": moe(3312)}),
            "other": ([at(100.0, 90.0)], {"coverage": moe(3312, kernel=960)}),
            "moe-alt": ([at(100.0, 90.0)], {"coverage": moe(3312), "op": "moe-decode"})}
    entry = _entry(runs)
    j = validate.judge(entry)
    assert j["same_routes"] == [["default", "moe-decode"]]
    assert j["noise"]["decode"]["16"] == pytest.approx(12 / 100) and j["noise"]["decode"]["1"] == pytest.approx(
        1 / 100.5)
    rows = {r["run"]: r for r in j["rows"]}
    assert rows["default"]["verdict"] == rows["moe-decode"]["verdict"] == "faster"  # 1.095 at batch 1
    assert "same routes as moe-decode" in rows["default"]["note"]
    assert rows["other"]["verdict"] == "neutral" and "same routes" not in rows["other"]["note"]  # 0.896: within 12%
    entry["runs"]["default"]["rounds"][0]["batches"]["1"]["decode"] = 100.0
    entry["runs"]["moe-decode"]["rounds"][0]["batches"]["1"]["decode"] = 101.0
    rows = {r["run"]: r for r in validate.judge(entry)["rows"]}
    assert rows["default"]["verdict"] == rows["moe-decode"]["verdict"] == "neutral"


def test_an_op_alone_is_not_rerun_where_the_default_set_already_did_its_work():
    """default_covers: the default set's only op that took calls, needing no switch to serve alone, would
    take the same routes alone; other ops that took any call (or attn-paged, which serves alone only with its
    switch) still run alone. A covered run carries the default set's figures, is judged like it, and is not
    pooled with it as a second process."""
    def cov(**called):
        return {op: {"active": True, "verdicts": ["active x1"], "counts": {"call": {"kernel": n}} if n else {},
                     "share": {}} for op, n in called.items()}

    default = {"rounds": [_round(110.0)], "coverage": cov(**{"moe-decode": 5, "norm": 0})}
    runs = {"default": default, "moe-decode": {"rounds": []}, "norm": {"rounds": []},
            "moe-alt": {"rounds": [], "op": "moe-decode"}}
    assert validate.default_covers(runs, "moe-decode", 0) is default
    assert validate.default_covers(runs, "moe-decode", 1) is None  # that round of the default set is not measured
    assert validate.default_covers(runs, "norm", 0) is None and validate.default_covers(runs, "moe-alt", 0) is None
    assert validate.default_covers({**runs, "default": {**default, "coverage": cov(**{"moe-decode": 5, "norm": 2})}},
                                   "moe-decode", 0) is None
    attn = {"default": {"rounds": [_round(110.0)], "coverage": cov(**{"attn-paged": 5})}, "attn-paged": {"rounds": []}}
    assert validate.default_covers(attn, "attn-paged", 0) is None  # alone it serves every attention layer
    entry = _entry({"off": ([_round(100.0)], {}), "off2": ([_round(101.0)], {}),
                    "default": ([_round(110.0)], {"coverage": default["coverage"]}),
                    "moe-decode": ([_round(110.0)], {"coverage": default["coverage"], "measured_by": "default"})})
    j = validate.judge(entry)
    rows = {r["run"]: r for r in j["rows"]}
    assert j["same_routes"] == [] and rows["moe-decode"]["verdict"] == rows["default"]["verdict"] == "faster"
    assert "not run alone: the only op that took calls in default" in rows["moe-decode"]["note"]


def test_a_run_that_served_nothing_is_never_faster_and_trace_time_declines_are_plugin_offs_work():
    """norm on Gemma-2 declined every norm while the graph was traced (fp32 weights): the compiled graph is
    vLLM's, so that run joins the noise; a run whose op declined at call time, and served nothing, may be
    slower (its checks cost time) but a gain there is noise."""
    def cov(op, at, route):
        return {op: {"active": True, "verdicts": ["active x1"], "counts": {at: {route: 9}}, "share": {}}}

    runs = {"off": ([_round(100.0)], {}), "off2": ([_round(101.0)], {}),
            "norm": ([_round(108.0)], {"coverage": cov("norm", "trace", "fallback weight-dtype")}),
            "moe-decode": ([_round(115.0)], {"coverage": cov("moe-decode", "call", "fallback activation")}),
            "attn-paged": ([_round(115.0)], {"coverage": cov("attn-paged", "call", "kernel")})}
    j = validate.judge(_entry(runs))
    rows = {r["run"]: r for r in j["rows"]}
    assert j["noise"]["decode"]["1"] == pytest.approx(8 / 100.5)  # off, off2 and the norm run
    assert rows["norm"]["verdict"] == "neutral" and rows["norm"]["note"].startswith("every call went to vLLM's")
    assert rows["moe-decode"]["verdict"] == "neutral" and "a gain without a served call is noise" in \
        rows["moe-decode"]["note"]
    assert rows["attn-paged"]["verdict"] == "faster"  # 1.144 beyond the 8% spread, on its kernel
    runs["moe-decode"] = ([_round(80.0)], {"coverage": cov("moe-decode", "call", "fallback activation")})
    assert {r["run"]: r["verdict"] for r in validate.judge(_entry(runs))["rows"]}["moe-decode"] == "slower"


def test_cpus_pin_every_run_and_name_only_cpus_this_process_has(monkeypatch, tmp_path):
    assert validate.cpu_list("0-3,8, 2") == [0, 1, 2, 3, 8]
    for bad in ("3-1", "x", "-1"):
        with pytest.raises(ValueError):
            validate.cpu_list(bad)
    have = sorted(os.sched_getaffinity(0))
    with pytest.raises(validate.InputError, match="not a subset"):
        validate._options(types.SimpleNamespace(matrix=None, cpus=str(have[-1] + 1)))
    assert validate._options(types.SimpleNamespace(matrix=None, cpus=str(have[0])))["cpus"] == [have[0]]
    monkeypatch.setattr(validate, "RUN_ONE", _stand_in(tmp_path))
    assert validate._spawn({"cpus": [have[0]]}, {**os.environ}, str(tmp_path / "a"))["cpus"] == [have[0]]
    assert validate._spawn({}, {**os.environ}, str(tmp_path / "b"))["cpus"] == have


def _stand_in(tmp_path) -> list[str]:
    """A stand-in for ``run-one`` (our process protocol, no vLLM): "imports" for STAND_IN_IMPORT_S, says so, waits
    for its turn and its quiet file, and writes what it saw."""
    script = tmp_path / "stand_in.py"
    script.write_text('''import json, os, sys, time
cfg = json.load(open(sys.argv[1]))
time.sleep(float(os.environ.get("STAND_IN_IMPORT_S", "0")))
imported_at = time.time()
open(cfg["imported_file"], "w").close()
if sys.stdin.readline().strip() != "go":
    sys.exit(3)
while not os.path.exists(cfg["quiet_file"]):
    time.sleep(0.01)
now = time.time()
json.dump({"batches": {}, "cpus": sorted(os.sched_getaffinity(0)), "imported_at": imported_at, "measured_at": now,
           "written_at": now}, open(sys.argv[2], "w"))
''')
    return [sys.executable, str(script)]


def test_the_next_run_imports_while_this_one_starts_and_nothing_is_timed_meanwhile(monkeypatch, tmp_path):
    """The next run's process is started when this run's turn comes; this run times nothing until that process
    has imported; the next run's own time counts from its turn."""
    monkeypatch.setattr(validate, "RUN_ONE", _stand_in(tmp_path))
    first = validate._start({}, {**os.environ}, str(tmp_path / "first"))
    first.go()
    second = validate._start({}, {**os.environ, "STAND_IN_IMPORT_S": "1.0"}, str(tmp_path / "second"))
    a = first.wait(second)
    assert a["imported_ahead"] is False  # its turn came as it started: its import was its own time
    assert second.proc.poll() is None and second.imported()  # imported, waiting for its turn
    second.go()
    b = second.wait()
    assert a["measured_at"] >= b["imported_at"]  # the first run timed nothing while the second imported
    assert b["imported_ahead"] is True and b["seconds"] < 1.0  # its import was not its own time
    third = validate._start({}, {**os.environ, "STAND_IN_IMPORT_S": "30"}, str(tmp_path / "third"))
    third.cancel()  # not its turn after all: ended
    assert third.proc.returncode is not None
    broken = validate._start({}, {**os.environ, "STAND_IN_IMPORT_S": "x"}, str(tmp_path / "broken"))
    broken.go()
    assert broken.wait()["error"].startswith("exit 1: ValueError")


def test_an_interrupted_call_leaves_no_run_process(fake_engine, tmp_path, monkeypatch):
    """Ctrl-C (or the device call's timeout) while a run is timed: its process and the next one's end too."""
    monkeypatch.setattr(validate, "RUN_ONE", _stand_in(tmp_path))
    started = []

    def start(cfg, env, work):
        run = validate._Run(cfg, {**os.environ, "STAND_IN_IMPORT_S": "0"}, work)
        started.append(run)
        return run

    def interrupted(self, behind=None, on_step=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(validate, "_start", start)
    monkeypatch.setattr(validate._Run, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        validate.main([_model_dir(tmp_path), "--rounds", "1", "--work", str(tmp_path / "w")])
    assert len(started) == 2 and all(run.proc.poll() is not None for run in started)


def test_coverage_shows_the_self_check_per_op():
    cov = {"norm": {"active": True, "verdicts": ["active x1"], "counts": {"call": {"kernel": 9}},
                    "share": {"call": {"kernel": 1.0}},
                    "self_check": {"buckets": 3, "checked": 3, "passed": 2, "failed": 1, "max_error": 0.25,
                                   "unchecked_at_capture": 0, "seconds": 0.5}}}
    text = validate._coverage_text(cov, ["norm"])
    assert text == "norm: kernel 100%, self-check 2/3 passed in 3 buckets (largest error 2.5e-01, 0.50 s)"
    entry = _entry(_runs(norm=([{**_round(100.0), "startup_s": 40.0}], _agree(1.0))))
    entry["runs"]["norm"]["coverage"] = cov
    assert "self-check time (vLLM's implementation run for the checks) of startup: norm 0.50 s of 40.0 s (1.2%)" \
        in validate.render({"models": [entry]})


def test_table_and_markdown_show_every_run_the_thresholds_and_what_was_not_run():
    entry = _entry(_runs(norm=([_round(110.0), _round(111.0)], _agree(1.0))), meaningful=False)
    entry["skipped"] = {"moe-decode": "takes none of the model's 0 moe layers"}
    text = validate.render({"models": [entry]})
    lines = text.splitlines()
    assert lines[0] == "== m (real weights, sm90, commit c, rounds 2/2, wall clock)"  # no `timing`: the wall
    assert any(ln.split()[:1] == ["norm"] and "agrees" in ln and "1.0000" in ln for ln in lines)
    assert "moe-decode         not run: takes none" in text
    assert "thresholds: faster/slower = a ratio beyond 1 +- max(2%, noise spread)" in text
    assert "below off-vs-off - 0.025 = 0.9750" in text
    assert "throughput here is not meaningful" in text
    md = validate.markdown({"models": [entry]}).splitlines()
    assert md[0] == "| model | run | decode x | prefill x | agreement | verdict | coverage |"
    assert md[2].startswith("| m | norm | 1.089 1.089 | 1.000 1.000 | 1.0000 | agrees (norm served no call on its "
                            "kernel) |")


# ---- the command, with each engine run stood in for -------------------------------------------------------

@pytest.fixture
def fake_engine(monkeypatch):
    """validate.plan and validate._spawn replaced (our own code, not vLLM's; a run started ahead calls _spawn at
    its turn): norm is the one op taking layers; every run measures 100 tok/s and the same top-1s, on a GPU (so
    not under Triton's interpreter, where throughput is not meaningful, whatever the session running these tests
    sets)."""
    calls = []
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)

    def fake_plan(model, requested):
        return {"norm": 7}, {"moe-decode": "takes none of the model's 0 moe layers"}, {"gpu_family": "sm90"}

    def fake_spawn(cfg, env, work):
        calls.append(env.get("INFERA_VLLM_OPS", "off" if env.get("INFERA_VLLM_OPS_DISABLE") else "default"))
        return {**_round(100.0, batches=cfg["batches"]), "top1": [[1, 2, 3]], "prompts": [[0, 1, 2, 3]]}

    class Deferred:  # a run's process started ahead of its turn: validate._spawn (stood in for) runs at its turn
        def __init__(self, cfg, env, work):
            self.args = (cfg, env, work)

        def imported(self):
            return True

        def go(self):
            pass

        def cancel(self):
            pass

        def wait(self, behind=None, on_step=None):
            return validate._spawn(*self.args)

    monkeypatch.setattr(validate, "plan", fake_plan)
    monkeypatch.setattr(validate, "machine_family", lambda: "sm90")  # the GPU's options, not the CPU profile
    monkeypatch.setattr(validate, "_spawn", fake_spawn)
    monkeypatch.setattr(validate, "_start", Deferred)
    return calls


def _model_dir(tmp_path) -> str:
    path = tmp_path / "tiny"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                                                  "num_hidden_layers": 2, "num_attention_heads": 4,
                                                  "vocab_size": 100}))
    for name in ("model.safetensors", "tokenizer.json"):  # what a real model directory holds (never loaded here)
        (path / name).write_text("{}")
    return str(path)


def test_results_accumulate_and_a_measured_model_is_not_rerun(fake_engine, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("INFERA_COMMIT", "abc123")
    model, out = _model_dir(tmp_path), str(tmp_path / "res" / "validation.json")
    args = [model, "--batches", "1,4", "--rounds", "2", "--out", out, "--work", str(tmp_path / "w")]
    assert validate.main(args) == 0
    assert fake_engine == ["off", "default", "norm", "off"] * 2  # alternating rounds, off2 closing each
    doc = json.loads(Path(out).read_text())
    assert doc["format"] == "infera-vllm-validate/1"
    (entry,) = doc["models"]
    assert {"model", "path", "config_sha256", "weights", "commit", "versions", "options", "environment", "runs",
            "skipped", "reference", "throughput_meaningful"} <= set(entry)
    assert entry["commit"] == "abc123" and entry["weights"] == "real" and entry["options"]["batches"] == [1, 4]
    assert list(entry["runs"]) == ["off", "default", "norm", "off2"]
    assert entry["runs"]["norm"]["env"] == {"INFERA_VLLM_OPS": "norm"}
    assert entry["runs"]["norm"]["agreement"]["agreement"] == 1.0 and entry["reference"]["model_accuracy"] == 1.0
    assert all(len(r["rounds"]) == 2 for r in entry["runs"].values())
    assert os.path.isfile(out.replace(".json", ".png"))
    header = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("== tiny"))
    assert header.startswith("== tiny (real weights, sm90, commit abc123, wheels ") and "infera-vllm 0.1.0" in header
    assert re.search(r"measured 20\d\d-\d\d-\d\d \d\d:\d\d:\d\d UTC, rounds 2/2, wall clock\)$", header), header

    fake_engine.clear()
    assert validate.main(args) == 0  # same commit, same options: nothing runs
    assert fake_engine == []
    assert "already measured at abc123" in capsys.readouterr().err
    assert validate.main(args + ["--rounds", "3"]) == 0  # one more round continues the entry
    assert fake_engine == ["off", "default", "norm", "off"]
    assert len(json.loads(Path(out).read_text())["models"]) == 1

    fake_engine.clear()
    assert validate.main(args[:-2] + ["--prompt-tokens", "64", "--work", str(tmp_path / "w")]) == 0  # other options
    assert len(fake_engine) == 8
    newer, older = json.loads(Path(out).read_text())["models"]  # the same model measured twice: newest first
    assert (newer["options"]["prompt_tokens"], older["options"]["prompt_tokens"]) == (64, 256)
    assert newer["measured_at"] >= older["measured_at"]
    fake_engine.clear()
    monkeypatch.setenv("INFERA_COMMIT", "abc123+dirty")  # uncommitted changes: the commit names no code
    assert validate.main(args) == 0 and len(fake_engine) == 8


def test_identity_is_the_installed_wheels_never_the_working_directorys_checkout(tmp_path, monkeypatch):
    """The commit comes from the wheels (BUILD_COMMIT, written when they were built), not from git in the
    directory validate happens to run in."""
    monkeypatch.delenv("INFERA_COMMIT", raising=False)
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    git = ["git", "-C", str(stranger), "-c", "user.name=x", "-c", "user.email=x@x"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    monkeypatch.chdir(stranger)
    ident = validate.identity()
    assert ident["commit"] != head
    built = ident["built_from"]
    assert set(built) == {n for n in ident["versions"] if n.startswith("infera-")} and "infera-vllm" in built
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?|unknown", built["infera-vllm"] or ""), built  # written at build
    if len(set(built.values())) == 1 and "unknown" not in built.values():
        assert ident["commit"] == built["infera-vllm"]
    else:  # wheels of several builds: the measurement names no one commit
        assert ident["commit"] is None


def test_a_budget_stops_between_runs_and_the_next_call_continues(fake_engine, tmp_path, monkeypatch):
    monkeypatch.setenv("INFERA_COMMIT", "abc123")
    clock = itertools.count(0, 100)  # every perf_counter call advances 100 s
    monkeypatch.setattr(validate.time, "perf_counter", lambda: next(clock))
    out = str(tmp_path / "v.json")
    args = [_model_dir(tmp_path), "--rounds", "1", "--out", out, "--budget-s", "250", "--json"]
    assert validate.main(args) == 0
    assert fake_engine == ["off", "default"]
    (entry,) = json.loads(Path(out).read_text())["models"]
    assert not entry["runs"]["off2"]["rounds"]  # the round's closing off2 not run: no spread, speed not judged
    assert "plugin off ran once" in next(r["note"] for r in validate.judge(entry)["rows"] if r["run"] == "default")
    monkeypatch.setattr(validate.time, "perf_counter", lambda: 0.0)
    assert validate.main(args) == 0
    assert fake_engine == ["off", "default", "norm", "off"]


STEPPING_RUN = """
import json, os, sys, time
cfg = json.load(open(sys.argv[1]))
assert sys.stdin.readline().strip() == "go"
for text in ("engine start", "agreement", "batch 1 (1 of 1)"):
    open(cfg["step_file"] + ".tmp", "w").write(text)
    os.replace(cfg["step_file"] + ".tmp", cfg["step_file"])
    time.sleep(0.4)
json.dump({"batches": {}}, open(sys.argv[2], "w"))
"""


def test_a_run_says_its_steps_to_the_progress_bar(tmp_path, monkeypatch):
    """run-one writes the step it is in; the parent's wait hands each new one to the bar as it comes."""
    script = tmp_path / "run.py"
    script.write_text(STEPPING_RUN)
    monkeypatch.setattr(validate, "RUN_ONE", [sys.executable, str(script)])
    run = validate._start({"model": "m"}, dict(os.environ), str(tmp_path / "w"))
    run.go()
    steps = []
    assert "batches" in run.wait(on_step=steps.append)
    assert steps == ["engine start", "agreement", "batch 1 (1 of 1)"]


@pytest.mark.parametrize("failing", ["off", "norm"])
def test_a_failure_that_would_repeat_stops_the_models_runs(fake_engine, monkeypatch, tmp_path, capsys, failing):
    """The plugin-off run failing (no baseline), or two runs failing alike (the error without its log's path):
    the model's other runs are skipped with one line, not started to fail the same way."""
    spawn = validate._spawn

    def failing_spawn(cfg, env, work):
        result = spawn(cfg, env, work)
        if fake_engine[-1] in (failing, "default"):
            return {"error": f"exit 1: Couldn't instantiate the backend tokenizer (log {work}/log.txt)", "seconds": 1}
        return result

    monkeypatch.setattr(validate, "_spawn", failing_spawn)
    assert validate.main([_model_dir(tmp_path), "--rounds", "2", "--out", str(tmp_path / "v.json")]) == 1
    # off fails: nothing after it; norm fails after default did alike: the rest skipped
    assert fake_engine == (["off"] if failing == "off" else ["off", "default", "norm"])
    err = capsys.readouterr().err
    assert err.count("skipped, as they would fail the same way") == 1, err


@pytest.mark.cpu_build  # the CPU build, where every op declines without Triton's interpreter
def test_on_the_cpu_without_the_interpreter_it_says_so_and_runs_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(validate, "_start", lambda *a: pytest.fail("an engine was started"))
    assert validate.main([_model_dir(tmp_path)]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "--batches 1, --prompt-tokens 8" in err  # the CPU profile, said first
    assert "plan for tiny on cpu" in err and "no op would take a call" in err and "triton-interpreter-off" in err
    assert "Nothing to judge" in err and "TRITON_INTERPRET=1" in err


def test_dummy_weights_where_throughput_is_not_judged_run_nothing(fake_engine, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(validate, "plan", lambda model, requested: ({"norm": 7}, {}, {"gpu_family": "cpu"}))
    model = _model_dir(tmp_path)
    assert validate.main([model, "--dummy"]) == 1 and fake_engine == []
    err = " ".join(capsys.readouterr().err.split())
    assert "norm (7 layers) would take a call" in err and "dummy weights give no agreement to judge" in err
    assert validate.main([model]) == 0
    err = " ".join(capsys.readouterr().err.split())  # real weights: agreement judged, throughput only measured
    assert "Judged here: agreement; throughput is measured but not judged" in err and fake_engine


def test_bad_input_exits_2_with_a_message(tmp_path, capsys):
    assert cli.main(["validate", str(tmp_path / "missing")]) == 2
    assert "no such model directory" in capsys.readouterr().err
    assert cli.main(["validate", "--batches", "1,x", _model_dir(tmp_path)]) == 2
    assert "--batches '1,x': expected comma-separated batch sizes" in capsys.readouterr().err
    assert cli.main(["validate"]) == 2
    assert "no model: give model directories, --preset NAME (presets: " in capsys.readouterr().err
    bad = tmp_path / "matrix.json"
    bad.write_text(json.dumps({"format": "infera-vllm-validate-matrix/1", "options": {"batch": [1]}, "models": []}))
    assert cli.main(["validate", "--matrix", str(bad)]) == 2
    assert "unknown options batch" in capsys.readouterr().err
    assert cli.main(["validate", "--repeats", "3", "--max-repeats", "2", str(tmp_path / "tiny")]) == 2
    assert "--max-repeats 2 is below --repeats 3" in capsys.readouterr().err


def test_validate_is_an_infera_vllm_subcommand():
    out = subprocess.run([sys.executable, "-m", "infera_vllm", "--help"], capture_output=True, text=True, check=True)
    assert "validate" in out.stdout
    out = subprocess.run([sys.executable, "-m", "infera_vllm", "validate", "--help"], capture_output=True, text=True,
                         check=True)
    assert "--batches" in out.stdout and "--tp" in out.stdout and "--matrix" in out.stdout


@pytest.mark.parametrize("command", [[], ["validate"], ["doctor"], ["report"], ["tune"]])
def test_help_is_plain_text(command):
    """No reStructuredText markup from the docstrings the help is made of."""
    out = subprocess.run([sys.executable, "-m", "infera_vllm", *command, "--help"], capture_output=True, text=True,
                         check=True)
    assert "usage: infera-vllm" in out.stdout and "``" not in out.stdout, out.stdout


# ---- the matrix and docs/results.md ------------------------------------------------------------------------

def _load(path: Path, name: str):
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(path.parent))


def test_matrix_names_its_models():
    matrix = json.loads((ROOT / "benchmarks" / "validation" / "matrix.json").read_text())
    assert matrix["format"] == validate.MATRIX_FORMAT and set(matrix["options"]) <= set(validate.DEFAULTS)
    models = {m["name"]: m for m in matrix["models"]}
    assert list(models) == ["smollm2-135m", "llama-3-8b", "qwen3-8b", "qwen3-30b-a3b", "gpt-oss-20b", "gemma-2-9b"]
    assert models["smollm2-135m"]["source"] == "smollm2"
    gemma = models["gemma-2-9b"]["config"]
    assert gemma["head_dim"] == 256 and gemma["attn_logit_softcapping"] == 50.0
    for name, m in models.items():
        if "config" in m:
            assert model_sites.unknown_architecture(m["config"]) is None, name
            assert model_sites.sites(m["config"]), name


def test_results_md_section_is_what_render_results_makes():
    script = _load(ROOT / "benchmarks" / "validation" / "render_results.py", "render_results")
    text = (ROOT / "docs" / "results.md").read_text()
    assert script.current(text) == script.section(), "run python benchmarks/validation/render_results.py --write"


# ---- a real run: vLLM's CPU engine, Triton's interpreter ------------------------------------------------------

def _tiny_llama(path: Path) -> str:
    """A 2-layer Llama with random weights (normal, std 0.2: not near-tied everywhere) and SmolLM2's tokenizer,
    so the teacher-forced agreement runs on the same real text as for a trained model."""
    import torch
    from safetensors.torch import save_file

    from infera_vllm import smollm2

    tok_dir = smollm2.prepare()
    path.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, name), path / name)
    hidden, inter, layers, heads, kv, head_dim, vocab = 256, 256, 2, 4, 2, 64, 49152
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
           "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": kv, "head_dim": head_dim, "vocab_size": vocab, "max_position_embeddings": 1024,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": True,
           "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}
    (path / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
                       p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
                       p + "self_attn.k_proj.weight": (kv * head_dim, hidden),
                       p + "self_attn.v_proj.weight": (kv * head_dim, hidden),
                       p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
                       p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
                       p + "mlp.down_proj.weight": (hidden, inter)})
    tensors = {name: (torch.randn(shape, generator=g) * 0.2 + (1.0 if name.endswith("norm.weight") else 0.0))
               .to(torch.bfloat16) for name, shape in shapes.items()}
    save_file(tensors, str(path / "model.safetensors"))
    return str(path)


@pytest.mark.e2e
@pytest.mark.cpu_build
@pytest.mark.interpret
def test_real_run_on_the_cpu_engine(tmp_path):
    model = _tiny_llama(tmp_path / "tiny-llama")
    out = tmp_path / "validation.json"
    # the engine in the front end's process (VLLM_ENABLE_V1_MULTIPROCESSING=0, executor "uni"): one process
    # start per run instead of three, so the four runs fit CI's minutes
    env = {**os.environ, "TRITON_INTERPRET": "1", "INFERA_COMMIT": "test-commit", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    args = [sys.executable, "-m", "infera_vllm", "validate", model, "--ops", "norm", "--rounds", "1",
            "--batches", "1,4", "--prompt-tokens", "32", "--decode-tokens", "8", "--repeats", "1",
            "--agreement-prompts", "2", "--agreement-tokens", "256", "--out", str(out), "--work", str(tmp_path / "w"),
            "--llm-kwargs", json.dumps({"distributed_executor_backend": "uni", "max_model_len": 512})]
    start = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    print(proc.stdout, f"({time.perf_counter() - start:.0f} s)")
    (entry,) = json.loads(out.read_text())["models"]
    assert entry["environment"]["gpu_family"] == "cpu" and entry["throughput_meaningful"] is False
    assert list(entry["runs"]) == ["off", "default", "norm", "off2"]
    assert "--ops" in entry["skipped"]["attn-paged"] and entry["ops_run"] == {"norm": 5}  # 2 x 2 + the final norm
    assert entry["runs"]["off2"]["agreement"] == {"positions": 510, "agreement": 1.0, "disagreements": []}
    # greedy continuations (the decode path): 64 tokens after each prompt's first 192, off2's all off's
    assert entry["runs"]["off2"]["greedy_agreement"] == {"tokens": 128, "matched": [64, 64], "share": 1.0}
    assert 0 <= entry["runs"]["norm"]["greedy_agreement"]["share"] <= 1 and "greedy decode vs off" in proc.stdout
    for label, run in entry["runs"].items():
        (r,) = run["rounds"]
        assert "error" not in r, r
        assert set(r["batches"]) == {"1", "4"} and r["batches"]["4"]["prefill"] > 0
        for b in r["batches"].values():  # timed by the engine core's own timestamps, which vLLM's CPU build fills
            assert b["timing"] == "engine" and b["decode"] > 0 and b["decode_wall"] > 0
            assert 0 < min(b["prefill_engine_s_all"]) < min(b["prefill_s_all"])
            assert set(b["prefill_steps_all"]) == {1}  # the engine in this process: every request added first
            assert r["measured_at"] < b["timed_at"][0] < b["timed_at"][1]  # the timed repeats' window
        assert r["whole_batches"] is True  # the engine core's scheduler paused while each batch is added
        if label.startswith("off"):
            assert run["coverage"] is None  # the plugin off writes no report
    assert not any("measured_by" in run for run in entry["runs"].values())  # norm took no call in the default set
    rounds = [entry["runs"][label]["rounds"][0] for label in ("off", "default", "norm", "off2")]
    assert [r["imported_ahead"] for r in rounds] == [False, True, True, True]  # each next run imported meanwhile
    for this, after in zip(rounds, rounds[1:]):
        assert this["measured_at"] >= after["imported_at"]  # and not while this run was timed
    for r in entry["runs"]["off"]["rounds"]:
        assert r["cpus"] == sorted(os.sched_getaffinity(0))  # the CPUs the run's process could use
        assert r["import_s"] > 0 and r["startup_s"] > 0 and r["measure_s"] > 0 and r["exit_s"] >= 0
    assert sorted(os.listdir(tmp_path / "validation-logs")) == [f"tiny-llama-{x}-r0.log" for x in
                                                                 ("default", "norm", "off", "off2")]
    # every kernel compile after the warm-up logged, not only each kernel's first (jit_in_timing reads them)
    assert "jit_monitor_verbose=True" in (tmp_path / "validation-logs" / "tiny-llama-off-r0.log").read_text()
    norm = entry["runs"]["norm"]["coverage"]["norm"]
    assert norm["active"] and sum(norm["counts"]["call"].values()) > 0
    assert norm["share"]["call"].get("kernel", 0) > 0.5, norm  # eager calls served under the interpreter
    check = norm["self_check"]  # the check is on by default (first): every bucket checked once, none failed
    assert check["checked"] >= check["buckets"] > 0 and check["passed"] == check["checked"], check
    assert "self-check" in proc.stdout and "passed in" in proc.stdout
    assert 0.5 < entry["runs"]["norm"]["agreement"]["agreement"] <= 1.0
    rows = {r["run"]: r["verdict"] for r in validate.judge(entry)["rows"]}
    assert set(rows) == {"default", "norm"} and set(rows.values()) <= {"agrees", "disagrees"}
    assert "norm: kernel" in proc.stdout and "throughput here is not meaningful" in proc.stdout

    logs, before = tmp_path / "validation-logs", out.read_text()
    seen = sorted(p.name for p in logs.iterdir())
    again = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 0 and "already measured at test-commit" in again.stderr
    assert sorted(p.name for p in logs.iterdir()) == seen and out.read_text() == before  # no run started


def test_whole_batches_pause_the_scheduler_around_the_adds_or_stand_aside():
    """The order on the engine core: pause (keep), the requests added, resume, then the outputs collected;
    a vLLM whose LLM or engine core lacks a piece gets plain generate (the LLM itself)."""
    calls = []

    class Client:
        def call_utility(self, method, *args):
            calls.append((method, *args))

    class Llm:
        llm_engine = types.SimpleNamespace(engine_core=Client())

        def enqueue(self, prompts, params, use_tqdm=True):
            calls.append(("enqueue", len(prompts), params, use_tqdm))

        def wait_for_completion(self, use_tqdm=True):
            calls.append(("wait", use_tqdm))
            return ["out"]

    llm = Llm()
    batches = validate.WholeBatches.of(llm)
    assert batches is not llm and calls == [("pause_scheduler", "keep", False), ("resume_scheduler",)]  # probe
    calls.clear()
    assert batches.generate([1, 2, 3], "params") == ["out"]
    assert calls == [("pause_scheduler", "keep", False), ("enqueue", 3, "params", False), ("resume_scheduler",),
                     ("wait", False)]

    class Refusing(Client):
        def call_utility(self, method, *args):
            raise RuntimeError(f"unknown utility {method}")

    refusing = Llm()
    refusing.llm_engine = types.SimpleNamespace(engine_core=Refusing())
    assert validate.WholeBatches.of(refusing) is refusing
    plain = types.SimpleNamespace(generate=lambda *a, **k: None, llm_engine=types.SimpleNamespace(engine_core=Client()))
    assert validate.WholeBatches.of(plain) is plain


_WHOLE_BATCH_SCRIPT = """
import json, random, sys
from vllm import LLM, SamplingParams
from infera_vllm import validate

if __name__ == "__main__":
    llm = LLM(model=sys.argv[1], max_model_len=256, max_num_seqs=16, enforce_eager=True, disable_log_stats=False,
              dtype="bfloat16", gpu_memory_utilization=0.2)
    batches = validate.WholeBatches.of(llm)
    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(1, 1000) for _ in range(64)]} for _ in range(16)]
    runs = []
    for max_tokens in (1, 1, 1, 5):
        outs = batches.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                                                        detokenize=False))
        runs.append({"steps": validate.engine_seconds(outs)[2], "tokens": sorted({len(o.outputs[0].token_ids)
                                                                                  for o in outs}), "n": len(outs)})
    print("RESULT", json.dumps({"whole": batches is not llm, "runs": runs}))
"""


@pytest.mark.e2e
@pytest.mark.cpu_build
def test_a_batchs_requests_reach_vllms_engine_process_together(tmp_path):
    """With the engine core in its own process (as validate runs it), LLM.generate sends a batch's requests
    one by one and the engine may schedule the first before the rest arrive; WholeBatches pauses the engine
    core's scheduler while they are added, so every prefill of the batch starts in one step."""
    model = _tiny_llama(tmp_path / "tiny-llama")
    script = tmp_path / "whole.py"
    script.write_text(_WHOLE_BATCH_SCRIPT)
    env = {**os.environ, "INFERA_VLLM_OPS_DISABLE": "1"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    proc = subprocess.run([sys.executable, str(script), model], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    got = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
    assert got["whole"] is True
    assert got["runs"] == [{"steps": 1, "tokens": [1], "n": 16}] * 3 + [{"steps": 1, "tokens": [5], "n": 16}]


def test_startup_and_the_self_check_cost():
    """Each run's engine construction time against plugin-off's; with --self-check-cost every op that takes
    layers runs together with the check first and off, and their startup ratio is the check's cost."""
    def timed(startup):
        return {**_round(100.0), "startup_s": startup}

    runs = {"off": ([timed(40.0), timed(42.0)], {}), "off2": ([timed(41.0), timed(40.0)], _agree(1.0)),
            "every-op": ([timed(42.0), timed(42.4)], _agree(1.0)),
            "every-op-nocheck": ([timed(41.6), timed(41.4)], _agree(1.0))}
    j = validate.judge(_entry(runs))
    rows = {r["run"]: r for r in j["rows"]}
    assert j["startup_off_s"] == pytest.approx(40.5)
    assert rows["every-op"]["startup"] == pytest.approx(42.2 / 40.5)
    assert j["self_check_startup_cost"] == pytest.approx(42.2 / 41.5 - 1)
    assert rows["every-op-nocheck"]["note"] == ""  # a whole-set run, like default: no "served no call" note
    text = validate.render({"models": [{**_entry(runs), "runs": {k: {**v, "coverage": {}} for k, v in
                                                                  _entry(runs)["runs"].items()}}]})
    assert "self-check startup cost: +1.7% (every-op vs every-op-nocheck)" in text
    assert "startup (engine construction) x off (40.5 s): every-op 1.042" in text
    configs = validate.run_configs(["norm", "attn-paged"], gpu=True, real=False, base_llm={}, self_check_cost=True)
    assert [c["label"] for c in configs] == ["off", "every-op", "every-op-nocheck", "default", "norm", "attn-paged",
                                             "off2"]
    every = {c["label"]: c["env"] for c in configs}
    assert every["every-op"] == {"INFERA_VLLM_OPS": "norm,attn-paged", "INFERA_ATTN_PAGED_DEFAULT": "1",
                                 "INFERA_VLLM_SELF_CHECK": "first"}
    assert every["every-op-nocheck"]["INFERA_VLLM_SELF_CHECK"] == "off"
    assert every["default"] == {}
    assert validate.judge(_entry(_runs()))["self_check_startup_cost"] is None


def test_off2_compiles_into_its_own_cache(tmp_path, monkeypatch):
    """Every plugin-on run compiles its own graph (the active ops are a vLLM compile factor), so off2 does too,
    in an empty VLLM_CACHE_ROOT inside its run's directory, whose modelinfos is vLLM's usual one (linked);
    off uses vLLM's usual cache."""
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-root"))
    configs = {c["label"]: c for c in validate.run_configs(["norm"], gpu=True, real=True, base_llm={})}
    assert configs["off2"].get("own_compile_cache") and not any(
        c.get("own_compile_cache") for label, c in configs.items() if label != "off2")
    entry = {"options": {"tp": 1, "cpus": None, "batches": [1], "prompt_tokens": 8, "decode_tokens": 4, "repeats": 1,
                         "max_repeats": None, "agreement_prompts": 1, "agreement_tokens": 16, "rounds": 2}}
    m = {"path": "model", "weights": "real"}
    _, env, _ = validate._run_config(m, entry, configs["off2"], 0, 100, str(tmp_path / "off2-r0"))
    assert env["VLLM_CACHE_ROOT"] == str(tmp_path / "off2-r0" / validate.OWN_COMPILE_CACHE)
    assert os.path.realpath(os.path.join(env["VLLM_CACHE_ROOT"], "modelinfos")) == str(
        tmp_path / "vllm-root" / "modelinfos")
    _, env, _ = validate._run_config(m, entry, configs["off"], 0, 100, str(tmp_path / "off-r0"))
    assert env.get("VLLM_CACHE_ROOT") == os.environ.get("VLLM_CACHE_ROOT")
    assert env.get("VLLM_DISABLE_COMPILE_CACHE") == os.environ.get("VLLM_DISABLE_COMPILE_CACHE")  # round 2 loads


def test_a_kernel_compile_in_a_runs_timed_repeats_is_kept_and_printed(fake_engine, tmp_path, monkeypatch, capsys):
    """The run's log (vLLM's, in its directory) is read after the run: a JIT monitor line inside a batch's
    timed window goes into that round's ``jit_in_timing`` and onto the table."""
    monkeypatch.setenv("INFERA_COMMIT", "abc123")
    spawn = validate._spawn

    def spawn_with_a_compile(cfg, env, work):
        res = spawn(cfg, env, work)
        if env.get("INFERA_VLLM_OPS") == "norm":
            now = time.time()
            res["measured_at"] = now
            res["batches"]["16"]["timed_at"] = [now - 2, now + 2]
            stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(now))
            Path(work, "log.txt").write_text(f"WARNING {stamp} [jit_monitor.py:135] Triton kernel JIT compilation "
                                             "during inference: fused_moe_kernel. This causes a latency spike\n")
        return res

    monkeypatch.setattr(validate, "_spawn", spawn_with_a_compile)
    out = tmp_path / "v.json"
    assert validate.main([_model_dir(tmp_path), "--out", str(out), "--work", str(tmp_path / "w"),
                          "--rounds", "1"]) == 0
    (entry,) = json.loads(out.read_text())["models"]
    assert entry["runs"]["norm"]["rounds"][0]["jit_in_timing"] == {"16": {"fused_moe_kernel": 1}}
    assert not any("jit_in_timing" in r for label, run in entry["runs"].items() if label != "norm"
                   for r in run["rounds"])
    assert ("kernel compiles during timed repeats (vLLM's JIT monitor; each stalls its repeat): "
            "norm r0 batch 16: fused_moe_kernel x1") in capsys.readouterr().out


def test_a_call_of_one_round_compiles_every_run_without_a_cache(fake_engine, tmp_path, monkeypatch):
    """With one round no run loads a graph another saved: vLLM's compile cache is off (no save), its cache root
    and Inductor's cache are the run's own, in its directory, removed when the run ends; the model's runs
    share one Triton cache (compiled kernels, the same binary for the same source)."""
    monkeypatch.setenv("INFERA_COMMIT", "abc123")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-root"))  # vLLM's usual cache
    seen = {}
    spawn = validate._spawn

    def spawn_and_compile(cfg, env, work):
        seen[os.path.basename(work)] = env
        if env["VLLM_CACHE_ROOT"] != os.environ["VLLM_CACHE_ROOT"]:
            os.makedirs(os.path.join(env["VLLM_CACHE_ROOT"], "torch_compile_cache"))  # what a compile leaves
            # vLLM's model-class facts (no compiled code) land in its usual cache, shared by every run
            Path(env["VLLM_CACHE_ROOT"], "modelinfos", f"{os.path.basename(work)}.json").write_text("{}")
        return spawn(cfg, env, work)

    monkeypatch.setattr(validate, "_spawn", spawn_and_compile)
    assert validate.main([_model_dir(tmp_path), "--out", str(tmp_path / "v.json"), "--work", str(tmp_path / "w"),
                          "--rounds", "1"]) == 0
    assert sorted(seen) == ["default-r0", "norm-r0", "off-r0", "off2-r0"]
    for name, env in seen.items():
        own = tmp_path / "w" / "tiny" / name / validate.OWN_COMPILE_CACHE
        assert env["VLLM_DISABLE_COMPILE_CACHE"] == "1"
        assert (env["VLLM_CACHE_ROOT"], env["TORCHINDUCTOR_CACHE_DIR"]) == (str(own), str(own / "inductor"))
        assert env["TRITON_CACHE_DIR"] == str(tmp_path / "w" / "tiny" / validate.SHARED_TRITON_CACHE)
        assert not own.exists()
    assert sorted(os.listdir(tmp_path / "vllm-root" / "modelinfos")) == [f"{n}.json" for n in sorted(seen)]
    seen.clear()  # with two rounds vLLM's cache is on (a later round loads its graph) and only off2 has its own
    (tmp_path / "x").mkdir()
    assert validate.main([_model_dir(tmp_path / "x"), "--out", str(tmp_path / "v2.json"), "--work",
                          str(tmp_path / "w2"), "--rounds", "2"]) == 0
    for name, env in seen.items():
        assert env.get("VLLM_DISABLE_COMPILE_CACHE") == os.environ.get("VLLM_DISABLE_COMPILE_CACHE")
        assert env.get("TRITON_CACHE_DIR") == os.environ.get("TRITON_CACHE_DIR")
        assert (env.get("VLLM_CACHE_ROOT") != os.environ.get("VLLM_CACHE_ROOT")) == name.startswith("off2")
    assert {"off2-r0.json", "off2-r1.json"} <= set(os.listdir(tmp_path / "vllm-root" / "modelinfos"))


# ---- presets, prompt lengths per batch size, the runs option, rows ---------------------------------------------

def test_presets_are_the_end_to_end_benchmarks():
    """Each preset is a matrix file of the plugin whose models are the matrix's configs (the context limit
    raised to the preset's longest prompt where needed; gpt-oss-20b with fewer experts in the attention
    preset) and whose options are validate's."""
    assert validate.presets() == ["attn-paged-fp8-h200", "attn-paged-h200", "linear-llama3-h200",
                                  "moe-decode-h200", "norm-qwen3-h200", "norm-smollm2-h200", "parallel-h200x2",
                                  "parallel-random-h200x2", "smollm2"]
    for name in validate.presets():
        preset = json.loads(Path(validate.preset_path(name)).read_text())
        assert preset["format"] == validate.MATRIX_FORMAT and set(preset["options"]) <= set(validate.DEFAULTS)
        opts = preset["options"]
        assert "runs" not in opts or (opts["runs"][:2] == ["off", "off2"] and [
            r for r in opts["runs"][2:] if r != "default"] == [
            o for o in opts.get("ops", []) if o in opts["runs"]] + list(opts.get("extra_runs", {})))
        if "config" not in preset["models"][0]:
            continue
        longest = max(validate.prompt_len(opts, b) for b in opts["batches"])
        for m in preset["models"]:
            assert m["config"]["max_position_embeddings"] >= longest + opts["decode_tokens"] + 1 + 16, (name, m)
        sizes = opts.get("llm_kwargs", {}).get("compilation_config", {}).get("cudagraph_capture_sizes")
        if sizes:  # graphs at the batch sizes only: no prefill may be short enough for one of vLLM's graphs
            assert sizes == sorted(opts["batches"]), name
            vllm_largest = min(2 * max(opts["batches"]), 512)  # VllmConfig._set_cudagraph_sizes' default
            for b in opts["batches"]:
                tokens = b * validate.prompt_len(opts, b)
                assert tokens > vllm_largest and tokens % 2048 == 0, (name, b, tokens)
    preset = json.loads(Path(validate.preset_path("attn-paged-h200")).read_text())
    assert [(b, validate.prompt_len(preset["options"], b)) for b in preset["options"]["batches"]] == [
        (1, 16384), (16, 8192), (64, 2048), (256, 512)]  # long prompts at small batches
    matrix = {m["name"]: m for m in json.loads((ROOT / "benchmarks" / "validation" / "matrix.json").read_text())[
        "models"]}
    shrink = {"gpt-oss-20b": {"num_local_experts": 8}}  # 8 of its 32 experts: attention is what is measured
    for m in preset["models"]:
        want = {**matrix[m["name"]]["config"], **shrink.get(m["name"], {})}
        assert {**m["config"], "max_position_embeddings": None} == {**want, "max_position_embeddings": None}
    for name in ("moe-decode-h200", "linear-llama3-h200", "parallel-h200x2", "parallel-random-h200x2"):
        for m in json.loads(Path(validate.preset_path(name)).read_text())["models"]:
            assert m["config"] == matrix[m["name"]]["config"], (name, m["name"])
    fp8 = json.loads(Path(validate.preset_path("attn-paged-fp8-h200")).read_text())
    assert fp8["options"] == {**preset["options"], "llm_kwargs": {**preset["options"]["llm_kwargs"],
                                                                   "kv_cache_dtype": "fp8"}}
    assert fp8["models"] == preset["models"][:2]  # the bf16 preset's dense models, on an fp8 cache
    attn_qwen3 = json.loads(Path(validate.preset_path("attn-paged-h200")).read_text())["models"][1]
    (norm_qwen3,) = json.loads(Path(validate.preset_path("norm-qwen3-h200")).read_text())["models"]
    assert {**norm_qwen3["config"], "max_position_embeddings": None} == {**attn_qwen3["config"],
                                                                          "max_position_embeddings": None}
    matrix = json.loads((ROOT / "benchmarks" / "validation" / "matrix.json").read_text())
    preset = json.loads(Path(validate.preset_path("smollm2")).read_text())  # the matrix's entry, in the wheel
    assert preset["models"] == [matrix["models"][0]] and preset["options"] == matrix["options"]


def test_a_preset_runs_its_configurations_with_a_prompt_length_per_batch(fake_engine, tmp_path, monkeypatch):
    monkeypatch.setenv("INFERA_COMMIT", "abc123")
    seen = []
    spawn = validate._spawn
    monkeypatch.setattr(validate, "_spawn", lambda cfg, env, work: (seen.append(cfg), spawn(cfg, env, work))[1])
    out = tmp_path / "v.json"
    assert validate.main(["--preset", "attn-paged-h200", "--models", "qwen3-8b", "--out", str(out),
                          "--work", str(tmp_path / "w"), "--runs", "off2,norm"]) == 0
    assert fake_engine == ["off", "norm", "off"]  # --runs replaces the preset's; off always runs
    assert seen[0]["prompt_tokens"] == {"1": 16384, "16": 8192, "64": 2048, "256": 512}
    (entry,) = json.loads(out.read_text())["models"]
    assert entry["options"]["llm_kwargs"]["max_model_len"] == 16384 + 128 + 1 + 16
    rows = [r for r in entry["rows"] if r["run"] == "norm"]
    assert [(r["batch"], r["prompt_tokens"]) for r in rows] == [(1, 16384), (16, 8192), (64, 2048), (256, 512)]
    assert all(r["decode_ratio"] == 1.0 and r["prefill_ratio"] == 1.0 and r["model"] == "qwen3-8b" for r in rows)


def test_gpu_runs_capture_the_graphs_a_default_vllm_replays_for_the_timed_steps():
    opts = {**validate.DEFAULTS, "batches": [1, 16, 64], "prompt_tokens": 256}
    sizes = validate.graph_sizes(validate.timed_steps(opts, real=False))
    # each batch's decode step, and the 256-token batch-1 prefill, which a default vLLM (largest graph 512)
    # replays; batch 16 x 256 = 4096 tokens and 64 x 256 run eagerly there too
    assert sizes == [1, 16, 64, 256]
    # with real weights, the greedy continuations' decode steps (a batch of the agreement prompts)
    real = {**opts, "agreement_prompts": 8, "agreement_tokens": 1500}
    assert validate.graph_sizes(validate.timed_steps(real, real=True)) == [1, 8, 16, 64, 256]
    short = {**real, "agreement_prompts": 3, "agreement_tokens": 100}  # 300- and 225-token prefills: graphs too
    assert validate.timed_steps(short, real=True)[-3:] == [3, 300, 225]
    assert validate.graph_sizes(validate.timed_steps(short, real=True)) == [1, 4, 16, 64, 232, 256, 304]
    # a step that is not on vLLM's list gets the graph vLLM pads it to; one over 512 tokens none
    assert validate.graph_sizes([3, 300, 600]) == [4, 304]
    assert validate.vllm_graph_sizes(512)[-3:] == [480, 496, 512] and len(validate.vllm_graph_sizes(512)) == 51
    gpu = validate.engine_kwargs(opts, {}, max_model_len=400, gpu=True)
    assert gpu["compilation_config"] == {"cudagraph_capture_sizes": sizes} and gpu["max_num_seqs"] == 64
    assert "enforce_eager" not in gpu
    cpu = validate.engine_kwargs(opts, {}, max_model_len=400, gpu=False)
    assert cpu["enforce_eager"] is True and "compilation_config" not in cpu
    small = {**opts, "batches": [1], "agreement_prompts": 2}  # the agreement's prompts run as one batch
    assert validate.engine_kwargs(small, {}, max_model_len=400, gpu=False)["max_num_seqs"] == 2
    # a preset's or a model's own vLLM arguments replace these, a compilation config whole
    own = {"compilation_config": {"cudagraph_capture_sizes": [1, 16]}}
    assert validate.engine_kwargs({**opts, "llm_kwargs": own}, {"max_num_seqs": 8}, max_model_len=400,
                                  gpu=True)["compilation_config"] == own["compilation_config"]
    assert validate.engine_kwargs(opts, {"max_num_seqs": 8}, max_model_len=400, gpu=True)["max_num_seqs"] == 8


def test_a_presets_own_run_is_its_op_with_more_switches(fake_engine, tmp_path, monkeypatch):
    """norm-qwen3-h200's norm-heads-kernel: norm alone with INFERA_NORM_PER_HEAD_KERNEL=1, judged and shown as
    norm's; a preset's run about an op that does not run on the model is listed as not run, with why."""
    monkeypatch.setenv("INFERA_COMMIT", "abc123")
    envs = []
    spawn = validate._spawn
    monkeypatch.setattr(validate, "_spawn", lambda cfg, env, work: (envs.append(dict(env)), spawn(cfg, env, work))[1])
    out = tmp_path / "v.json"
    assert validate.main(["--preset", "norm-qwen3-h200", "--out", str(out), "--work", str(tmp_path / "w")]) == 0
    assert fake_engine == ["off", "norm", "norm", "off"]
    assert envs[2]["INFERA_NORM_PER_HEAD_KERNEL"] == "1" and "INFERA_NORM_PER_HEAD_KERNEL" not in envs[1]
    (entry,) = json.loads(out.read_text())["models"]
    assert entry["runs"]["norm-heads-kernel"]["op"] == "norm"
    rows = {r["run"]: r for r in validate.judge(entry)["rows"]}
    assert rows["norm-heads-kernel"]["verdict"] == "neutral"
    configs = validate.run_configs(["attn-paged"], gpu=True, real=False, base_llm={"seed": 0},
                                   extra_runs={"norm-x": {"op": "norm", "env": {"A": "1"}},
                                               "attn-x": {"op": "attn-paged", "env": {"B": "2"}, "llm": {"x": 1}}})
    (attn_x,) = [c for c in configs if c["label"] == "attn-x"]
    assert attn_x == {"label": "attn-x", "plugin": True, "op": "attn-paged", "llm": {"seed": 0, "x": 1},
                      "env": {"INFERA_VLLM_OPS": "attn-paged", "INFERA_ATTN_PAGED_DEFAULT": "1", "B": "2"}}
    assert "norm-x" not in [c["label"] for c in configs]  # norm takes no layers here


@pytest.mark.parametrize("extra, message", [
    ({"off3": {"op": "norm"}}, "built-in run's label"),
    ({"off-triton": {"op": None}}, "built-in run's label"),
    ({"off-x": {"op": "norm"}}, "plugin-off run (op null) is labelled off-"),
    ({"x": {"op": None}}, "plugin-off run (op null) is labelled off-"),
    ({"norm": {"op": "norm"}}, "built-in run's label"),
    ({"x": {"env": {}}}, "'op' required"),
    ({"x": {"op": "norm", "when": 1}}, "'op' required"),
    ({"x": {"op": "norm", "env": {"INFERA_VLLM_OPS": "attn-paged"}}}, "without INFERA_VLLM_OPS"),
    ({"x": {"op": "norm", "env": {"A": 1}}}, "switch -> string"),
])
def test_a_presets_own_runs_are_checked(tmp_path, capsys, extra, message):
    matrix = tmp_path / "m.json"
    matrix.write_text(json.dumps({"format": validate.MATRIX_FORMAT, "options": {"extra_runs": extra},
                                  "models": [{"name": "m", "config": {"architectures": ["LlamaForCausalLM"]}}]}))
    assert cli.main(["validate", "--matrix", str(matrix)]) == 2
    assert message in capsys.readouterr().err


def test_prompt_lengths_and_presets_are_checked(tmp_path, capsys):
    assert cli.main(["validate", _model_dir(tmp_path), "--batches", "1,16", "--prompt-tokens", "1:64"]) == 2
    assert "no length for batch size 16" in capsys.readouterr().err
    assert cli.main(["validate", "--preset", "nope"]) == 2
    err = capsys.readouterr().err
    assert "no such preset" in err and "moe-decode-h200" in err  # the message lists the presets
    assert cli.main(["validate", "--preset", "moe-decode-h200", "--matrix", "m.json"]) == 2
    assert "give one" in capsys.readouterr().err
    assert validate.prompt_len({"prompt_tokens": 256}, 64) == 256
    assert validate.prompt_len({"prompt_tokens": {"1": 9, "4": 3}}, 4) == 3


def test_a_random_weight_model_gets_one_checkpoint_and_its_agreement_is_judged(fake_engine, tmp_path, monkeypatch):
    """``"weights": "random"``: the checkpoint is written once, before the model's first run, by
    ``python -m infera_vllm.validate write-random DIR``; every run loads it (not vLLM's dummy loader) and the
    agreement is taken; a write that fails stops with a message, any other weights value is bad input."""
    monkeypatch.setenv("INFERA_COMMIT", "abc123")
    writes, seen = [], []

    def fake_write(cmd, *a, **k):
        writes.append(cmd[-1])
        Path(cmd[-1], "model.safetensors").write_text("x")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(validate.subprocess, "run", fake_write)
    spawn = validate._spawn
    monkeypatch.setattr(validate, "_spawn", lambda cfg, env, work: (seen.append(cfg), spawn(cfg, env, work))[1])
    out = tmp_path / "v.json"
    assert validate.main(["--preset", "parallel-random-h200x2", "--out", str(out), "--work", str(tmp_path / "w"),
                          "--runs", "off2,norm"]) == 0
    assert writes == [str(tmp_path / "w" / "models" / "qwen3-8b")] and fake_engine == ["off", "norm", "off"]
    assert {c["weights"] for c in seen} == {"random"} and {c["tp"] for c in seen} == {2}
    (entry,) = json.loads(out.read_text())["models"]
    assert entry["weights"] == "random" and entry["runs"]["norm"]["agreement"]["agreement"] == 1.0
    assert entry["options"]["llm_kwargs"]["max_model_len"] == 256 + 16  # the agreement prompts' length

    monkeypatch.setattr(validate.subprocess, "run", lambda cmd, *a, **k: subprocess.CompletedProcess(cmd, 1))
    assert validate.main(["--preset", "parallel-random-h200x2", "--out", str(tmp_path / "v2.json"),
                          "--work", str(tmp_path / "w2")]) == 2
    matrix = tmp_path / "m.json"
    matrix.write_text(json.dumps({"format": validate.MATRIX_FORMAT, "models": [
        {"name": "m", "config": {"architectures": ["LlamaForCausalLM"]}, "weights": "zeros"}]}))
    assert cli.main(["validate", "--matrix", str(matrix)]) == 2


def test_the_parallel_preset_runs_the_moe_op_with_expert_parallel_where_it_serves(tmp_path):
    """parallel-h200x2: tensor parallel 2 for every run; the moe-decode-ep run is moe-decode alone with vLLM's
    expert parallel on, and is left out of a dense model's runs."""
    preset = json.loads(Path(validate.preset_path("parallel-h200x2")).read_text())
    assert preset["options"]["tp"] == 2
    extra = preset["options"]["extra_runs"]
    moe = validate.run_configs(["moe-decode"], gpu=True, real=False, base_llm={}, runs=preset["options"]["runs"],
                               extra_runs=extra)
    assert [c["label"] for c in moe] == ["off", "default", "moe-decode-ep", "off2"]
    assert moe[-2]["llm"] == {"enable_expert_parallel": True} and moe[-2]["env"] == {"INFERA_VLLM_OPS": "moe-decode"}
    dense = validate.run_configs([], gpu=True, real=False, base_llm={}, runs=preset["options"]["runs"],
                                 extra_runs=extra)
    assert [c["label"] for c in dense] == ["off", "default", "off2"]


def test_the_random_checkpoint_is_the_config_with_transformers_init(tmp_path):
    """write-random on a tiny Qwen3 config: a bf16 safetensors checkpoint of that config, the same bytes on a
    second write (seed 0), so every run and every call serves one model."""
    import torch
    from safetensors.torch import load_file

    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
           "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "vocab_size": 256, "max_position_embeddings": 128, "torch_dtype": "bfloat16"}
    tensors = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
        proc = subprocess.run([sys.executable, "-m", "infera_vllm.validate", "write-random", str(tmp_path / name)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        tensors.append(load_file(str(tmp_path / name / "model.safetensors")))
    a, b = tensors
    assert a["model.layers.1.self_attn.q_norm.weight"].shape == (16,)
    assert a["model.embed_tokens.weight"].shape == (256, 64) and a["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert a["model.embed_tokens.weight"].float().std() > 0.01  # random, not zeros
    assert set(a) == set(b) and all(a[k].equal(b[k]) for k in a)


def test_a_presets_plugin_off_run_is_a_reference_shown_not_judged(fake_engine, tmp_path, monkeypatch, capsys):
    """norm-smollm2-h200's off-vllm-c: plugin off with vLLM's vllm_c norm provider first (vLLM arguments of its
    own), its agreement with off and its ratios shown as a reference line, no verdict."""
    monkeypatch.setenv("INFERA_COMMIT", "abc123")
    seen = []
    spawn = validate._spawn
    monkeypatch.setattr(validate, "_spawn", lambda cfg, env, work: (seen.append((cfg, env)), spawn(cfg, env, work))[1])
    monkeypatch.setattr(validate, "_models", lambda args, opts, work: [
        {"name": "smollm2-135m", "path": _model_dir(tmp_path), "weights": "real", "llm_kwargs": {}}])
    out = tmp_path / "v.json"
    assert validate.main(["--preset", "norm-smollm2-h200", "--out", str(out), "--work", str(tmp_path / "w")]) == 0
    assert fake_engine == ["off", "norm", "off", "off"]
    cfg, env = seen[2]
    assert cfg["llm_kwargs"]["ir_op_priority"] == {"rms_norm": ["vllm_c"], "fused_add_rms_norm": ["vllm_c"]}
    assert env["INFERA_VLLM_OPS_DISABLE"] == "1"
    (entry,) = json.loads(out.read_text())["models"]
    j = validate.judge(entry)
    assert [r["run"] for r in j["rows"]] == ["norm"]
    (ref,) = j["references"]
    assert ref["run"] == "off-vllm-c" and ref["agreement"] == 1.0 and ref["ratios"]["decode"]["1"] == 1.0
    assert "off-vllm-c" in capsys.readouterr().out.split("reference")[0].splitlines()[-1]


def test_the_defaults_table_says_what_the_specs_ship():
    """docs/validate.md's table of each op's defaults names every installed op once, calls an op opt-in
    exactly when its spec is not on by default, and names each default switch it cites with the spec's
    default (attn-paged's automatic-choice switch off but on for the families its policy lists, which the
    row names; norm's per-head kernel off)."""
    from infera_vllm import discovery

    text = (ROOT / "docs" / "validate.md").read_text().split("## Each op's defaults")[1].split("\n## ")[0]
    rows = [line.split(" | ")[0].strip("| ") for line in text.splitlines() if line.startswith("| ")][1:]
    specs = {f.spec.name: f.spec for f in discovery.discover() if f.spec is not None}
    ops = [r for r in rows if not r.endswith("q/k norms")]  # norm's second row: its per-head setting
    assert sorted(ops) == sorted(specs)
    for name, spec in specs.items():
        (line,) = [line for line in text.splitlines() if line.startswith(f"| {name} | ")]
        assert ("opt-in" in line.split(" | ")[1]) == (not spec.default_on), name
    switches = {s.name: s for spec in specs.values() for s in spec.switches}
    from infera_ops.attn_paged import policy

    (attn,) = [line.split(" | ") for line in text.splitlines() if line.startswith("| attn-paged | ")]
    assert "`policy.AUTOMATIC_BY_DEFAULT`" in attn[1] and "`INFERA_ATTN_PAGED_DEFAULT=0`" in attn[1]
    assert switches["INFERA_ATTN_PAGED_DEFAULT"].default is False
    assert policy.AUTOMATIC_BY_DEFAULT and all(f in attn[2] for f in policy.AUTOMATIC_BY_DEFAULT), attn[2]
    assert "INFERA_NORM_PER_HEAD_KERNEL=1" in text and switches["INFERA_NORM_PER_HEAD_KERNEL"].default is False
