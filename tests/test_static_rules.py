"""The static gate's own rules, the ones ruff and mypy cannot say (docs/adr/0009-a-static-gate.md).

* Every ``noqa`` and ``type: ignore`` in src/, tests/ and scripts/ says why, after its codes,
  in one form:
  ``# noqa: PLW0603 - the boot's one state object`` and
  ``# type: ignore[attr-defined]  # vLLM's module attribute, set by its hooks``.
* A function of four or more parameters (``self``/``cls`` not counted) takes its optional
  (defaulted) ones by keyword: a call that hands over that many values says which option is
  which. The public API (``plancache.__all__``: its functions, and the methods of its classes)
  keeps its positions, since users' scripts call it that way.
* A public function or method that raises says what, in a Google-style ``Raises:`` section.
* Time is read through the injectable clock (``plancache.clock``: ``Clock``, ``Deadline``,
  ``Stopwatch``; docs/adr/0010-deadlines-on-an-injectable-clock.md): no ``time.monotonic()``,
  ``time.time()``, ``time.perf_counter()``, ``time.sleep()`` (nor their ``_ns`` twins, nor
  ``time.gmtime()``/``time.localtime()`` of the current time) outside ``clock.py``, except the
  reads listed in :data:`CLOCK_READS_ALLOWED`, each with its reason.

Each rule is a function of one module's source, run over the live tree and over small planted
modules (one offender, then the same code fixed), so a rule that stopped catching anything
fails here too. A failure lists every offender as ``path:line name``.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Callable, Iterator
from pathlib import Path

import plancache

ROOT = Path(plancache.__file__).parent
REPO = ROOT.parents[1]

NOQA = re.compile(r"#\s*noqa\b(?P<rest>.*)", re.IGNORECASE)
NOQA_WITH_REASON = re.compile(r":\s*[A-Z]+[0-9]+(\s*,\s*[A-Z]+[0-9]+)*\s+-\s+\S")
TYPE_IGNORE = re.compile(r"#\s*type:\s*ignore\b(?P<rest>.*)")
TYPE_IGNORE_WITH_REASON = re.compile(r"\[[a-z-]+(\s*,\s*[a-z-]+)*\]\s+#\s*\S")


def _sources(
    repo: Path = REPO, folders: tuple[str, ...] = ("src/plancache",)
) -> Iterator[tuple[str, str]]:
    """(path from the repository root, source) of every module under ``folders`` of ``repo``
    (the package alone unless asked: the rules of options and raises are the product's)."""
    for folder in folders:
        for path in sorted((repo / folder).rglob("*.py")):
            yield str(path.relative_to(repo)), path.read_text(encoding="utf-8")


def _live(check: Callable[[str, str], list[str]]) -> list[str]:
    return [offence for path, source in _sources() for offence in check(source, path)]


# -- a reason on every suppression ----------------------------------------------------------------


def suppressions_without_reason(source: str, path: str) -> list[str]:
    """``path:line noqa`` or ``path:line type: ignore`` for each suppression in a comment of
    ``source`` that names no code or gives no reason after its codes (text in strings is not a
    comment, and is not read)."""
    found: list[str] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        line = token.start[0]
        for match in NOQA.finditer(token.string):
            if not NOQA_WITH_REASON.match(match.group("rest")):
                found.append(f"{path}:{line} noqa")
        for match in TYPE_IGNORE.finditer(token.string):
            if not TYPE_IGNORE_WITH_REASON.match(match.group("rest")):
                found.append(f"{path}:{line} type: ignore")
    return found


SAY_WHY = ("src/plancache", "tests", "scripts")
"""Where every suppression says why: the product, and the tests and scripts that go with it."""


def suppression_offenders(repo: Path) -> list[str]:
    return [
        offence
        for path, source in _sources(repo, SAY_WHY)
        for offence in suppressions_without_reason(source, path)
    ]


def test_every_suppression_says_why() -> None:
    offenders = suppression_offenders(REPO)
    assert not offenders, (
        f"{len(offenders)} suppressions without a reason after their codes (`# noqa: CODE - why`, "
        "`# type: ignore[code]  # why`):\n" + "\n".join(offenders)
    )


def test_a_suppression_without_its_reason_is_caught_and_one_with_it_passes() -> None:
    bare = (
        "import os  # noqa\n"
        "import re  # noqa: F401\n"
        "import io  # noqa: F401 -\n"
        "x = f()  # type: ignore\n"
        "y = g()  # type: ignore[attr-defined]\n"
        "z = h()  # type: ignore[attr-defined]  #\n"
        "w = k()  # a comment, then  # type: ignore[no-any-return]\n"
    )
    assert suppressions_without_reason(bare, "m.py") == [
        "m.py:1 noqa",
        "m.py:2 noqa",
        "m.py:3 noqa",
        "m.py:4 type: ignore",
        "m.py:5 type: ignore",
        "m.py:6 type: ignore",
        "m.py:7 type: ignore",
    ]
    fixed = (
        "import os  # noqa: F401 - imported for its side effect\n"
        "import re  # noqa: F401,E402 - after sys.path is set\n"
        "x = f()  # type: ignore[attr-defined]  # vLLM's module attribute, set by its hooks\n"
        "y = g()  # type: ignore[arg-type, union-attr]  # the caller checked\n"
        's = "# noqa and # type: ignore in a string are not comments"\n'
    )
    assert suppressions_without_reason(fixed, "m.py") == []


def test_a_bare_suppression_in_the_tests_or_the_scripts_is_caught(tmp_path: Path) -> None:
    planted = {
        "src/plancache/m.py": "import os  # noqa: F401 - imported for its side effect\n",
        "tests/test_m.py": "import os  # noqa: F401\n",
        "tests/engine_site/probe.py": "f.mark = True  # type: ignore[attr-defined]\n",
        "scripts/bench_m.py": "import re  # noqa: E402\n",
    }
    for name, source in planted.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source)
    assert suppression_offenders(tmp_path) == [
        "tests/engine_site/probe.py:1 type: ignore",
        "tests/test_m.py:1 noqa",
        "scripts/bench_m.py:1 noqa",
    ]
    (tmp_path / "tests/test_m.py").write_text("import os  # noqa: F401 - a fixture\n")
    (tmp_path / "tests/engine_site/probe.py").write_text(
        "f.mark = True  # type: ignore[attr-defined]  # the probe's mark\n"
    )
    (tmp_path / "scripts/bench_m.py").write_text("import re  # noqa: E402 - after sys.path\n")
    assert suppression_offenders(tmp_path) == []


# -- options by keyword ---------------------------------------------------------------------------


def public_api() -> dict[str, set[str]]:
    """What ``plancache.__all__`` reaches, by module path: its functions' names and, for its
    classes, ``Class.method`` for every method defined in the class body."""
    reached: dict[str, set[str]] = {}
    for name, module in plancache._EXPORTS.items():
        path = ROOT.parent.joinpath(*module.split(".")).with_suffix(".py")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = reached.setdefault(str(path.relative_to(REPO)), set())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                names.add(name)
            elif isinstance(node, ast.ClassDef) and node.name == name:
                names.update(
                    f"{name}.{item.name}"
                    for item in node.body
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                )
    return reached


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    """(qualified name, node) of every function and method, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def positional_options(source: str, path: str, exempt: frozenset[str] = frozenset()) -> list[str]:
    """``path:line name`` for each function of four or more parameters (``self``/``cls`` not
    counted) that takes a defaulted parameter by position; ``exempt`` holds qualified names."""
    found: list[str] = []
    for qualname, node in _functions(ast.parse(source)):
        assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        positional = [
            a for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")
        ]
        if (
            len(positional) + len(node.args.kwonlyargs) >= 4
            and node.args.defaults
            and qualname not in exempt
        ):
            found.append(f"{path}:{node.lineno} {qualname}")
    return found


def test_long_signatures_take_their_options_by_keyword() -> None:
    """A call that hands over four or more values says which option is which: a function that
    takes that many has its defaulted parameters keyword-only (``*,``). The public API keeps the
    positions users' scripts already call it with."""
    api = public_api()
    assert "Store.__init__" in api["src/plancache/storage/store.py"]
    assert "pull" in api["src/plancache/api.py"]
    offenders = [
        offence
        for path, source in _sources()
        for offence in positional_options(source, path, frozenset(api.get(path, ())))
    ]
    assert not offenders, (
        f"{len(offenders)} functions of four or more parameters take an option by position "
        "(make the defaulted ones keyword-only, `*,`, and update the callers):\n"
        + "\n".join(offenders)
    )


def test_a_positional_option_is_caught_and_a_keyword_one_passes() -> None:
    planted = (
        "def adopt(envelope, keyring, trusted, now=None):\n    pass\n"
        "class Signer:\n"
        "    def sign(self, payload, keyid, scheme, comment=''):\n        pass\n"
        "    def short(self, a, b, c=1):\n        pass\n"  # three: not counted
        "def outer():\n"
        "    def inner(a, b, c, d=0):\n        pass\n"
    )
    assert positional_options(planted, "m.py") == [
        "m.py:1 adopt",
        "m.py:4 Signer.sign",
        "m.py:9 outer.inner",
    ]
    assert positional_options(planted, "m.py", frozenset({"adopt", "Signer.sign"})) == [
        "m.py:9 outer.inner"
    ]
    fixed = (
        "def adopt(envelope, keyring, trusted, *, now=None):\n    pass\n"
        "class Signer:\n"
        "    def sign(self, payload, keyid, scheme, *, comment=''):\n        pass\n"
        "    def all_required(self, a, b, c, d):\n        pass\n"
    )
    assert positional_options(fixed, "m.py") == []


# -- what a public function raises ----------------------------------------------------------------


def _own_raises(function: ast.AST) -> Iterator[ast.Raise]:
    """The ``raise`` statements of ``function`` itself: not those of a nested function or class,
    not a bare ``raise``, not ``raise exc`` of the exception an ``except ... as exc`` caught."""
    caught: set[str] = set()
    stack = list(ast.iter_child_nodes(function))
    raises: list[ast.Raise] = []
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.ExceptHandler) and node.name:
            caught.add(node.name)
        if isinstance(node, ast.Raise) and node.exc is not None:
            raises.append(node)
        stack.extend(ast.iter_child_nodes(node))
    for node in raises:
        if not (isinstance(node.exc, ast.Name) and node.exc.id in caught):
            yield node


def _public(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    """(qualified name, node) of the public functions and methods: names without a leading
    underscore, in classes whose names have none either; a function's nested ones are its own."""
    for node in ast.iter_child_nodes(tree):
        if (getattr(node, "name", None) or "").startswith("_"):
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
        elif isinstance(node, ast.ClassDef):
            yield from _public(node, f"{prefix}{node.name}.")
        elif not isinstance(node, ast.Lambda):
            yield from _public(node, prefix)


RAISES_SECTION = re.compile(r"^\s*Raises:\s*$", re.MULTILINE)


def raises_undocumented(source: str, path: str) -> list[str]:
    """``path:line name`` for each public function or method that raises of its own and whose
    docstring has no ``Raises:`` section."""
    found: list[str] = []
    for qualname, node in _public(ast.parse(source)):
        assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        if next(_own_raises(node), None) is None:
            continue
        if not RAISES_SECTION.search(ast.get_docstring(node) or ""):
            found.append(f"{path}:{node.lineno} {qualname}")
    return found


def test_public_functions_say_what_they_raise() -> None:
    offenders = _live(raises_undocumented)
    assert not offenders, (
        f"{len(offenders)} public functions raise without a `Raises:` section in their docstring "
        "(`Raises:\\n    Rejected: the bytes are not a plan (reason ``malformed``).`):\n"
        + "\n".join(offenders)
    )


def test_an_undocumented_raise_is_caught_and_a_documented_one_passes() -> None:
    planted = '''
def parse(data):
    """Parse."""
    if not data:
        raise ValueError("empty")

class Store:
    def fetch(self, name):
        raise KeyError(name)

    def _helper(self):
        raise KeyError("private: not public")

def passes_on(data):
    """Re-raises only: nothing of its own to document."""
    try:
        parse(data)
    except ValueError as exc:
        log(exc)
        raise
    except KeyError as exc:
        raise exc

def outer():
    """Its nested function raises, not outer itself."""
    def inner():
        raise RuntimeError("inner")
    return inner

class _Private:
    def method(self):
        raise RuntimeError("a private class's method is not public")
'''
    assert raises_undocumented(planted, "m.py") == ["m.py:2 parse", "m.py:8 Store.fetch"]
    fixed = '''
def parse(data):
    """Parse.

    Raises:
        ValueError: ``data`` is empty.
    """
    if not data:
        raise ValueError("empty")

class Store:
    def fetch(self, name):
        """Fetch.

        Raises:
            KeyError: no object is named ``name``.
        """
        raise KeyError(name)
'''
    assert raises_undocumented(fixed, "m.py") == []


# -- time read through the clock ------------------------------------------------------------------

CLOCK_CALLS = frozenset(
    {"monotonic", "monotonic_ns", "time", "time_ns", "perf_counter", "perf_counter_ns", "sleep"}
)
"""``time`` functions that read or wait on the machine's clock: only :mod:`plancache.clock` may."""
CURRENT_TIME_CALLS = frozenset({"gmtime", "localtime", "ctime", "asctime", "strftime"})
"""``time`` functions that read the current time when given no time (one argument for
``strftime``): they must be handed ``REAL_CLOCK.wall()``."""

CLOCK_READS_ALLOWED: dict[str, str] = {
    "src/plancache/clock.py": "the clock itself: the one place that reads the machine's time",
}
"""Modules that may read the machine's clock directly, each with the reason it must."""


def direct_clock_reads(source: str, path: str) -> list[str]:
    """``path:line time.NAME`` for each call of the ``time`` module's clock in ``source``: through
    ``import time`` (or an alias) or a name imported from it."""
    tree = ast.parse(source)
    modules = {"time"}
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name == "time"}
        elif isinstance(node, ast.ImportFrom) and node.module == "time" and not node.level:
            names |= {a.asname or a.name: a.name for a in node.names}
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id in modules
        ):
            name = func.attr
        elif isinstance(func, ast.Name) and func.id in names:
            name = names[func.id]
        else:
            continue
        current = name in CURRENT_TIME_CALLS and len(node.args) < (2 if name == "strftime" else 1)
        if name in CLOCK_CALLS or current:
            found.append((node.lineno, f"{path}:{node.lineno} time.{name}"))
    return [offence for _, offence in sorted(found)]


def test_time_is_read_through_the_clock() -> None:
    offenders = [
        offence
        for path, source in _sources()
        if path not in CLOCK_READS_ALLOWED
        for offence in direct_clock_reads(source, path)
    ]
    assert not offenders, (
        f"{len(offenders)} direct reads of the machine's clock outside plancache.clock (a budget: "
        "Deadline; a measurement: Stopwatch; a wall time: REAL_CLOCK.wall(); or a reason in "
        "CLOCK_READS_ALLOWED):\n" + "\n".join(offenders)
    )
    for path in CLOCK_READS_ALLOWED:  # an allowance that no longer allows anything goes
        assert direct_clock_reads((REPO / path).read_text(encoding="utf-8"), path), path


def test_a_direct_clock_read_is_caught_and_one_through_the_clock_passes() -> None:
    planted = (
        "import time\n"
        "import time as t\n"
        "from time import monotonic, sleep as nap\n"
        "a = time.monotonic()\n"
        "b = (t.time() - a) * 1000\n"
        "c = monotonic()\n"
        "nap(1)\n"
        "d = time.strftime('%Y', time.gmtime())\n"
        "e = time.perf_counter_ns()\n"
    )
    assert direct_clock_reads(planted, "m.py") == [
        "m.py:4 time.monotonic",
        "m.py:5 time.time",
        "m.py:6 time.monotonic",
        "m.py:7 time.sleep",
        "m.py:8 time.gmtime",
        "m.py:9 time.perf_counter_ns",
    ]
    fixed = (
        "import time\n"
        "from plancache.clock import REAL_CLOCK, Stopwatch\n"
        "watch = Stopwatch.started()\n"
        "ms = watch.elapsed_ms()\n"
        "stamp = time.strftime('%Y', time.gmtime(REAL_CLOCK.wall()))\n"
        "REAL_CLOCK.sleep(0.1)\n"
    )
    assert direct_clock_reads(fixed, "m.py") == []
