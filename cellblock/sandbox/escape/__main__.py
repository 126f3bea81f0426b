"""Run the escape attempts as a script: ``python3 escape --json SPEC`` (see `spec.py`).

The folder is loaded as a package from its own path, under a name no installed package has, so
that its relative imports work in a jail that has no cellblock to import.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

__all__: list[str] = []

PACKAGE = "cellblock_escape"  # a name no package import can collide with


def _package() -> ModuleType:
    here = os.path.dirname(os.path.realpath(__file__))
    # run as a script, this folder comes first on sys.path: its modules are not top-level modules
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    spec = importlib.util.spec_from_file_location(
        PACKAGE, os.path.join(here, "__init__.py"), submodule_search_locations=[here]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the escape attempts from {here}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module  # dataclasses and the relative imports look the package up by name
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    sys.exit(_package().main())
