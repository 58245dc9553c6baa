"""A corpus of ordinary step code, every branch of which should succeed (issue 44).

Written as users write steps, not for Quiver: imports inside step bodies, module-level caches,
closures, lambdas and ``functools.partial``, a generator step, a class with ``__getstate__``,
pandas / NumPy / torch / scikit-learn objects travelling as values, a value over 100 MB, steps
that print, warn and log, a step that starts threads and one that uses joblib. Run it with
``quiver run benchmarks/corpus/good_steps.py`` or through ``benchmarks/step_corpus.py``.
"""
import functools
import logging
import threading
import warnings

from pipelines import Pipeline, grid

_CACHE = {}  # module-level state a step fills


def load(seed):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    X_tr, X_val, y_tr, y_val = train_test_split(X, y, test_size=0.3, random_state=seed, stratify=y)
    return {"X_tr": X_tr, "y_tr": y_tr, "X_val": X_val, "y_val": y_val}


def _scaled(data, scaler):
    scaler.fit(data["X_tr"])
    return {**data, "X_tr": scaler.transform(data["X_tr"]), "X_val": scaler.transform(data["X_val"]), "scaler": scaler}


def robust(data):
    from sklearn.preprocessing import RobustScaler  # imported in the body, the scaler travels on

    return _scaled(data, RobustScaler())


def standard(data):
    from sklearn.preprocessing import StandardScaler

    return _scaled(data, StandardScaler())


def frame(data):
    """pandas objects as values, and a module-level cache."""
    import pandas as pd

    df = pd.DataFrame(data["X_tr"]).astype("float32")
    _CACHE["columns"] = list(df.columns)
    return {**data, "X_tr": df.to_numpy(), "frame": df.describe()}


class Clipper:
    """A class instance with __getstate__ that travels as a value (its lock stays behind)."""

    def __init__(self, limit):
        self.limit, self.lock = limit, threading.Lock()

    def __getstate__(self):
        return {"limit": self.limit}

    def __setstate__(self, state):
        self.limit, self.lock = state["limit"], threading.Lock()


def clipped(data, limit):
    import numpy as np

    c = Clipper(limit)
    with c.lock:
        return {**data, "X_tr": np.clip(data["X_tr"], -c.limit, c.limit), "X_val": np.clip(data["X_val"], -c.limit, c.limit), "clipper": c}


def chatty(data):
    """Prints, warns and logs."""
    print("chatty: scaling", len(data["X_tr"]), "rows")
    warnings.warn("chatty: a user warning from a step", UserWarning)
    logging.getLogger("user.steps").info("chatty: logged")
    return data


def threaded(data):
    """Starts (and joins) threads of its own."""
    import numpy as np

    out = {}

    def work(name, x):
        out[name] = np.asarray(x, dtype="float64") / 2.0

    ts = [threading.Thread(target=work, args=(k, data[k])) for k in ("X_tr", "X_val")]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return {**data, **out}


def logreg(data, C):
    from sklearn.linear_model import LogisticRegression

    m = LogisticRegression(C=C, max_iter=500).fit(data["X_tr"], data["y_tr"])
    return {"accuracy": m.score(data["X_val"], data["y_val"]), "model": m}


def forest(data, n_estimators):
    from sklearn.ensemble import RandomForestClassifier  # joblib inside

    m = RandomForestClassifier(n_estimators=n_estimators, n_jobs=2, random_state=0).fit(data["X_tr"], data["y_tr"])
    return {"accuracy": m.score(data["X_val"], data["y_val"]), "model": m}


def _knn(data, k, weights):
    from sklearn.neighbors import KNeighborsClassifier

    m = KNeighborsClassifier(n_neighbors=k, weights=weights).fit(data["X_tr"], data["y_tr"])
    return {"accuracy": m.score(data["X_val"], data["y_val"]), "model": m}


def torch_mlp(data, epochs):
    """A generator step: a torch.optim loop, one report per epoch; the module travels as the value."""
    import torch

    torch.manual_seed(0)
    X = torch.tensor(data["X_tr"], dtype=torch.float32)
    y = torch.tensor(data["y_tr"])
    Xv = torch.tensor(data["X_val"], dtype=torch.float32)
    yv = torch.tensor(data["y_val"])
    net = torch.nn.Sequential(torch.nn.Linear(X.shape[1], 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for _ in range(epochs):
        for i in range(0, len(X), 64):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(X[i:i + 64]), y[i:i + 64])
            loss.backward()
            opt.step()
        with torch.no_grad():
            acc = float((net(Xv).argmax(1) == yv).float().mean())
        yield {"accuracy": acc, "loss": float(loss)}
    return {"accuracy": acc, "model": net}


def big(data, megabytes):
    """A value over 100 MB that travels on to the model steps."""
    import numpy as np

    return {**data, "ballast": np.ones(megabytes * 2**20 // 8)}


p = Pipeline("good-corpus")
data = p.source(load, seed=0)
prepped = data.explore(
    "prep",
    robust=robust,
    standard=standard,
    frame=frame,
    clip=functools.partial(clipped, limit=8.0),
    chatty=chatty,
    threaded=threaded,
    ballast=functools.partial(big, megabytes=110),
    identity=lambda d: d,
)
fitted = prepped.explore(
    "model",
    grid(logreg, C=[0.1, 1.0]),
    grid(forest, n_estimators=[10]),
    grid(torch_mlp, epochs=[2]),
    knn=functools.partial(_knn, k=3, weights="distance"),
)
output = fitted.choose("accuracy", mode="max")
