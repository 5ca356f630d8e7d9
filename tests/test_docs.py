"""The reference in docs/ builds, strictly, and the README's quick start points into it.

The README is a quick start; the reference moved to docs/ (issue 21) and is built with mkdocs.
Building it here, with ``mkdocs build --strict`` as CI would, makes a broken link or anchor, a
link out of docs/, or a page left out of ``nav`` fail the suite (mkdocs.yml raises each of those
to a warning, and strict mode fails on any warning). The README's own relative links are checked
too: they are read on GitHub or in an editor, where mkdocs never looks.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
SETUP_COMMANDS = (
    "python3 -m venv /tmp/plancache-demo && /tmp/plancache-demo/bin/pip install -q . && "
    "/tmp/plancache-demo/bin/plancache demo",
    "bash scripts/run-tests.sh",
)
"""The README's two set-up commands, verbatim: CI and users run them as written."""
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """docs/ built once with ``mkdocs build --strict`` into a temp dir (never into the checkout)."""
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}{proc.stderr}"
    return out


def nav_pages(nav: list) -> Iterator[str]:
    """Every page a (possibly nested) mkdocs nav names."""
    for entry in nav:
        if isinstance(entry, str):
            yield entry
        elif isinstance(entry, dict):
            for value in entry.values():
                yield from nav_pages(value) if isinstance(value, list) else [value]


def config() -> dict:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def built_page(site: Path, page: str) -> Path:
    """Where mkdocs (use_directory_urls) writes a docs page: index.md -> index.html, x.md ->
    x/index.html."""
    stem = page[: -len(".md")]
    return site / "index.html" if stem == "index" else site / stem / "index.html"


def outside_code(text: str) -> str:
    """Markdown text without fenced code blocks and inline code (links in code are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def test_mkdocs_config_fails_on_every_warning() -> None:
    cfg = config()
    assert cfg["strict"] is True
    assert cfg["theme"]["name"] == "mkdocs"
    assert cfg.get("docs_dir", "docs") == "docs"
    # omitted_files and anchors are "info" by default: not failures even in strict mode
    assert {
        k: cfg["validation"][k] for k in ("omitted_files", "not_found", "anchors")
    } == dict.fromkeys(("omitted_files", "not_found", "anchors"), "warn")


def test_every_docs_page_is_in_the_nav() -> None:
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    nav = list(nav_pages(config()["nav"]))
    assert sorted(nav) == pages, (
        f"in docs/ but not in nav: {sorted(set(pages) - set(nav))}; "
        f"in nav but not in docs/: {sorted(set(nav) - set(pages))}"
    )
    assert len(set(nav)) == len(nav), "a page is listed twice in nav"
    assert nav[0] == "index.md"


def test_docs_build_strict(site: Path) -> None:
    for page in nav_pages(config()["nav"]):
        assert built_page(site, page).is_file(), page


def test_readme_keeps_the_two_set_up_commands() -> None:
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), re.S)
    for command in SETUP_COMMANDS:
        assert any(command in block.splitlines() for block in blocks), command


def test_readme_relative_links_resolve(site: Path) -> None:
    links = LINK.findall(outside_code(README.read_text()))
    relative = [link for link in links if not re.match(r"[a-z][a-z0-9+.-]*:", link)]
    assert any(link.startswith("docs/") for link in relative), "the README links no docs page"
    for link in relative:
        path, _, anchor = link.partition("#")
        target = (README.parent / path).resolve() if path else README
        assert target.exists(), f"README links {link!r}: {target} does not exist"
        if anchor and target.suffix == ".md" and target.parent == DOCS:
            html = built_page(site, target.name).read_text()
            assert f'id="{anchor}"' in html, (
                f"README links {link!r}: docs/{target.name} has no #{anchor}"
            )
