#!/usr/bin/env bash
# Runs a command that must fail within a time limit, and checks its combined output against regexes.
#   expect.sh SECONDS 'regex1' ['regex2' ...] -- command args...
set -uo pipefail
limit=$1; shift
patterns=()
while [ "$1" != "--" ]; do patterns+=("$1"); shift; done
shift
start=$SECONDS
out=$(timeout "$limit" "$@" 2>&1); rc=$?
elapsed=$((SECONDS - start))
echo "$out"
echo "exit code $rc after ${elapsed}s"
if [ $rc -eq 0 ]; then echo "EXPECTED A FAILURE"; exit 1; fi
if [ $rc -eq 124 ]; then echo "HUNG: still running after ${limit}s"; exit 1; fi
for p in "${patterns[@]}"; do
  grep -Eq -- "$p" <<<"$out" || { echo "MISSING in the output: $p"; exit 1; }
done
echo "failed as expected"
