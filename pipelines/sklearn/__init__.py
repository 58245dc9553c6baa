"""scikit-learn searches as Quiver explorations (imports scikit-learn; ``import pipelines`` does not).

- :class:`GridSearchCV`, :class:`RandomizedSearchCV`: drop-in for scikit-learn's (they are
  subclasses), run as one exploration that fits each (step prefix, parameters, fold) once.
- :func:`from_sklearn`: the same exploration as a node, to add chooses, steps or a budget.

``HalvingGridSearchCV`` is not here yet: it needs the pruning choose, which has not landed.

>>> from pipelines.sklearn import GridSearchCV
>>> GridSearchCV.__mro__[2].__module__
'sklearn.model_selection._search'
"""

from .exploration import from_sklearn
from .search import GridSearchCV, RandomizedSearchCV

__all__ = ["GridSearchCV", "RandomizedSearchCV", "from_sklearn"]
