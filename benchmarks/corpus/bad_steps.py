"""A corpus of step code with genuine failures (issue 44): each failing branch must be reported
as its own error (the user's file and line), an unpicklable value as ``ValueCannotTravel``
naming its step, and every other branch must still succeed.
"""
import threading

from pipelines import Pipeline, grid


def load(seed):
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return {"X_tr": X[:1200], "y_tr": y[:1200], "X_val": X[1200:], "y_val": y[1200:]}


def standard(data):
    from sklearn.preprocessing import StandardScaler

    s = StandardScaler().fit(data["X_tr"])
    return {**data, "X_tr": s.transform(data["X_tr"]), "X_val": s.transform(data["X_val"])}


def with_lock(data):
    """Returns a value holding a lock: it cannot be pickled, so it cannot leave its worker."""
    return {**data, "lock": threading.Lock()}


def missing_package(data):
    import quiver_corpus_no_such_package  # noqa: F401  (a package the worker lacks)

    return data


def raises(data, threshold):
    if threshold > 0:
        raise ValueError(f"bad threshold {threshold}")  # the user's own error
    return data


def logreg(data, C):
    from sklearn.linear_model import LogisticRegression

    m = LogisticRegression(C=C, max_iter=300).fit(data["X_tr"], data["y_tr"])
    return {"accuracy": m.score(data["X_val"], data["y_val"]), "model": m}


p = Pipeline("bad-corpus")
data = p.source(load, seed=0)
prepped = data.explore("prep", standard=standard, lock=with_lock, missing=missing_package,
                       raises=grid(raises, threshold=[0, 1]))
output = prepped.explore("model", grid(logreg, C=[0.1, 1.0])).choose("accuracy", mode="max")
