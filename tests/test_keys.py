"""Task keys follow the code a step really runs: its helpers and constants, in any process."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

from graph.keys import metric_key, step_key

ROOT = Path(__file__).resolve().parent.parent

MODULE = '''
SCALE = {scale}
def bonus(x):
    return x + SCALE
class Score:
    def __call__(self, v):
        return v["x"] * {weight}
def step(x):
    return bonus(x)
'''


def load(scale=1, weight=1):
    m = types.ModuleType("user_steps")
    exec(MODULE.format(scale=scale, weight=weight), m.__dict__)
    return m


def test_editing_a_helper_or_a_module_constant_changes_the_step_key():
    base = step_key(load().step, {}, ("in",))
    assert step_key(load().step, {}, ("in",)) == base  # same code, same key
    assert step_key(load(scale=2).step, {}, ("in",)) != base  # the helper reads another constant


def test_editing_a_callable_objects_class_changes_the_metric_key():
    score = load().Score
    assert metric_key(score(), "v") == metric_key(score(), "v")
    assert metric_key(load(weight=2).Score(), "v") != metric_key(score(), "v")


def test_keys_do_not_depend_on_the_string_hash_seed():
    code = (
        "import sys; sys.path.insert(0, %r)\n"
        "from graph.keys import step_key\n"
        "def f(x, how='mean'):\n"
        "    return how in {'mean', 'median', 'max', 'min'}\n"
        "print(step_key(f, {}, ()))\n" % str(ROOT)
    )
    keys = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env=dict(os.environ, PYTHONHASHSEED=str(seed))).stdout
        for seed in (1, 2, 3)
    }
    assert len(keys) == 1


def test_graph_keys_owns_the_key_format_both_ways():
    from graph.keys import original_key, recompute_key, step_name

    def fit_model(x, c):
        return x

    key = step_key(fit_model, {"c": 1}, ("in",))
    assert step_name(key) == "fit_model"
    copy = recompute_key(key, 3)
    assert copy != key and original_key(copy) == key and step_name(copy) == "fit_model"
    assert original_key(key) == key and original_key(("tuple", "key")) == ("tuple", "key")
    assert step_name(metric_key("accuracy", key)) == "metric"
