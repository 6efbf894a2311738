"""``infera-vllm doctor``: what the plugin would do in this environment, before serving."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from infera_vllm import activation, compat, discovery
from infera_vllm.spec import OpSpec
from infera_vllm.switches import SwitchError, Switches, allowed_values, default_text, parse
from infera_vllm.version import __version__


def _driver() -> dict[str, str | None]:
    info: dict[str, str | None] = {"cuda_runtime": None, "hip": None, "driver": None}
    try:
        import torch

        info["cuda_runtime"] = torch.version.cuda
        info["hip"] = getattr(torch.version, "hip", None)
    except Exception:
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            info["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
        except Exception:
            pass
    return info


def plan_model(verdicts: list[activation.Verdict], specs: dict, model: str) -> list[dict]:
    from infera_vllm.model_sites import load_config, sites

    all_sites = sites(load_config(model))
    rows = []
    for v in verdicts:
        spec = specs.get(v.name)
        if spec is None or not spec.sites:
            continue
        mine = [s for s in all_sites if s.kind in spec.sites]
        plan = activation.load_callable(spec.plan) if (spec.plan and v.active) else None
        take: list[str] = []
        declined: dict[str, list[str]] = {}
        for site in mine:
            decline = v.decline if not v.active else (plan(site) if plan else None)
            if decline is None:
                take.append(site.name)
            else:
                declined.setdefault(str(decline), []).append(site.name)
        rows.append({"op": v.name, "kinds": list(spec.sites), "sites": len(mine), "take": take, "decline": declined})
    return rows


def switch_rows(spec: OpSpec | None) -> list[dict]:
    """The op's declared switches with their current value (None: unset), default, what they accept, and the
    problem serving would decline the op ``bad-switch`` for (empty when the value is good)."""
    rows = []
    for switch in spec.switches if spec is not None else ():
        raw = os.environ.get(switch.name)
        try:
            parse(switch, raw)
            problem = ""
        except SwitchError as exc:
            problem = str(exc)
        rows.append({"switch": switch.name, "kind": switch.kind, "value": raw, "default": default_text(switch),
                     "allowed": allowed_values(switch), "problem": problem, "doc": switch.doc})
    return rows


def collect(model: str | None = None, switches: Switches | None = None) -> tuple[dict, int]:
    """doctor's document and exit code; ``switches``: the plugin's switches to judge under (default: this
    process's environment's)."""
    switches = Switches.from_env() if switches is None else switches
    env = compat.Environment.detect()
    found = discovery.discover()
    verdicts = [activation.evaluate_isolated(f, env, switches, install=False) for f in found]
    names = {v.name for v in verdicts}
    verdicts += activation.not_installed(switches, names)
    report_problem = activation.report_dir_problem(switches.report_dir) if switches.report_dir else None
    specs = {f.spec.name: f.spec for f in found if f.spec is not None}
    ops = [{"op": v.name, "distribution": v.distribution, "version": v.version, "seam": v.seam,
            "verdict": "would activate" if v.active else "declined",
            "reason": "" if v.active else str(v.decline.code),
            "detail": "" if v.active else v.decline.detail,
            "switches": switch_rows(specs.get(v.name))} for v in verdicts]
    # the exit code answers "will what I asked for run?", one reason per problem found (the last line says them)
    problems, flagged = [], set()
    for v in verdicts:
        if v.decline is None or str(v.decline.code) in activation.CHOSEN:
            continue
        if switches.requested_explicitly(v.name):
            problems.append(f"{v.name}, named in INFERA_VLLM_OPS, cannot activate ({v.decline})")
        elif switches.strict:
            problems.append(f"{v.name} would decline ({v.decline.code}) and INFERA_VLLM_STRICT=1 makes that an error")
        else:
            continue
        flagged.add(v.name)
    problems += [f"{o['op']}: {sw['problem']}" for o in ops if o["op"] not in flagged
                 for sw in o["switches"] if sw["problem"]]  # refused, whether or not the op was named
    unknown = switches.unknown_names(names)
    problems += switches.unknown_names(names, lists=("INFERA_VLLM_OPS_EXCLUDE",))  # the allow-list's: above
    doc = {
        "infera_vllm": __version__,
        "report_dir": {"path": switches.report_dir, "problem": report_problem},
        "python": sys.version.split()[0],
        "environment": {**env.__dict__, **_driver()},
        "switches": switches.describe(),
        "ops": ops,
        "unknown_names": unknown,
        "problems": problems,
    }
    if model is not None:
        from infera_vllm.model_sites import load_config, unknown_architecture

        doc["model"] = {"path": model, "ops": plan_model(verdicts, specs, model),
                        "note": unknown_architecture(load_config(model))}
    return doc, (1 if problems else 0)


def render(doc: dict) -> str:
    e = doc["environment"]
    out = [f"infera-vllm {doc['infera_vllm']} doctor (python {doc['python']})",
           f"  vLLM {e['vllm']} | torch {e['torch']} | triton {e['triton']} | CUDA runtime {e['cuda_runtime']} | "
           f"HIP {e['hip']} | driver {e['driver']}",
           f"  GPU family: {e['gpu_family']} ({e['gpu_detail']})",
           "  switches: " + ", ".join(f"{k}={v}" for k, v in doc["switches"].items()),
           *(f"  WARNING: {line}" for line in doc["unknown_names"]),
           *([f"  WARNING: INFERA_VLLM_REPORT_DIR={doc['report_dir']['path']} cannot be written "
              f"({doc['report_dir']['problem']}): serving would put the reports in a new temporary directory"]
             if doc["report_dir"]["problem"] else []),
           "", "operators:"]
    if not doc["ops"]:
        out.append("  none installed (pip install infera-norm infera-attn-paged ...)")
    for o in doc["ops"]:
        why = f" [{o['reason']}] {o['detail']}" if o["reason"] else f" -> {o['seam']}"
        out.append(f"  {o['op']:<18} {o['distribution']} {o['version']}: {o['verdict']}{why}")
        for sw in o["switches"]:
            value = "unset" if sw["value"] is None else repr(sw["value"])
            bad = "  <- refused" if sw["problem"] else ""
            out.append(f"  {'':<18}   {sw['switch']} = {value} (default {sw['default']}; {sw['allowed']}){bad}")
    if "model" in doc:
        out += ["", f"model {doc['model']['path']}:"]
        if doc["model"].get("note"):
            out.append(f"  note: {doc['model']['note']}")
        for r in doc["model"]["ops"]:
            out.append(f"  {r['op']:<18} would take {len(r['take'])}/{r['sites']} {'/'.join(r['kinds'])} layers")
            for reason, names in r["decline"].items():
                out.append(f"  {'':<18}   declines {len(names)} ({reason}), e.g. {names[0]}")
    return "\n".join(out)


def main(model: str | None, as_json: bool) -> int:
    doc, code = collect(model)
    print(json.dumps(doc, indent=1, default=str) if as_json else render(doc))
    if code and not as_json:
        print("\nexit 1: " + "; ".join(doc["problems"]))
    return code
