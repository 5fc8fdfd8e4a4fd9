"""``tsctl init NAME --from START``: a handler of your own, ready to change, test, package and serve.

Writes ``NAME/`` with three files:

- ``handler.py``: ``class <CamelName>(<toolkit handler>)`` with the hooks a handler overrides (decode,
  preprocess, inference, postprocess; ``blank`` also load_model, all written out), each saying what it
  receives and returns; a ``@dataclass`` Settings subclass with one setting of its own; and
  ``handle = entry_point(<CamelName>)``, which ``tsctl package --handler NAME/handler.py`` finds and
  records in MAR-INF/tsctl.json.
- ``model-config.yaml``: TorchServe's worker keys, then every ``handler:`` setting with its default and
  its comment. It passes ``tsctl package``'s validation as written.
- ``test_NAME.py``: packages the handler with a stand-in model (``archiver.mar.package``), runs it
  with ``serving.local_model.LocalModel`` and checks answers and per-request errors. Its name is the
  handler's own, so the tests of several handlers run in one pytest process (two ``test_handler.py``
  would be one module name twice: pytest's "import file mismatch").

What each ``--from`` start subclasses, and the flags and input files of the commands it prints next,
come from the handler catalogue (``handlers.catalogue.STARTS``). No torch here, so the command stays
fast. The files are text templates (``templates/START/*.tmpl``, ``__NAME__``, ``__CLASS__`` and
``__TEST__`` replaced). The toolkit's settings, defaults and comments come from
``templates/settings.json``, a table written from the real Settings classes by
``python -m archiver.scaffold`` (which imports them); tests/cli/test_init.py fails when the table and the
classes disagree. The handler's own settings are read from the rendered handler.py with ``ast``.
"""

import ast
import builtins
import dataclasses
import importlib
import inspect
import io
import json
import keyword
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from handlers import catalogue

from .errors import UserError

TEMPLATES = Path(__file__).parent / "templates"
SETTINGS_TABLE = TEMPLATES / "settings.json"
NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
TEST_TEMPLATE = "test_handler.py"  # templates/START/test_handler.py.tmpl, written as test_NAME.py
RESERVED = {"handlers", "serving", "archiver"}  # a NAME/ directory would hide them from the generated test
COMMENT_COLUMN = 32  # model-config.yaml's comments start here, unless the entry is longer


STARTS = catalogue.STARTS  # --from's choices: each toolkit handler a scaffold starts from, and blank


# TorchServe's keys, first in model-config.yaml: (key, value, comment).
WORKER_KEYS = (
    ("minWorkers", 1, "worker processes TorchServe starts for this model"),
    ("maxWorkers", 1, "at most this many; each holds its own copy of the model"),
    ("batchSize", 8, "requests per handler call, at most (tsctl bench --sweep-batch tunes it)"),
    ("maxBatchDelay", 50, "milliseconds TorchServe waits for a batch to fill"),
    ("responseTimeout", 120, "seconds one batch may take before TorchServe restarts the worker"),
)


@dataclass
class Written:
    """What ``init`` wrote: the files, the class it named, the commands to run next and what the
    files they name are."""

    directory: Path
    files: List[Path]
    class_name: str
    next_commands: List[str]
    note: str


def init(name: str, start: str, parent: Path = Path(".")) -> Written:
    """Write ``parent/name/`` for ``--from start``. UserError (nothing written) for a NAME that is not
    a plain name, or a NAME/ that exists and is not empty."""
    if start not in STARTS:
        raise UserError(f"unknown --from {start!r}: use one of {', '.join(STARTS)}")
    if not NAME.match(name):
        raise UserError(
            f"invalid NAME {name!r}: use up to 64 letters, digits, '_' and '-', starting with a letter "
            "(it names the directory, the model and the handler class)"
        )
    if name in RESERVED:
        raise UserError(f"NAME {name!r} is the name of one of tsctl's own packages (it would shadow it): pick another")
    directory = Path(parent) / name
    if directory.is_symlink() or (directory.exists() and not directory.is_dir()):
        raise UserError(f"{directory} already exists and is not a directory: pick another NAME")
    if directory.is_dir() and any(directory.iterdir()):
        raise UserError(f"{directory}/ already exists and is not empty: pick another NAME, or remove it")
    contents = render(name, start)
    written = []
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for file_name in files(name):
            path = directory / file_name
            with open(path, "x", encoding="utf-8") as out:  # never over a file that appeared meanwhile
                out.write(contents[file_name])
            written.append(path)
    except OSError as exc:
        raise UserError(f"could not write {exc.filename or directory}: {exc.strerror or exc}") from None
    return Written(directory, written, class_name(name, start), next_commands(name, start), STARTS[start].weights_are)


def files(name: str) -> Tuple[str, str, str]:
    """The three files ``init`` writes in NAME/, in order: the handler, its config, its test."""
    return ("handler.py", "model-config.yaml", test_file(name))


def test_file(name: str) -> str:
    """``test_NAME.py``: a module name no other handler's test has (pytest imports each test file by its
    base name; ``test_scorer-v2`` imports as it is)."""
    return f"test_{name}.py"


def render(name: str, start: str) -> Dict[str, str]:
    """The three files' contents, by file name."""
    klass = class_name(name, start)
    handler = fill(template(start, "handler.py"), name, klass)
    test = fill(template(start, TEST_TEMPLATE), name, klass)
    own = own_settings(handler, klass + "Settings")
    return {"handler.py": handler, "model-config.yaml": model_config(name, start, klass, own), test_file(name): test}


def template(start: str, file_name: str) -> str:
    return (TEMPLATES / start / f"{file_name}.tmpl").read_text(encoding="utf-8")


def fill(text: str, name: str, klass: str) -> str:
    return text.replace("__TEST__", test_file(name)).replace("__NAME__", name).replace("__CLASS__", klass)


def class_name(name: str, start: str) -> str:
    """``sentiment_v2`` -> ``SentimentV2``; ``My...`` when that name is taken in the handler file
    (``text_embedder`` would shadow the TextEmbedder it subclasses), a builtin or a keyword."""
    camel = "".join(part[:1].upper() + part[1:] for part in re.split(r"[_-]+", name) if part)
    taken = template_names(start) | set(dir(builtins))
    if keyword.iskeyword(camel) or camel in taken or camel + "Settings" in taken:
        camel = "My" + camel
    return camel


def template_names(start: str) -> set:
    """The top-level names the handler template binds (imports, classes, functions), its own excepted."""
    names = set()
    for node in ast.parse(template(start, "handler.py")).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
    return {name for name in names if "__CLASS__" not in name}


def next_commands(name: str, start: str) -> List[str]:
    spec = STARTS[start]
    return [
        f"python -m pytest {name}/{test_file(name)}",
        f"tsctl package --model-name {name} --handler {name}/handler.py --config-file {name}/model-config.yaml "
        f"{spec.weights}",
        "tsctl config",
        "tsctl serve",
        f"{spec.make_input}tsctl predict {name} {spec.predict}",
        "tsctl stop",
    ]


# ---- model-config.yaml ---------------------------------------------------------------------------
def model_config(name: str, start: str, klass: str, own: List[dict]) -> str:
    """TorchServe's worker keys, then the handler: section: the toolkit's settings (from the table) and
    the handler's own (``own``), each with its default and comment, grouped by where it is defined."""
    rows = read_table()[start] + [dict(row, source=f"yours: {klass}Settings in {name}/handler.py") for row in own]
    lines = [
        f"# {name}: packaged into the archive with tsctl package --config-file {name}/model-config.yaml.",
        "# TorchServe reads the keys at the top; the handler reads its handler: section into",
        f"# {klass}Settings (handler.py). Every handler setting is listed with its default: change",
        "# or delete them; a key the handler does not know is refused when the archive is packaged.",
    ]
    lines += [commented(f"{key}: {value}", comment) for key, value, comment in WORKER_KEYS]
    lines.append("handler:")
    source = None
    for row in rows:
        if row["source"] != source:
            source = row["source"]
            lines.append(f"  # from {source}" if not source.startswith("yours") else f"  # {source}")
        lines.append(commented(f"  {row['key']}: {yaml_value(row['default'])}", row["comment"]))
    return "\n".join(lines) + "\n"


def commented(entry: str, comment: str) -> str:
    if not comment:
        return entry
    return f"{entry.ljust(COMMENT_COLUMN - 2)}  # {comment}"


def yaml_value(value) -> str:
    """One value as YAML flow text: 256, 0.5, null, [0.485, 0.456], index_to_name.json, 'yes'."""
    import yaml  # here, not at the top: the CLI reads STARTS for every command's --help

    text = yaml.safe_dump([value], default_flow_style=True, width=10_000).strip()
    return text[1:-1]


def read_table() -> Dict[str, List[dict]]:
    return json.loads(SETTINGS_TABLE.read_text(encoding="utf-8"))


def own_settings(handler_source: str, settings_class: str) -> List[dict]:
    """The fields ``settings_class`` defines in the rendered handler.py: key, default, comment.
    Defaults are literals (read with ast.literal_eval); nothing is imported."""
    tree = ast.parse(handler_source)
    comments = line_comments(handler_source)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == settings_class:
            return [
                {
                    "key": stmt.target.id,
                    "default": ast.literal_eval(stmt.value),
                    "comment": comments.get(stmt.end_lineno, ""),
                }
                for stmt in node.body
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None
            ]
    raise ValueError(f"the handler template defines no {settings_class}")


def line_comments(source: str) -> Dict[int, str]:
    """{line number: the text of the comment ending that line}."""
    return {
        token.start[0]: token.string.lstrip("#").strip()
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    }


# ---- the settings table, from the real classes (imports torch) ------------------------------------
# For settings whose source says nothing about them, neither on the field nor in a module docstring.
FALLBACK_COMMENTS = {
    "mean": "per channel (R, G, B), subtracted from pixels scaled to 0..1",
    "std": "per channel (R, G, B), divides them after",
    "top_k": "labels in each answer, the most probable first",
    "labels": "the archive's class index -> name file (--extra-files); absent: labels are indices",
}


def settings_table() -> Dict[str, List[dict]]:
    """For each start (catalogue.STARTS), every field of its Settings class in order: key, default (tuples as lists),
    comment (the field's own ``# ...``, else the one its module's docstring gives the key, else the
    handler module's), and the class defining it (``source``)."""
    table = {}
    for start, spec in STARTS.items():
        module = importlib.import_module(spec.module)
        settings = getattr(module, spec.settings)
        rows = []
        for field in dataclasses.fields(settings):
            owner = next(c for c in settings.__mro__ if field.name in vars(c).get("__annotations__", {}))
            comment = (
                class_field_comments(owner).get(field.name)
                or docstring_comments(sys.modules[owner.__module__]).get(field.name)
                or docstring_comments(module).get(field.name)
                or FALLBACK_COMMENTS.get(field.name, "")
            )
            rows.append(
                {
                    "key": field.name,
                    "default": plain(default_of(field)),
                    "comment": comment,
                    "source": f"{owner.__module__}.{owner.__qualname__}",
                }
            )
        table[start] = rows
    return table


def default_of(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    raise ValueError(f"setting {field.name} has no default: every handler setting needs one")


def plain(value):
    """A default as JSON/YAML holds it: tuples as lists."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def class_field_comments(cls) -> Dict[str, str]:
    """{field: the comment on its line} for a dataclass, from its source."""
    source = inspect.getsource(sys.modules[cls.__module__])
    comments = line_comments(source)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            return {
                stmt.target.id: comments[stmt.end_lineno]
                for stmt in node.body
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.end_lineno in comments
            }
    return {}


DOC_KEY = re.compile(r"^\s+([A-Za-z_]\w*):[^#]*#\s*(.+?)\s*$")


def docstring_comments(module) -> Dict[str, str]:
    """{key: comment} from the ``handler:`` block of a module's docstring (``  top_k: 5  # ...``)."""
    found = {}
    lines = (module.__doc__ or "").splitlines()
    for number, line in enumerate(lines):
        if line.strip() != "handler:":
            continue
        indent = len(line) - len(line.lstrip())
        for entry in lines[number + 1 :]:
            if entry.strip() and len(entry) - len(entry.lstrip()) <= indent:
                break  # the block under handler: ended
            match = DOC_KEY.match(entry)
            if match:
                found.setdefault(match.group(1), match.group(2))
    return found


def write_table(path: Optional[Path] = None) -> Path:
    path = Path(path or SETTINGS_TABLE)
    path.write_text(json.dumps(settings_table(), indent=2) + "\n", encoding="utf-8")
    return path


if __name__ == "__main__":  # python -m archiver.scaffold: write templates/settings.json from the classes
    print(write_table())
