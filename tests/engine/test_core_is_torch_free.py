"""The engine's bookkeeping (bulkrun/engine/core) never imports torch nor the worker side: the scheduler,
block pool and requests stay plain Python, unit-tested in milliseconds (DESIGN.md, Engine layout)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import bulkrun.engine.core

CORE = Path(bulkrun.engine.core.__file__).parent
CORE_MODULES = sorted(f"bulkrun.engine.core.{p.stem}" for p in CORE.glob("*.py") if p.stem != "__init__")


def test_importing_every_core_module_loads_no_torch():
    imports = "; ".join(f"import {m}" for m in CORE_MODULES)
    probe = f"import sys; {imports}; print('torch' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split()[0] == "False", "an engine.core module pulled in torch"


def test_no_core_module_names_the_worker():
    offenders = []
    for path in CORE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [
                f"{path.name}: {n}"
                for n in names
                if n == "torch" or n.startswith(("torch.", "bulkrun.engine.worker"))
            ]
    assert offenders == []


def test_the_probe_sees_a_torch_import():
    out = subprocess.run([sys.executable, "-c", "import sys, torch; print('torch' in sys.modules)"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == "True"
