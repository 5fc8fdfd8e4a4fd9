"""The three wings stay apart, and each stays small enough to read.

``handlers/`` (the toolkit, inside every archive) imports neither ``serving/`` nor ``archiver/``;
``serving/`` (the engine, MLServer runtime, KServe transformer, LocalModel) does not import the CLI;
no product module imports itself back through others; a toolkit archive bundles exactly ``handlers/``;
no product file is over 600 lines and no function over 80. Imports are read from the source (every
``import`` statement, in functions too), so a lazy import cannot hide a circle.
"""

import ast
import zipfile
from pathlib import Path

import pytest

from helpers.models import package_resnet
from helpers.paths import ROOT

WINGS = ("handlers", "serving", "archiver")
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


def product_files():
    return sorted(path for wing in WINGS for path in (ROOT / wing).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path):
    """The product modules ``path`` imports (a ``from X import name`` counts ``X.name`` when that is a module)."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    known = {module_name(p) for p in product_files()}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . import x, from ..y import z
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in WINGS:
                yield name


@pytest.mark.parametrize("wing, forbidden", [("handlers", {"serving", "archiver"}), ("serving", {"archiver"})])
def test_a_wing_does_not_import_the_ones_above_it(wing, forbidden):
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / wing).rglob("*.py"))
        for name in imported(path)
        if name.split(".")[0] in forbidden
    ]
    assert not wrong


def test_no_import_circle():
    graph = {module_name(path): set(imported(path)) for path in product_files()}
    for module in graph:  # a package's own __init__ is not a circle of its submodules
        graph[module] = {name for name in graph[module] if name in graph and name != module}
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(module):  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in graph[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    assert not circles


def test_a_toolkit_archive_bundles_the_toolkit_alone(image_sample, tmp_path):
    archive = package_resnet(image_sample, tmp_path)
    with zipfile.ZipFile(archive) as mar:
        bundled = {name for name in mar.namelist() if name.endswith(".py") and "/" in name}
    assert bundled == {f"handlers/{path.name}" for path in (ROOT / "handlers").glob("*.py")}


def test_no_product_file_or_function_is_too_long():
    long_files, long_functions = [], []
    for path in product_files():
        text = path.read_text()
        if text.count("\n") > MAX_FILE_LINES:
            long_files.append(f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines")
    assert not long_files and not long_functions
