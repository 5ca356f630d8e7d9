"""Every registry listing is bounded by its cap, whatever the registry says follows.

A registry's ``tags/list`` is paginated by the registry (``Link: rel="next"``): one that never
ends it must not grow the process. The stub (tests/registry_stub.py) answers 1000 new plan tags
per page, forever; the cap is lowered so the test reads a few pages, and what is asserted is
the number of pages read, never memory or time.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from plancache.cli.main import main
from plancache.storage import listing
from plancache.storage import store as store_module
from plancache.storage.compile_cache.archives import list_subjects
from plancache.storage.store import open_store
from plancache.trust.errors import Rejected
from registry_stub import RegistryStub

CAP = 2500
"""The lowered MAX_NAMES: the listing must stop in the third page of 1000."""


@pytest.fixture
def endless(monkeypatch: pytest.MonkeyPatch) -> Iterator[RegistryStub]:
    monkeypatch.setattr(listing, "MAX_NAMES", CAP)
    monkeypatch.setattr(store_module, "MAX_NAMES", CAP)
    server = RegistryStub()
    server.state.endless_tags = True
    yield server
    server.stop()


def test_a_compile_cache_listing_of_an_endless_tag_list_stops_at_the_cap(
    endless: RegistryStub,
) -> None:
    store = open_store(endless.url("plancache/endless"), timeout=30)
    with pytest.raises(Rejected, match=f"more than {CAP} objects") as caught:
        list_subjects(store)
    assert caught.value.reason.value == "too-large"
    assert endless.state.tag_pages == 3  # the page that passed the cap was the last one read


def test_ls_of_an_endless_tag_list_stops_at_the_cap(
    endless: RegistryStub, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ls", "--timeout", "30", endless.url("plancache/endless")]) == 2
    assert f"lists more than {CAP} plan objects" in capsys.readouterr().err
    assert endless.state.tag_pages <= 3


@pytest.mark.parametrize(
    "body", [b'{"tags": {"a": 1}}', b'{"tags": "startup_plan_0123456789abcdef.json"}', b"[1]"]
)
def test_a_malformed_tag_list_is_malformed_not_an_empty_repository(
    body: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    """Red team 47b: ``tags`` that is not a list read as no tags (``ls`` exit 0, an empty
    table), and the existence probe raised Python's own text ('list' object has no attribute
    'get')."""
    server = RegistryStub()
    server.state.tags_body = body
    try:
        assert main(["ls", "--timeout", "10", server.url("plancache/broken")]) == 2
    finally:
        server.stop()
    assert "the registry's tag list is not a JSON list of tags" in capsys.readouterr().err
