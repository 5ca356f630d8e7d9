"""Time at the edges of the calendar: a documented rejection or a pass, never an exception.

Dates in a statement are untrusted (and signed_at is the signer's clock); a statement that
expires on 9999-12-31 must not raise ``OverflowError`` in the verifier and abort a batch.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import plancache
from conftest import FP, NOW, keyring_of, make_signer, plan_bytes
from plancache.trust import envelope as dsse
from plancache.trust.errors import ConfigError, PlanCacheError, Reason
from plancache.trust.keyring.keyformat import openssh_line
from plancache.trust.keyring.keys import Ed25519Signer
from plancache.trust.keyring.trusted_keys_file import parse_trusted_keys
from plancache.trust.plans.plan import plan_name
from plancache.trust.signing import sign_plan
from plancache.trust.statement import Statement, format_time, parse_statement, parse_time
from plancache.trust.verify import verify_plan

NAME = plan_name(FP)
FIRST = "0001-01-01T00:00:00Z"
LAST = "9999-12-31T23:59:59Z"
UTC = timezone.utc
FIRST_DT = datetime(1, 1, 1, tzinfo=UTC)
LAST_DT = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)


def sidecar(signer: Ed25519Signer, signed_at: str, expires_at: str | None) -> bytes:
    """A statement carrying these exact time strings, signed by ``signer``."""
    data = plan_bytes()
    obj = json.loads(Statement(NAME, hashlib.sha256(data).hexdigest(), FP, NOW).to_json_bytes())
    obj["predicate"].update(signed_at=signed_at, expires_at=expires_at)
    payload = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    signature = dsse.Signature(signer.keyid, signer.sign(dsse.pae(dsse.PAYLOAD_TYPE, payload)))
    return dsse.encode(dsse.Envelope(dsse.PAYLOAD_TYPE, payload, (signature,)))


def outcome(
    signed_at: str, expires_at: str | None, now: datetime = NOW, **kwargs: object
) -> Reason | None:
    signer = make_signer()
    try:
        verify_plan(
            NAME,
            plan_bytes(),
            sidecar(signer, signed_at, expires_at),
            keyring_of(signer),
            now,
            **kwargs,
        )
    except PlanCacheError as exc:
        return exc.reason
    return None


def test_statement_dates_at_the_ends_of_the_calendar() -> None:
    assert outcome(format_time(NOW), LAST) is None
    assert outcome(FIRST, LAST) is None
    assert outcome(FIRST, None) is None
    assert outcome(LAST, None) is Reason.NOT_YET_VALID
    assert outcome(LAST, LAST) is Reason.NOT_YET_VALID
    assert outcome(format_time(NOW), FIRST) is Reason.EXPIRED
    assert outcome(FIRST, FIRST) is Reason.EXPIRED


def test_the_verifiers_clock_at_the_ends_of_the_calendar() -> None:
    assert outcome(FIRST, LAST, now=datetime(9999, 12, 31, 23, 58, tzinfo=UTC)) is None
    assert outcome(FIRST, None, now=LAST_DT) is None
    assert outcome(LAST, None, now=LAST_DT) is None
    assert outcome(FIRST, FIRST, now=LAST_DT) is Reason.EXPIRED
    assert outcome(format_time(NOW), None, now=FIRST_DT) is Reason.NOT_YET_VALID
    assert outcome(FIRST, None, now=FIRST_DT) is None


def test_clock_skew_as_large_as_timedelta_goes() -> None:
    assert outcome(LAST, FIRST, now=NOW, clock_skew=timedelta.max) is None
    assert outcome(LAST, FIRST, now=NOW, clock_skew=timedelta(0)) is Reason.NOT_YET_VALID


def test_key_windows_at_the_ends_of_the_calendar() -> None:
    signer = make_signer()
    sig = sidecar(signer, format_time(NOW), None)
    wide = parse_trusted_keys(
        f"valid-after={FIRST},valid-before={LAST} {openssh_line(signer.public)}\n", "k"
    )
    verify_plan(NAME, plan_bytes(), sig, wide, NOW)
    ended = parse_trusted_keys(
        f"valid-after={FIRST},valid-before=0001-01-01T00:00:01Z {openssh_line(signer.public)}\n",
        "k",
    )
    with pytest.raises(PlanCacheError) as info:
        verify_plan(NAME, plan_bytes(), sig, ended, NOW)
    assert info.value.reason is Reason.EXPIRED
    verify_plan(
        NAME,
        plan_bytes(),
        sig,
        keyring_of(signer, valid_after=FIRST_DT, valid_before=LAST_DT),
        LAST_DT - timedelta(seconds=1),
    )


def test_signing_at_the_ends_of_the_calendar_round_trips() -> None:
    """glibc's strftime writes year 1 as "1": such a statement would never verify again."""
    signer = make_signer()
    sig = sign_plan(NAME, plan_bytes(), signer, FIRST_DT, expires_at=LAST_DT)
    vp = verify_plan(NAME, plan_bytes(), sig, keyring_of(signer), FIRST_DT)
    assert vp.statement is not None and (vp.statement.signed_at, vp.statement.expires_at) == (
        FIRST_DT,
        LAST_DT,
    )
    assert format_time(FIRST_DT) == FIRST and format_time(LAST_DT) == LAST


def test_a_time_that_leaves_the_calendar_in_utc_is_a_config_error() -> None:
    west = timezone(timedelta(hours=-5))
    with pytest.raises(ConfigError):
        sign_plan(
            NAME,
            plan_bytes(),
            make_signer(),
            NOW,
            expires_at=datetime(9999, 12, 31, 23, 0, tzinfo=west),
        )
    assert format_time(datetime(2026, 1, 1, 0, 0, tzinfo=west)) == "2026-01-01T05:00:00Z"


_moments = st.datetimes(min_value=datetime.min, max_value=datetime.max, timezones=st.just(UTC)).map(
    lambda d: d.replace(microsecond=0)
)


@settings(max_examples=300, deadline=None)
@given(_moments, st.none() | _moments, _moments, st.none() | _moments, st.none() | _moments)
def test_fuzz_dates_never_escape_as_anything_but_a_reason(
    signed_at: datetime,
    expires_at: datetime | None,
    now: datetime,
    after: datetime | None,
    before: datetime | None,
) -> None:
    signer = make_signer()
    sig = sidecar(
        signer, format_time(signed_at), None if expires_at is None else format_time(expires_at)
    )
    keyring = keyring_of(
        signer,
        **{k: v for k, v in (("valid_after", after), ("valid_before", before)) if v is not None},
    )
    try:
        vp = verify_plan(NAME, plan_bytes(), sig, keyring, now)
    except PlanCacheError as exc:
        reason = exc.reason  # either outcome is allowed: checked below, whichever came
    else:
        assert vp.statement is not None and vp.statement.signed_at == signed_at
        return
    assert reason in {Reason.EXPIRED, Reason.NOT_YET_VALID}


def _oldest_python() -> str | None:
    """An interpreter of the oldest Python that ``requires-python`` admits, if this machine has
    one that runs: beside the running one (pyenv keeps its versions side by side), or on the
    PATH (where a pyenv shim may name a version it will not run)."""
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    floor = re.search(r'requires-python = ">=([0-9]+[.][0-9]+)"', pyproject)
    assert floor is not None, "pyproject.toml names no requires-python floor"
    name = f"python{floor.group(1)}"
    beside = sorted(Path(sys.base_prefix).parent.glob(f"{floor.group(1)}.*/bin/{name}"))
    for python in [*map(str, beside), shutil.which(name)]:
        if python and subprocess.run([python, "-c", ""], capture_output=True).returncode == 0:
            return python
    return None


_READ_ON_ANOTHER_PYTHON = """
import json, sys
sys.path.insert(0, sys.argv[1])
from plancache.trust import envelope as dsse
from plancache.trust.errors import Rejected
from plancache.trust.statement import parse_statement, parse_time
def outcome(f, *args):
    try:
        return repr(f(*args))
    except Rejected as exc:
        return f"{exc.reason.value}: {exc.detail}"
sidecar = sys.stdin.buffer.read()
st = parse_statement(dsse.decode(sidecar).payload)
print(json.dumps([repr(st.signed_at), repr(st.expires_at), outcome(dsse.unb64, "QUJD\\n", "x"),
    outcome(parse_time, "2026-02-30T00:00:00Z", "t"), outcome(parse_time, LAST, "t")]))
"""


def test_the_oldest_python_allowed_reads_sidecars_and_times_as_this_one() -> None:
    """pyproject.toml admits Python 3.10, whose ``binascii.a2b_base64`` takes no
    ``strict_mode`` and whose ``datetime.fromisoformat`` reads no ``Z``: a reader written for
    3.11 raised TypeError on every sidecar there, and refused every statement's date (red team
    7d). The same bytes, read by the oldest Python and by this one, give the same answers."""
    python = _oldest_python()
    if python is None:
        pytest.skip("no interpreter of the oldest Python pyproject.toml admits")
    sig = sidecar(make_signer(), "2026-01-31T12:00:00Z", LAST)
    src = str(Path(plancache.__file__).parents[1])
    script = _READ_ON_ANOTHER_PYTHON.replace("LAST", repr(LAST))
    done = subprocess.run(
        [python, "-I", "-B", "-c", script, src], input=sig, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    st = parse_statement(dsse.decode(sig).payload)

    def here(f: Callable[..., object], *args: object) -> str:
        try:
            return repr(f(*args))
        except PlanCacheError as exc:
            return f"{exc.reason.value}: {exc.detail}"

    expected = [
        repr(st.signed_at),
        repr(st.expires_at),
        here(dsse.unb64, "QUJD\n", "x"),
        here(parse_time, "2026-02-30T00:00:00Z", "t"),
        here(parse_time, LAST, "t"),
    ]
    assert json.loads(done.stdout) == expected
    assert expected[0] == repr(datetime(2026, 1, 31, 12, tzinfo=UTC))
