"""Imports only point down the layers (README, Layout): every `import` in the package, at module level
or inside a function, is read from the source and checked against the layer order."""

from __future__ import annotations

import ast
from pathlib import Path

import bulkrun

# Highest first. A module may import its own layer and any layer below it, never one above.
LAYERS = [
    "bulkrun.cli",
    "bulkrun.distributed",
    "bulkrun.job",
    "bulkrun.tasks",
    "bulkrun.io",
    "bulkrun.model_source",  # resolving a model reference: the job layer's, never the engine's
    "bulkrun.engine",
    "bulkrun.model",
    "bulkrun_kernels",
    "bulkrun.errors",  # exceptions and exit codes: importable from everywhere
]
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
            if rank is not None and rank < own:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{line} {module} imports {target}")
    return found


def test_no_module_imports_a_higher_layer():
    assert upward_imports() == []


def test_the_check_sees_upward_imports(tmp_path, monkeypatch):
    """The walk itself can fail: an engine module importing the job layer is reported."""
    fake = tmp_path / "bulkrun"
    (fake / "engine").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "engine" / "__init__.py").write_text("")
    (fake / "engine" / "loop.py").write_text("def f():\n    from bulkrun.job.spec import JobSpec\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    monkeypatch.setattr(__import__(__name__), "KERNELS", tmp_path / "none")
    assert upward_imports() == ["bulkrun/engine/loop.py:2 bulkrun.engine.loop imports bulkrun.job.spec"]
