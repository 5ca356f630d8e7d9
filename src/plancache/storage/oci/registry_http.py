"""One registry repository over HTTP: capped, digest-checked reads, uploads and deletes.

Plain aiohttp (the stack's HTTP client, on the store's event loop and deadline) rather than an
OCI client library: oras-py 0.2.43 does not check blob digests on pull, reads non-chunked
uploads whole, mistakes a ``Basic`` challenge for a token URL (two minutes of backoff), has no
``artifactType``, referrers or tag-schema support, and is synchronous (``requests``), which
the deadlines here would have to wrap in threads. The registry API plancache needs is seven
requests; each is checked here:

* every body is read capped (its declared length first, then at most ``cap + 1`` bytes, so an
  endless body costs the cap), never inflated (``Accept-Encoding: identity``);
* a manifest is checked against the digest it was asked by, and against the registry's
  ``Docker-Content-Digest`` when read by tag, and must be the media type asked for; a blob must
  be exactly the size its descriptor states and hash to its digest (``digest-mismatch``);
* no redirect is followed, except a blob download's (registries hand out signed storage URLs),
  which is followed at most three times to an ``https`` URL (or loopback) *without* the
  registry's credentials;
* how a request is sent (the session, credentials, the challenge, a mirror's failures named)
  is :mod:`.access.registry_session`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urljoin, urlsplit

import aiohttp

from ...trust.display import safe_text
from ...trust.errors import Reason, Rejected, StoreError
from .access.registry_session import RegistrySession
from .registry_answers import (
    MAX_MANIFEST,
    TAGS_CAP,
    expect,
    media_type_of,
    read_capped,
    sha256_digest,
)
from .registry_urls import DIGEST, check_authority

MAX_REDIRECTS = 3
REDIRECTS = (301, 302, 303, 307, 308)


class RegistryClient(RegistrySession):
    """The requests plancache makes of one repository of one registry (or, for reads, of its
    mirror), each answer checked."""

    # -- reads ---------------------------------------------------------------------------------
    async def manifest_answer(
        self, method: str, reference: str, media_types: tuple[str, ...], what: str
    ) -> aiohttp.ClientResponse | None:
        """The answer to a ``GET`` or ``HEAD`` of the manifest at a tag or digest, accepting
        ``media_types``: a 200, its body unread (the caller reads and releases it); None if
        absent (a 404). Every manifest request starts here: the manifest's, a tag's
        resolution, the subject image's lookup.

        Raises:
            StoreError: access denied (401, 403), ``what`` naming the request.
            RegistryAnswer: another status than wanted.
        """
        response = await self.send(
            method,
            f"/v2/{self.repository}/manifests/{reference}",
            headers={"Accept": ", ".join(media_types)},
        )
        if response.status == 404:
            response.release()
            return None
        try:
            await expect(response, (200,), what)
        except BaseException:
            response.release()
            raise
        return response

    async def manifest(
        self, reference: str, media_types: tuple[str, ...]
    ) -> tuple[bytes, str] | None:
        """(bytes, digest) of the manifest at a tag or digest, checked; None if absent.

        Raises:
            Rejected: another media type than asked (reason ``malformed``), or bytes that are
                not the digest asked for or stated (``digest-mismatch``).
            StoreError: access denied (401, 403).
            RegistryAnswer: another status than wanted (retried by the shared rules).
        """
        response = await self.manifest_answer(
            "GET", reference, media_types, f"manifest {reference}"
        )
        if response is None:
            return None
        async with response:
            got_type = media_type_of(response.headers)
            if got_type not in media_types:
                raise Rejected(
                    Reason.MALFORMED,
                    f"{reference} in {self.repository} is a {safe_text(got_type, 80)!r}, "
                    f"not a {media_types[0]}",
                )
            body = await read_capped(response, MAX_MANIFEST, f"manifest {reference}")
            stated = response.headers.get("Docker-Content-Digest")
        digest = sha256_digest(body)
        expected = reference if reference.startswith("sha256:") else stated
        if expected is not None and expected != digest:
            raise Rejected(
                Reason.DIGEST_MISMATCH,
                f"the registry answered manifest {safe_text(reference, 80)} with other bytes "
                f"({digest[:19]}…, not {safe_text(expected, 24)}…)",
            )
        return body, digest

    async def resolve(self, tag: str, media_types: tuple[str, ...]) -> str | None:
        """The digest a tag names (a ``HEAD``: no body; the bytes are checked when read by it):
        None if absent, ``""`` if the registry does not say (the caller then reads the tag)."""
        response = await self.manifest_answer("HEAD", tag, media_types, f"manifest {tag}")
        if response is None:
            return None
        async with response:
            stated = response.headers.get("Docker-Content-Digest", "")
        return stated if DIGEST.fullmatch(stated) else ""

    async def blob(self, digest: str, size: int, cap: int) -> bytes:
        """A blob's bytes, exactly ``size`` of them hashing to ``digest``.

        Raises:
            FileNotFoundError: no such blob.
            Rejected: ``size`` over ``cap``, before a byte is read (reason ``too-large``), or
                other bytes than stated (``digest-mismatch``).
            StoreError: a redirect that is not followed, or access denied (401, 403).
            RegistryAnswer: another status than wanted.
        """
        if size > cap:
            raise Rejected(
                Reason.TOO_LARGE, f"blob {digest[:19]}… is {size} bytes, the cap is {cap}"
            )
        response = await self.send("GET", f"/v2/{self.repository}/blobs/{digest}")
        hops = 0
        while response.status in REDIRECTS and hops < MAX_REDIRECTS:
            target = urljoin(str(response.url), response.headers.get("Location", ""))
            response.release()
            response = await self._follow(target)
            hops += 1
        async with response:
            if response.status == 404:
                raise FileNotFoundError(digest)
            await expect(response, (200,), f"blob {digest[:19]}…")
            body = await read_capped(response, size, f"blob {digest[:19]}…")
        if len(body) != size or sha256_digest(body) != digest:
            raise Rejected(
                Reason.DIGEST_MISMATCH,
                f"the registry answered blob {digest[:19]}… with other bytes "
                f"({len(body)} bytes, {size} stated)",
            )
        return body

    async def _follow(self, target: str) -> aiohttp.ClientResponse:
        """A redirected blob download: a fresh request carrying no credentials, to https or
        loopback only (a signed storage URL carries its own authorisation)."""
        parts = urlsplit(target)
        if parts.scheme not in ("http", "https") or not parts.netloc or "@" in parts.netloc:
            raise StoreError(
                f"a blob download redirected to {safe_text(target, 80)!r}: not followed"
            )
        host = check_authority(parts.netloc, "blob redirect")
        if parts.scheme == "http" and not (host.loopback or self.plain_http_allowed):
            raise StoreError(
                f"a blob download redirected to plain HTTP at {host.authority}: not followed"
            )
        return await self.session().request("GET", target, allow_redirects=False)

    async def tags_page(self, last: str | None, n: int) -> tuple[bytes, bool]:
        """One ``tags/list`` page (capped) and whether the registry says more follow."""
        query = f"?n={n}" + (f"&last={last}" if last else "")
        response = await self.send("GET", f"/v2/{self.repository}/tags/list{query}")
        async with response:
            if response.status == 404:
                return b'{"tags": []}', False
            await expect(response, (200,), "the tag list")
            body = await read_capped(response, TAGS_CAP, "the tag list")
            return body, 'rel="next"' in response.headers.get("Link", "")

    # -- writes --------------------------------------------------------------------------------
    async def has_blob(self, digest: str) -> bool:
        response = await self.send("HEAD", f"/v2/{self.repository}/blobs/{digest}", write=True)
        async with response:
            if response.status == 404:
                return False
            await expect(response, (200,), f"blob {digest[:19]}…")
            return True

    async def put_blob(self, data: bytes) -> str:
        """Upload ``data`` (unless the repository has it); returns its digest.

        Raises:
            StoreError: the registry sends the upload to another host (refused), or access
                denied (401, 403).
            RegistryAnswer: another status than wanted.
        """
        digest = sha256_digest(data)
        if await self.has_blob(digest):
            return digest
        response = await self.send("POST", f"/v2/{self.repository}/blobs/uploads/", write=True)
        async with response:
            await expect(response, (202,), "a blob upload")
            location = urljoin(self.base + "/", response.headers.get("Location", ""))
        if not location.startswith(self.base + "/"):
            raise StoreError(f"{self.registry.authority} sent the upload to another host: refused")
        location += ("&" if "?" in location else "?") + f"digest={digest}"
        response = await self.send(
            "PUT",
            location,
            headers={"Content-Type": "application/octet-stream"},
            data=data,
            write=True,
        )
        async with response:
            await expect(response, (201,), "a blob upload")
        return digest

    async def put_manifest(self, reference: str, body: bytes, media_type: str) -> Mapping[str, str]:
        """PUT a manifest or index at a tag or digest; the answer's headers (``OCI-Subject``)."""
        response = await self.send(
            "PUT",
            f"/v2/{self.repository}/manifests/{reference}",
            headers={"Content-Type": media_type},
            data=body,
            write=True,
        )
        async with response:
            await expect(response, (201, 200), f"manifest {reference}")
            return response.headers

    async def delete_manifest(self, digest: str) -> None:
        """Delete a manifest by digest (distribution untags every tag on it too).

        Raises:
            FileNotFoundError: no such manifest.
            StoreError: access denied (401, 403).
            RegistryAnswer: another status than wanted.
        """
        response = await self.send(
            "DELETE", f"/v2/{self.repository}/manifests/{digest}", write=True, delete=True
        )
        async with response:
            if response.status == 404:
                raise FileNotFoundError(digest)
            await expect(response, (202, 200), f"the delete of {digest[:19]}…")
