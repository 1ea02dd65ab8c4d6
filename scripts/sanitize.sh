#!/usr/bin/env bash
# compute-sanitizer, one tool at a time: first on the tool's planted bug
# (scripts/sanitize_cases.py --planted TOOL; it must report errors, or the tool is not
# live), then on the reduced suite (scripts/sanitize_cases.py; it must report none and
# run to its end).
# Prints each run's summary line and exits non-zero on any surprise.
# Usage on a GPU machine from the checkout (SANITIZE_PART=half: the float16 / bfloat16 wgmma
# cases of the suite alone):
#   [SANITIZE_PART=half] bash scripts/sanitize.sh [memcheck racecheck synccheck initcheck]
set -uo pipefail
export PYTHONPATH=. CUPY_CACHE_DIR="${CUPY_CACHE_DIR:-$PWD/.cupy_cache}"
part=(--part "${SANITIZE_PART:-all}")
# Compile outside the sanitizer; a suite that fails without one proves nothing under one.
if ! python3 scripts/sanitize_cases.py "${part[@]}" > /tmp/sanitize_cases.log 2>&1; then
    echo "the suite fails without a sanitizer:"; tail -25 /tmp/sanitize_cases.log; exit 1
fi
tail -1 /tmp/sanitize_cases.log
tools=("$@"); [ ${#tools[@]} -eq 0 ] && tools=(memcheck racecheck synccheck initcheck)
status=0
summary() { grep -E "ERROR SUMMARY|RACECHECK SUMMARY" | head -1; }  # the total precedes "N errors were not printed"
errors() { grep -oE "SUMMARY: [0-9]+" | grep -oE "[0-9]+$"; }
for tool in "${tools[@]}"; do
    planted=$(timeout 120 compute-sanitizer --tool "$tool" --print-limit 5 python3 scripts/sanitize_cases.py --planted "$tool" 2>&1 | summary)
    echo "== $tool, planted bug: $planted"
    [ "$(echo "$planted" | errors)" -gt 0 ] 2>/dev/null || { echo "   the planted bug was NOT found"; status=1; }
    suite=$(compute-sanitizer --tool "$tool" --print-limit 20 python3 scripts/sanitize_cases.py "${part[@]}" 2>&1 | tee "/tmp/sanitize_$tool.log" | summary)
    echo "== $tool, suite: $suite"
    [ "$(echo "$suite" | errors)" = "0" ] || { echo "   errors in the suite: /tmp/sanitize_$tool.log"; status=1; }
    # A clean summary counts only from a suite that ran to its end (its last line).
    grep -q "^sanitize cases:" "/tmp/sanitize_$tool.log" || {
        echo "   the suite did not run to its end under $tool:"; grep -v "^=====" "/tmp/sanitize_$tool.log" | tail -8; status=1; }
done
exit $status
