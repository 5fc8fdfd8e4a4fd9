"""What the documentation names exists: a newcomer who follows a path, a link or a module name the docs
give finds it, so the docs cannot drift from the tree again unnoticed.

Read from README.md, BENCHMARKS.md and docs/*.md (and, for repository paths, from the code's own
docstrings and comments):

- every repository path (``serving/engine/app.py``, ``tests/engine/test_engine.py``, ``docs/limits.md``,
  ``archiver/export/templates/*.md``) exists; what the samples write (``samples/build/...``) is made on
  the spot, not kept;
- every relative link leads to a file, and its ``#anchor`` to a heading of that file;
- every module a doc names by its dotted name (``serving.engine``, ``handlers.image:handle``,
  ``serving.runtimes.mlserver_runtime.ArchiveModel``) exists, with the name it is followed by;
- a constant (``MAX_DIMS``) is defined in the file the same paragraph or table row names, if it names one;
- docs/architecture.md lists every module of each wing, and no module that is not there.

Read from the files alone, nothing imported: no torch, a second or so.
"""

import ast
import functools
import re
from pathlib import Path

import pytest

from helpers.paths import ROOT

DOCUMENTS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
WINGS = ("handlers", "serving", "archiver")
TOP = (*WINGS, "tests", "docs", "samples", "benchmarks")
MADE_ON_THE_SPOT = ("samples/build/",)  # what samples/*.py write when run: a reader's output, not the repository's
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./*-]*[\w*/])" % "|".join(TOP))
LINK = re.compile(r"\]\(([^)\s]+)\)")
DOTTED = re.compile(r"(?<![\w./-])((?:%s)(?:\.\w+)+)(?::(\w+))?(?![\w/.-])" % "|".join((*WINGS, "samples")))
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FILE_SUFFIXES = ("md", "py", "json", "yaml", "mar", "txt", "properties")
# Stale citations in files another change of issue #30 is rewriting (LocalModel in TorchServe's worker
# process: serving/local_model.py, serving/worker.py, archiver/inprocess.py), left to it; the test fails
# once one is right, so that it is taken out of here.
OWNED_ELSEWHERE = set()


def code_files():
    """Every Python file of the repository but this one (whose OWNED_ELSEWHERE names what is missing)."""
    found = (path for top in (*WINGS, "samples", "benchmarks", "tests") for path in (ROOT / top).rglob("*.py"))
    return sorted(path for path in found if path != Path(__file__).resolve())


def exists(path: str) -> bool:
    """A repository path as a doc writes it: a file, a folder (``handlers/``), a glob, or ``module.Name``."""
    path = path.rstrip(".,;:")
    if "*" in path:
        return any(ROOT.glob(path))
    if (ROOT / path).exists():
        return True
    module, _, name = path.rpartition(".")  # archiver/output.Progress: a name in a module
    return bool(module) and (ROOT / f"{module}.py").is_file() and name in defined(ROOT / f"{module}.py")


@functools.lru_cache(maxsize=None)
def defined(path: Path) -> set:
    """The names a module defines or imports at its top level (and a package's submodules)."""
    names = {p.stem for p in path.parent.glob("*.py")} | {p.name for p in path.parent.iterdir() if p.is_dir()}
    if path.name != "__init__.py":
        names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def cited_paths(text: str):
    for number, line in enumerate(text.splitlines(), 1):
        for match in PATH.finditer(line):
            path = match.group(1)
            if not path.startswith(MADE_ON_THE_SPOT):
                yield number, path


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(doc: Path) -> set:
    found, seen = set(), {}
    for line in FENCE.sub("", doc.read_text()).splitlines():
        if line.startswith("#"):
            base = slug(line.lstrip("#"))
            found.add(base if base not in seen else f"{base}-{seen[base]}")
            seen[base] = seen.get(base, 0) + 1
    return found


def where(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


@pytest.mark.parametrize("doc", DOCUMENTS, ids=where)
def test_every_path_a_doc_cites_exists(doc):
    missing = [f"{where(doc)}:{n}: {path}" for n, path in cited_paths(doc.read_text()) if not exists(path)]
    assert not missing, "paths the docs cite that are not in the repository:\n" + "\n".join(missing)


def test_every_path_a_docstring_or_comment_cites_exists():
    missing = {
        (where(path), cited) for path in code_files() for _, cited in cited_paths(path.read_text()) if not exists(cited)
    }
    fixed = sorted(OWNED_ELSEWHERE - missing)
    assert not fixed, f"these are right now: take them out of OWNED_ELSEWHERE: {fixed}"
    wrong = sorted(missing - OWNED_ELSEWHERE)
    assert not wrong, "paths the code's docstrings and comments cite that are not in the repository:\n" + "\n".join(
        f"{path}: {cited}" for path, cited in wrong
    )


@pytest.mark.parametrize("doc", DOCUMENTS, ids=where)
def test_every_link_leads_somewhere(doc):
    broken = []
    for target in LINK.findall(FENCE.sub("", doc.read_text())):
        if re.match(r"^[a-z]+:", target):  # https://, mailto: ...
            continue
        file, _, anchor = target.partition("#")
        linked = (doc.parent / file).resolve() if file else doc
        if not linked.exists():
            broken.append(f"{where(doc)}: ({target}): no {file}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{where(doc)}: ({target}): {where(linked)} has no heading #{anchor}")
    assert not broken, "links that lead nowhere:\n" + "\n".join(broken)


@pytest.mark.parametrize("doc", DOCUMENTS, ids=where)
def test_every_module_a_doc_names_exists(doc):
    wrong = []
    for span in CODE_SPAN.findall(FENCE.sub("", doc.read_text())):
        for match in DOTTED.finditer(span):
            dotted, attribute = match.group(1), match.group(2)
            parts = dotted.split(".")
            if parts[-1] in FILE_SUFFIXES:  # handlers.md, tsctl.json: a file, not a module
                continue
            for cut in range(len(parts), 0, -1):  # the longest prefix that is a module or a package
                base = ROOT.joinpath(*parts[:cut])
                module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
                if module.is_file():
                    break
            else:
                wrong.append(f"{where(doc)}: {dotted}: no such module")
                continue
            names = [*parts[cut : cut + 1], *([attribute] if attribute and cut == len(parts) else [])]
            absent = [name for name in names if name not in defined(module)]
            if absent:
                wrong.append(f"{where(doc)}: {match.group(0)}: {where(module)} defines no {absent[0]}")
    assert not wrong, "module names the docs give that do not resolve:\n" + "\n".join(wrong)


def units(text: str):
    """A doc's paragraphs, its table rows and list items each on their own (code blocks left out)."""
    for block in re.split(r"\n\s*\n", FENCE.sub("", text)):
        yield from re.split(r"\n(?=\||- |\d+\. )", block)


@functools.lru_cache(maxsize=None)
def constants() -> dict:
    """{NAME: the wing modules assigning it at their top level} for every UPPER_CASE constant (a file
    cited as ``export/targets.py``, inside its wing, counts as ``archiver/export/kserve/targets.py``)."""
    found = {}
    for path in (p for wing in WINGS for p in (ROOT / wing).rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            for name in (n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)):
                if re.fullmatch(r"[A-Z][A-Z0-9_]+", name):
                    found.setdefault(name, set()).add(where(path))
    return found


@pytest.mark.parametrize("doc", DOCUMENTS, ids=where)
def test_every_constant_is_in_the_file_its_paragraph_names(doc):
    """``MAX_DIMS`` in a sentence citing ``handlers/v2_tensors.py`` is defined there: a limit is found by its
    name, in the file the docs say (docs/limits.md says where each is defined)."""
    known, wrong = constants(), []
    for unit in units(doc.read_text()):
        spans = CODE_SPAN.findall(unit)
        files = {span for span in spans if span.endswith(".py") and "/" in span}
        for name in (span for span in spans if span in known):
            if files and not any(path == file or path.endswith("/" + file) for path in known[name] for file in files):
                wrong.append(f"{where(doc)}: {name} is in {sorted(known[name])}, not {sorted(files)}")
    assert not wrong, "constants the docs place in the wrong file:\n" + "\n".join(wrong)


def architecture_tables():
    """{wing: {path inside the wing: the line}} of the module tables of docs/architecture.md: a row's
    first cell names files of the wing (``engine.py``, ``export/kserve.py``) and folders (``commands/``);
    a bare file name after a folder in the same cell is in that folder (``engines/`` (``base.py``, ...))."""
    listed, wing = {}, None
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        heading = re.match(r"^## `(\w+)/`", line)
        if heading:
            wing = heading.group(1)
            listed[wing] = {}
        elif line.startswith("## "):
            wing = None
        elif wing and line.startswith("| `"):
            folder = ""
            for name in CODE_SPAN.findall(line.split(" | ")[0]):
                if name.endswith("/"):
                    folder = name
                    listed[wing][name] = line
                elif "/" in name:
                    listed[wing][name] = line
                else:
                    listed[wing][folder + name] = line
    return listed


def test_architecture_lists_every_module_of_each_wing():
    listed = architecture_tables()
    assert set(listed) == set(WINGS)
    missing, gone = [], []
    for wing in WINGS:
        modules = {str(p.relative_to(ROOT / wing)) for p in (ROOT / wing).rglob("*.py")}
        modules -= {m for m in modules if not (ROOT / wing / m).read_text().strip()}  # an empty __init__.py
        modules -= {m for m in modules if m.endswith("/__init__.py") and f"{m.rpartition('/')[0]}/" in listed[wing]}
        missing += [f"{wing}/{name}" for name in sorted(modules - set(listed[wing]))]
        gone += [f"{wing}/{name}" for name in sorted(listed[wing]) if not (ROOT / wing / name).exists()]
    assert not missing, f"modules docs/architecture.md has no line for: {missing}"
    assert not gone, f"what docs/architecture.md lists that is not in the tree: {gone}"


def test_the_tsctl_engine_is_called_tsctl_where_its_former_name_is_not_explained():
    """``--engine kserve`` is the tsctl engine's former name, kept as an alias: the docs, the benchmarks and the
    product's docstrings and messages call the engine ``--engine tsctl``, and name ``kserve`` only in a paragraph
    that says what it is (an alias, the former name, recorded as tsctl)."""
    explained = ("alias", "former name", "older name", "recorded as `tsctl`")
    files = [*DOCUMENTS, *(path for path in code_files() if not where(path).startswith("tests/"))]
    stale = [
        f"{where(path)}: {line.strip()}"
        for path in files
        for paragraph in re.split(r"\n\s*\n", path.read_text())
        if not any(words in paragraph.lower() for words in explained)
        for line in paragraph.splitlines()
        if re.search(r"engine[ =]kserve\b", line)
    ]
    assert not stale, "--engine kserve where the engine is --engine tsctl:\n" + "\n".join(stale)
