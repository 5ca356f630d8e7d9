"""Fulcio extensions encoded wrongly (issue 48 items 3, 6), through the local stack.

Tried, each against `identity=SAN source-ref=refs/heads/main` (or as labelled), signed from
refs/heads/evil unless said: the deprecated raw .1.6 ref saying main (DER .1.14 left out); both
.1.6=main and .1.14=evil; two .1.14 extensions (evil, then main; main, then evil); .1.14 as
IA5String / PrintableString / raw bytes saying main; a DER UTF8String followed by junk; NUL and
newline inside the ref against exact and -regexp pins; an issuer .1.8 that is not UTF8String
beside a raw .1.1 naming the trusted issuer.
Expected: only a DER UTF8String .1.14 saying exactly refs/heads/main is valid."""
from harness import SAN, Env, github, report

e = Env()
iss = e.stack.issuer
PIN = f"sigstore issuer={iss} identity={SAN} source-ref=refs/heads/main\n"
REF14, REF6 = "1.3.6.1.4.1.57264.1.14", "1.3.6.1.4.1.57264.1.6"


def der(tag: int, text: bytes) -> bytes:
    return bytes([tag, len(text)]) + text


def signed(ref: str = "refs/heads/evil", replaced=None, extra=(), patch=None) -> bytes:
    s = e.stack
    s.replaced_extensions, s.extra_extensions, s.tbs_patch = dict(replaced or {}), list(extra), patch
    try:
        return e.sign(github(s, ref=ref))
    finally:
        s.replaced_extensions, s.extra_extensions, s.tbs_patch = {}, [], None


def oid_der(dotted: str) -> bytes:
    from cryptography.hazmat.primitives import serialization  # noqa: F401
    from cryptography import x509
    n = x509.ObjectIdentifier(dotted)
    # encode by hand
    parts = [int(p) for p in dotted.split(".")]
    body = bytes([40 * parts[0] + parts[1]])
    for p in parts[2:]:
        chunk = [p & 0x7F]
        p >>= 7
        while p:
            chunk.insert(0, 0x80 | (p & 0x7F))
            p >>= 7
        body += bytes(chunk)
    del n
    return bytes([6, len(body)]) + body


def attempt(label, make, text):
    try:
        sidecar = make()
    except Exception as exc:  # the real signer refused the certificate
        report(label, f"no bundle: sigstore-python's signer refused it ({str(exc)[-90:]})")
        return
    report(label, e.verdict(sidecar, text))


def dup_patch(tbs: bytes) -> bytes:  # placeholder .1.99 becomes a second .1.14
    return tbs.replace(oid_der("1.3.6.1.4.1.57264.1.99"), oid_der(REF14))


try:
    report("deprecated raw .1.6=main only (no .1.14)",
           e.verdict(signed(replaced={REF14: None}, extra=[(REF6, b"refs/heads/main")]), PIN))
    report("raw .1.6=main beside DER .1.14=evil",
           e.verdict(signed(extra=[(REF6, b"refs/heads/main")]), PIN))
    attempt("two .1.14: evil (claims) then main (patched in)",
            lambda: signed(extra=[("1.3.6.1.4.1.57264.1.99", der(0x0C, b"refs/heads/main"))], patch=dup_patch), PIN)
    attempt("two .1.14: main (claims) then evil",
            lambda: signed(ref="refs/heads/main", extra=[("1.3.6.1.4.1.57264.1.99", der(0x0C, b"refs/heads/evil"))], patch=dup_patch), PIN)
    for tag, kind in ((0x16, "IA5String"), (0x13, "PrintableString"), (0x1E, "BMPString-ish")):
        report(f".1.14 as {kind} 'refs/heads/main'",
               e.verdict(signed(replaced={REF14: der(tag, b"refs/heads/main")}), PIN))
    report(".1.14 raw bytes 'refs/heads/main' (v1 style)",
           e.verdict(signed(replaced={REF14: b"refs/heads/main"}), PIN))
    report(".1.14 UTF8String + trailing junk",
           e.verdict(signed(replaced={REF14: der(0x0C, b"refs/heads/main") + b"\x00\x00"}), PIN))
    report(".1.14 UTF8String long-form length (non-DER)",
           e.verdict(signed(replaced={REF14: b"\x0c\x81\x0frefs/heads/main"}), PIN))
    report(".1.14 = 'refs/heads/main\\x00evil' vs exact pin",
           e.verdict(signed(replaced={REF14: der(0x0C, b"refs/heads/main\x00evil")}), PIN))
    report(".1.14 = 'refs/heads/main\\n' vs exact pin",
           e.verdict(signed(replaced={REF14: der(0x0C, b"refs/heads/main\n")}), PIN))
    RX = f"sigstore issuer={iss} identity={SAN} source-ref-regexp=refs/heads/main$\n"
    report(".1.14 = 'refs/heads/main\\n' vs source-ref-regexp=refs/heads/main$",
           e.verdict(signed(replaced={REF14: der(0x0C, b"refs/heads/main\n")}), RX))
    RX2 = f"sigstore issuer={iss} identity={SAN} source-ref-regexp=refs/heads/[^/]+\n"
    report(".1.14 = 'refs/heads/x\\nrefs/heads/main' vs source-ref-regexp=refs/heads/[^/]+ (lax by the line's own choice)",
           e.verdict(signed(replaced={REF14: der(0x0C, b"refs/heads/x\nrefs/heads/main")}), RX2))
    # issuer: v2 not UTF8String, v1 raw names the trusted issuer
    v2 = "1.3.6.1.4.1.57264.1.8"
    LINE = f"sigstore issuer={iss} identity={SAN}\n"
    report("issuer .1.8 as IA5String (same text) + raw .1.1",
           e.verdict(signed(replaced={v2: der(0x16, iss.encode())}), LINE))
    report("issuer .1.8 = another issuer, .1.1 = the trusted one",
           e.verdict(signed(replaced={v2: der(0x0C, b"https://evil.example")}), LINE))
    report("issuer .1.8 left out, .1.1 = the trusted one",
           e.verdict(signed(replaced={v2: None}), LINE))
    report("issuer .1.8 with trailing slash",
           e.verdict(signed(replaced={v2: der(0x0C, (iss + "/").encode())}), LINE))
    report("issuer .1.8 with upper-case scheme/host",
           e.verdict(signed(replaced={v2: der(0x0C, iss.upper().encode())}), LINE))
finally:
    e.close()
