"""Imports only point down the layers (README, Layout): every `import` in the package, at module level
or inside a function, is read from the source and checked against the layer order."""

from __future__ import annotations

import ast
from pathlib import Path

import bulkrun

# Highest first. A module may import its own layer and any layer below it, never one above.
LAYERS = [
    "bulkrun.api",  # the Python API: runs jobs through bulkrun.execute, reads output directories
    "bulkrun.cli",  # parses, builds a JobSpec, calls bulkrun.execute
    "bulkrun.execute",  # runs a JobSpec: the one door of the CLI and the API
    "bulkrun.distributed",
    "bulkrun.job",
    "bulkrun.tasks",
    "bulkrun.io",
    "bulkrun.model_source",  # resolving a model reference: the job layer's, never the engine's
    "bulkrun.gguf_config",  # completing what transformers reads of a GGUF: model_source's conversion
    "bulkrun.engine",
    "bulkrun.model",
    "bulkrun_kernels",
    "bulkrun.exceptions",  # exceptions and exit codes: importable from everywhere
]
ALLOWED: set[tuple[str, str]] = set()  # no import may go up a layer
# Pairs of layers that may not import each other although the order allows it (importer, imported).
FORBIDDEN = [("bulkrun.api", "bulkrun.cli")]  # the library never depends on its command line
PACKAGE = Path(bulkrun.__file__).parent
KERNELS = PACKAGE.parent / "kernels"


def _layer(module: str) -> int | None:
    for rank, name in enumerate(LAYERS):
        if module == name or module.startswith(name + "."):
            return rank
    return None


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        yield ".".join(p for p in parts if p != "__init__"), path
    for path in sorted(KERNELS.rglob("*.py")):
        parts = ("bulkrun_kernels", *path.relative_to(KERNELS).with_suffix("").parts)
        yield ".".join(p for p in parts if p != "__init__"), path


def _imports(path: Path, module: str):
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                yield node.lineno, f"{base}.{node.module}" if node.module else base
            else:
                yield node.lineno, node.module


def upward_imports() -> list[str]:
    found = []
    for module, path in _sources():
        own = _layer(module)
        if own is None:
            continue
        for line, target in _imports(path, module):
            rank = _layer(target)
            if rank is not None and rank < own and (module, target) not in ALLOWED:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{line} {module} imports {target}")
    return found


def test_no_module_imports_a_higher_layer():
    assert upward_imports() == []


def forbidden_imports() -> list[str]:
    found = []
    for module, path in _sources():
        for importer, imported in FORBIDDEN:
            if module == importer or module.startswith(importer + "."):
                found += [
                    f"{path.relative_to(PACKAGE.parent)}:{line} {module} imports {target}"
                    for line, target in _imports(path, module)
                    if target == imported or target.startswith(imported + ".")
                ]
    return found


def test_the_api_does_not_import_the_cli():
    assert forbidden_imports() == []


def test_the_check_sees_upward_imports(tmp_path, monkeypatch):
    """The walk itself can fail: an engine module importing the job layer is reported."""
    fake = tmp_path / "bulkrun"
    (fake / "engine").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "engine" / "__init__.py").write_text("")
    (fake / "engine" / "loop.py").write_text("def f():\n    from bulkrun.job.spec import JobSpec\n")
    (fake / "api.py").write_text("from bulkrun.cli.app import app\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    monkeypatch.setattr(__import__(__name__), "KERNELS", tmp_path / "none")
    assert upward_imports() == ["bulkrun/engine/loop.py:2 bulkrun.engine.loop imports bulkrun.job.spec"]
    assert forbidden_imports() == ["bulkrun/api.py:1 bulkrun.api imports bulkrun.cli.app"]
