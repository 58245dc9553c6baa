"""scikit-learn searches as Quiver explorations (imports scikit-learn; ``import pipelines`` does not).

- :class:`GridSearchCV`, :class:`RandomizedSearchCV`: drop-in for scikit-learn's (they are
  subclasses), run as one exploration that fits each (step prefix, parameters, fold) once.
- :class:`HalvingGridSearchCV`, :class:`HalvingRandomSearchCV`: scikit-learn's successive
  halving, each iteration one exploration over the candidates left.
- :func:`from_sklearn`: the same exploration as a node, to add chooses, steps or a budget.
- :class:`OptunaSearchCV`: ``optuna_integration``'s drop-in (a subclass), run as one Quiver
  adaptive search whose trials share pipeline prefixes (needs ``pip install 'quiver[optuna]'``;
  imported on first use).

What is identical to scikit-learn's classes and what differs: docs/sklearn-dropin.md.

>>> from sklearn import model_selection
>>> from pipelines.sklearn import GridSearchCV
>>> issubclass(GridSearchCV, model_selection.GridSearchCV)
True
"""

from .exploration import from_sklearn
from .search import GridSearchCV, HalvingGridSearchCV, HalvingRandomSearchCV, RandomizedSearchCV

__all__ = ["GridSearchCV", "RandomizedSearchCV", "HalvingGridSearchCV", "HalvingRandomSearchCV", "from_sklearn",
           "OptunaSearchCV"]


def __getattr__(name: str):
    """``OptunaSearchCV`` on first use: it imports Optuna and optuna-integration (the optuna extra)."""
    if name == "OptunaSearchCV":
        try:
            import optuna_integration.sklearn  # noqa: F401
        except ImportError as exc:
            raise ImportError(f"pipelines.sklearn.OptunaSearchCV needs optuna-integration ({exc}): "
                              "pip install 'quiver[optuna]' (or pip install optuna-integration).") from None
        from .optunasearch import OptunaSearchCV

        return OptunaSearchCV
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
