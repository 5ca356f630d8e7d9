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
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any, Mapping

from .display import safe_text
from .errors import Reason, Rejected

MAX_ITEMS = 512
"""Entries in one inputs object, nested ones counted (vLLM 0.33 hashes ~120 environment variables)."""
MAX_TEXT = 1024
MAX_DEPTH = 3
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,127}")
_SECRET = re.compile(r"(^|_)(KEY|TOKEN|AUTH)$|SECRET|PASSW|CREDENTIAL|PRIVATE", re.IGNORECASE)
"""Names whose values are never written in the clear (vLLM already leaves out its API key and the
S3 credentials; a variable named like a secret, ``…_KEY``, ``…_TOKEN``, ``…SECRET…``, is hashed, so
a difference still shows; ``…_TOKENS`` and ``…_TOKEN_THRESHOLD`` are counts, left readable)."""
_HASHED = re.compile(r"sha256:[0-9a-f]{64}")

PLAN_INPUT_KEYS = ("schema", "vllm", "vllm_config", "device_name", "device_total_memory", "device_capability",
                   "torch", "cuda", "rank", "world_size")
"""vLLM 0.33's ``compute_plan_fingerprint`` factors, in its order."""


def _check(value: Any, what: str, depth: int, budget: list[int]) -> Any:
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
            raise Rejected(Reason.TOO_LARGE, f"{what}: a value is longer than {MAX_TEXT} characters")
        return value
    if isinstance(value, list) and depth < MAX_DEPTH:
        return [_check(v, what, depth + 1, budget) for v in value]
    if isinstance(value, dict) and depth < MAX_DEPTH:
        out = {}
        for key, item in value.items():
            if not isinstance(key, str) or not _NAME.fullmatch(key):
                raise Rejected(Reason.MALFORMED, f"{what}: '{safe_text(key, 60)}' is not a plain name")
            out[key] = _check(item, what, depth + 1, budget)
        return out
    raise Rejected(Reason.MALFORMED, f"{what}: a value is not a JSON scalar, list or object (or nests too deep)")


def check_inputs(inputs: object, what: str = "inputs") -> dict[str, Any]:
    """A bounded JSON object of plain names and scalars (lists/objects nested at most 3 deep),
    or ``Rejected(MALFORMED | TOO_LARGE)``: the same rule for signing and for verifying."""
    if not isinstance(inputs, dict):
        raise Rejected(Reason.MALFORMED, f"{what} is not an object")
    return _check(inputs, what, 0, [MAX_ITEMS + 1])  # type: ignore[no-any-return]


def fingerprint_of_inputs(inputs: Mapping[str, Any]) -> str:
    """vLLM 0.33's digest of its fingerprint factors (``compute_plan_fingerprint``)."""
    return hashlib.sha256(json.dumps(dict(inputs), sort_keys=True).encode()).hexdigest()[:16]


def without_secrets(factors: Mapping[str, Any]) -> dict[str, Any]:
    """``factors`` with every value whose name looks like a secret replaced by its sha256
    (``sha256:<hex>``), at any depth: comparable, never readable."""
    out: dict[str, Any] = {}
    for key, value in factors.items():
        if isinstance(value, dict):
            out[key] = without_secrets(value)
        elif _SECRET.search(key) and value not in (None, "", False) and not (
                isinstance(value, str) and _HASHED.fullmatch(value)):  # hashed once, never twice
            out[key] = "sha256:" + hashlib.sha256(str(value).encode()).hexdigest()
        else:
            out[key] = value
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
    input only one side has is ``None`` on the other. Sorted by name."""
    a, b = flatten(signed), flatten(mine)
    return [{"input": name, "signed": a.get(name), "here": b.get(name)}
            for name in sorted(set(a) | set(b)) if a.get(name) != b.get(name)]
