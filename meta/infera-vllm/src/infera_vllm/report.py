"""Merge the per-process coverage reports of one run into one table (``infera-vllm report DIR``)."""

from __future__ import annotations

import glob
import json
import os

from infera_vllm.coverage import REPORT_FORMAT


def _problem(data: object) -> str | None:
    """Why a parsed file is not a report this version can merge, or None."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not a report object"
    if data.get("format") != REPORT_FORMAT:
        return f"format {data.get('format')!r}, expected {REPORT_FORMAT!r}"
    process = data.get("process")
    if not isinstance(process, dict) or not all(k in process for k in ("pid", "name", "host")):
        return "no 'process' with pid, name and host"
    for key, fields in (("ops", ("op", "status", "reason", "detail")),
                        ("counts", ("op", "route", "reason", "bucket", "at", "count"))):
        rows = data.get(key)
        if not isinstance(rows, list) or not all(isinstance(r, dict) and all(f in r for f in fields) for r in rows):
            return f"'{key}' is not a list of entries with {', '.join(fields)}"
    checks = data.get("self_check", [])  # absent in reports of processes without the self-check
    fields = ("op", "bucket", "checked", "passed", "failed", "max_error")
    if not isinstance(checks, list) or not all(isinstance(r, dict) and all(f in r for f in fields) for r in checks):
        return f"'self_check' is not a list of entries with {', '.join(fields)}"
    return None


def load(directory: str, problems: list[tuple[str, str]] | None = None) -> list[dict]:
    """The reports in ``directory``. A file that is not a mergeable report raises ValueError naming it, or,
    with ``problems`` given, is skipped and recorded there as (path, why); ValueError too when no file is
    left to merge."""
    if os.path.isfile(directory):
        raise FileNotFoundError(f"{directory!r} is a file: give the directory that holds the infera-*.json "
                                f"reports ({os.path.dirname(directory) or '.'!r})")
    paths = sorted(glob.glob(os.path.join(directory, "infera-*.json")))
    if not paths:
        raise FileNotFoundError(f"no infera-*.json reports in {directory!r}")
    reports, bad = [], []
    for path in paths:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as exc:
            bad.append((path, f"not readable as JSON ({exc})"))
            continue
        why = _problem(data)
        if why is not None:
            bad.append((path, why))
            continue
        data["path"] = path
        reports.append(data)
    if bad and (problems is None or not reports):
        raise ValueError("; ".join(f"{path}: {why}" for path, why in bad))
    if problems is not None:
        problems.extend(bad)
    return reports


def merge(reports: list[dict]) -> dict:
    """One document: the processes, each op's verdicts across them, and the summed counts."""
    processes = [
        {"pid": r["process"]["pid"], "name": r["process"]["name"], "host": r["process"]["host"],
         "run": r["process"].get("run"),
         "gpu_family": r.get("environment", {}).get("gpu_family"), "vllm": r.get("environment", {}).get("vllm"),
         "active": sorted(o["op"] for o in r["ops"] if o["status"] == "active")}
        for r in reports
    ]
    verdicts: dict[tuple[str, str, str, str], int] = {}
    for r in reports:
        for o in r["ops"]:
            key = (o["op"], o["status"], o["reason"], o["detail"])
            verdicts[key] = verdicts.get(key, 0) + 1
    counts: dict[tuple[str, str, str, str, str], list[int]] = {}
    for r in reports:
        for c in r["counts"]:
            key = (c["op"], c["route"], c["reason"], c["bucket"], c["at"])
            total = counts.setdefault(key, [0, 0])
            total[0] += c["count"]
            total[1] += 1
    checks: dict[tuple[str, str], dict] = {}
    for r in reports:
        for c in r.get("self_check", []):
            total = checks.setdefault((c["op"], c["bucket"]), {"checked": 0, "passed": 0, "failed": 0,
                                                               "max_error": 0.0, "unchecked_at_capture": 0,
                                                               "seconds": 0.0, "processes": 0})
            for k in ("checked", "passed", "failed", "unchecked_at_capture", "seconds"):
                total[k] += c.get(k, 0)
            total["max_error"] = max(total["max_error"], c["max_error"])
            total["processes"] += 1
    runs: dict[tuple, int] = {}
    for p in processes:
        runs[(p["run"], p["host"])] = runs.get((p["run"], p["host"]), 0) + 1
    return {
        "format": "infera-vllm-merged/1",
        "processes": processes,
        "runs": [{"run": run, "host": host, "processes": n} for (run, host), n in sorted(runs.items(), key=str)],
        "ops": [{"op": op, "status": s, "reason": reason, "detail": detail, "processes": n}
                for (op, s, reason, detail), n in sorted(verdicts.items())],
        "counts": [{"op": op, "route": route, "reason": reason, "bucket": bucket, "at": at,
                    "count": total, "processes": n}
                   for (op, route, reason, bucket, at), (total, n) in sorted(counts.items())],
        "self_check": [{"op": op, "bucket": bucket, **total} for (op, bucket), total in sorted(checks.items())],
    }


def _table(header: list[str], rows: list[list[object]]) -> list[str]:
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]


def render(merged: dict) -> str:
    n = len(merged["processes"])
    out = [f"infera-vllm coverage: {n} process(es)"]
    runs = merged.get("runs", [])
    if len(runs) > 1:  # several servers (or hosts) wrote into this directory: summed below, said here
        out.append(f"WARNING: these reports come from {len(runs)} runs ("
                   + ", ".join(f"run {r['run'] or 'unknown'} on {r['host']}: {r['processes']} process(es)"
                               for r in runs)
                   + "); every count below is summed over them: give each run its own INFERA_VLLM_REPORT_DIR")
    out += _table(["pid", "process", "host", "run", "gpu", "vllm", "active ops"],
                  [[p["pid"], p["name"], p["host"], p.get("run") or "-", p["gpu_family"], p["vllm"],
                    ",".join(p["active"]) or "-"] for p in merged["processes"]])
    out += ["", "operators:"]
    out += _table(["op", "status", "reason", "processes", "detail"],
                  [[o["op"], o["status"], o["reason"] or "-", f"{o['processes']}/{n}", o["detail"]]
                   for o in merged["ops"]])
    out += ["", "routed calls:"]
    if merged["counts"]:
        out += _table(["op", "route", "reason", "shape", "counted at", "count", "processes"],
                      [[c["op"], c["route"], c["reason"] or "-", c["bucket"] or "-", c["at"], c["count"],
                        c["processes"]] for c in merged["counts"]])
        if any(c["at"] != "call" for c in merged["counts"]):
            out.append("(counted at trace/plan: decided that many times while compiling or capturing graphs; "
                       "replays are not counted)")
    active = sorted({op for p in merged["processes"] for op in p["active"]})
    idle = [op for op in active if not any(c["op"] == op for c in merged["counts"])]
    if not merged["counts"]:
        out.append("  none: " + ("no op is active, and declined ops route nothing: vLLM's own kernels served "
                                 "everything" if not active else "no op counted a call"))
    for op in idle:  # active, yet no call reached it: its layers ran elsewhere or never ran
        out.append(f"  {op}: active, no call counted (the model's layers of its kind never reached it)")
    if merged.get("self_check"):
        out += ["", "self-check (kernel vs vLLM's implementation on the same inputs, max |diff| / max |vLLM's|):"]
        out += _table(["op", "shape", "checked", "passed", "failed", "max error", "captured unchecked", "seconds",
                       "processes"],
                      [[c["op"], c["bucket"], c["checked"], c["passed"], c["failed"], f"{c['max_error']:.2e}",
                        c["unchecked_at_capture"], f"{c.get('seconds', 0.0):.3f}", c["processes"]]
                       for c in merged["self_check"]])
    return "\n".join(out)
