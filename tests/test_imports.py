"""The import graph is the architecture: no import circle among the project's modules, and every import
that waits inside a function says why.

Both read the sources with ``ast`` (nothing is imported): an import counts wherever it sits, at the top
of a module or inside a function, since a circle closed by a function-level import is still a circle
(it is only hidden until that function runs).
"""

from __future__ import annotations

import ast
import io
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the project's top-level packages, whose modules make the graph
PACKAGES = ("harness", "kernels", "models")
#: where an import inside a function must say why it is lazy
LAZY_RULE_DIRS = PACKAGES
#: files there not held to that rule yet (being reworked apart; the rule widens to them, and to
#: kernels/ and models/, once they say why their lazy imports wait)
LAZY_RULE_PENDING = ()
#: what such an import is: a project module, or one of these heavy dependencies
HEAVY = ("torch", "triton", "lightning", "hydra", "wandb", "matplotlib")


def project_modules() -> dict[str, Path]:
    """Every module of the project's packages: dotted name -> file (a package is its __init__.py)."""
    out = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _base(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` names, relative imports resolved against ``module``."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def imports(module: str, path: Path, modules: dict, tree: ast.AST) -> list[tuple[ast.stmt, list[str]]]:
    """(import statement, the modules it imports) for every import in ``tree`` (the file ``path`` of
    ``module``), at any depth. ``from pkg import name`` imports ``pkg.name`` when that is a module, else
    ``pkg``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.append((node, [a.name for a in node.names]))
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, path, node)
            out.append((node, [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]))
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (itself left out)."""
    modules = project_modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for _, targets in imports(module, path, modules, ast.parse(path.read_text(), str(path))):
            graph[module].update(t for t in targets if t in modules and t != module)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _function_level(tree: ast.AST) -> list[ast.stmt]:
    """The import statements that sit inside a function (at any depth below it)."""
    out = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out += [n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return list({id(n): n for n in out}.values())


def _comment_lines(source: str) -> set[int]:
    return {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.COMMENT}


def test_no_import_circle():
    found = circles(import_graph())
    assert not found, "import circles among the project's modules (module- and function-level imports):\n" + \
        "\n".join(" <-> ".join(c) for c in found)


def test_lazy_imports_say_why():
    modules = project_modules()
    unexplained = []
    for module, path in modules.items():
        where = str(path.relative_to(ROOT))
        if module.split(".")[0] not in LAZY_RULE_DIRS or where.startswith(LAZY_RULE_PENDING):
            continue
        source = path.read_text()
        comments = _comment_lines(source)
        tree = ast.parse(source, str(path))
        targets = {id(n): t for n, t in imports(module, path, modules, tree)}
        for node in _function_level(tree):
            heavy = list(dict.fromkeys(t for t in targets[id(node)] if t in modules or t.split(".")[0] in HEAVY))
            lines = set(range(node.lineno, (node.end_lineno or node.lineno) + 1)) | {node.lineno - 1}
            if heavy and not lines & comments:
                unexplained.append(f"{where}:{node.lineno}: {', '.join(heavy)}")
    assert not unexplained, ("imports inside a function with no comment on their line or the line above saying "
                             "why they wait:\n" + "\n".join(unexplained))


def test_the_graph_reads_what_python_imports():
    # the rules above, on a module whose imports are known
    modules = project_modules()
    assert "harness.study" in modules and "kernels" in modules
    graph = import_graph()
    assert "harness.config" in graph["harness.cli"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


#: what each package may not import: the layering of docs/architecture.md (harness -> models, kernels)
FORBIDDEN = {
    "kernels": ("harness", "models", "lightning", "hydra", "omegaconf", "wandb"),
    "models": ("harness",),
}
#: the only modules of kernels/ that models/ may import (the layout of the attention projection)
MODELS_MAY_IMPORT = ("kernels.layouts",)


def layering_violations() -> list[str]:
    """``file:line: module`` for every import (at any depth) that crosses the layering above."""
    modules = project_modules()
    found = []
    for module, path in modules.items():
        top = module.split(".")[0]
        if top not in FORBIDDEN:
            continue
        for node, targets in imports(module, path, modules, ast.parse(path.read_text(), str(path))):
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: {t}" for t in targets if crosses(top, t)]
    return found


def crosses(top: str, target: str) -> bool:
    """Whether a module of the package ``top`` may not import ``target``."""
    head = target.split(".")[0]
    if top == "models" and head == "kernels":
        return not any(target == m or target.startswith(m + ".") for m in MODELS_MAY_IMPORT)
    return head in FORBIDDEN.get(top, ())


def test_kernels_and_models_keep_to_their_layer():
    found = layering_violations()
    assert not found, ("kernels/ imports nothing of harness/, models/, Lightning, Hydra, OmegaConf or W&B; "
                       "models/ nothing of harness/ and of kernels/ only kernels.layouts:\n" + "\n".join(found))


def test_the_layering_rule_reads_what_it_should():
    assert crosses("kernels", "omegaconf") and crosses("kernels", "harness.config") and crosses("kernels", "models.gpt")
    assert crosses("models", "kernels.registry") and crosses("models", "kernels") and crosses("models", "harness.env")
    assert not crosses("models", "kernels.layouts") and not crosses("kernels", "torch")
    assert not crosses("harness", "lightning") and not crosses("harness", "kernels.registry")


def test_the_command_lines_refuse_a_bad_config_without_loading_lightning():
    """Lightning takes seconds to import: train and study load it only once a config is accepted."""
    code = "import sys, harness.train, harness.study; sys.exit('lightning' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:] or "harness.train or harness.study imported lightning at import"
