"""scikit-learn searches as Quiver explorations (imports scikit-learn; ``import pipelines`` does not).

- :class:`GridSearchCV`, :class:`RandomizedSearchCV`: drop-in for scikit-learn's (they are
  subclasses), run as one exploration that fits each (step prefix, parameters, fold) once.
- :class:`HalvingGridSearchCV`, :class:`HalvingRandomSearchCV`: scikit-learn's successive
  halving, each iteration one exploration over the candidates left.
- :func:`from_sklearn`: the same exploration as a node, to add chooses, steps or a budget.

What is identical to scikit-learn's classes and what differs: docs/sklearn-dropin.md.

>>> from pipelines.sklearn import GridSearchCV
>>> GridSearchCV.__mro__[2].__module__
'sklearn.model_selection._search'
"""

from .exploration import from_sklearn
from .search import GridSearchCV, HalvingGridSearchCV, HalvingRandomSearchCV, RandomizedSearchCV

__all__ = ["GridSearchCV", "RandomizedSearchCV", "HalvingGridSearchCV", "HalvingRandomSearchCV", "from_sklearn"]
