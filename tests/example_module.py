"""Import a script from ``examples/`` as a module the workers can run (one place for the recipe).

``examples/`` is not a package and is not on the workers' path, so its functions are shipped by
value (``cloudpickle.register_pickle_by_value``) for as long as the module is loaded.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import cloudpickle

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@contextlib.contextmanager
def example_module(script: str, name: str) -> Iterator[ModuleType]:
    """``with example_module("digits_explore.py", "digits_explore_example") as m: ...``"""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        cloudpickle.register_pickle_by_value(module)  # workers cannot import examples/
        yield module
    finally:
        with contextlib.suppress(ValueError):  # not registered when exec_module failed
            cloudpickle.unregister_pickle_by_value(module)
        del sys.modules[spec.name]
