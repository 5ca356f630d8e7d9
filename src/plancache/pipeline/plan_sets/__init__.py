"""Plan sets in the flows: signed at push time, audited in verify/ls/prune, read once per node at
boot."""
