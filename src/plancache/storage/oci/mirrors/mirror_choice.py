"""Which mirror the node's runtime configuration names for a registry: which file applies.

Looked up only when the store names no ``mirror``; the first that applies wins:

1. ``mirror_config=PATH``: a containerd hosts directory (``certs.d``, holding
   ``<host>/hosts.toml``), one ``hosts.toml``, or a ``registries.conf``; ``mirror_config=none``
   reads nothing;
2. containerd's: ``/etc/containerd/certs.d``, then ``/etc/docker/certs.d`` (containerd 2's CRI
   ``config_path`` when unset), the registry's own directory or ``_default``;
3. containers' (CRI-O, podman): ``$CONTAINERS_REGISTRIES_CONF``, else
   ``~/.config/containers/registries.conf``, else ``/etc/containers/registries.conf``, with
   their ``registries.conf.d`` drop-ins.

Why these two: a Kubernetes node runs containerd (its mirrors are ``hosts.toml`` files) or
CRI-O (OpenShift; ``registries.conf``, which podman shares). Docker's ``daemon.json``
``registry-mirrors`` applies to Docker Hub only, where no plancache store lives, and no
Kubernetes node has run dockerd since 1.24.

One mirror is used: the first the file lists that serves reads. containerd tries the next host
when one fails; plancache's reads run on a boot's deadline, so a failing mirror is the read's
outcome (one line), not a walk down the list.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ..registry_urls import Registry
from .containerd_hosts import hosts_dir_mirror, hosts_file_mirror
from .mirror_hosts import MAX_ENTRIES, MirrorHost
from .registries_conf import registries_conf_mirror

CONTAINERD_ROOTS = (Path("/etc/containerd/certs.d"), Path("/etc/docker/certs.d"))
REGISTRIES_CONF = Path("/etc/containers/registries.conf")
USER_REGISTRIES_CONF = Path(".config/containers/registries.conf")
REGISTRIES_ENV = "CONTAINERS_REGISTRIES_CONF"


def configured_mirror(
    registry: Registry, repository: str, mirror_config: str | None, env: Mapping[str, str]
) -> MirrorHost | None:
    """The mirror the node's configuration names for ``registry``/``repository``, if any.

    Raises:
        ConfigError: a configuration file that is unreadable or malformed, or that blocks the
            registry (registries.conf ``blocked``).
    """
    if mirror_config is not None:
        if mirror_config.lower() == "none":
            return None
        path = Path(mirror_config).expanduser()
        if path.is_dir():
            return hosts_dir_mirror(path, registry, repository)
        if path.name == "hosts.toml":
            return hosts_file_mirror(path, registry, repository, explicit=True)
        return registries_conf_mirror([path], registry, repository, explicit=True)
    for root in CONTAINERD_ROOTS:
        if root.is_dir():
            found = hosts_dir_mirror(root, registry, repository)
            if found is not None:
                return found
    named = bool(env.get(REGISTRIES_ENV))
    files = _registries_files(env)
    return registries_conf_mirror(files, registry, repository, explicit=named)


def _registries_files(env: Mapping[str, str]) -> list[Path]:
    """containers/image's order: the file (``$CONTAINERS_REGISTRIES_CONF`` must exist, as
    podman requires), then the drop-ins (``*.conf``, by name) of the system's directory and the
    user's, or only the user's beside a user's own file."""
    home = Path(env.get("HOME") or os.path.expanduser("~"))
    user = home / USER_REGISTRIES_CONF
    user_dir, system_dir = user.with_suffix(".conf.d"), REGISTRIES_CONF.with_suffix(".conf.d")
    if env.get(REGISTRIES_ENV):
        main, dirs = Path(env[REGISTRIES_ENV]), [system_dir, user_dir]
    elif user.is_file():
        main, dirs = user, [user_dir]
    else:
        main, dirs = REGISTRIES_CONF, [system_dir, user_dir]
    files = [main]
    for directory in dirs:
        try:
            names = sorted(p for p in directory.iterdir() if p.name.endswith(".conf"))
        except OSError:
            continue
        files += names[:MAX_ENTRIES]
    return files
