#!/bin/sh
# Run a PoC against the new code (this worktree's src) and the old (6a1747b in /tmp/old48b).
here=$(cd "$(dirname "$0")/.." && pwd)
for code in "$here/src" /tmp/old48b/src; do
  PYTHONPATH="$code" /work/main/.venv/bin/python "$@"
done
