#!/bin/bash
# Run every proof of concept against the new code (this worktree) and the old (6a1747b).
cd "$(dirname "$0")/../.."
[ -d /tmp/old48/src ] || { mkdir -p /tmp/old48; git archive 6a1747b | tar -x -C /tmp/old48; }
for poc in redteam/keyless48a/poc_*.py; do
  for side in new old; do
    src=$PWD/src; [ $side = old ] && src=/tmp/old48/src
    echo "=== $poc [$side]"
    PYTHONPATH=$src /work/main/.venv/bin/python "$poc" 2>&1 | tail -40
  done
done
