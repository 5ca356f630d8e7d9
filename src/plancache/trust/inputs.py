"""The inputs of a key, signed in the clear: what a plan's fingerprint and a compile cache's
directory name were computed from, so that a node that misses can be told which input differs.

Why here, in the trust core: these values come from statements and manifests, which are hostile
until verified, and are compared with this node's own values. Only the *verified* statement's or
manifest's inputs are evidence (an unsigned claim costs an attacker nothing); this module checks
their shape (bounded, JSON scalars, plain names) and compares them, with no IO.

- Plan fingerprint inputs are exactly the dictionary vLLM's ``compute_plan_fingerprint`` hashes
  (``schema``, ``vllm``, ``vllm_config``, device name/memory/capability, ``torch``, ``cuda``,
  ``rank``, ``world_size``): :func:`fingerprint_of_inputs` recomputes vLLM's digest from them, so
  inputs that do not reproduce their fingerprint are never signed (and are shown as such).
- Compile-cache key factors are what vLLM writes to ``cache_key_factors.json`` (``env``: the
  environment variables it hashes, ``config_hash``, ``code_hash``, ``compiler_hash``).

Why keyed hashes: vLLM hashes every environment variable it knows but a few, so its factors hold
host names, paths, URLs (``VLLM_BUILD_URL=https://user:token@…``) and whatever a later vLLM adds,
and a manifest goes to a shared bucket. A signed manifest keeps in the clear only the digests and
the compile settings of :data:`CLEAR_ENV` with plain values (:func:`keyed_factors`); every other
value is redacted, then HMAC-SHA256-keyed with a random salt the manifest records
(:data:`SALT_KEY`): a node holding a value can compare it (:func:`differences`), nobody can
precompute a table, and equal values in two manifests do not look alike. A short value can still
be guessed one salt at a time: what must stay secret is never in the factors vLLM writes.
Plan inputs need none of this: they are vLLM's ten fingerprint factors (versions, device, hashes,
rank), named in :data:`PLAN_INPUT_KEYS`, and are signed only if they reproduce the fingerprint.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from .display import redact, safe_text
from .errors import Reason, Rejected

MAX_ITEMS = 512
"""Entries in one inputs object, nested ones counted (vLLM 0.33 hashes ~120 environment
variables)."""
MAX_TEXT = 1024
MAX_DEPTH = 3
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,127}")
_SECRET = re.compile(r"(^|_)(KEY|TOKEN|AUTH)$|SECRET|PASSW|CREDENTIAL|PRIVATE", re.IGNORECASE)
"""Names whose values this node's comparable form hashes (:func:`without_secrets`), as manifests
signed before keyed hashes did (``…_KEY``, ``…_TOKEN``, ``…SECRET…``; ``…_TOKENS`` and
``…_TOKEN_THRESHOLD`` are counts). A pattern can only guess: what is signed now is an allow-list."""
_HASHED = re.compile(r"sha256:[0-9a-f]{64}")

PLAN_INPUT_KEYS = (
    "schema",
    "vllm",
    "vllm_config",
    "device_name",
    "device_total_memory",
    "device_capability",
    "torch",
    "cuda",
    "rank",
    "world_size",
)
"""vLLM 0.33's ``compute_plan_fingerprint`` factors, in its order."""

SALT_KEY = "hmac_salt"
"""Where signed key factors carry their salt (32 lowercase hex, new for each manifest): beside
the values it keys, so it goes wherever they go (a verified outcome, a boot record), and a
manifest that has it still parses on every version since issue 20 (a plain name, a string)."""
KEYED = "hmac-sha256:"
_SALT = re.compile(r"[0-9a-f]{32}")
_PLAIN = re.compile(r"[A-Za-z0-9_.,+-]{0,64}")
"""A value an allow-listed name may show: a flag, a size, an enum, ``4,4,4``; no ``/``, ``:``,
``@`` or space, so never a path, a URL or a sentence (those are keyed even under a known name)."""
_HEX = re.compile(r"[0-9a-f]{1,128}")
CLEAR_DIGESTS = frozenset({"config_hash", "code_hash", "compiler_hash"})
"""The top-level digests of ``cache_key_factors.json`` (vLLM's ``VllmBackend.__call__``): hex,
shown."""
_COMPILE_SETTINGS = """
ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE ALLREDUCE_USE_FLASHINFER ALLREDUCE_USE_SYMM_MEM
B12X_MOE_FP4_FORCE_A16 BATCH_INVARIANT BLOCKSCALE_FP8_GEMM_FLASHINFER
COHERE2_ATTN_MOE_DUAL_STREAM_TOKEN_THRESHOLD COMPILE_CACHE_SAVE_FORMAT COMPUTE_NANS_IN_LOGITS
CPU_ATTN_SPLIT_KV CPU_INT4_W4A8 CPU_NUM_OF_RESERVED_CPU CPU_OMP_THREADS_BIND DBO_COMM_SMS
DCP_Q_REPLICATE DEEPEPLL_NVFP4_DISPATCH DEEP_GEMM_WARMUP DISABLED_KERNELS DISABLE_COMPILE_CACHE
DISABLE_DSV4_MEGAMOE_SHARED_EXPERT_FUSION DISABLE_PYNCCL DISABLE_SHARED_EXPERTS_STREAM
DISTRIBUTED_USE_SPLIT_GROUP ENABLE_CUDAGRAPH_GC ENABLE_FLA_PACKED_RECURRENT_DECODE ENABLE_GEMM_RS
ENABLE_HPC_OPS ENABLE_INDUCTOR_COORDINATE_DESCENT_TUNING ENABLE_INDUCTOR_MAX_AUTOTUNE
ENABLE_PREGRAD_PASSES FLASHINFER_ALLREDUCE_BACKEND FLASHINFER_MOE_A2A_LOW_PRECISION_COMBINE
FLASHINFER_WORKSPACE_BUFFER_SIZE FLOAT32_MATMUL_PRECISION GDN_DECODE_KERNEL HAS_FLASHINFER_CUBIN
HUMMING_MOE_GEMM_TYPE KIMI_K3_AUX_ATTN_RES_STREAM KIMI_K3_GEMM_AR KIMI_K3_SHARD_SP_SHARED_EXPERT
KV_CACHE_LAYOUT LORA_ENABLE_DUAL_STREAM MAIN_CUDA_VERSION MARLIN_INPUT_DTYPE MARLIN_USE_ATOMIC_ADD
MAX_TOKENS_PER_EXPERT_FP4_MOE MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS MLA_DISABLE
MOE_ROUTING_SIMULATION_STRATEGY MOE_SKIP_PADDING MOE_USE_DEEP_GEMM MULTI_STREAM_GEMM_TOKEN_THRESHOLD
MXFP4_EMULATION_DEQUANT_AT_LOAD MXFP8_EMULATION_DEQUANT_AT_LOAD PP_LAYER_PARTITION
RAISE_ON_LOGIT_NANS ROCM_AITER_MLA_ASM_PADDING ROCM_AITER_MOE_DISPATCH_POLICY
ROCM_FP8_MFMA_PAGE_ATTN ROCM_FP8_PADDING ROCM_MOE_PADDING ROCM_MUSE_MOE_ONLINE_QUANT
ROCM_MUSE_MOE_REDUCE_DTYPE ROCM_QUICK_REDUCE_CAST_BF16_TO_FP16 ROCM_QUICK_REDUCE_MAX_SIZE_BYTES_MB
ROCM_QUICK_REDUCE_MIN_SIZE_BYTES_MB ROCM_QUICK_REDUCE_QUANTIZATION
ROCM_QUICK_REDUCE_QUANTIZATION_MIN_SIZE_KB ROCM_SHUFFLE_KV_CACHE_LAYOUT ROCM_USE_AITER
ROCM_USE_AITER_CUSTOM_AR ROCM_USE_AITER_FP4BMM ROCM_USE_AITER_FP8BMM
ROCM_USE_AITER_FUSION_SHARED_EXPERTS ROCM_USE_AITER_LINEAR ROCM_USE_AITER_LINEAR_HIPBMM
ROCM_USE_AITER_MHA ROCM_USE_AITER_MLA ROCM_USE_AITER_MOE ROCM_USE_AITER_MOE_A4W4_DSV4
ROCM_USE_AITER_MOE_SITUV2 ROCM_USE_AITER_RMSNORM ROCM_USE_AITER_TRITON_GEMM
ROCM_USE_AITER_TRITON_ROPE ROCM_USE_AITER_TRITON_SPARSE_MLA ROCM_USE_AITER_UNIFIED_ATTENTION
ROCM_USE_SKINNY_GEMM SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD SKIP_PRECOMPILED_VERSION_SUFFIX
SSM_CONV_STATE_LAYOUT STEP5_SHARD_SP_SHARED_EXPERT TARGET_DEVICE TRITON_FORCE_FIRST_CONFIG
TRITON_USE_TD USE_AOT_COMPILE USE_BREAKABLE_CUDAGRAPH USE_BYTECODE_HOOK USE_DEEP_GEMM
USE_DEEP_GEMM_E8M0 USE_DEEP_GEMM_TMA_ALIGNED_SCALES USE_FLASHINFER_MOE_INT4 USE_FLASHINFER_SAMPLER
USE_FUSED_MOE_GROUPED_TOPK USE_HW_AGNOSTIC USE_LAYERNAME USE_MEGA_AOT_ARTIFACT USE_NCCL_SYMM_MEM
USE_OINK_OPS USE_PRECOMPILED USE_PRECOMPILED_RUST USE_SPINLOOP_EXT USE_STANDALONE_COMPILE
USE_TRITON_AWQ USE_V2_MODEL_RUNNER XLA_USE_SPMD XPU_FORCE_N_CONTIG_WEIGHT XPU_INC_WNA16_BACKEND
XPU_PP_MICROBATCH XPU_USE_SAMPLER_KERNEL
"""
CLEAR_ENV = frozenset("VLLM_" + name for name in _COMPILE_SETTINGS.split())
"""The variables of vLLM 0.33's ``envs.compile_factors()`` that select how a graph is compiled
(compile/AOT/inductor switches, kernels, backends, layouts, precisions, device): parsed by vLLM
into flags, numbers and enums, known not to be secret. Hosts, ports, paths, URLs, build
metadata, free text and any name a later vLLM adds are keyed instead."""


def _check(value: object, what: str, depth: int, budget: list[int]) -> object:
    """``value`` checked, one entry counted against ``budget`` (shared by the whole object)."""
    budget[0] -= 1
    if budget[0] < 0:
        raise Rejected(Reason.TOO_LARGE, f"{what}: more than {MAX_ITEMS} entries")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise Rejected(Reason.MALFORMED, f"{what}: a number is not finite")
        return value
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise Rejected(
                Reason.TOO_LARGE, f"{what}: a value is longer than {MAX_TEXT} characters"
            )
        return value
    if isinstance(value, list) and depth < MAX_DEPTH:
        return [_check(v, what, depth + 1, budget) for v in value]
    if isinstance(value, dict) and depth < MAX_DEPTH:
        return _check_object(value, what, depth, budget)
    raise Rejected(
        Reason.MALFORMED,
        f"{what}: a value is not a JSON scalar, list or object (or nests too deep)",
    )


def _check_object(
    value: dict[object, object], what: str, depth: int, budget: list[int]
) -> dict[str, Any]:
    """An object's entries checked: plain names, values as :func:`_check` takes them."""
    out: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not _NAME.fullmatch(key):
            raise Rejected(Reason.MALFORMED, f"{what}: '{safe_text(key, 60)}' is not a plain name")
        out[key] = _check(item, what, depth + 1, budget)
    return out


def check_inputs(inputs: object, what: str = "inputs") -> dict[str, Any]:
    """A bounded JSON object of plain names and scalars (lists/objects nested at most 3 deep):
    the same rule for signing and for verifying.

    Raises:
        Rejected: ``malformed`` (not an object, a name not plain, a number not finite, a value
            not a JSON scalar, list or object, or nested too deep), ``too-large`` (more than
            :data:`MAX_ITEMS` entries, or a value longer than :data:`MAX_TEXT` characters).
    """
    if not isinstance(inputs, dict):
        raise Rejected(Reason.MALFORMED, f"{what} is not an object")
    return _check_object(inputs, what, 0, [MAX_ITEMS])  # the object itself is the first entry


def fingerprint_of_inputs(inputs: Mapping[str, Any]) -> str:
    """vLLM 0.33's digest of its fingerprint factors (``compute_plan_fingerprint``)."""
    return hashlib.sha256(json.dumps(dict(inputs), sort_keys=True).encode()).hexdigest()[:16]


def _redacted(value: object) -> object:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    return value


def without_secrets(factors: Mapping[str, Any]) -> dict[str, Any]:
    """This node's own factors in the form it compares (never the form it signs: see
    :func:`keyed_factors`): credentials in values masked (:func:`redact`), and a value whose name
    looks like a secret replaced by its sha256 (``sha256:<hex>``), at any depth, as manifests
    signed before keyed hashes recorded them, so that those still compare."""
    out: dict[str, Any] = {}
    for key, value in factors.items():
        if isinstance(value, dict):
            out[key] = without_secrets(value)
        elif (
            _SECRET.search(key)
            and value not in (None, "", False)
            and not (isinstance(value, str) and _HASHED.fullmatch(value))
        ):  # hashed once, never twice
            out[key] = "sha256:" + hashlib.sha256(str(value).encode()).hexdigest()
        else:
            out[key] = _redacted(value)
    return out


def new_salt() -> str:
    """A fresh salt for one manifest's keyed factors (128 random bits)."""
    import secrets  # here: the trust core's every reader would import random's seeding for it

    return secrets.token_hex(16)


def salt_of(factors: Mapping[str, Any] | None) -> str | None:
    """The salt signed factors were keyed with (None: older factors, values as they were signed)."""
    salt = (factors or {}).get(SALT_KEY)
    return salt if isinstance(salt, str) and _SALT.fullmatch(salt) else None


def keyed(value: object, salt: str) -> str:
    """``hmac-sha256:<hex>`` of the value's canonical JSON (credentials masked first) under
    ``salt``: equal values under one salt compare equal; without the value nothing reads it
    back."""
    text = json.dumps(_redacted(value), sort_keys=True, separators=(",", ":"))
    return KEYED + hmac.new(bytes.fromhex(salt), text.encode(), hashlib.sha256).hexdigest()


def _plain(value: object) -> bool:
    if value is None or isinstance(value, (bool, int, float)):
        return True
    if isinstance(value, str):
        return _PLAIN.fullmatch(value) is not None
    return (
        isinstance(value, list)
        and len(value) <= 64
        and all(not isinstance(v, list) and _plain(v) for v in value)
    )


def _keyed_tree(value: object, salt: str, clear: frozenset[str] = frozenset()) -> object:
    if isinstance(value, dict):
        return {
            k: v if k in clear and _plain(v) else _keyed_tree(v, salt) for k, v in value.items()
        }
    return None if value is None else keyed(value, salt)


def keyed_factors(factors: Mapping[str, Any], salt: str) -> dict[str, Any]:
    """Compile-cache key factors as a manifest signs them: the digests (:data:`CLEAR_DIGESTS`,
    hex) and the compile settings of :data:`CLEAR_ENV` with plain values in the clear, an unset
    (``None``) value as it is, every other value :func:`keyed` under ``salt``, recorded as
    :data:`SALT_KEY`. Names stay readable (they are vLLM's), values do not.

    Raises:
        ValueError: ``salt`` is not 32 lowercase hex digits (a caller's bug: :func:`new_salt`
            makes them).
    """
    if not _SALT.fullmatch(salt):
        raise ValueError("a salt is 32 lowercase hex digits")
    out: dict[str, Any] = {}
    for key, value in factors.items():
        if key == SALT_KEY:
            continue
        if key in CLEAR_DIGESTS and isinstance(value, str) and _HEX.fullmatch(value):
            out[key] = value
        else:
            out[key] = _keyed_tree(value, salt, CLEAR_ENV if key == "env" else frozenset())
    out[SALT_KEY] = salt
    return out


def flatten(inputs: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"env": {"VLLM_PLUGINS": "x"}}`` -> ``{"env.VLLM_PLUGINS": "x"}``: one name per input."""
    flat: dict[str, Any] = {}
    for key, value in inputs.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def differences(signed: Mapping[str, Any], mine: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every input whose value differs, by flattened name: ``{"input", "signed", "here"}``; an
    input only one side has is ``None`` on the other. Sorted by name. Where ``signed`` holds a
    keyed value, this node's is keyed with the signed salt before comparing (and shown keyed):
    equal values compare equal, a differing one differs as two hashes."""
    a, b = flatten(signed), flatten(mine)
    salt = salt_of(signed)
    a.pop(SALT_KEY, None)
    b.pop(SALT_KEY, None)
    if salt is not None:
        b = {
            name: keyed(value, salt)
            if value is not None and isinstance(a.get(name), str) and a[name].startswith(KEYED)
            else value
            for name, value in b.items()
        }
    return [
        {"input": name, "signed": a.get(name), "here": b.get(name)}
        for name in sorted(set(a) | set(b))
        if a.get(name) != b.get(name)
    ]
