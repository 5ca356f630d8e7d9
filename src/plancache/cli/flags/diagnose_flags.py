"""Flags of the commands that diagnose a node: ``doctor``, ``fingerprint``, ``explain``.

One family because they answer "would a worker here use what is stored, and if not why", and
read vLLM's configuration or this machine's set-up to do so; their code is in :mod:`..diagnose`,
imported only when one of them runs. Three functions, because the commands are listed in the
order of ``plancache --help``, where ``demo`` and ``completion`` come between them.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..args import byte_count, positive_int
from ..flag_objects import add_store_options, add_trust_options
from .shared_flags import add_command, json_flag

if TYPE_CHECKING:
    from .shared_flags import Sub


def add_doctor(sub: Sub) -> None:
    p = add_command(
        sub,
        "doctor",
        "diagnose.doctor:cmd_doctor",
        "would a vLLM worker here apply a plan, and if not why",
        "Check this machine's set-up as a vLLM worker sees it: the plugin's entry point and "
        "VLLM_PLUGINS, VLLM_ENABLE_STARTUP_PLAN, vLLM's plan directory, trusted keys, signing key, "
        "the store (one listing within PLANCACHE_TIMEOUT), and what a worker would do with each "
        "local plan. Exit 0 when a worker here has all it needs, 1 otherwise, 2 on usage errors.",
    )
    p.add_argument(
        "--free-memory",
        type=byte_count,
        metavar="BYTES",
        help="free GPU memory to judge local plans against (default: only say each plan's "
        "baseline)",
    )
    p.add_argument(
        "--records",
        type=positive_int,
        default=5,
        metavar="N",
        help="show the last N boot records the plugin wrote under the cache root (default 5)",
    )
    p.add_argument(
        "--textfile",
        metavar="FILE",
        help="also write the last record of each rank as Prometheus gauges to FILE, atomically "
        "(node_exporter's textfile collector: DIR/plancache.prom)",
    )
    json_flag(p)


def add_fingerprint(sub: Sub) -> None:
    p = add_command(
        sub,
        "fingerprint",
        "diagnose.fingerprint:run",
        "print vLLM's plan fingerprint for every rank of a vllm serve configuration",
        "Print vLLM's own startup-plan fingerprint (compute_plan_fingerprint) for every rank of "
        "the configuration given by the vllm serve arguments after --. Needs the [vllm] extra. "
        "Device facts come from the local GPU unless given; torch/CUDA are this machine's.",
    )
    p.epilog = (
        "example: plancache fingerprint --device-name 'NVIDIA H100 80GB HBM3' "
        "--device-total-memory 85520809984 -- meta-llama/Llama-3.1-8B --tensor-parallel-size 2"
    )
    p.add_argument("--explain", action="store_true", help="print the factors vLLM hashes, per rank")
    p.add_argument("--json", action="store_true", help="print JSON (fingerprints and factors)")
    device_flags(p)
    p.add_argument("serve_args", nargs=argparse.REMAINDER, metavar="-- VLLM_SERVE_ARGS")


def device_flags(p: argparse.ArgumentParser) -> None:
    """The device facts vLLM hashes into a fingerprint, given instead of asking the local GPU
    (``fingerprint`` and ``explain`` compute the same fingerprints)."""
    p.add_argument(
        "--device-name", metavar="NAME", help="device name to hash instead of asking the local GPU"
    )
    p.add_argument(
        "--device-total-memory",
        type=positive_int,
        metavar="BYTES",
        help="device total memory to hash instead of asking the local GPU",
    )


def add_explain(sub: Sub) -> None:
    p = add_command(
        sub,
        "explain",
        "diagnose.explain_command:run",
        "per rank: would this node use a stored plan and compile cache, and if not which inputs "
        "differ",
        "For the vllm serve configuration after -- (taken as plancache fingerprint takes it) and a "
        "store URL or plan directory: verify what is stored, then say per rank whether a worker "
        "would apply a plan and load a compile cache; for a miss, the nearest verified candidates "
        "and exactly which inputs differ. Only signed, verified statements and manifests are "
        "compared. Compile caches: the store's, or for a directory those under --compile-root "
        "(default: the cache root above a startup_plan directory). Exit 0 every rank would use "
        "what is stored, 1 a miss, 2 usage, configuration or store error.",
    )
    p.epilog = (
        "example: plancache explain s3://bucket/plans --trusted-keys ci.pub -- /models/llama "
        "--tensor-parallel-size 2"
    )
    add_trust_options(p)
    add_store_options(p)
    p.add_argument(
        "--compile-root",
        metavar="ROOT",
        help="vLLM cache root whose compile caches to compare (directory locations only)",
    )
    device_flags(p)
    json_flag(p)
    p.add_argument("location", metavar="DIR|URL", help="plan directory or store URL")
    p.add_argument("serve_args", nargs=argparse.REMAINDER, metavar="-- VLLM_SERVE_ARGS")


def add_release(sub: Sub) -> None:
    p = add_command(
        sub,
        "release",
        "diagnose.release:cmd_release",
        "clear this node's hold-back of a plan (plan-exceeds-profile)",
        "A worker holds a signed plan back on its node (decision=profile "
        "reason=plan-exceeds-profile) after a boot that applied it died before the end of its "
        "start-up and the node's fresh profile came out more than 10 % smaller than the plan. "
        "This clears the hold (and any unfinished-boot note) for FINGERPRINT, so the next boot "
        "applies the plan again. Exit 0 when each was held back, 1 otherwise, 2 on usage errors.",
    )
    p.add_argument("fingerprint", nargs="*", metavar="FINGERPRINT", help="plan fingerprint(s)")
    p.add_argument("--all", action="store_true", help="release every plan held back here")
    p.add_argument(
        "--dir",
        metavar="DIR",
        help="the plan directory (default: vLLM's, $VLLM_CACHE_ROOT/startup_plan)",
    )
    json_flag(p)
