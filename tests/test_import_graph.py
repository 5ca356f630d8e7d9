"""plancache's modules import one another down the rings and without a circle: trust at the
bottom, then storage and keys, the pipeline, the CLI and the plugin on top (RINGS says what each
folder may import). Every import counts, a function's lazy one too (a circle through a lazy
import still ties two rooms into one); only imports for type checkers (``if TYPE_CHECKING:``) do
not, since they never run."""

from __future__ import annotations

import ast
from pathlib import Path

import plancache

ROOT = Path(plancache.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:``."""
    nodes: list[ast.AST] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        nodes.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return nodes


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The plancache modules ``path`` imports: ``from M import x`` is M.x when that is a module,
    else M."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                found.add(
                    f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module
                )
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
    return {name: _imports(path, name, set(paths)) for name, path in paths.items()}


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (``a -> b -> ... -> a``), or None if the graph is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def test_plancache_has_no_import_circle() -> None:
    graph = import_graph()
    assert (
        "plancache.storage.store" in graph
        and "plancache.storage.s3.direct" in graph["plancache.storage.store"]
    )
    found = circle(graph)
    assert found is None, "import circle: " + " -> ".join(found or [])


def test_a_lazy_import_counts_and_a_circle_through_it_is_found() -> None:
    graph = import_graph()
    # imported inside a function
    assert "plancache.storage.azure.blob" in graph["plancache.storage.backends"]
    graph["plancache.trust.errors"] = graph["plancache.trust.errors"] | {"plancache.storage.store"}
    found = circle(graph)
    assert found is not None and found[0] == found[-1] and "plancache.trust.errors" in found


RINGS = {
    "trust": set(),
    "settings": set(),
    "clock": set(),
    "storage": {"trust", "settings", "clock"},
    "keys": {"trust", "settings", "clock", "storage"},
    "pipeline": {"trust", "settings", "clock", "storage", "keys"},
    "api": {"trust", "settings", "clock", "storage", "keys", "pipeline"},
    "cli": {
        "trust",
        "settings",
        "clock",
        "storage",
        "keys",
        "pipeline",
        "vllm_plugin",
        "plancache",
    },
    "vllm_plugin": {
        "trust",
        "settings",
        "clock",
        "storage",
        "keys",
        "pipeline",
        "plancache",
    },
    "journeys": {"trust", "settings", "clock", "storage", "keys", "pipeline", "cli", "vllm_plugin"},
    "plancache": set(),
}
"""What each ring (a folder of plancache, or a module at its root) may import besides itself:
trust at the bottom (it imports nothing of plancache, so it does no IO of plancache's), then
storage, then keys (key files are read through storage's capped reads), the pipeline, and the
integrations on top (the CLI may use the plugin's leaves: doctor reads the plugin's settings;
the plugin imports nothing of the CLI, whose parsing rules it shares through ``settings``).
``plancache`` is the package's own ``__init__`` (its version, its lazy exports); ``settings``
the environment variables' names and how their values parse;
``clock`` the time every budget is measured by (a ``Deadline`` on a ``Clock``, docs/adr/0010)."""


def _ring(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def ring_violations(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for each import that goes up or sideways between rings, or out of a ring that
    RINGS does not know (a new folder must be given its place)."""
    return sorted(
        f"{a} -> {b}"
        for a, imported in graph.items()
        for b in imported
        if _ring(a) != _ring(b) and _ring(b) not in RINGS.get(_ring(a), {"(a ring of its own)"})
    )


def test_every_import_goes_down_the_rings() -> None:
    """The folder listing says where trust is decided because nothing below the pipeline reaches
    up into it: a module imports its own ring and the rings below, never above."""
    graph = import_graph()
    assert {_ring(m) for m in graph} <= set(RINGS), {_ring(m) for m in graph} - set(RINGS)
    violations = ring_violations(graph)
    assert not violations, "imports against the rings:\n" + "\n".join(violations)


def test_an_import_up_the_rings_is_found() -> None:
    graph = import_graph()
    graph["plancache.trust.verify"] = graph["plancache.trust.verify"] | {"plancache.storage.store"}
    graph["plancache.storage.store"] = graph["plancache.storage.store"] | {
        "plancache.pipeline.resolver"
    }
    assert ring_violations(graph) == [
        "plancache.storage.store -> plancache.pipeline.resolver",
        "plancache.trust.verify -> plancache.storage.store",
    ]


TRUST_DECIDERS = (
    "plancache.trust.verify",
    "plancache.trust.policy",
    "plancache.trust.sealing",
    "plancache.trust.signing",
    "plancache.trust.keyring",
    "plancache.trust.keyless",
    "plancache.trust.plans.gate",
)
"""The trust core's modules that decide: who signed, whether it counts, whether a plan applies."""


def storage_deciders(graph: dict[str, set[str]]) -> list[str]:
    """``storage -> decider`` edges: storage moves bytes and reads names, never judges them."""
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.startswith("plancache.storage")
        for target in targets
        if any(target == d or target.startswith(d + ".") for d in TRUST_DECIDERS)
    )


def test_storage_decides_nothing_about_trust() -> None:
    """Rooms are cut by interface, not by size (issue 50: the old caps of 350 lines a module and
    twelve modules a folder split one idea into pairs that called each other): what a room may
    import is the rule. Storage may read the trust core's names, caps, errors and values, but
    no module that decides trust, so a reader sees from the imports alone that it judges
    nothing."""
    graph = import_graph()
    assert storage_deciders(graph) == []
    graph["plancache.storage.store"] = graph["plancache.storage.store"] | {
        "plancache.trust.keyring.keys"
    }
    assert storage_deciders(graph) == ["plancache.storage.store -> plancache.trust.keyring.keys"]


def test_no_two_modules_share_a_name() -> None:
    """A module's name says what it holds wherever it is read (a traceback, a grep, an import):
    one ``headers.py`` per layer needed ``import headers as files`` to tell them apart. The rings
    stay folders (trust/, storage/, pipeline/, the integrations: docs/adr/0008), and the names
    inside them never repeat."""
    seen: dict[str, list[str]] = {}
    for path in ROOT.rglob("*.py"):
        if path.name != "__init__.py":
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT.parent)))
    assert not {n: p for n, p in seen.items() if len(p) > 1}
