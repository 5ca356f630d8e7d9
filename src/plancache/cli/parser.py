"""The ``plancache`` command line, declared in one place: every command in the order ``plancache
--help`` lists them, every flag, its help, and the types its values parse to.

Declarations only. A command's code is named by its ``handler`` (``"module:function"`` under
:mod:`plancache.cli`) and imported by :mod:`plancache.cli.main` only when that command runs, so
``plancache pull`` does not import what ``verify``, ``push`` or ``demo`` need (process pools,
signing, temp dirs); ``plancache --help`` and shell completion (:mod:`plancache.cli.completion`)
build this parser whole, so this module imports argparse, the settings' names and
:mod:`plancache.cli.suggest`, nothing more. What the parsed flags become (a trust policy, a
signer, a store's options) is :mod:`plancache.cli.flag_objects`, imported by the commands that
use it: it reaches into the library, which a parser must not import.

Read top-down: the parser itself, the commands by family (a family shares what its commands
read or change, and the module their code lives in), then the flags several families share,
then the argument types.
"""

from __future__ import annotations

import argparse
import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from .. import __version__
from ..settings import (
    BOOT_TIMEOUT,
    BULK_TIMEOUT,
    DEFAULT_TIMEOUT,
    SIGNING_KEY_ENV,
    SIGSTORE_TRUSTED_ROOT_ENV,
    STORAGE_OPTIONS_ENV,
    TRUSTED_KEYS_ENV,
    URL_ENV,
    parse_duration,
    parse_key_value,
)
from .suggest import leaf_parser, unrecognized, with_suggestion

if TYPE_CHECKING:
    Sub = argparse._SubParsersAction["Parser"]
    """Where a command is added: the subcommands of ``plancache`` or of ``compile-cache``."""


# The parser: its errors, its top level, its commands in --help's order.


class Parser(argparse.ArgumentParser):
    """argparse, except that a usage error under ``--json`` also prints the JSON report."""

    json_requested = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault(
            "allow_abbrev", False
        )  # ``--trusted-key`` is a typo, never a prefix taken silently
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        """Leftover arguments are reported by the subcommand that was parsed, with the nearest
        option."""
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            leaf = leaf_parser(self, namespace)
            leaf.error(unrecognized(leaf, extras))
        return namespace

    def error(self, message: str) -> NoReturn:
        message = with_suggestion(message)
        if Parser.json_requested:
            from .output import document, print_json

            command = self.prog.split(" ", 1)[1] if " " in self.prog else ""
            print_json(
                document(
                    command, False, error=("usage-error", f"{message} (see {self.prog} --help)")
                )
            )
        # One line, like every other error (argparse would print the whole usage first).
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="plancache",
        description="Signed, shareable vLLM startup plans. Sign plans in CI, pull them verified "
        "on boot, audit them offline.",
        epilog="Exit codes: 0 ok; 1 a plan is invalid, unsigned or refused; 2 usage or "
        "configuration error. "
        "Every command explains itself with --help; --json prints one report (schema "
        "plancache.report/v1).",
    )
    parser.add_argument("--version", action="version", version=f"plancache {__version__}")
    debug(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_commands(sub)
    return parser


def add_commands(sub: Sub) -> None:
    """Every built-in command, in the order ``plancache --help`` lists them."""
    add_signing_commands(sub)
    add_audit_commands(sub)
    add_store_commands(sub)
    add_doctor(sub)
    add_release(sub)
    p = add_command(
        sub,
        "demo",
        "demo:run",
        "run the whole story in temporary directories",
        "CI bake (plans written as vLLM writes them, signed, pushed) -> a tampered plan in the "
        "store -> spot boot pull (verified) -> the gate's decision at two free-memory values. "
        "Touches nothing outside a temp dir, except the store given with --store.",
    )
    p.add_argument(
        "--store",
        metavar="URL",
        help="use this store instead of an embedded file:// one (the demo writes and then deletes "
        "two plans under it)",
    )
    p.add_argument(
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        default=[],
        help="storage option for --store (repeatable)",
    )
    p = add_command(
        sub,
        "completion",
        "completion:cmd_completion",
        "print shell completion code for bash or zsh",
        "Print the code that makes bash or zsh complete plancache's commands, options and choices "
        "(argcomplete; pip install 'plancache[completion]'). Load it from your shell's rc file:\n"
        '  bash: eval "$(plancache completion bash)"\n  zsh:  eval "$(plancache completion zsh)"',
    )
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("shell", choices=("bash", "zsh"), metavar="SHELL", help="bash or zsh")
    add_fingerprint(sub)
    add_explain(sub)
    add_compile_cache_commands(sub)


# The commands, by family.


def add_signing_commands(sub: Sub) -> None:
    """``keygen``, ``pubkey``, ``sign``: each works with a key reference or writes what a key
    signs, in place (code: :mod:`.plans.signing_commands`, :mod:`.keys_cmd` for ``pubkey``)."""
    p = add_command(
        sub,
        "keygen",
        "plans.signing_commands:cmd_keygen",
        "create an Ed25519 signing key (PATH) and its public key (PATH.pub)",
        "Write a new Ed25519 private key to PATH (PEM PKCS#8, mode 0600; encrypted when "
        "PLANCACHE_KEY_PASSPHRASE is set) and its OpenSSH public line to PATH.pub, which is itself "
        "a valid trusted-keys file.",
    )
    p.add_argument("path", metavar="PATH")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.add_argument("--comment", help="name recorded in PATH.pub (default: the file name)")
    p.add_argument(
        "--format",
        choices=("pem", "openssh"),
        default="pem",
        help="private key format: PEM PKCS#8 (default) or OpenSSH's, which ssh-keygen reads",
    )
    json_flag(p)

    p = add_command(
        sub,
        "pubkey",
        "keys_cmd:cmd_pubkey",
        "print the OpenSSH public key line of a key reference",
        "Print the ssh-ed25519 line of KEYREF's public key, ready for a trusted-keys file (or an "
        f"allowed_signers file after a principal). KEYREF is any --key form ({KEYREF_HELP}). The "
        "key id goes to stderr. For 'sigstore' (keyless): the 'sigstore issuer=... identity=...' "
        "line of the identity Fulcio certifies for this job's token (one certificate requested, "
        "nothing logged).",
    )
    p.add_argument(
        "keyref", metavar="KEYREF", nargs="?", help=f"{KEYREF_HELP} (default: ${SIGNING_KEY_ENV})"
    )
    p.add_argument("--name", help="name written after the key (the key's name in verify reports)")
    add_identity_token(p)
    json_flag(p)

    p = add_command(
        sub,
        "sign",
        "plans.signing_commands:cmd_sign",
        "sign every plan in DIR that lacks a valid signature by the key",
        "Sign each plan in DIR that lacks a valid signature by KEY. A plan already signed by other "
        "keys is co-signed (same statement, one more signature) only if that statement verifies "
        "under --trusted-keys and says what this command would sign; otherwise it is refused (exit "
        "1) unless --replace. Warns when the gate's conditions (gpu_memory_utilization, "
        "device_name, device_total_memory) are not recorded: without them a plan made at one "
        "setting is applied at another.",
    )
    p.add_argument("--key", metavar="KEYREF", help=f"{KEYREF_HELP} (default: ${SIGNING_KEY_ENV})")
    add_identity_token(p)
    new_signature_flags(p)
    add_cosign_options(p)
    json_flag(p)
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no summary line on stderr (the table or JSON and warnings stay)",
    )
    p.add_argument(
        "dir", nargs="?", metavar="DIR", help="plan directory (default: vLLM's plan directory)"
    )


def add_audit_commands(sub: Sub) -> None:
    """``verify``, ``ls``, ``inspect``: each reads plans where they lie (a directory, a store
    URL, one file) and reports on them, changing nothing (code: :mod:`.plans.offline`, the
    offline audit, and :mod:`.plans.inspect_command`)."""
    for name, summary, description in (
        (
            "verify",
            "verify every plan and signature (exit 1 if any is bad, or if there are none)",
            "Verify each plan against the trusted keys and print a table (or --json). Exit 0 if "
            "all are valid; 1 if any is invalid or unsigned, or if the location holds no plans "
            "(unless --allow-empty); 2 on errors, including a bucket or directory that does not "
            "exist.",
        ),
        (
            "ls",
            "list plans with their sizes, signers and status",
            "List plans: fingerprint, KV cache GiB, baseline GiB, signer, signed at, expiry, "
            "status. Without trusted keys, values are shown unverified. Exit 2 if the bucket or "
            "directory does not exist.",
        ),
    ):
        p = add_command(sub, name, f"plans.offline:cmd_{name}", summary, description)
        add_trust_options(p)
        json_flag(p)
        p.add_argument("--jobs", type=positive_int, help="worker processes (default: one per core)")
        add_store_options(p)
        quiet_flag(p)
        subject_flag(
            p,
            "list only what is attached to this image (oci:// stores)"
            if name == "ls"
            else "verify only what is attached to this image (oci:// stores)",
        )
        if name == "verify":
            p.add_argument(
                "--fingerprint",
                action="append",
                metavar="FP",
                help="verify only this plan (repeatable; one absent is a failure: missing)",
            )
            p.add_argument(
                "--allow-empty",
                action="store_true",
                help="a location without plans is not a failure",
            )
            p.add_argument(
                "--report",
                metavar="FILE",
                help="also write the JSON report to FILE, atomically (a failure report when the "
                "audit cannot run)",
            )
        p.add_argument(
            "location",
            nargs="?",
            metavar="DIR|URL",
            help="plan directory or store URL (default: vLLM's plan directory, "
            "$VLLM_CACHE_ROOT/startup_plan)",
        )

    p = add_command(
        sub,
        "inspect",
        "plans.inspect_command:cmd_inspect",
        "show one plan file and its signature in detail",
        "Show a plan (or its .sig) in detail: fields, envelope, statement, and, with trusted keys, "
        "the verification result. A Sigstore bundle (a keyless signature) shows its payload's "
        "statement, as claimed until it verifies. FILE may be a store URL, e.g. "
        "s3://bucket/prefix/startup_plan_<fp>.json.",
    )
    p.add_argument("file", metavar="FILE|URL")
    p.add_argument(
        "--trusted-keys", metavar="PATH", help=f"verify as well (default: ${TRUSTED_KEYS_ENV})"
    )
    add_trusted_root(p)
    add_store_options(p, f"budget of the fetch for a URL (default {DEFAULT_TIMEOUT:g} s)")
    subject_flag(p, "read the plan attached to this image (oci:// stores)")
    json_flag(p)


def add_store_commands(sub: Sub) -> None:
    """``push``, ``pull``, ``prune``: each takes a store URL and a budget for it, and changes
    something, a store or a plan directory (code: :mod:`.plans.remote`)."""
    p = add_command(
        sub,
        "push",
        "plans.remote:cmd_push",
        "sign (with --key) and upload plans to a store",
        "Upload the plans in DIR (or the --fingerprint ones) and their signatures to URL. With "
        "--key, plans lacking a valid signature by that key are signed first. Unsigned plans are "
        "refused unless --allow-unsigned. Objects the store already holds byte-identical are "
        "skipped. --dry-run signs and uploads nothing and says what would be.",
    )
    p.add_argument(
        "--key",
        metavar="KEYREF",
        help=f"sign first with this {KEYREF_HELP} (default: ${SIGNING_KEY_ENV})",
    )
    add_identity_token(p)
    p.add_argument(
        "--allow-unsigned", action="store_true", help="push plans without a signature too"
    )
    p.add_argument(
        "--fingerprint", action="append", metavar="FP", help="push only this plan (repeatable)"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="show what would be signed and uploaded; change nothing",
    )
    p.add_argument(
        "--set-replicas",
        type=int,
        default=1,
        metavar="N",
        help="with --key: copies of each plan set to write (a boot storm on Azure: see "
        "docs/boot-storm.md)",
    )
    new_signature_flags(p)
    add_cosign_options(p)
    add_store_options(p)
    subject_flag(
        p, "attach what is pushed to this image (oci:// stores: referrers API or tag schema)"
    )
    json_flag(p)
    quiet_flag(p)
    p.add_argument(
        "dir", nargs="?", metavar="DIR", help="plan directory (default: vLLM's plan directory)"
    )
    p.add_argument(
        "url",
        metavar="URL",
        help="store URL, e.g. s3://bucket/prefix, gs://bucket/prefix, file:///path",
    )

    p = add_command(
        sub,
        "pull",
        "plans.remote:cmd_pull",
        "fetch plans from a store, verify them, write the valid ones into DIR",
        "Fetch each plan (or the --fingerprint ones) and its signature, verify them against the "
        "trusted keys, and write only verified plans into DIR, atomically. Exit 0 all verified, 1 "
        "any rejected or missing, 2 usage, configuration or store error (including a bucket that "
        "does not exist).",
    )
    add_trust_options(p)
    p.add_argument(
        "--fingerprint", action="append", metavar="FP", help="pull only this plan (repeatable)"
    )
    add_store_options(
        p,
        f"end-to-end budget (default {DEFAULT_TIMEOUT:g} s with --fingerprint, else "
        f"{BULK_TIMEOUT:g} s, or {BOOT_TIMEOUT:g} s with --boot)",
    )
    p.add_argument(
        "--boot",
        action="store_true",
        help=f"on a boot's critical path: a whole-store pull's budget defaults to {BOOT_TIMEOUT:g} "
        "s",
    )
    subject_flag(p, "pull only what is attached to this image (oci:// stores)")
    json_flag(p)
    quiet_flag(p)
    p.add_argument("url", metavar="URL", help="store URL")
    p.add_argument(
        "dir", nargs="?", metavar="DIR", help="plan directory (default: vLLM's plan directory)"
    )

    p = add_command(
        sub,
        "prune",
        "plans.remote:cmd_prune",
        "delete old, unsigned, invalid or revoked plans from a store",
        "Delete plans (and their signatures) from URL: signed longer ago than --older-than; "
        "without a signature (--unsigned); that no longer verify because their signing key or "
        "sigstore identity is revoked (--revoked); or that fail verification for any reason but "
        "a store error (--invalid). A plan is deleted only if the store still holds the bytes "
        "that were judged (re-read and compared right before the delete, and on S3, GCS and Azure "
        "deleted only if still the version re-read: ETag or generation precondition, once the "
        "store has shown it honours one on a canary object; else refused unless "
        "--unconditional).",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--older-than",
        type=duration,
        metavar="DURATION",
        help="signed longer ago than this, e.g. 30d",
    )
    what.add_argument(
        "--revoked",
        action="store_true",
        help="signed only by keys or sigstore identities the trusted-keys file revokes (a file "
        "of @revoked lines alone will do)",
    )
    what.add_argument("--unsigned", action="store_true", help="plans without a signature sidecar")
    what.add_argument(
        "--invalid",
        action="store_true",
        help="plans that fail verification under the trusted keys (unsigned, tampered, expired, "
        "...)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="list what would be deleted, delete nothing"
    )
    p.add_argument(
        "--unconditional",
        action="store_true",
        help="delete after the re-read even where the store does not honour conditional deletes "
        "(checked before the first delete, else refused): a plan re-pushed in between may be "
        "deleted",
    )
    add_trust_options(p)
    add_store_options(p)
    subject_flag(
        p,
        "judge and delete only what is attached to this image (oci:// stores), e.g. a "
        "referrer that fails verification",
    )
    json_flag(p)
    quiet_flag(p)
    p.add_argument("url", metavar="URL", help="store URL")


def add_doctor(sub: Sub) -> None:
    """``doctor``, ``fingerprint``, ``explain`` (and ``release``, which clears what a boot
    held back) answer "would a worker here use what is stored, and if not why" (code:
    :mod:`.diagnose`); one function each, because ``plancache --help`` lists ``release``,
    ``demo`` and ``completion`` between them."""
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


def add_compile_cache_commands(sub: Sub) -> None:
    """``compile-cache ACTION``: every action works on vLLM's compile caches under one cache
    root (ROOT) and shares its flags, :func:`_cache_common` (code: :mod:`.compile_cache`)."""
    parser = sub.add_parser(
        "compile-cache",
        help="sign, verify, list, push and pull vLLM's torch.compile cache",
        description="vLLM's torch.compile/AOT cache under ROOT/torch_compile_cache, signed as a "
        "closed world (every file's path, size and sha256). Exit 0 all fine; 1 a cache rejected; 2 "
        "usage, configuration or store error.",
    )
    actions = parser.add_subparsers(dest="compile_command", metavar="ACTION", required=True)
    p = add_command(
        actions,
        "sign",
        "compile_cache:cmd_sign",
        "sign every cache directory as it is now (run where it was built)",
        None,
    )
    p.add_argument(
        "--key", metavar="KEY", help=f"private key reference (default: ${SIGNING_KEY_ENV})"
    )
    add_identity_token(p)
    p.add_argument(
        "--expires-in", type=duration, metavar="DURATION", help="signature lifetime, e.g. 30d"
    )
    p.add_argument("--comment", default="", help="free text recorded in the signed manifest")
    p.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="longest wait for each cache's node lock, held by a vLLM worker or another command "
        f"(default {BULK_TIMEOUT:g} s; past it the cache is an error, exit 2)",
    )
    _cache_common(p)
    p = add_command(
        actions,
        "verify",
        "compile_cache:cmd_verify",
        "verify every cache directory (exit 1 if any is bad)",
        None,
    )
    add_trust_options(p)
    _cache_common(p)
    p = add_command(
        actions,
        "ls",
        "compile_cache:cmd_ls",
        "list cache directories (verified with trusted keys, else as found)",
        None,
    )
    add_trust_options(p)
    _cache_common(p)
    for name, summary in (
        ("push", "upload verified caches: one archive and its signature each"),
        ("pull", "download, verify, extract and install caches"),
    ):
        p = add_command(
            actions,
            name,
            f"compile_cache:cmd_{name}",
            summary,
            f"The store URL is URL, --url or ${URL_ENV}; a lone positional is the URL when it has "
            "a scheme (s3://, gs://, file://, ...), else ROOT.",
        )
        add_trust_options(p)
        if name == "push":
            p.add_argument(
                "--key", metavar="KEY", help="verify with this signing key's own public key instead"
            )
        p.add_argument(
            "--url", metavar="URL", help=f"store URL, e.g. s3://bucket/prefix (default: ${URL_ENV})"
        )
        add_store_options(
            p,
            "overall budget of each store operation, and longest wait for each cache's node lock "
            f"(default {BULK_TIMEOUT:g} s)",
        )
        url_help = f"store URL, e.g. s3://bucket/prefix (default: --url, else ${URL_ENV})"
        if name == "pull":  # the order of plancache pull URL [DIR]
            p.add_argument("source", nargs="?", metavar="URL", help=url_help)
        _cache_common(p, name)
        if name == "push":  # the order of plancache push [DIR] URL
            p.add_argument("target", nargs="?", metavar="URL", help=url_help)


def _cache_common(p: argparse.ArgumentParser, name: str = "") -> None:
    p.add_argument(
        "--cache",
        action="append",
        metavar="NAME",
        help="only this cache, e.g. torch_aot_compile/<64 hex> (repeatable; default: all)",
    )
    json_flag(p)
    exists = "created if missing" if name == "pull" else "must exist"
    p.add_argument(
        "root",
        nargs="?",
        metavar="ROOT",
        help=f"vLLM's cache root (default: $VLLM_CACHE_ROOT or ~/.cache/vllm; {exists})",
    )


# Flags several families share, and how a command is declared (``add_command`` records the
# ``"module:function"`` it runs).

KEYREF_HELP = (
    "key reference: a private key file, env://VAR, pkcs11:…, awskms://…, gcpkms://…, sigstore"
)


def json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON report on stdout (schema plancache.report/v1), errors included",
    )


def subject_flag(p: argparse.ArgumentParser, text: str) -> None:
    """``--subject IMAGE``: an ``oci://`` store's storage option ``subject`` (docs/stores.md)."""
    p.add_argument("--subject", metavar="IMAGE", help=f"{text}: TAG, @sha256:..., or HOST/REPO:TAG")


def quiet_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def new_signature_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--expires-in",
        type=duration,
        metavar="DURATION",
        help="lifetime of new signatures, e.g. 30d, 12h",
    )
    p.add_argument("--comment", help="free text recorded in new signatures")
    p.add_argument(
        "--fact",
        type=key_value,
        action="append",
        metavar="KEY=VALUE",
        help="provenance fact recorded in new signatures, e.g. gpu_memory_utilization=0.9 "
        "(repeatable); gpu_memory_utilization, device_name and device_total_memory are the gate's "
        "conditions",
    )
    p.add_argument(
        "--inputs",
        metavar="FILE",
        help="plancache fingerprint --json's output: each plan whose fingerprint it lists gets "
        "that rank's fingerprint inputs in its new signature, in the clear (plancache explain)",
    )


def add_command(
    sub: Sub, name: str, handler: str, summary: str, description: str | None
) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=summary, description=description)
    p.set_defaults(handler=handler)
    debug(p, argparse.SUPPRESS)
    return p


def debug(p: argparse.ArgumentParser, default: object = False) -> None:
    """``--debug``, before or after the command: PLANCACHE_DEBUG=1 for this run (tracebacks of
    internal errors, the SDKs' own warnings; never their request logs, which carry tokens)."""
    p.add_argument(
        "--debug",
        action="store_true",
        default=default,
        help="show tracebacks of internal errors and the SDKs' warnings (as PLANCACHE_DEBUG=1)",
    )


def add_trust_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trusted-keys",
        metavar="PATH",
        help=f"trusted-keys file or directory of .pub files (default: ${TRUSTED_KEYS_ENV})",
    )
    parser.add_argument(
        "--threshold",
        type=positive_int,
        default=1,
        help="distinct trusted keys that must sign (default 1)",
    )
    add_trusted_root(parser)


def add_identity_token(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--identity-token",
        metavar="FILE",
        help="with --key sigstore: the OIDC token to sign with (default: $SIGSTORE_ID_TOKEN, "
        "else the CI's ambient token)",
    )


def add_trusted_root(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trusted-root",
        metavar="FILE",
        help=f"Sigstore trusted_root.json for sigstore identities (default: "
        f"${SIGSTORE_TRUSTED_ROOT_ENV}, else Sigstore's public-good root)",
    )


def add_cosign_options(parser: argparse.ArgumentParser) -> None:
    """What signing needs to co-sign safely: shared by ``sign`` and ``push --key``."""
    parser.add_argument(
        "--trusted-keys",
        metavar="PATH",
        help="an existing signature is co-signed only if it verifies under these keys and says "
        f"what this command would sign (default: ${TRUSTED_KEYS_ENV})",
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help="sign anew with this key alone where an existing signature cannot be adopted",
    )
    parser.add_argument(
        "--sign-cold",
        action="store_true",
        help="sign a plan whose boot the plugin saw compile cold (refused: cold-compile)",
    )
    add_trusted_root(parser)


def add_store_options(parser: argparse.ArgumentParser, timeout_help: str = "") -> None:
    """``--storage-option`` and ``--timeout``: shared by every command that takes a URL."""
    parser.add_argument(
        "--storage-option",
        type=key_value,
        action="append",
        metavar="KEY=VALUE",
        help="fsspec storage option, VALUE parsed as JSON where it parses, e.g. "
        "endpoint_url=http://127.0.0.1:9000 or anon=true (repeatable; wins over "
        f"${STORAGE_OPTIONS_ENV} and plancache's defaults)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help=timeout_help or f"overall budget of each store operation (default {BULK_TIMEOUT:g} s)",
    )
    s3 = parser.add_argument_group("S3 (as aws-cli names them; shorthands for storage options)")
    s3.add_argument(
        "--endpoint-url",
        metavar="URL",
        help="S3-compatible endpoint, e.g. http://minio:9000 (storage option endpoint_url)",
    )
    s3.add_argument(
        "--profile", metavar="NAME", help="AWS profile of ~/.aws/config (storage option profile)"
    )
    s3.add_argument(
        "--region", metavar="REGION", help="AWS region (storage option client_kwargs.region_name)"
    )


# Argument types: a flag's value parsed, or a usage error that says what was expected.


def duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``3600s``, ``2w`` -> timedelta, up to 100 years (argparse type;
    the rule is :func:`~plancache.settings.parse_duration`, which the plugin reads its
    environment with).

    Raises:
        argparse.ArgumentTypeError: not a positive whole number and a unit, or longer than 100
            years.
    """
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def key_value(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE parsed as JSON where it parses (argparse type).

    Raises:
        argparse.ArgumentTypeError: no ``=`` or an empty KEY, or a VALUE nested too deeply.
    """
    try:
        return parse_key_value(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    """A whole number of at least 1 (argparse type).

    Raises:
        argparse.ArgumentTypeError: not a whole number, or below 1.
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


_SIZE = re.compile(r"(\d+)\s*([KMGT]i?B?|B)?", re.IGNORECASE)


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "ki": 2**10,
    "kib": 2**10,
    "m": 1000**2,
    "mb": 1000**2,
    "mi": 2**20,
    "mib": 2**20,
    "g": 1000**3,
    "gb": 1000**3,
    "gi": 2**30,
    "gib": 2**30,
    "t": 1000**4,
    "tb": 1000**4,
    "ti": 2**40,
    "tib": 2**40,
}


def byte_count(text: str) -> int:
    """``85899345920`` or ``80GiB`` / ``80G`` (whole numbers; GiB = 2**30, GB = 10**9) -> bytes
    (argparse type).

    Raises:
        argparse.ArgumentTypeError: not a whole number with an optional known unit.
    """
    match = _SIZE.fullmatch(text.strip())
    unit = (match.group(2) or "").lower() if match else ""
    if not match or unit not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a byte count like 85899345920 or 80GiB")
    return int(match.group(1)) * _SIZE_UNITS[unit]
