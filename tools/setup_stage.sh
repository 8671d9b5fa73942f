#!/usr/bin/env bash
# One stage of `make setup`, with a line before it, a line every 30 s while pip works quietly, and a line after it:
# how long it took and how big the venv is. Usage: tools/setup_stage.sh "LABEL" VENV COMMAND [ARGS...]
set -u
label=$1 venv=$2
shift 2
start=$(date +%s)
size() { du -sh "$venv" 2>/dev/null | cut -f1; }
echo "make setup: $label ..."
( while sleep 30; do echo "make setup:   $label: $(( $(date +%s) - start )) s so far, $venv is $(size)"; done ) &
beat=$!
"$@"
rc=$?
kill "$beat" 2>/dev/null
wait "$beat" 2>/dev/null
if [ "$rc" = 0 ]; then outcome=done; else outcome="FAILED (exit status $rc)"; fi
echo "make setup: $label: $outcome in $(( $(date +%s) - start )) s; $venv is $(size)"
exit "$rc"
