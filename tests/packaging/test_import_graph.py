"""The import graph of the package, as grimp (the library import-linter uses) reads it: imports inside functions and
under TYPE_CHECKING included. The layer contracts themselves are in pyproject.toml, checked by `lint-imports` in
`make test`; these tests hold what a contract cannot say: no cycles, and no own-module import hidden in a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp")

PACKAGE = Path(__file__).resolve().parents[2] / "hpcmem"
# Own-module imports allowed inside a function: a heavy dependency deferred, each with its reason on the line
# (`# deferred: ...`). None is needed today.
MAX_DEFERRED = 20


def _folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else "hpcmem"


def _cycles(exclude_type_checking: bool) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    graph = grimp.build_graph("hpcmem", exclude_type_checking_imports=exclude_type_checking, cache_dir=None)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            for j in range(i, len(edges[node])):
                nxt = edges[node][j]
                if nxt not in index:
                    work += [(node, j + 1), (nxt, 0)]
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                if low[node] == index[node]:
                    comp = set()
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        comp.add(top)
                        if top == node:
                            break
                    if len(comp) > 1:
                        out.append(comp)
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
    return out


def test_no_import_cycle_at_run_time() -> None:
    """Imports that run (at module level or in a function) form no cycle at all."""
    assert _cycles(exclude_type_checking=True) == []


def test_type_only_imports_close_no_cycle_across_folders_nor_of_three() -> None:
    """Counting the imports under TYPE_CHECKING too: no cycle spans two folders, and none is larger than two modules
    (a spec and the module its annotations name, e.g. models.spec ⇄ models.params)."""
    for comp in _cycles(exclude_type_checking=False):
        assert len({_folder(m) for m in comp}) == 1, f"a cycle across folders: {sorted(comp)}"
        assert len(comp) <= 2, f"a cycle of {len(comp)} modules: {sorted(comp)}"


def _deferred_imports() -> list[tuple[str, int, str]]:
    """(file, line, text) of every import of an hpcmem module inside a function body."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        for func in ast.walk(ast.parse(source)):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                own = (isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("hpcmem"))
                       or isinstance(node, ast.Import) and any(a.name.startswith("hpcmem") for a in node.names))
                if own:
                    out.append((str(path.relative_to(PACKAGE.parent)), node.lineno, lines[node.lineno - 1]))
    return sorted(set(out))


def test_own_module_imports_inside_functions_are_few_and_say_why() -> None:
    deferred = _deferred_imports()
    assert len(deferred) <= MAX_DEFERRED, "\n".join(f"{f}:{n}: {t.strip()}" for f, n, t in deferred)
    unexplained = [f"{f}:{n}" for f, n, t in deferred if "# deferred:" not in t]
    assert not unexplained, f"an own-module import inside a function needs '# deferred: <why>': {unexplained}"


def test_the_counter_sees_an_import_hidden_in_a_function(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: a module with one hidden import is counted."""
    fake = tmp_path / "hpcmem"
    fake.mkdir()
    (fake / "m.py").write_text("def f():\n    from hpcmem.errors import SpecError\n    return SpecError\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["PACKAGE"]), "PACKAGE", fake)
    assert [(f, n) for f, n, _ in _deferred_imports()] == [("hpcmem/m.py", 2)]
