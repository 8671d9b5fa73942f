#!/usr/bin/env bash
# tools/gpu_check.sh — the GPU owner's check: on a CUDA machine, run every solution notebook top to bottom and
# the test suite, and say in one line per notebook and one summary line whether the lab works there.
#
#   tools/gpu_check.sh                       # everything (from any folder: it runs from the repo root)
#   tools/gpu_check.sh --weeks "16 18"       # only those weeks' notebooks (and the tests)
#   tools/gpu_check.sh --notebooks-only --jobs 3
#   tools/gpu_check.sh --tests-only -k week17 -- -x    # after `--`: passed on to pytest as they are
#   make gpu-check ARGS='--weeks 17'
#
# Options:
#   --allow-cpu        run even where torch sees no CUDA device (to test this script itself on a CPU)
#   --notebooks-only   skip pytest            --tests-only   skip the notebooks
#   --jobs N           notebooks run at once, each in its own kernel (default 1)
#   --timeout S        seconds one notebook cell may take (default 1200)
#   -k EXPR            passed to pytest
#   --weeks "16 18"    a subset of the notebooks (solutions/NN/*.ipynb; all: grader/course_map.py's weeks)
#   --out DIR          where the logs, the executed notebooks and pytest's junit xml go (default: a new temp dir)
#
# Python: $PYTHON if set, else .venv/bin/python if it exists, else python3. The repo root is put first on
# PYTHONPATH (as `pip install -e .` makes it importable), so `lib` and `grader` are this checkout's.
# Steps: the machine (nvidia-smi -L, torch, CUDA, device; notes on a torch other than the pin and on a missing
# gguf) — no CUDA device: exit 2 with the reason; the model
# (`python -m lib.modeling.fetch --check`) — missing or wrong: exit 2 with the fixing command; each solution notebook
# through tools/run_notebooks.py (its own folder as the working directory; the committed notebook is never
# written, the executed copy goes to --out); then `pytest -m "not notebook and not commands"` over pyproject's
# testpaths (the notebook-marked tests grade the same notebooks through nbgrader; the commands tests need `make
# setup`'s .venv). Exit status: 0 only if every notebook and every test passed; 1 otherwise; 2 if it could not
# start. README.md, "GPU owners", says what to expect.
set -u

usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

allow_cpu=0 notebooks=1 tests=1 jobs=1 timeout=1200 kexpr="" weeks="" out="" extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --allow-cpu) allow_cpu=1 ;;
        --notebooks-only) tests=0 ;;
        --tests-only) notebooks=0 ;;
        --jobs) jobs="${2:?--jobs needs a number}"; shift ;;
        --timeout) timeout="${2:?--timeout needs seconds}"; shift ;;
        -k) kexpr="${2:?-k needs an expression}"; shift ;;
        --weeks) weeks="${2:?--weeks needs a list, e.g. \"16 18\"}"; shift ;;
        --out) out="${2:?--out needs a folder}"; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; extra=("$@"); break ;;
        *) echo "gpu_check: unknown argument '$1' (tools/gpu_check.sh --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ "$notebooks" = 0 ] && [ "$tests" = 0 ]; then
    echo "gpu_check: --notebooks-only and --tests-only together leave nothing to run" >&2; exit 2
fi

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
REPO="$(pwd)"
if [ -n "${PYTHON:-}" ]; then :
elif [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python
else PYTHON=python3
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

# --- the machine ----------------------------------------------------------------------------------------------
echo "== machine"
gpus="$(command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>&1 || echo "nvidia-smi: not found")"
echo "$gpus"
facts="$("$PYTHON" - <<'EOF'
import platform, sys
try:
    import torch
except ImportError as e:
    print(f"torch=missing ({e})"); sys.exit(0)
cuda = torch.cuda.is_available()
print(f"python={platform.python_version()} ({sys.executable})")
print(f"torch={torch.__version__}")
print(f"cuda={torch.version.cuda}")
print(f"available={int(cuda)}")
print(f"device={torch.cuda.get_device_name(0) if cuda else 'cpu (no CUDA device)'}")
try:
    import gguf  # the model loads through it
except ImportError:
    print("note=gguf is not installed: the model cannot load (`make setup` installs it)")
EOF
)"
echo "$facts" | grep -v '^note='
fact() { echo "$facts" | sed -n "s/^$1=//p"; }
torch_version="$(fact torch)" device="$(fact device)"
fact note | sed 's/^/gpu_check: note: /'
if [ -z "$torch_version" ]; then echo "gpu_check: $PYTHON did not start" >&2; exit 2; fi
case "$torch_version" in missing*)
    echo "gpu_check: $PYTHON has no torch ($torch_version): see README 'GPU owners'" >&2; exit 2 ;;
esac
if [ "$(fact available)" != 1 ]; then
    if [ "$allow_cpu" = 1 ]; then
        echo "gpu_check: no CUDA device: going on because of --allow-cpu (this tests the script, not the GPU)"
    else
        echo "gpu_check: no CUDA device visible to torch $torch_version (a CPU build?): see README 'GPU owners'" >&2
        exit 2
    fi
fi
pin="$(sed -n 's/^ *"torch==\([^"]*\)".*/\1/p' pyproject.toml)"
if [ -n "$pin" ] && [ "${torch_version%%+*}" != "$pin" ]; then
    echo "gpu_check: note: torch $torch_version is not the lab's pin ($pin):" \
         "tests/test_setup.py::test_installed_torch_is_the_pin fails for that alone"
fi

if [ -z "$out" ]; then out="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")" || exit 2; fi
mkdir -p "$out" && out="$(cd "$out" && pwd)" || exit 2
printf '%s\n' "$gpus" "$facts" > "$out/machine.txt"

# --- the model ------------------------------------------------------------------------------------------------
echo "== model"
if ! "$PYTHON" -m lib.modeling.fetch --check; then
    echo "gpu_check: the model file is missing or wrong: run \`make setup\` (or \`$PYTHON -m lib.modeling.fetch\`) from $REPO" >&2
    exit 2
fi
"$PYTHON" -c "from lib.modeling.llama import build_smollm2_cache; build_smollm2_cache()" >/dev/null || exit 2  # once, not per notebook

# --- the notebooks --------------------------------------------------------------------------------------------
nb_summary="notebooks: not run" nb_ok=1
if [ "$notebooks" = 1 ]; then
    echo "== notebooks (executed copies in $out/notebooks)"
    paths=()
    all_weeks="$("$PYTHON" -m grader.course_map weeks)" || exit 2  # the course's weeks: grader/course_map.py
    for week in ${weeks:-$all_weeks}; do
        found=(solutions/"$week"/*.ipynb)
        if [ ! -e "${found[0]}" ]; then echo "gpu_check: no notebook in solutions/$week" >&2; exit 2; fi
        paths+=("${found[@]}")
    done
    "$PYTHON" tools/run_notebooks.py --jobs "$jobs" --timeout "$timeout" --out "$out/notebooks" "${paths[@]}" \
        2>&1 | tee "$out/notebooks.log"
    nb_rc=${PIPESTATUS[0]}
    passed="$(grep -c '^PASS ' "$out/notebooks.log")"
    nb_summary="notebooks $passed/${#paths[@]} passed"
    [ "$nb_rc" = 0 ] && [ "$passed" = "${#paths[@]}" ] || nb_ok=0
fi

# --- the tests ------------------------------------------------------------------------------------------------
py_summary="pytest: not run" py_ok=1
if [ "$tests" = 1 ]; then
    echo "== pytest -m \"not notebook and not commands\" (log: $out/pytest.log)"
    args=(-m "not notebook and not commands" -q -rfEs --junitxml "$out/pytest.xml")
    [ -n "$kexpr" ] && args+=(-k "$kexpr")
    "$PYTHON" -m pytest "${args[@]}" "${extra[@]}" 2>&1 | tee "$out/pytest.log"
    py_rc=${PIPESTATUS[0]}
    py_summary="$("$PYTHON" - "$out/pytest.xml" "$py_rc" <<'EOF'
import sys
import xml.etree.ElementTree as ET
path, rc = sys.argv[1], int(sys.argv[2])
try:
    suites = ET.parse(path).getroot()
except (OSError, ET.ParseError):
    print(f"pytest: exit status {rc}, no report"); sys.exit(0)
n = {k: 0 for k in ("tests", "failures", "errors", "skipped")}
for suite in suites.iter("testsuite"):
    for k in n:
        n[k] += int(suite.get(k, 0))
passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
text = f"pytest: {passed} passed, {n['skipped']} skipped, {n['failures'] + n['errors']} failed"
print(text + ("" if rc in (0, 1) else f" (exit status {rc}{': no tests ran' if rc == 5 else ''})"))
EOF
)"
    [ "$py_rc" = 0 ] || py_ok=0
fi

echo "gpu_check: $nb_summary, $py_summary — $device, torch $torch_version" | tee "$out/summary.txt"
echo "gpu_check: logs, executed notebooks and pytest.xml in $out"
[ "$nb_ok" = 1 ] && [ "$py_ok" = 1 ]
