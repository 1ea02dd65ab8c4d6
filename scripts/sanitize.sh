#!/usr/bin/env bash
# compute-sanitizer over scripts/sanitize_cases.py, one tool at a time; prints each
# tool's summary line. Usage on a GPU machine from the checkout:
#   bash scripts/sanitize.sh [memcheck racecheck synccheck initcheck]
set -uo pipefail
export PYTHONPATH=. CUPY_CACHE_DIR="${CUPY_CACHE_DIR:-$PWD/.cupy_cache}"
python3 scripts/sanitize_cases.py > /dev/null  # compile outside the sanitizer
tools=("$@"); [ ${#tools[@]} -eq 0 ] && tools=(memcheck racecheck synccheck initcheck)
for tool in "${tools[@]}"; do
    echo "== $tool"
    compute-sanitizer --tool "$tool" --print-limit 20 python3 scripts/sanitize_cases.py 2>&1 | tail -4
done
