"""What ``tsctl package --handler`` names, resolved as torch-model-archiver and TorchServe read it (``resolve``): a
toolkit handler by name (its package bundled), a handler file stored in the archive (``file.py``,
``file.py:function``, without the ``.py`` as torch-model-archiver adds it), a TorchServe built-in
(``object_detector``, ``ts.torch_handler.NAME``), or a module TorchServe can import. And what a toolkit handler
behind it declares (``declared``, ``fitted_handler``), read from the catalogue or from the user's file, loaded
as a worker would load it (``load_handler_file``). ``inputs`` is the build's (archiver/mar.py ``Inputs``): a
handler file goes into the archive through it."""

import ast
import difflib
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from typing import List, Optional, Tuple

from handlers import catalogue
from handlers.settings import did_you_mean

from .errors import UserError

BUILTIN_PREFIX = "ts.torch_handler."  # --handler ts.torch_handler.NAME: TorchServe's built-in NAME


def resolve(handler: str, inputs, extra_files: List[str] = ()) -> Tuple[str, bool]:
    """The manifest's handler string and whether to bundle the toolkit's ``handlers/`` package.

    Every value torch-model-archiver takes means what it means there: a handler file (``file.py``,
    ``file.py:function``, or either without the ``.py`` torch-model-archiver adds) is stored in the
    archive; TorchServe's built-in handlers
    (``object_detector``, ``image_segmenter``, ``base_handler``, ...) are written into the manifest
    by name, and so is ``ts.torch_handler.NAME`` (``ts.torch_handler.image_classifier``: TorchServe's
    own image classifier, where the bare name is the toolkit's), the archive torch-model-archiver
    makes of ``--handler NAME``; any other module TorchServe can import is written as it is. A
    toolkit handler's name (``image_classifier``, ``text_classifier``, ...) is the toolkit's
    handler, whose package is bundled."""
    if handler in catalogue.HANDLERS:
        return catalogue.HANDLERS[handler].entry_point, True
    path, _, function = handler.partition(":")
    if _looks_like_a_path(path) and not Path(path).is_file() and not Path(path + ".py").is_file():
        raise UserError(_missing_handler_file(path))  # a file meant, not a name: the file is missing
    if Path(path).suffix == ".py":
        return _handler_file(Path(path), function, inputs)
    builtin = handler.removeprefix(BUILTIN_PREFIX)
    if builtin in torchserve_handlers():  # written as torch-model-archiver writes a built-in's name
        return builtin, False
    if Path(path + ".py").is_file():  # DIR/my_handler[:function]: torch-model-archiver adds the .py
        return _handler_file(Path(path + ".py"), function, inputs)
    toolkit = catalogue.by_entry_module(path)
    if toolkit:  # handlers.image: the toolkit's own module, which is bundled only by its name
        raise UserError(f"--handler {handler} is the toolkit's {toolkit.name}: pass --handler {toolkit.name}")
    carried = {Path(e).stem if e.endswith(".py") else Path(e).name for e in extra_files}
    if path.split(".")[0] in carried or _module_exists(path):
        return handler, False
    known = sorted(set(catalogue.HANDLERS) | set(torchserve_handlers()))
    raise UserError(
        f"unknown --handler {handler!r}: not a toolkit handler, a TorchServe built-in, a module TorchServe "
        f"can import, nor a .py file{did_you_mean(path, known, 'handlers')}"
    )


def _looks_like_a_path(value: str) -> bool:
    """A ``--handler`` value that names a file (``dir/x``, ``x.py``), never a handler or module name."""
    return "/" in value or os.sep in value or value.strip().lower().endswith(".py")


def _missing_handler_file(path: str) -> str:
    """The one line for a ``--handler`` file that is not there: the path, a near file of its directory,
    and the fix."""
    given = Path(path)
    if given.is_dir():
        return f"--handler {path}: is a directory, not a handler file: give the .py file in it (e.g. {path}/handler.py)"
    folder = given.parent
    near = ""
    if folder.is_dir():
        try:
            files = sorted(p.name for p in folder.iterdir() if p.suffix == ".py" and p.is_file())
        except OSError:
            files = []
        close = difflib.get_close_matches(given.name, files, n=1, cutoff=0.6)
        if close:
            near = f" (did you mean {(folder / close[0]).as_posix() if str(folder) != '.' else close[0]}?)"
    shown = path if path == path.strip() else repr(path)  # a stray space is what is wrong: show it
    return (
        f"--handler {shown}: no such file{near}: check the path of your handler file (relative to the directory "
        "tsctl runs in), or give a toolkit handler by name: " + ", ".join(sorted(catalogue.HANDLERS))
    )


def _handler_file(source: Path, function: str, inputs) -> Tuple[str, bool]:
    """A handler file stored in the archive: its manifest entry, and whether it imports the toolkit."""
    inputs.add(str(source), "--handler")
    imports_toolkit = _imports_toolkit(source)
    if function and not imports_toolkit and not _defines(source, function):
        raise UserError(f"--handler {source}:{function}: {source} defines no '{function}' at its top level")
    return source.name + (f":{function}" if function else ""), imports_toolkit


def torchserve_handlers() -> List[str]:
    """TorchServe's built-in handler names (``ts/torch_handler/*.py``, less ``contractions``, a word
    list), read from the installed package's files without importing it."""
    spec = importlib.util.find_spec("ts")
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = Path(list(spec.submodule_search_locations)[0]) / "torch_handler"
    return [p.stem for p in folder.glob("*.py") if not p.stem.startswith("_") and p.stem != "contractions"]


def _module_exists(module: str) -> bool:
    """True for a dotted module name this Python's path holds, found without importing anything
    (finding ``a.b`` through ``importlib`` would run ``a/__init__.py``)."""
    parts = module.split(".")
    if not all(part.isidentifier() for part in parts):
        return False
    search = None
    for part in parts:
        try:
            spec = importlib.machinery.PathFinder.find_spec(part, search)
        except (ImportError, ValueError, OSError):
            return False
        if spec is None:
            return False
        search = spec.submodule_search_locations
        if search is None and part != parts[-1]:
            return False  # a module, not a package, with more names after it
    return True


def _defines(source: Path, name: str) -> bool:
    """True when a Python file defines ``name`` at its top level (def, class, assignment, import)."""
    tree = ast.parse(source.read_bytes(), filename=str(source))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == name for a in node.names):
            return True
    return False


def _imports_toolkit(source: Path) -> bool:
    """True when a user's handler file imports this toolkit's ``handlers`` package."""
    try:
        tree = ast.parse(source.read_bytes(), filename=str(source))
    except SyntaxError as exc:
        raise UserError(f"--handler {source} is not valid Python (line {exc.lineno}): {exc.msg}") from None
    except ValueError as exc:  # null bytes
        raise UserError(f"--handler {source} is not a Python source file: {exc}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "handlers" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "handlers":
            return True
    return False


def declared(handler: str, handler_entry: str, bundle: bool) -> Optional[catalogue.Declared]:
    """What the toolkit handler behind ``--handler`` declares: a toolkit handler's by name, read
    from the catalogue (no torch); else that of its class in the user's ``--handler`` file (imported,
    as a worker will); None for a handler that is not a toolkit one."""
    if handler in catalogue.HANDLERS:
        return catalogue.HANDLERS[handler].declared()
    served = handler_class(handler_entry, handler) if bundle else None
    return catalogue.declared_by(served) if served is not None else None


def fitted_handler(handler: str, declared: Optional[catalogue.Declared]) -> str:
    """The toolkit handler whose fit to the model ``fit.problem`` checks: ``--handler``'s name, or for a
    handler file (``tsctl init``'s) the toolkit handler its class subclasses, unless it loads its model
    itself."""
    if handler in catalogue.HANDLERS or declared is None or declared.loads_own_model:
        return handler
    subclassed = catalogue.subclassed(declared)
    return subclassed.name if subclassed else handler


def handler_class(handler_entry: str, handler: str):
    """The class a user's ``--handler`` file serves, found as TorchServe's model loader finds the
    entry point: the class its function (``handle = entry_point(MyHandler)``, or the
    ``file.py:function`` named) serves, else the one class the file defines (which TorchServe
    instantiates itself) if it is a toolkit handler. None for any other."""
    function = handler_entry.partition(":")[2]
    module = load_handler_file(Path(handler.partition(":")[0]))
    if hasattr(module, function or "handle"):
        return getattr(getattr(module, function or "handle"), "handler_class", None)
    defined = [c for c in vars(module).values() if inspect.isclass(c) and c.__module__ == module.__name__]
    is_toolkit = len(defined) == 1 and any(
        (k.__module__, k.__qualname__) == ("handlers.base", "ToolkitHandler") for k in defined[0].__mro__
    )
    return defined[0] if is_toolkit else None


def load_handler_file(path: Path):
    """Run a user's handler file as a module, as a worker would (its directory first on sys.path),
    without leaving it in sys.modules. A file that fails to import is the user's one-line error."""
    name = f"_tsctl_handler_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's code; its error is theirs to fix
        raise UserError(f"--handler {path} failed to import: {type(exc).__name__}: {exc}") from None
    finally:
        sys.path.remove(str(path.parent.resolve()))
        sys.modules.pop(name, None)
    return module
