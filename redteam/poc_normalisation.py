"""Normalisation that could make two identities one (issue 48 item 5), through the local stack
with SANs the attack chooses (the CA issues them as Fulcio would for a token naming them).

Tried against exact and regexp lines: host case vs path case; a Unicode host/e-mail domain whose
str.lower() is ASCII (KELVIN SIGN U+212A -> 'k'); userinfo and port in the URL; a trailing slash
and '.git' on a repository-shaped SAN; percent-encoding; NFC vs NFD; an e-mail local part in
another case; a SAN whose 'e-mail domain' fold turns a case-different ref into the trusted one.
Expected: only spellings that name the same identity compare equal."""
from cryptography import x509

from harness import Env, github, report

e = Env()
iss = e.stack.issuer


def with_sans(*names: x509.GeneralName) -> bytes:
    e.stack.san_override = list(names)
    try:
        return e.sign(e.stack.token("whoever"))
    finally:
        e.stack.san_override = None


def on(text: str) -> x509.OtherName:  # Sigstore's otherName SAN: a UTF8String, any text
    raw = text.encode()
    return x509.OtherName(x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.7"), b"\x0c" + bytes([len(raw)]) + raw)


U = x509.UniformResourceIdentifier
M = x509.RFC822Name
exact = lambda ident: f"sigstore issuer={iss} identity={ident}\n"  # noqa: E731
regexp = lambda rx: f"sigstore issuer={iss} identity-regexp={rx}\n"  # noqa: E731
T = "https://github.com/acme/serving/.github/workflows/bake.yml@refs/heads/main"
cases = [
    ("host case GitHub.com vs github.com (same identity)", [U(T.replace("github.com", "GitHub.com"))], exact(T)),
    ("path case ACME vs acme", [U(T.replace("acme", "ACME"))], exact(T)),
    ("userinfo: https://github.com@evil.example/...", [U(T.replace("github.com", "github.com@evil.example"))], exact(T)),
    ("port: https://github.com:443/...", [U(T.replace("github.com", "github.com:443"))], exact(T)),
    ("trailing slash on the SAN", [U(T + "/")], exact(T)),
    ("percent-encoded path (%2F)", [U(T.replace("acme/serving", "acme%2Fserving"))], exact(T)),
    ("ref 'main' vs 'refs/heads/main'", [U(T.replace("refs/heads/main", "main"))], exact(T)),
    ("KELVIN SIGN in an otherName URL host 'https://\u212aube.example/x' vs kube.example", None, exact("https://kube.example/x")),
    ("otherName 'alice@\u212aube.example' vs exact alice@kube.example", None, exact("alice@kube.example")),
    ("e-mail local part case: Alice@example.com vs alice@example.com", [M("Alice@example.com")], exact("alice@example.com")),
    ("e-mail domain case: alice@EXAMPLE.com vs alice@example.com (same mailbox)", [M("alice@EXAMPLE.com")], exact("alice@example.com")),
    ("NFD 'e\u0301' vs NFC '\u00e9' in an otherName", None, exact("r\u00e9lease!example.com")),
    ("regexp sees the host lowered: (?-i)https://GITHUB\\.com/.* vs GITHUB.com", [U(T.replace("github.com", "GITHUB.com"))], regexp(r"https://GITHUB\.com/.*")),
]
for label, sans, line in cases:
    if sans is None:
        if "alice@" in label:
            sans = [on("alice@\u212aube.example")]
        elif "NFD" in label:
            sans = [on("re\u0301lease!example.com")]
        else:
            sans = [on("https://\u212aube.example/x")]
    try:
        sidecar = with_sans(*sans)
    except Exception as exc:
        report(label, f"no certificate: {type(exc).__name__}: {str(exc)[:100]}")
        continue
    report(label, e.verdict(sidecar, line))
e.close()
