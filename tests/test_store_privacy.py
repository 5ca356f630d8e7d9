"""Nothing outside ``storage/`` reaches into a store: what the pipeline, the CLI, the plugin and
the API need from a :class:`~plancache.storage.store.Store` or its backend is a public method or
property (``store.deadline(...)``, ``store.read(...)``, ``store.subject``), so a backend can change
behind it without a caller noticing. An AST walk finds every use of a ``_``-prefixed member of the
store or a backend class (``x._backend``, ``getattr(x, "_open")``) in ``src/plancache`` outside
``storage/``; a class's own members (``self._x``) are its own business."""

from __future__ import annotations

import ast
from pathlib import Path

import plancache

ROOT = Path(plancache.__file__).parent
STORAGE = ROOT / "storage"


def _is_store_or_backend(cls: ast.ClassDef) -> bool:
    return cls.name == "Store" or cls.name.endswith("Backend")


def private_members() -> set[str]:
    """The ``_``-prefixed methods and attributes of Store and every backend class in storage/
    (dunders aside)."""
    names: set[str] = set()
    for path in STORAGE.rglob("*.py"):
        for cls in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(cls, ast.ClassDef) or not _is_store_or_backend(cls):
                continue
            for node in ast.walk(cls):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(node.name)
                elif (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "self"
                ):
                    names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def private_uses(source: str, members: set[str]) -> list[int]:
    """Lines of ``source`` that use one of ``members`` on anything but ``self`` or ``cls``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in members:
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                lines.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in members
        ):
            lines.append(node.lineno)
    return lines


def test_the_walk_knows_the_stores_private_members() -> None:
    members = private_members()
    assert {"_backend", "_open", "_first_deadline", "_remove"} <= members, members


def test_nothing_outside_storage_uses_a_private_member_of_a_store() -> None:
    members = private_members()
    offenders = [
        f"{path.relative_to(ROOT.parent)}:{line}"
        for path in sorted(ROOT.rglob("*.py"))
        if STORAGE not in path.parents
        for line in private_uses(path.read_text(encoding="utf-8"), members)
    ]
    assert not offenders, "private members of a Store or backend used outside storage/:\n" + (
        "\n".join(offenders)
    )


def test_a_planted_use_is_found() -> None:
    members = private_members()
    planted = (
        "def audit(store, deadline):\n"
        "    deadline = store.deadline(deadline)\n"  # public: fine
        "    backend = store._backend\n"
        "    return getattr(store, '_first_deadline', None), backend\n"
        "class Mine:\n"
        "    def _open(self):\n"
        "        return self._open\n"  # its own member: fine
    )
    assert private_uses(planted, members) == [3, 4]
