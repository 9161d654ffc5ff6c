#!/bin/bash
# Run the current traceinsight on every trace of a folder; JSON to OUT (default $T/out), log with rc and time.
# usage: run_all.sh [TRACES=/work/foreign_traces] [OUT=$TRACES/out] [VENV=/work/venv-verdicts]
T=${1:-/work/foreign_traces}; O=${2:-$T/out}; V=${3:-/work/venv-verdicts}
. $V/bin/activate
mkdir -p $O
for f in $(ls $T | grep -E '\.(json|json\.gz|sqlite)$'); do
  n=${f%%.*}
  [ -s $O/$n.json ] && continue
  s=$(date +%s.%N)
  timeout 600 traceinsight analyze $T/$f --json $O/$n.json --no-html -q --force > $O/$n.log 2>&1; rc=$?
  e=$(date +%s.%N)
  echo "$n rc=$rc t=$(echo "$e - $s" | bc)" | tee -a $O/runs.txt
done
