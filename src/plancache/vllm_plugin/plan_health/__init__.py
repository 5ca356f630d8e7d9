"""Plans that are right, not just signed (issue 49): the evidence a profiling boot signs with its
plan (:mod:`.measured`), and a node's own memory of the plans it tried (:mod:`.notes`,
:mod:`.node_memory`): no crash loop on a plan, and the margin left after applying one."""
