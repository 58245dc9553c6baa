"""Search spaces: an alternative whose parameters a sampler proposes (issue 47).

``space(fn, **params)`` is an alternative of an explore, like ``grid``, whose parameters are
Optuna distributions (``FloatDistribution``, ``IntDistribution``, ``CategoricalDistribution``)
or fixed values. Its distributions apply only when a search's proposal takes this alternative
(conditional parameters). Importing this module does not import Optuna: a distribution is
recognised only once the user's own code has imported ``optuna.distributions``.

>>> from optuna.distributions import FloatDistribution
>>> def fit(x, C, penalty): return x
>>> s = space(fit, C=FloatDistribution(1e-3, 1e2, log=True), penalty="l2")
>>> s
space(fit, C=FloatDistribution(high=100.0, log=True, low=0.001, step=None), penalty='l2')
>>> [name for name, _ in s.distributions("example")], s.fixed
(['C'], (('penalty', 'l2'),))
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from graph.errors import PipelineError
from graph.spec import fn_name

__all__ = ["Space", "space", "is_distribution", "SUPPORTED"]

#: the Optuna distributions a space takes (their public names in ``optuna.distributions``)
SUPPORTED = ("FloatDistribution", "IntDistribution", "CategoricalDistribution")


def is_distribution(value: Any) -> bool:
    """Whether ``value`` is an Optuna distribution (without importing Optuna).

    >>> is_distribution(0.5), is_distribution([1, 2])
    (False, False)
    """
    mod = sys.modules.get("optuna.distributions")
    return mod is not None and isinstance(value, mod.BaseDistribution)


class Space:
    """``space(fn, **params)``: one alternative whose distributions a search's sampler proposes."""

    def __init__(self, fn: Callable, **params: Any):
        self.fn = fn
        self.params = params

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        name = fn_name(self.fn) if callable(self.fn) else repr(self.fn)
        return f"space({name}, {inner})"

    @property
    def fixed(self) -> tuple[tuple[str, Any], ...]:
        """The parameters that are plain values (the same in every proposal)."""
        return tuple((k, v) for k, v in self.params.items() if not is_distribution(v))

    def distributions(self, where: str) -> tuple[tuple[str, Any], ...]:
        """The checked distributions, in the order given."""
        if not callable(self.fn):
            raise PipelineError(
                f"{where}: {self!r} needs a callable as its first argument, got {type(self.fn).__name__}. "
                "Pass the step function itself: space(fit, C=FloatDistribution(1e-3, 1e2, log=True))."
            )
        out = []
        for name, value in self.params.items():
            if is_distribution(value):
                kind = type(value).__name__
                if not any(cls.__name__ in SUPPORTED for cls in type(value).__mro__):
                    raise PipelineError(
                        f"{where}: {self!r}: parameter {name!r} is an optuna {kind}; a space takes "
                        f"{', '.join(SUPPORTED)} (optuna.distributions). Write e.g. "
                        f"{name}=FloatDistribution(low, high, log=True)."
                    )
                out.append((name, value))
            elif isinstance(value, (list, tuple, set, range)) and value and not isinstance(value, str):
                raise PipelineError(
                    f"{where}: {self!r}: parameter {name!r} is a {type(value).__name__}, which a space "
                    f"would pass as one fixed value. To let the sampler pick among them, write "
                    f"{name}=CategoricalDistribution({list(value)!r}); for a fixed value, a plain one."
                )
            elif type(value).__module__.split(".")[0] == "optuna":
                raise PipelineError(
                    f"{where}: {self!r}: parameter {name!r} is an optuna {type(value).__name__}, not a "
                    f"distribution; a space takes {', '.join(SUPPORTED)}."
                )
        if not out:
            raise PipelineError(
                f"{where}: {self!r} has no distribution to search; give at least one "
                "(C=FloatDistribution(1e-3, 1e2, log=True)), or pass the function itself (or grid(...)) "
                "for fixed parameters."
            )
        return tuple(out)


def space(fn: Callable, **params: Any) -> Space:
    """An alternative of ``explore`` whose parameters a search's sampler proposes: each one an
    Optuna distribution (``FloatDistribution(low, high, log=...)``, ``IntDistribution``,
    ``CategoricalDistribution``) or a fixed value. Run it with ``node.search(...)``.

    >>> from optuna.distributions import IntDistribution
    >>> def tree(x, depth): return x
    >>> space(tree, depth=IntDistribution(2, 8)).params["depth"].high
    8
    """
    return Space(fn, **params)
