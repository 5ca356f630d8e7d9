"""Lines a new user (or a typo) writes (issue 48 item 8), parsed by parse_trusted_keys.

Tried: quotes (double, single, empty, unbalanced, a '#' or space inside), a trailing '# comment',
one key twice, unknown keys, keys and the keyword in another case, an issuer without a scheme or
with another scheme, quotes in the options (name="..."), a tab between fields, a NUL/CR in a
value. Expected: every line is parsed to what it says or refused; nothing kept with its quotes."""
from harness import report
from plancache.trust.errors import PlanCacheError
from plancache.trust.keyring.trusted_keys_file import parse_trusted_keys

I = "https://token.actions.githubusercontent.com"
S = "https://github.com/acme/serving/.github/workflows/bake.yml@refs/heads/main"
lines = {
    "double quotes": f'sigstore issuer="{I}" identity="{S}"',
    "single quotes": f"sigstore issuer='{I}' identity='{S}'",
    "empty quotes": f'sigstore issuer="{I}" identity=""',
    "unbalanced quote": f'sigstore issuer="{I} identity={S}',
    "'#' inside quotes": f'sigstore issuer={I} identity="{S}#x"',
    "space inside quotes": f'sigstore issuer={I} identity="{S} x"',
    "trailing # comment": f"sigstore issuer={I} identity={S} # the bake job",
    "identity twice": f"sigstore issuer={I} identity={S} identity=https://evil",
    "identity and identity-regexp": f"sigstore issuer={I} identity={S} identity-regexp=.*",
    "unknown key (sourcerepository=)": f"sigstore issuer={I} identity={S} sourcerepository=x",
    "key in another case (Identity=)": f"sigstore issuer={I} Identity={S}",
    "keyword in another case (Sigstore)": f"Sigstore issuer={I} identity={S}",
    "@revoked + keyword SIGSTORE": f"@revoked SIGSTORE issuer={I} identity={S}",
    "issuer without scheme": f"sigstore issuer=token.actions.githubusercontent.com identity={S}",
    "issuer ftp://": f"sigstore issuer=ftp://x identity={S}",
    "issuer https:/x (one slash)": f"sigstore issuer=https:/token.actions.githubusercontent.com identity={S}",
    'name="bake job" in options': f'name="bake",valid-before=2027-01-01T00:00:00Z sigstore issuer={I} identity={S}',
    "tab between fields": f"sigstore\tissuer={I}\tidentity={S}",
    "CR at end (CRLF file)": f"sigstore issuer={I} identity={S}\r",
    "source-ref= and source-ref-regexp=": f"sigstore issuer={I} identity={S} source-ref=refs/heads/main source-ref-regexp=.*",
    "source-ref-regexp not compiling": f"sigstore issuer={I} identity={S} source-ref-regexp=(",
    "identity-regexp with (?i) flag": f"sigstore issuer={I} identity-regexp=(?i)https://github\\.com/acme/.*",
    "source-repository without scheme": f"sigstore issuer={I} identity={S} source-repository=github.com/acme/serving",
    "source-repository with .git": f"sigstore issuer={I} identity={S} source-repository=https://github.com/acme/serving.git",
    "source-ref=main (no refs/heads/)": f"sigstore issuer={I} identity={S} source-ref=main",
}
for label, line in lines.items():
    try:
        k = parse_trusted_keys(line + "\n", "trusted")
    except PlanCacheError as exc:
        report(label, f"refused: {exc.detail[:130]}")
        continue
    ids = k.identities
    if ids is None:
        report(label, f"NOT an identity line: keys={list(k.keys)} revoked={sorted(k.revoked)}")
        continue
    for t in ids.trusted:
        report(label, f"trusted issuer={t.issuer!r} identity={t.identity!r} regexp={t.regexp} "
               f"source={getattr(t, 'source', ())} name={t.name!r}")
    for t in ids.revoked:
        report(label, f"revoked issuer={t.issuer!r} identity={t.identity!r}")
