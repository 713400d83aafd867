"""``scripts/gpu_check.sh quick``: the load question answered whole in one short device call.

One command of at most ``--budget-s`` seconds (default 360) on a lent GPU machine runs,
each step under its share of the budget:

    tests      the GPU tests of the transfer path (transfer_kernels, controller, vLLM mover)
    load       bench/load_batch.py: DeepSeek-V4-Pro page_first, 16 and 64 pages, auto,
               triton and dma, H2D and D2H: idle, beside bf16 GEMMs, both ways at once
    host_only  bench/load_batch.py --host-only: each backend's host cost, device calls out
    verify     hicache verify-model --device cuda (DeepSeek-V4, bytes and logits)
    profile    bench/device_profile.py: the device's measured profile (links, prefill rates),
               ``OUT/profile.json`` (``hicache replay --device-profile OUT/profile.json``)

and writes ONE JSON, ``OUT/gpu_quick.json`` (``read`` loads it back): per step its exit
status, seconds and log tail, the load and host-only rows, the previous round's
targets with their figures (``None`` where a step did not give them), and the measured
profile beside the shipped ``h100`` one (measured / shipped per figure). ``--smoke`` runs
CPU-sized stand-ins of every step (the test suite checks the orchestration and the JSON
on a machine without a GPU).

    python bench/gpu_quick.py --out OUT [--budget-s 360] [--steps tests,load,...]
    python bench/gpu_quick.py --read OUT/gpu_quick.json      # the targets table again
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
FORMAT, VERSION = "hicache-gpu-quick", 1
STEPS = ("tests", "load", "host_only", "verify", "profile")
SHARE = {"tests": 0.25, "load": 0.33, "host_only": 0.14, "verify": 0.16, "profile": 0.10}  # of the budget
COMPARED = (("h2d", "gbps"), ("h2d", "enqueue_s"), ("d2h", "gbps"), ("prefill", "bf16_tflops"),
            ("prefill", "fp8_tflops"), ("prefill", "attention_tflops"), ("prefill", "hbm_gbps"))
PRO = "deepseek-v4-pro"


def step_commands(out: Path, smoke: bool) -> dict[str, list[str]]:
    """Each step's command (``--smoke``: CPU-sized stand-ins of the same commands)."""
    py = sys.executable
    tests = sorted({*glob.glob(str(ROOT / "tests/hicache/**/test_controller_cuda*.py"), recursive=True),
                    *glob.glob(str(ROOT / "tests/integrations/vllm/test_mover*.py"))})
    model = f"{PRO}:2" if smoke else PRO
    profile = [py, str(ROOT / "bench/device_profile.py"), "--out", str(out / "profile.json")]
    load = [py, str(ROOT / "bench/load_batch.py"), "--models", model, "--layouts", "page_first",
            "--backends", "auto,triton,dma", "--directions", "h2d,d2h"]
    if smoke:
        return {"tests": [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
                          str(ROOT / "tests/transfer_kernels/test_bound_launch.py")],
                "load": load + ["--pages", "1", "--ops", "1", "--batches", "1", "--no-extra",
                                "--out", str(out / "load.json")],
                "host_only": load + ["--host-only", "--pages", "1", "--ops", "1", "--batches", "1",
                                     "--out", str(out / "host_only.json")],
                "verify": [py, "-m", "hicache.cli", "verify-model", "--device", "cpu", "--layers", "2",
                           "--conversations", "1", "--turns", "2", "--allow-device-only", "--json"],
                "profile": profile + ["--device", "cpu"]}
    return {"tests": [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
                      str(ROOT / "tests/transfer_kernels"), *tests],
            "load": load + ["--pages", "16,64", "--ops", "1", "--batches", "8",
                            "--extras", "steady,compute,bidir", "--out", str(out / "load.json")],
            "host_only": load + ["--host-only", "--pages", "16,64", "--ops", "1,16", "--batches", "10",
                                 "--out", str(out / "host_only.json")],
            "verify": [py, "-m", "hicache.cli", "verify-model", "--device", "cuda", "--json"],
            "profile": profile}


def run_step(name: str, cmd: list[str], limit: float, out: Path) -> dict[str, Any]:
    """Run one step under ``limit`` seconds; its log goes to ``out/<name>.log``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    start = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                timeout=max(1.0, limit)).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    text = (out / f"{name}.log").read_text(errors="replace")
    return {"rc": rc, "seconds": round(time.perf_counter() - start, 1), "limit_s": round(limit, 1),
            "tail": text[-1500:]}


def _rows(path: Path) -> list[dict]:
    try:
        return json.loads(path.read_text())["rows"]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def targets(load: list[dict], host_only: list[dict]) -> list[dict[str, Any]]:
    """The previous round's targets on DeepSeek-V4-Pro, 16 pages as 1 op: each with its
    figure (``None``: not measured) and whether it was met."""
    def row(rows, backend, direction, mode=None):
        return next((r for r in rows if r.get("model", "").startswith(PRO) and r.get("pages") == 16
                     and r.get("ops") == 1 and r.get("backend") == backend and r.get("dir") == direction
                     and (mode is None or r.get("mode") == mode)), {})

    def get(r, key):
        value = r.get(key)
        return value if isinstance(value, (int, float)) else None

    h2d, d2h, trusted = row(load, "auto", "h2d"), row(load, "auto", "d2h"), row(host_only, "auto", "h2d", "trusted")
    beside = None if get(h2d, "frac") is None or get(h2d, "cmp_ratio") is None else h2d["frac"] * h2d["cmp_ratio"]
    out = [_target("16-page load, end to end / one-shot copy, idle (auto)", get(h2d, "frac"), ">=", 0.85),
           _target("same beside bf16 GEMMs (frac x cmp_ratio)", beside, ">=", 0.80),
           _target("GEMMs slowed by the load", get(h2d, "compute_slowdown"), "<=", 0.05),
           _target("host enqueue, us (auto, --host-only, trusted)", get(trusted, "host_us"), "<=", 150),
           _target("D2H end to end / one-shot copy (auto)", get(d2h, "frac"), ">=", 0.90),
           _target("load + backup at once / one way", get(h2d, "bidir_x"), ">=", 1.6)]
    for r in load:  # auto within 10 % of the best backend, every (dir, pages, ops)
        if r.get("backend") != "auto" or get(r, "e2e_us") is None:
            continue
        peers = [get(p, "e2e_us") for p in load if p.get("backend") in ("triton", "dma")
                 and (p.get("dir"), p.get("pages"), p.get("ops")) == (r["dir"], r["pages"], r["ops"])]
        peers = [p for p in peers if p is not None]
        if peers:
            out.append(_target(f"auto / best backend, {r['dir']} {r['pages']} pages x {r['ops']} op",
                               r["e2e_us"] / min(peers), "<=", 1.10))
    return out


def _target(name: str, value: float | None, op: str, bound: float) -> dict[str, Any]:
    met = None if value is None else (value >= bound if op == ">=" else value <= bound)
    return {"target": f"{name} {op} {bound}", "value": value, "met": met}


def profile_beside_shipped(path: Path) -> tuple[dict | None, dict[str, float]]:
    """The measured profile's document, and per `COMPARED` figure measured / shipped h100."""
    from hicache.cost import load_profile, profile_dict
    try:  # read as any profile is: bounded, checked key by key
        doc = profile_dict(load_profile(path, "profile step"))
    except ValueError:
        return None, {}
    shipped = profile_dict(load_profile("h100"))
    out = {}
    for section, field in COMPARED:
        got, ref = doc.get(section, {}).get(field), shipped[section][field]
        if isinstance(got, (int, float)) and ref:
            out[f"{section}.{field}"] = got / ref
    return doc, out


def read(path: str | Path) -> dict[str, Any]:
    """The document a run wrote (``ValueError`` naming the file when it is not one)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable gpu_quick JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise ValueError(f"{path}: format/version must be {FORMAT!r} / {VERSION}")
    return doc


def summary(doc: dict[str, Any]) -> str:
    """The steps and the targets as text."""
    lines = [f"gpu_quick on {doc['device']} ({doc['date']}, commit {doc['commit']}), "
             f"budget {doc['budget_s']} s, {doc['seconds']} s"]
    lines += [f"  step {n}: rc={s['rc']} {s['seconds']} s (limit {s['limit_s']} s)"
              for n, s in doc["steps"].items()]
    for t in doc["targets"]:
        value = "not measured" if t["value"] is None else f"{t['value']:.3g}"
        verdict = {True: "met", False: "NOT met", None: "-"}[t["met"]]
        lines.append(f"  {t['target']}: {value} ({verdict})")
    if doc.get("profile_vs_h100"):
        lines.append("  measured profile / shipped h100: " + ", ".join(
            f"{k} {v:.2f}" for k, v in doc["profile_vs_h100"].items()))
    return "\n".join(lines)


def run(out: Path, steps: Sequence[str], budget_s: float, smoke: bool) -> dict[str, Any]:
    """Run ``steps`` within ``budget_s`` seconds and write ``out/gpu_quick.json``."""
    out.mkdir(parents=True, exist_ok=True)
    start, commands, results = time.perf_counter(), step_commands(out, smoke), {}
    share = sum(SHARE[s] for s in steps)
    for name in steps:
        left = budget_s - (time.perf_counter() - start) - 5  # 5 s for the JSON
        results[name] = run_step(name, commands[name], min(left, budget_s * SHARE[name] / share), out)
    verify = out / "verify.log"
    doc = {"format": FORMAT, "version": VERSION, "device": _device(), "date": time.strftime("%Y-%m-%d"),
           "commit": _commit(), "budget_s": budget_s, "smoke": smoke, "steps": results,
           "load": _rows(out / "load.json"), "host_only": _rows(out / "host_only.json"),
           "verify_ok": results["verify"]["rc"] == 0 if "verify" in results else None,
           "verify_log": str(verify) if verify.exists() else None}
    doc["targets"] = targets(doc["load"], doc["host_only"])
    doc["profile"], doc["profile_vs_h100"] = profile_beside_shipped(out / "profile.json")
    doc["seconds"] = round(time.perf_counter() - start, 1)
    (out / "gpu_quick.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def _device() -> str:
    try:
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return f"CPU {platform.machine()}"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/gpu_quick.py", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, help="folder for the logs, the step JSON and gpu_quick.json")
    p.add_argument("--budget-s", type=float, default=360.0, help="seconds for every step together")
    p.add_argument("--steps", default=",".join(STEPS), help=f"comma list of {', '.join(STEPS)}")
    p.add_argument("--smoke", action="store_true", help="CPU-sized stand-ins (tests of this script)")
    p.add_argument("--read", type=Path, help="print the summary of a gpu_quick.json and exit")
    args = p.parse_args(argv)
    if args.read is not None:
        try:
            print(summary(read(args.read)))
        except ValueError as exc:
            p.error(str(exc))
        return 0
    steps = args.steps.split(",")
    if bad := [s for s in steps if s not in STEPS]:
        p.error(f"--steps: unknown {bad[0]!r}; allowed: {', '.join(STEPS)}")
    if args.out is None:
        p.error("--out: required (or --read FILE)")
    if not 10 <= args.budget_s <= 3600:
        p.error(f"--budget-s: must be in [10, 3600], got {args.budget_s:g}")
    doc = run(args.out, steps, args.budget_s, args.smoke)
    print(summary(doc))
    return 0 if all(s["rc"] == 0 for s in doc["steps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
