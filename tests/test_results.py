"""Results as data (lib/bench/records.py, tools/results.py): the speed figures the README and docs/performance.md show are
rendered from the committed records, so a figure edited by hand, or a record changed without `make results`, fails
here; and the README quotes no measured figure outside its rendered table."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lib.bench import records
from tools import results

REPO = Path(__file__).resolve().parent.parent


def test_machine_classes_are_named_by_vendor_line_and_feature():
    assert records.machine_class({"vendor": "GenuineIntel", "cpu": "Intel(R) Xeon(R) Processor",
                                  "flags": ["avx2", "avx512f", "amx_tile"]}) == "intel-xeon-amx"
    assert records.machine_class({"vendor": "AuthenticAMD", "cpu": "AMD EPYC 9R14",
                                  "flags": ["avx2", "avx512f"]}) == "amd-epyc-avx512"
    assert records.machine_class({"vendor": "GenuineIntel", "cpu": "12th Gen Intel(R) Core(TM) i7-1260P",
                                  "flags": ["avx2"]}) == "intel-core-avx2"
    assert records.machine_class({"gpu": "NVIDIA H100 80GB HBM3"}) == "nvidia-h100-80gb-hbm3"
    m = records.machine()
    assert m["class"] == records.machine_class(m) and m["cores"] >= 1


def test_a_record_keeps_every_repeat_and_where_it_ran(tmp_path, monkeypatch):
    monkeypatch.setattr(records, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(records, "RESULTS", tmp_path / "results")
    r = records.Record("probe", command="probe.py --x")
    r.add("rate", [10.0, 12.0, 11.0], "tok/s", True)
    r.note("kernel", "cpp")
    paths = r.write(commit_as_reference=True)
    data = json.loads(paths[-1].read_text())
    assert paths[-1] == tmp_path / "results" / data["machine"]["class"] / "probe.json"
    assert data["figures"]["rate"] == {"unit": "tok/s", "samples": [10.0, 12.0, 11.0], "min": 10.0, "median": 11.0,
                                       "max": 12.0, "higher_is_better": True}
    assert data["notes"] == {"kernel": "cpp"} and data["command"] == "probe.py --x"
    assert {"commit", "dirty", "date", "versions", "load", "threads"} <= set(data)


def test_the_committed_text_is_what_the_records_give():
    done = subprocess.run([sys.executable, "tools/results.py", "--check"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_a_figure_edited_by_hand_is_caught(tmp_path):
    """The drift test can fail: a copy of the repo's README, docs and records with one rendered figure changed by
    hand, and with one record's figure changed, each fails --check."""
    copy = tmp_path / "repo"
    for part in ("README.md", "docs", "results", "tools/results.py", "tools/__init__.py", "lib"):
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (copy / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, copy / part)
    readme = (copy / "README.md").read_text()
    block = readme.split(results.BEGIN, 1)[1].split(results.END, 1)[0]
    figure = re.search(r"\d+\.\d", block)
    assert figure, "the README's results block shows no figure"
    edited = block.replace(figure[0], f"{float(figure[0]) + 1:.1f}", 1)
    (copy / "README.md").write_text(readme.replace(block, edited))
    check = [sys.executable, "tools/results.py", "--check"]
    assert subprocess.run(check, cwd=copy, capture_output=True).returncode == 1
    (copy / "README.md").write_text(readme)
    assert subprocess.run(check, cwd=copy, capture_output=True).returncode == 0
    rec = next((copy / "results").glob("*/decode.json"))
    data = json.loads(rec.read_text())
    fig = next(iter(data["figures"].values()))
    fig["samples"] = [x * 2 for x in fig["samples"]]
    fig["min"], fig["median"], fig["max"] = (x * 2 for x in (fig["min"], fig["median"], fig["max"]))
    rec.write_text(json.dumps(data))
    assert subprocess.run(check, cwd=copy, capture_output=True).returncode == 1


# A number of a measured kind: a rate, a time, a bandwidth, a ratio or a share.
MEASURED = re.compile(r"\b\d[\d,]*(\.\d+)?\s*(tok/s|ms\b|GB/s|×|x\b|%|s\b|min\b)")


# Phrases of a document that match MEASURED but quote no measurement: a check's bound or a setting, arithmetic shown
# with its operands, a regex false positive ("min(0, min x)"). Each is a literal substring, removed before the
# search; anything else that matches is a measured figure typed by hand.
NOT_MEASURED = {
    "solutions/16/README.md": ("≤ 3 min", "4 KV heads give 8×", "32 / 8 = 4×"),
    "solutions/16/week16_kv_cache.ipynb": (
        "(≤ 60 s)", "a 2048×2048 product", "the 2048×2048 matmul's", "about 5 % of the original pre-training compute",
        "at 3× the memory", "cuts the cache 3×", "is 3× against", "32 / 8 = 4×",
        "(32× for a 32-head model, only 9× for SmolLM2)", "saves 8× because", "does give 8×", "the saving is 4×"),
    "solutions/17/README.md": (),
    "solutions/17/week17_flash_attention.ipynb": (
        "a copy, and 3× the K/V bytes", "FlashAttention reported 2–4× speed-ups", "a 100×200 by 200×60 product",
        "≈ 7× fewer at N = 4096", "≈ 7× fewer accesses at N = 4096"),
    "solutions/18/README.md": (),
    "solutions/18/week18_speculative.ipynb": (
        "budget of 3 min", "42,000 + 5 × 4,000 + 1,000", "49152 × 576", "4096 × 576", "first 80 %", "last 20 %",
        "would need for 1.5×", "the α that 1.5× needs", "= 2.80×", "giving 2–3×"),
    "solutions/20/README.md": (
        "within 0.8–1.25×", "within 0.5 %", "(5 % on heavy-tailed rows)", "within 1 % (3 % heavy-tailed)",
        "below 0.95× Q4_1's", "≤ 3 min", "at least 90 %", "within 5 %", "a share above 100 %"),
    "solutions/20/week20_quantization.ipynb": (
        "within 0.8–1.25×", "within 0.5 % of llama.cpp's", "(5 % on heavy-tailed rows;", "the plain RMSE within 1 % of it",
        "(3 % heavy-tailed)", "below 0.95× Q4_1's", "`lo = min(0, min x)`", "1536 = 6 × 256", "(1 % by default)",
        "With 1 % damping", "We use 10 % below", "keeping just **1 % of the weights**", "the 1 % columns",
        "a share above 100 %", "choosing the 1 % by activation"),
    "solutions/21/README.md": (
        "within 1.2× with one slot", "1.35× with several", "on 4×A100"),
    "solutions/21/week21_serving.ipynb": (
        "p95 TTFT under 200 ms", "4×A100", "(4× one GPU)", "2×A100", "2×80 GB", "TTFT under 100 ms", "8×A100"),
    "solutions/19/README.md": ("≤ 3 min", "on 4×A100", "projections scaled 8×"),
    "solutions/19/week19_paged_batching.ipynb": (
        "half 4× longer", "each swap is 2 × 30 separate copies", "(32 GB/s theoretical for PCIe 4.0 x16",
        "runs on 4×A100"),
}
NOTEBOOKS = [doc for doc in NOT_MEASURED if doc.endswith(".ipynb")]
# Notebooks with nothing to render: no committed record holds their figures, which their cells measure live (week
# 17: attention's memory and time, §1, §5, §7).
RENDERS_NONE = {"solutions/17/week17_flash_attention.ipynb"}


def typed_figures(text: str, allowed=()) -> list[str]:
    """The figures of a measured kind in `text` that are typed by hand: outside the README's rendered block, outside
    a notebook's rendered figures (tools.results.RECORDED_MARK), outside quotations ("..." — a seed's claim, quoted
    to be checked) and outside the `allowed` phrases."""
    if results.BEGIN in text:
        head, rest = text.split(results.BEGIN, 1)
        text = head + rest.split(results.END, 1)[1]
    text = " ".join(results.RECORDED_MARK.sub("", text).split())  # one line: a phrase may wrap anywhere
    text = re.sub(r'"[^"]*"', "", text)
    for phrase in allowed:
        text = text.replace(phrase, "")
    return [m[0] for m in MEASURED.finditer(text)]


def _markdown(notebook: str) -> str:
    cells = json.loads((REPO / notebook).read_text())["cells"]
    return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


@pytest.mark.parametrize("doc", ["README.md", *[d for d in NOT_MEASURED if d.endswith(".md")]])
def test_no_measured_figure_is_typed_into_the_prose(doc):
    """Outside the rendered block, the README (and a week's README) states no measured figure: figures live in
    records (rendered) or are derived where they are shown. (Thresholds and settings are not measurements: `≤ 60 s`,
    `4 GiB`, `90 %` of a threshold are written as such and listed in NOT_MEASURED when they match.)"""
    for phrase in NOT_MEASURED.get(doc, ()):
        assert phrase in " ".join((REPO / doc).read_text().split()), f"{doc} no longer says {phrase!r}: drop it"
    typed = typed_figures((REPO / doc).read_text(), NOT_MEASURED.get(doc, ()))
    assert not typed, f"{doc} quotes measured figures outside its rendered table: {typed[:20]}"


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_no_measured_figure_is_typed_into_a_notebook(notebook):
    """A notebook's markdown quotes no measured figure it did not render from a record (its builder calls
    tools.results.recorded_md) or derive in a cell: the live figures are printed by the cells."""
    text = _markdown(notebook)
    for phrase in NOT_MEASURED[notebook]:
        assert phrase in " ".join(text.split()), f"{notebook} no longer says {phrase!r}: drop it from NOT_MEASURED"
    typed = typed_figures(text, NOT_MEASURED[notebook])
    assert not typed, f"{notebook}'s markdown quotes measured figures it neither rendered nor derived: {typed[:20]}"


def stale_recordings(text: str) -> list[str]:
    """Each figure a notebook rendered from a record (RECORDED_MARK) that the committed records now render otherwise."""
    return [f"{m['benchmark']} / {m['figure']} ({m['cls']}): {m['text']!r}, the records give "
            f"{results.recorded(m['benchmark'], m['figure'], m['cls'])!r}"
            for m in results.RECORDED_MARK.finditer(text)
            if m["text"] != results.recorded(m["benchmark"], m["figure"], m["cls"])]


@pytest.mark.parametrize("notebook", [*(n for n in NOTEBOOKS if n not in RENDERS_NONE), "solutions/21/README.md"])
def test_a_notebooks_recorded_figures_are_the_records(notebook):
    """Each figure a notebook's builder rendered (or a week's README quotes, marked as rendered) is what the committed
    records render now: a record changed without a rebuild, or a rendered figure edited by hand, fails."""
    text = _markdown(notebook) if notebook.endswith(".ipynb") else (REPO / notebook).read_text()
    assert results.RECORDED_MARK.search(text), f"{notebook} renders no recorded figure"
    assert stale_recordings(text) == []


def test_a_typed_or_stale_notebook_figure_is_caught():
    """The notebook tests can fail: a figure typed beside a rendered one, a rendered one edited by hand."""
    notebook = NOTEBOOKS[0]
    text = _markdown(notebook)
    assert typed_figures(text + "\nThe probe read 38–69 GB/s within the hour.", NOT_MEASURED[notebook]) == ["69 GB/s"]
    mark = results.RECORDED_MARK.search(text)
    figure = re.search(r"\d+\.\d", mark["text"])[0]
    edited = text.replace(mark[0], mark[0].replace(figure, f"{float(figure) + 1:.1f}", 1))
    assert len(stale_recordings(edited)) == 1
    assert typed_figures(edited, NOT_MEASURED[notebook]) == []  # a rendered figure is never "typed"


def test_the_readme_is_short():
    lines = (REPO / "README.md").read_text().count("\n")
    assert lines <= 150, f"README.md has {lines} lines: the detail belongs in docs/ (the performance page, the guides)"


def test_the_roofline_uses_the_best_bandwidth_the_class_has_shown(tmp_path, monkeypatch):
    monkeypatch.setattr(records, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(records, "RESULTS", tmp_path / "results")
    for i, gbs in enumerate((21.2, 26.2)):  # two runs a minute apart on a busy VM read this far apart
        r = records.Record("decode", command="decode.py")
        r.add("streaming bandwidth", gbs, "GB/s", True)
        path = r.write()[0]
        path.rename(path.with_name(f"decode-{i}.json"))
    cls = records.machine()["class"]
    assert records.best_bandwidth(cls, measured_now=21.0e9)[0] == 26.2e9  # not this run's low reading
    assert records.best_bandwidth(cls, measured_now=30.0e9) == (30.0e9, "measured in this run (the best for this "
                                                                        "machine class so far)")
