"""Run notebooks top to bottom, each in a fresh kernel, and print one line per notebook.

    python tools/run_notebooks.py solutions/16/week16_kv_cache.ipynb solutions/17/*.ipynb --jobs 2 --out /tmp/nb

    PASS  week 16  solutions/16/week16_kv_cache.ipynb  48.2 s
    FAIL  week 17  solutions/17/week17_flash_attention.ipynb  12.9 s  cell 23 (ex05-tests): AssertionError: ...

What it promises (tools/gpu_check.sh runs the solution notebooks through it on a GPU machine):
- each notebook runs in its own folder as the working directory, as JupyterLab runs it;
- the kernel is this interpreter (ipykernel's own `python3` spec, built from `sys.executable`; no kernelspec
  installed elsewhere on the machine is used), with the repo root first on its PYTHONPATH, so `lib` and `grader`
  are this checkout's whatever is installed;
- a notebook is never written over: the executed copy (outputs and all, also when it failed) goes to
  `--out DIR/<folder>/<name>.ipynb`, the kernel process's own output (not the cells') to `<name>.kernel.log`
  and a failure's whole traceback to `<name>.error.txt` beside it;
- the first failing cell stops that notebook (its index, its nbgrader grade_id and `ename: evalue` are printed);
  a cell over `--timeout` seconds or a dead kernel fails it the same way.

Exit status: 0 if every notebook passed, 1 if one failed, 2 for a usage error (a notebook that does not exist) or
where nbclient, nbformat or ipykernel is missing.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _kernel_manager():
    """A kernel manager whose `python3` is ipykernel's native spec: `sys.executable -m ipykernel_launcher`."""
    from jupyter_client import AsyncKernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    # No kernel folders: only the native spec, which ipykernel builds from this interpreter.
    specs = KernelSpecManager(kernel_dirs=[], ensure_native_kernel=True)
    return AsyncKernelManager(kernel_name="python3", kernel_spec_manager=specs)


def _week(path: Path) -> str:
    return path.parent.name if path.parent.name.isdigit() else "-"


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def _first_error(nb) -> tuple[int, str, str] | None:
    """(cell index, grade_id or cell id, 'ename: evalue') of the first cell with an error output."""
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                meta = cell.get("metadata", {}).get("nbgrader", {})
                label = meta.get("grade_id") or cell.get("id", "")
                evalue = " ".join(str(out.get("evalue", "")).split())
                return i, label, f"{out.get('ename')}: {evalue}"
    return None


def run_one(path: str, timeout: float, out_dir: str) -> dict:
    """Execute one notebook; returns {ok, path, week, seconds, where, error, saved}. Never raises."""
    import nbformat
    from nbclient import NotebookClient

    path = Path(path).resolve()
    saved = Path(out_dir) / path.parent.name / path.name
    saved.parent.mkdir(parents=True, exist_ok=True)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    nb = nbformat.read(path, as_version=4)
    current = {"index": None, "label": ""}

    def on_cell_start(cell, cell_index, **_):
        current["index"] = cell_index
        current["label"] = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") or cell.get("id", "")

    client = NotebookClient(nb, km=_kernel_manager(), kernel_name="python3", timeout=timeout,
                            resources={"metadata": {"path": str(path.parent)}}, on_cell_start=on_cell_start)
    began = time.monotonic()
    result = {"ok": False, "path": _shown(path), "week": _week(path), "where": "", "error": "", "saved": str(saved)}
    try:
        with open(saved.with_suffix(".kernel.log"), "w") as log:  # the kernel process's own stderr (and stdout)
            client.execute(stdout=log, stderr=log)
        result["ok"] = True
    except BaseException as e:  # noqa: BLE001  (any failure of the run is this notebook's result, reported below)
        found = _first_error(nb)
        if found:
            index, label, message = found
        else:  # a timeout, a dead kernel, a kernel that would not start: no error output in the notebook
            index, label = current["index"], current["label"]
            message = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
        result["where"] = f"cell {index} ({label})" if index is not None else "before the first cell"
        result["error"] = message
        saved.with_suffix(".error.txt").write_text(f"{result['where']}: {message}\n\n{traceback.format_exc()}")
    finally:
        result["seconds"] = time.monotonic() - began
        nbformat.write(nb, saved)
    return result


def line(r: dict) -> str:
    text = f"{'PASS' if r['ok'] else 'FAIL'}  week {r['week']}  {r['path']}  {r['seconds']:.1f} s"
    return text if r["ok"] else f"{text}  {r['where']}: {r['error']}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+", help="notebook files")
    parser.add_argument("--jobs", type=int, default=1, help="notebooks run at once, each in its own process")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds a cell may take (default 1200)")
    parser.add_argument("--out", required=True, help="folder for the executed copies and error tracebacks")
    args = parser.parse_args(argv)
    missing = [p for p in args.notebooks if not Path(p).is_file()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)}")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    try:
        import ipykernel  # noqa: F401  (the kernel runs this interpreter's ipykernel)
        import nbclient  # noqa: F401
        import nbformat  # noqa: F401
    except ImportError as e:
        print(f"run_notebooks: {sys.executable} cannot run notebooks: {e} (nbclient, nbformat and ipykernel are "
              f"pyproject.toml dependencies: `make setup` installs them)", file=sys.stderr)
        return 2
    results = []
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(args.jobs, len(args.notebooks))) as pool:
        futures = [pool.submit(run_one, p, args.timeout, args.out) for p in args.notebooks]
        for future in concurrent.futures.as_completed(futures):
            results.append(future.result())
            print(line(results[-1]), flush=True)
    passed = sum(r["ok"] for r in results)
    print(f"notebooks: {passed}/{len(results)} passed (executed copies in {args.out})", flush=True)
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
