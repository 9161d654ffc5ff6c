#!/usr/bin/env bash
# ab.sh TRACE N [BASE_TREE]: N interleaved runs of analyze with the tree at BASE_TREE (a git worktree
# of an older commit, default /work/wtbase) and with this checkout; wall, CPU (user+sys: less
# swayed by other work on the machine than wall) and peak RSS per run
t=$(realpath "$1"); n=${2:-5}
here=$(cd "$(dirname "$0")/.." && pwd)  # before the cd: $0 may be relative
cd /tmp
for i in $(seq $n); do
  for side in base main; do
    d=${3:-/work/wtbase}; [ $side = main ] && d=$here
    PYTHONPATH=$d /usr/bin/time -f "$side %e s %U+%S cpu %M KB" python -c "import sys; sys.argv=['traceinsight','analyze','$t','-q','--force','-o','/tmp/ab_$side.html']; from traceinsight.cli import entry_point; entry_point()" 2>&1 | tail -1
  done
done
