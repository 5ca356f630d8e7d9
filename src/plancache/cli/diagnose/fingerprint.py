"""``plancache fingerprint``: vLLM's own startup-plan fingerprint for every rank of a serve command.

Why: a plan is found only under the fingerprint a worker computes at boot, and that key hashes
things an operator cannot see from outside (vLLM's config hash, the device, the torch/CUDA
build, the rank). This command builds the configuration exactly as ``vllm serve`` does
(``AsyncEngineArgs`` parsing, ``create_engine_config(UsageContext.OPENAI_API_SERVER)``) and calls
vLLM's ``startup_plan.compute_plan_fingerprint(cfg, rank, world_size)`` for every rank
(world size = tensor x pipeline parallel), so CI can bake, and operators can check, the
fingerprints a fleet will look up. ``--explain`` shows the factors vLLM hashes.

Device facts come from the local accelerator unless ``--device-name`` / ``--device-total-memory``
pin them (they are set on the ``current_platform`` that vLLM's startup_plan itself asks). The
torch and CUDA versions are always this machine's: run the command where the serving stack is
installed. vLLM is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from ...trust.errors import ConfigError

EXIT_CONFIG = 2
NO_PLATFORM = (
    "; vLLM finds no GPU here. VLLM_TARGET_DEVICE=cpu lets it build the configuration, but the "
    "fingerprint then hashes this machine's CPU platform and torch build, so it cannot match a "
    "GPU node's: run this where the fleet's image runs (a node of its kind)"
)
"""Why a CPU box cannot stand in for a GPU node (issue 21 item 1): said, not papered over."""
NEEDS_VLLM = "plancache: fingerprint needs the [vllm] extra (pip install 'plancache[vllm]')"


@contextlib.contextmanager
def _pinned(platform: Any, name: str | None, total: int | None) -> Iterator[None]:
    """Pin the device facts on the very platform object vLLM's fingerprint asks, then restore."""
    saved = {
        k: platform.__dict__[k]
        for k in ("get_device_name", "get_device_total_memory")
        if k in platform.__dict__
    }
    try:
        if name is not None:
            platform.get_device_name = lambda device_id=0: name
        if total is not None:
            platform.get_device_total_memory = lambda device_id=0: total
        yield
    finally:
        for key in ("get_device_name", "get_device_total_memory"):
            if key in saved:
                setattr(platform, key, saved[key])
            elif key in platform.__dict__:
                delattr(platform, key)


def _engine_config(serve_args: list[str]) -> tuple[Any, list[str]]:
    """The VllmConfig ``vllm serve`` would build from these arguments, and the ones not used."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm serve")
    parser.add_argument("model_tag", nargs="?", help="the model, as vllm serve takes it")
    parser = AsyncEngineArgs.add_cli_args(parser)
    ns, unused = parser.parse_known_args(serve_args)
    if ns.model_tag is not None:
        ns.model = ns.model_tag  # what vllm serve does with its positional argument
    engine_args = AsyncEngineArgs.from_cli_args(ns)
    return engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER), unused


def fingerprints(
    serve_args: list[str], device_name: str | None = None, device_total_memory: int | None = None
) -> dict[str, Any]:
    """Fingerprint and factors for every rank; raises ImportError without vLLM."""
    return node_config(serve_args, device_name, device_total_memory)[0]


def node_config(
    serve_args: list[str], device_name: str | None = None, device_total_memory: int | None = None
) -> tuple[dict[str, Any], Any]:
    """:func:`fingerprints`, and the VllmConfig they were computed from (``plancache explain``)."""
    from vllm.v1.worker import startup_plan

    from ...vllm_plugin.adapter import (
        config_parts,
        fingerprint_inputs,
    )  # the plugin's reading of the same factors

    cfg, unused = _engine_config(serve_args)
    world_size = int(cfg.parallel_config.world_size)
    ranks = []
    with _pinned(startup_plan.current_platform, device_name, device_total_memory):
        for rank in range(world_size):
            factors = fingerprint_inputs(cfg, rank, world_size)
            fp = startup_plan.compute_plan_fingerprint(cfg, rank, world_size)
            ranks.append({"rank": rank, "fingerprint": fp, "factors": factors})
    return {
        "model": str(cfg.model_config.model),
        "tensor_parallel_size": int(cfg.parallel_config.tensor_parallel_size),
        "pipeline_parallel_size": int(cfg.parallel_config.pipeline_parallel_size),
        "world_size": world_size,
        "ranks": ranks,
        "config_parts": config_parts(cfg),
        "ignored_arguments": unused,
    }, cfg


def _first_line(exc: BaseException) -> str:
    """vLLM's and the hub's messages run over lines; one line is an error line (no ``\\x0a``)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def configure(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """The serve arguments after ``--`` -> (fingerprints of every rank, the VllmConfig), every
    failure one ConfigError line (shared by ``fingerprint`` and ``explain``).

    Raises:
        ConfigError: no serve arguments, vLLM not installed, no device to hash, the model's
            configuration unreadable, or arguments vLLM refuses (``config-error``).
    """
    serve = list(args.serve_args)
    if serve[:1] == ["--"]:
        serve = serve[1:]
    if not serve:
        raise ConfigError(
            "fingerprint: give the vllm serve arguments after --, e.g. -- MODEL "
            "--tensor-parallel-size 2"
        )
    # vLLM logs to stdout by default; the fingerprints are this command's stdout (--json).
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        import vllm  # noqa: F401 - only to tell a missing extra from a failing configuration
    except ImportError as exc:
        raise ConfigError(f"{NEEDS_VLLM.removeprefix('plancache: ')}: {exc}") from None
    try:
        result, cfg = node_config(serve, args.device_name, args.device_total_memory)
    except (NotImplementedError, RuntimeError) as exc:
        hint = (
            ""
            if args.device_name and args.device_total_memory
            else ("; without a local GPU give --device-name and --device-total-memory")
        )
        if "infer device type" in str(
            exc
        ):  # no GPU here, and vLLM was not told which platform to build for
            hint = NO_PLATFORM
        raise ConfigError(f"fingerprint: {type(exc).__name__}: {_first_line(exc)}{hint}") from None
    except (
        OSError
    ) as exc:  # the model's files: a hub id not in the local cache while offline, a bad path
        hub_offline = type(exc).__name__ == "LocalEntryNotFoundError" or os.environ.get(
            "HF_HUB_OFFLINE"
        )
        offline = "offline, " if hub_offline else ""
        raise ConfigError(
            f"fingerprint: cannot read the model's configuration ({_first_line(exc)}): {offline}a "
            "hub model id must be in the local Hugging Face cache ($HF_HOME); or give the model's "
            "local directory"
        ) from None
    except (ValueError, SystemExit) as exc:  # vLLM's own argument/config validation
        raise ConfigError(
            f"fingerprint: invalid vllm serve arguments: {_first_line(exc)}"
        ) from None
    if result["ignored_arguments"]:
        print(
            f"plancache: {args.command}: not engine arguments, ignored: "
            + " ".join(result["ignored_arguments"]),
            file=sys.stderr,
        )
    return result, cfg


def run(args: argparse.Namespace) -> int:
    result, _ = configure(args)
    if args.json:
        from ..output import report  # the shared top level (schema, command, ok) beside the result

        report(args, True, **result)
        return 0
    for entry in result["ranks"]:
        print(
            f"rank {entry['rank']}/{result['world_size']}  {entry['fingerprint']}  "
            f"startup_plan_{entry['fingerprint']}.json"
        )
        if args.explain:
            for key, value in entry["factors"].items():
                print(f"    {key:<20} {value}")
            print(f"    {'model (as hashed)':<20} {result['model']}")
    return 0
