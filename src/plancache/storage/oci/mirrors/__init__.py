"""A registry's mirror from the node's own configuration: containerd's ``hosts.toml``
(:mod:`.containerd_hosts`), containers' ``registries.conf`` (:mod:`.registries_conf`), which
one applies (:mod:`.mirror_choice`) and how their files are read (:mod:`.mirror_hosts`).

A folder of its own because these modules read configuration files written for the container
runtime, not the registry's answers: what they share is the file reading (capped, strict) and
the one shape they produce, :class:`.mirror_hosts.MirrorHost`.
"""
