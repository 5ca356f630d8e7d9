"""Reasons that blame the wrong party, and verdicts that depend on the order of lines.

Tried: an exact line against a branch main-old; an anchored expression against v1.2-rc1; a
fragment expression (unanchored); a SAN with a trailing newline against identity-regexp ...main$;
an expired exact line and a current expression covering it, in both orders; a revoked line and a
trusted one in both orders; a line trusted from another issuer.
Expected: the reason names what is wrong; the verdict is the same in either order."""
from cryptography import x509

from harness import SAN, Env, github, report

e = Env()
iss = e.stack.issuer
T = "https://github.com/acme/serving/.github/workflows/bake.yml@refs/heads/"


def with_san(text: str) -> bytes:
    e.stack.san_override = [x509.UniformResourceIdentifier(text)]
    try:
        return e.sign(e.stack.token("whoever"))
    finally:
        e.stack.san_override = None


report("exact ...@refs/heads/main vs main-old",
       e.verdict(with_san(T + "main-old"), f"sigstore issuer={iss} identity={T}main\n"))
report(r"anchored ...@refs/tags/v[0-9]+\.[0-9]+ vs v1.2-rc1",
       e.verdict(with_san(T.replace("heads/", "tags/") + "v1.2-rc1"),
                 f"sigstore issuer={iss} identity-regexp=https://github\\.com/acme/serving/\\.github/workflows/bake\\.yml@refs/tags/v[0-9]+\\.[0-9]+\n"))
report("fragment acme/serving/.* (unanchored)",
       e.verdict(with_san(T + "main"), f"sigstore issuer={iss} identity-regexp=acme/serving/.*\n"))
try:
    nl = with_san(T + "main\n")
    report("SAN with a trailing newline vs identity-regexp=...main$",
           e.verdict(nl, f"sigstore issuer={iss} identity-regexp=https://github\\.com/acme/serving/\\.github/workflows/bake\\.yml@refs/heads/main$\n"))
except Exception as exc:
    report("SAN with a trailing newline", f"no certificate: {type(exc).__name__}: {str(exc)[:80]}")
acme = e.sign(github(e.stack))
expired = f"name=old,valid-before=2020-01-01T00:00:00Z sigstore issuer={iss} identity={SAN}\n"
current = f"sigstore issuer={iss} identity-regexp=https://github\\.com/acme/.*\n"
report("expired exact line, then a current expression", e.verdict(acme, expired + current))
report("a current expression, then the expired exact line", e.verdict(acme, current + expired))
revoked = f"@revoked sigstore issuer={iss} identity={SAN}\n"
trusted = f"sigstore issuer={iss} identity={SAN}\n"
report("trusted then revoked", e.verdict(acme, trusted + revoked))
report("revoked then trusted", e.verdict(acme, revoked + trusted))
report("trusted from another issuer only",
       e.verdict(acme, f"sigstore issuer=https://gitlab.com identity={SAN}\n"))
e.close()
