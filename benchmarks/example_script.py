"""A script of ``examples/`` loaded as a module the benchmark's workers can run.

``examples/`` is not a package and not on the workers' path, so the module's functions are
shipped by value (``cloudpickle.register_pickle_by_value``). The benchmarks that time an
example's own steps (``train_explore.py``, ``staged_training.py``) load it here.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(script: str, name: str) -> ModuleType:
    """``load_example("tune_mnist.py", "tune_mnist")``: the example, imported once, by value on workers."""
    import cloudpickle

    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module
