"""The device check: the kernel tests, the handoff kernel's figures, the pack kernels' figures and their
roofline ratios, in one bounded run and one table. `scripts/device-check.sh` builds the tree it runs in.

    bash scripts/device-check.sh              # on a CUDA box: everything, compiled (270 s on an H200)
    bash scripts/device-check.sh hook         # only tests/kernels/test_handoff_hook.py
    bash scripts/device-check.sh --dry-run    # anywhere: the same steps on CPU (interpreter, smoke shapes)

The script copies the repo into a temporary tree laid out as the installed package (sglang_pdd with
kernels/ inside, tests/, pyproject.toml), cd's into it and runs this module there, so every import (of
this process, of pytest's, of each benchmark child) resolves to that copy, on a box where nothing is
installed. Steps, each bounded:

  env       python, torch, triton, the device, and where sglang_pdd and its kernels were imported from
  tests     pytest tests/kernels, compiled (dry run: every module collected, a quick selection run)
  peak      the device's copy bandwidth and bf16 matmul rate, measured (`roofline --measure`)
  pack      sglang_pdd.lab.micro.pack_kernel at 1K and 16K tokens: a device copy, pack / unpack plain and fp8
  kernel    sglang_pdd.lab.micro.handoff_kernel: batch 8 at 16K and 64K, k 1..256, each point with its tile
            sweep (handoff_tune); batch 1 at 4K; each (point, implementation) in its own child
  roofline  the ratios of the kernel and pack points (roofline time / measured) against the measured peak

A point that does not finish within its bound is a STALL row naming the point and the stage it stalled in;
the run goes on. The exit status is 1 when any row failed: a test, a STALL / ERROR / BAD point of the
handoff kernel or the pack kernels, a step cut short by the time budget. sglang's and flashinfer's
kernels (the comparators) are shown when present, absent otherwise, and never fail the check.
Logs and JSON go to --out: kernels.log, kernels.xml, handoff.json, pack.json, device_check.json and
device_check.txt (the table), peak.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Dry run: pytest collects every module of tests/kernels (so every import resolves as on the device) and
# runs these, one or a few per module, in about a minute on CPU.
DRY_RUN_TESTS = " or ".join([
    "gqa3",  # test_handoff_attention: odd shapes through the kernel
    "k64_point", "bounds_its_loops", "variant_set", "prefix200-k57",  # test_handoff_variants
    "byte_identical",  # test_kv_pack
    "layer_by_layer",  # test_handoff_hook: the hook over the pool (sglang's or the stand-ins)
    "wrong_kernel",  # test_warmup
])  # not test_compile_sm90 (collected only): the device run deselects it, and CI's own run compiles (40 s)


@dataclass
class Row:
    section: str
    point: str
    impl: str = ""
    status: str = "ok"
    us: float | None = None
    gbps: float | None = None
    roofline: float | None = None
    notes: str = ""
    failure: bool = False


def _num(v: float | None, width: int, fmt: str) -> str:
    if not isinstance(v, (int, float)):
        return f"{'-':>{width}}"
    return f"{v:{width}{fmt}}" if v == 0 or abs(v) >= 0.1 else f"{v:{width}.1e}"


def format_table(rows: list[Row]) -> str:
    head = (f"{'section':<8} {'point':<28} {'impl':<11} {'status':<7} {'us':>10} {'GB/s':>8} {'roofline':>8}  notes")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.section:<8} {r.point[:28]:<28} {r.impl[:11]:<11} {r.status[:7]:<7} "
                     f"{_num(r.us, 10, '.1f')} {_num(r.gbps, 8, '.1f')} {_num(r.roofline, 8, '.3f')}  {r.notes}")
    return "\n".join(lines)


def _show(row: Row) -> None:
    print("  " + format_table([row]).splitlines()[-1], flush=True)


# -- env ------------------------------------------------------------------------------------------------


def env_rows(dry_run: bool) -> list[Row]:
    import torch

    rows = []
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "absent"
    cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name(0) if cuda else "cpu"
    status = "ok" if cuda or dry_run else "FAIL"
    notes = f"python {sys.version.split()[0]}, torch {torch.__version__}, triton {triton_version}"
    if cuda:
        notes += f", CUDA {torch.version.cuda}"
    if not cuda and not dry_run:
        notes += "; no CUDA device (use --dry-run on CPU)"
    rows.append(Row("env", "device", device, status, notes=notes, failure=status != "ok"))
    if triton_version == "absent":
        rows.append(Row("env", "triton", "", "FAIL", notes="triton is not importable", failure=True))
    rows.append(_import_row())
    import importlib.util

    present = [m for m in ("sglang", "flashinfer") if importlib.util.find_spec(m) is not None]
    rows.append(Row("env", "comparators", "", "ok", notes=f"installed: {', '.join(present) or 'none'} "
                    "(sglang's and flashinfer's kernels; absent ones are left out)"))
    return rows


def _import_row() -> Row:
    """sglang_pdd and sglang_pdd.kernels import, from the tree this check runs in (the current directory)."""
    try:
        import sglang_pdd
        import sglang_pdd.kernels as kernels
    except Exception as e:  # noqa: BLE001 - reported as the row
        return Row("env", "imports", "", "FAIL", notes=f"{type(e).__name__}: {e}", failure=True)
    pkg = Path(sglang_pdd.__file__).resolve().parent
    here = Path.cwd().resolve()
    ok = pkg.parent == here and Path(kernels.__file__).resolve().parent == pkg / "kernels"
    notes = f"sglang_pdd from {pkg}" + ("" if ok else f"; expected {here / 'sglang_pdd'} with kernels/ inside")
    return Row("env", "imports", "sglang_pdd", "ok" if ok else "FAIL", notes=notes, failure=not ok)


# -- tests ----------------------------------------------------------------------------------------------


def run_logged(argv: list[str], timeout_s: float, log: Path,
               env: dict[str, str] | None = None) -> tuple[int | None, float]:
    """Run `argv` with its output in `log`, at most `timeout_s`; (exit status or None on a stall, seconds)."""
    t0 = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            rc = None
    return rc, time.monotonic() - t0


def _summary(log: Path) -> str:
    """pytest's summary line ("12 passed, 1 failed in 30.1s"), else the log's last line."""
    lines = [ln.strip(" =") for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.search(r"\d+ (passed|failed|errors?|skipped|deselected)|no tests ran", ln) and " in " in ln:
            return ln[:200]
    return (lines[-1] if lines else "no output")[:200]


def test_rows(what: str, dry_run: bool, out: Path, timeout_s: float) -> list[Row]:
    target = "tests/kernels/test_handoff_hook.py" if what == "hook" else "tests/kernels"
    xml = out / "kernels.xml"
    xml.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
            f"--junitxml={xml}", target]
    if dry_run:
        argv += ["-k", DRY_RUN_TESTS]
    elif what != "hook":  # the compile-only check is CI's (a CPU box); here the kernels compile for real
        argv += ["--deselect", "tests/kernels/test_compile_sm90.py"]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # tests/kernels/conftest decides
    log = out / "kernels.log"
    rc, seconds = run_logged(argv, timeout_s, log, env)
    rows = _junit_rows(xml)
    last = _summary(log)
    if rc is None:
        rows.append(Row("tests", target, "pytest", "STALL", notes=f"no end within {seconds:.0f} s; last: {last}",
                        failure=True))
    else:
        selection = " (dry run: a selection of the collected tests)" if dry_run else ""
        rows.append(Row("tests", target, "pytest", "ok" if rc == 0 else "FAIL",
                        notes=f"{seconds:.0f} s, exit {rc}: {last}{selection}", failure=rc != 0))
    return rows


def _junit_rows(xml: Path) -> list[Row]:
    if not xml.exists():
        return []
    per_file: dict[str, dict[str, Any]] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        f = case.get("file") or (case.get("classname") or "?").replace(".", "/") + ".py"
        d = per_file.setdefault(f, {"passed": 0, "failed": 0, "skipped": 0, "first": ""})
        if case.find("failure") is not None or case.find("error") is not None:
            d["failed"] += 1
            d["first"] = d["first"] or case.get("name", "")
        elif case.find("skipped") is not None:
            d["skipped"] += 1
        else:
            d["passed"] += 1
    rows = []
    for f, d in sorted(per_file.items()):
        notes = f"{d['passed']} passed" + (f", {d['failed']} failed (first: {d['first']})" if d["failed"] else "") + (
            f", {d['skipped']} skipped" if d["skipped"] else "")
        rows.append(Row("tests", Path(f).name, "pytest", "FAIL" if d["failed"] else "ok", notes=notes,
                        failure=bool(d["failed"])))
    return rows


# -- kernel and pack figures ------------------------------------------------------------------------------


def kernel_grids(dry_run: bool, timeout_s: float) -> list[Any]:
    """Issue 37's points: batch 8 (page 16) at prefixes of 16K and 64K for k from 1 to 256, each with its
    tile sweep; and batch 1 (page 1) at 4K, the first H200 table's row. Dry run: the smoke grid, swept."""
    from sglang_pdd.lab.micro import handoff_kernel as hk

    if dry_run:
        return [hk.Grid.smoke_grid(timeout_s=timeout_s, tune=True, tune_budget_s=10.0)]
    return [hk.Grid(batch=8, page_size=16, prefixes=[16384, 65536], ks=[1, 8, 32, 64, 128, 256], tune=True,
                    tune_budget_s=30.0, timeout_s=timeout_s),
            hk.Grid(batch=1, page_size=1, prefixes=[4096], ks=[1, 8, 32, 64], timeout_s=timeout_s)]


def peak_rows(dry_run: bool, out: Path, timeout_s: float) -> tuple[list[Row], Any]:
    """The peak the ratios are taken against: measured on a CUDA device (copy, bf16 matmul), nominal on CPU."""
    from sglang_pdd.lab.micro import bounded, roofline

    if dry_run:
        return [Row("roofline", "peak", "cpu", "ok", notes=roofline.CPU_NOMINAL.label())], roofline.CPU_NOMINAL
    outcome = bounded.run_child([sys.executable, "-m", "sglang_pdd.lab.micro.roofline", "--measure"], timeout_s)
    if outcome.status != "ok":
        return [Row("roofline", "peak", "measured", outcome.status, notes=outcome.why() + "; vendor peaks used")], None
    (out / "peak.json").write_text(json.dumps(outcome.result))
    peak = roofline.measured(outcome.result)
    return [Row("roofline", "peak", "measured", "ok", notes=peak.label())], peak


def kernel_rows(dry_run: bool, out: Path, timeout_s: float, deadline: float, peak: Any = None) -> list[Row]:
    from sglang_pdd.lab.micro import handoff_kernel as hk

    rows: list[Row] = []
    absent: dict[str, str] = {}

    def on_result(r: dict[str, Any]) -> None:
        if r["status"] in ("absent", "skipped"):
            absent.setdefault(r["impl"], f"{r['status']}: {r.get('why', '')}")
            return
        if r["impl"] == "pdd" and r["status"] == "ok":
            notes = f"call {r['us_call']:.1f} us, err {r['err']:.1e}, {r['plan']}"
            if "us_best" in r:
                notes += f"; sweep best {r['best']}: {r['us_best']:.1f} us ({r['roofline_best'] or 0:.3f})"
        elif r["status"] == "ok":
            notes = f"err {r['err']:.1e}"
        else:
            notes = r.get("why", "")
        if r["impl"] != "pdd" and r["status"] in ("STALL", "ERROR", "n/a", "not run"):
            notes += " (comparator: not counted)"
        row = Row("kernel", f"b{r['batch']} k={r['k']} prefix={r['prefix']}", r["impl"], r["status"], r.get("us"),
                  r.get("GB/s"), r.get("roofline"), notes, failure=hk.is_failure(r))
        rows.append(row)
        _show(row)

    results = []
    for grid in kernel_grids(dry_run, timeout_s):
        results += hk.run_grid(grid, on_result, deadline, peak)
    (out / "handoff.json").write_text(json.dumps(results, indent=1))
    for impl, why in absent.items():
        rows.append(Row("kernel", "every point", impl, why.split(":")[0], notes=why.split(": ", 1)[-1]))
    return rows


def pack_rows(dry_run: bool, out: Path, timeout_s: float, deadline: float, peak: Any = None) -> list[Row]:
    """pack_kernel's points for a Llama-3-8B request of 1K and 16K tokens (dry run: the smoke pool)."""
    from sglang_pdd.lab.micro import pack_kernel as pk

    geos = ([pk.PoolGeometry.smoke_geometry(timeout_s=timeout_s)] if dry_run else
            [pk.PoolGeometry(tokens=n, timeout_s=timeout_s) for n in (1024, 16384)])
    rows: list[Row] = []
    every: list[dict[str, Any]] = []
    for geo in geos:
        every.append({"geometry": asdict(geo), "results": _pack_points(pk, geo, rows, deadline, peak)})
    (out / "pack.json").write_text(json.dumps(every, indent=1))
    return rows


def _pack_points(pk: Any, geo: Any, rows: list[Row], deadline: float, peak: Any) -> list[dict[str, Any]]:
    def on_result(r: dict[str, Any]) -> None:
        notes = r.get("why", "")
        if r["status"] == "ok":
            notes = f"{r['bytes'] / 1e6:.1f} MB moved" + (f", call {r['us_call']:.1f} us" if "us_call" in r else "")
            if "us_host" in r:
                notes += f", host {r['us_host']:.1f} us/launch"
            if "err" in r:
                notes += f", round trip err {r['err']:.2g}"
        row = Row("pack", f"{geo.tokens} tok", r["impl"], r["status"], r.get("us"), r.get("GB/s"), r.get("roofline"),
                  notes, failure=r["status"] != "ok")
        rows.append(row)
        _show(row)

    return pk.run_points(geo, on_result, deadline, peak)


def roofline_rows(device: str, kernel: list[Row], pack: list[Row], measured: Any = None) -> list[Row]:
    from sglang_pdd.lab.micro import roofline

    peak = measured or roofline.peak_for(device)
    rows = [Row("roofline", "ratios of", device[:11], "ok" if peak else "n/a",
                notes=peak.label() if peak else "no peak figures for this device: ratios left out")]
    for name, section, impls in (("handoff kernel", kernel, ("pdd",)), ("pack kernels", pack,
                                                                         ("pack", "unpack", "pack fp8", "unpack fp8")),
                                 ("device copy", pack, ("copy",))):
        ratios = [r.roofline for r in section if r.impl in impls and r.status == "ok" and r.roofline is not None]
        if not ratios:
            continue
        rows.append(Row("roofline", name, "", "ok", roofline=statistics.median(ratios),
                        notes=f"median of {len(ratios)} point{'s' if len(ratios) > 1 else ''}, "
                        f"{min(ratios):.3g} to {max(ratios):.3g}"))
    return rows


# -- main -------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="?", default="all", choices=["all", "hook", "tests", "kernel", "pack"])
    ap.add_argument("--dry-run", action="store_true", help="CPU, Triton's interpreter, smoke shapes")
    ap.add_argument("--out", default="runs/device", help="logs, JSON and the table")
    ap.add_argument("--budget-s", type=float, help="the whole run (default 440; dry run 240)")
    ap.add_argument("--tests-timeout-s", type=float, help="the pytest step (default 200; dry run 150)")
    ap.add_argument("--point-timeout-s", type=float, help="each benchmark point (default 90; dry run 60)")
    args = ap.parse_args(argv)
    dry = args.dry_run
    budget = args.budget_s or (240.0 if dry else 440.0)
    tests_timeout = args.tests_timeout_s or (150.0 if dry else 200.0)
    point_timeout = args.point_timeout_s or (60.0 if dry else 90.0)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    deadline = t0 + budget
    print(f"device check{' (dry run: CPU, interpreter, smoke shapes)' if dry else ''}: {args.what}, "
          f"budget {budget:.0f} s, output in {out}", flush=True)

    rows = env_rows(dry)
    for r in rows:
        _show(r)
    if rows[0].failure or any(r.failure for r in rows if r.point in ("imports", "triton")):
        return _finish(rows, out, t0)
    device = rows[0].impl
    if args.what in ("all", "hook", "tests"):
        print("tests ...", flush=True)
        for r in test_rows(args.what, dry, out, min(tests_timeout, deadline - time.monotonic())):
            rows.append(r)
            _show(r)
    kernel: list[Row] = []
    pack: list[Row] = []
    peak = None
    if args.what in ("all", "kernel", "pack"):
        print("peak ...", flush=True)
        peak_row, peak = peak_rows(dry, out, point_timeout)
        rows += peak_row
        _show(peak_row[0])
    if args.what in ("all", "pack"):
        print("pack ...", flush=True)
        pack = pack_rows(dry, out, point_timeout, deadline, peak)
        rows += pack
    if args.what in ("all", "kernel"):
        print("kernel ...", flush=True)
        kernel = kernel_rows(dry, out, point_timeout, deadline, peak)
        rows += kernel
    if kernel or pack:
        rows += roofline_rows(device, kernel, pack, peak)
    return _finish(rows, out, t0)


def _finish(rows: list[Row], out: Path, t0: float) -> int:
    failures = [r for r in rows if r.failure]
    table = format_table(rows)
    verdict = (f"device check: {'FAILED' if failures else 'passed'} in {time.monotonic() - t0:.0f} s; "
               f"{len(failures)} failed rows")
    print("\n" + table + "\n" + verdict, flush=True)
    (out / "device_check.txt").write_text(table + "\n" + verdict + "\n")
    (out / "device_check.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
