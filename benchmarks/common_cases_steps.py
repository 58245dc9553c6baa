"""The steps of benchmarks/common_cases.py's workloads, in a module every tool's workers import
(Dask workers, joblib's loky workers, joblib's cache all pickle them by reference).

Each step is written once and used by every tool: Quiver's exploration, one ``dask.compute``
of ``dask.delayed(pure=True)`` branches, and, through :func:`sk_pipeline`, scikit-learn's and
dask-ml's searches, so the tools do the same work.
"""

from __future__ import annotations

import numpy as np
from sklearn.datasets import load_digits, make_classification
from sklearn.decomposition import PCA
from sklearn.ensemble import HistGradientBoostingClassifier, RandomForestClassifier
from sklearn.feature_selection import SelectKBest, f_classif
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import MaxAbsScaler, MinMaxScaler, PolynomialFeatures, RobustScaler, StandardScaler
from sklearn.svm import SVC

SCALERS = {"standard": StandardScaler, "minmax": MinMaxScaler, "robust": RobustScaler, "maxabs": MaxAbsScaler}


# --------------------------------------------------------------------------- (a) grid112


def load_table(seed: int = 0) -> dict:
    """make_classification 8,000 x 30, split 60/20/20 (seeded, stratified)."""
    X, y = make_classification(n_samples=8000, n_features=30, n_informative=12, random_state=seed)
    return _split(X, y, seed)


def _split(X, y, seed: int) -> dict:
    X_trval, X_test, y_trval, y_test = train_test_split(X, y, test_size=0.2, random_state=seed, stratify=y)
    X_train, X_val, y_train, y_val = train_test_split(X_trval, y_trval, test_size=0.25, random_state=seed,
                                                      stratify=y_trval)
    return {"X_train": X_train, "y_train": y_train, "X_val": X_val, "y_val": y_val, "X_test": X_test, "y_test": y_test}


def _transform(data: dict, transformer) -> dict:
    out = dict(data)
    out["X_train"] = transformer.fit_transform(data["X_train"], data["y_train"])
    out["X_val"] = transformer.transform(data["X_val"])
    out["X_test"] = transformer.transform(data["X_test"])
    return out


def scale(data: dict, kind: str) -> dict:
    return _transform(data, SCALERS[kind]())


def pca(data: dict, k: int) -> dict:
    return _transform(data, PCA(n_components=k, random_state=0))


def kbest(data: dict, k: int) -> dict:
    return _transform(data, SelectKBest(f_classif, k=k))


def _fit(data: dict, model) -> dict:
    model.fit(data["X_train"], data["y_train"])
    return {"model": model, "accuracy": float(model.score(data["X_val"], data["y_val"])),
            "X_test": data["X_test"], "y_test": data["y_test"]}


def logreg(data: dict, C: float) -> dict:
    return _fit(data, LogisticRegression(C=C, max_iter=1000))


def forest(data: dict, depth: int) -> dict:
    return _fit(data, RandomForestClassifier(n_estimators=100, max_depth=depth, random_state=0, n_jobs=1))


def hgb(data: dict, lr: float) -> dict:
    return _fit(data, HistGradientBoostingClassifier(learning_rate=lr, random_state=0))


def svc(data: dict, C: float) -> dict:
    return _fit(data, SVC(C=C))


def test_accuracy(fitted: dict) -> dict:
    return {"test_accuracy": float(fitted["model"].score(fitted["X_test"], fitted["y_test"])),
            "accuracy": fitted["accuracy"]}


GRID112 = {
    "scaler": list(SCALERS),
    "features": [("pca", 8), ("pca", 16), ("kbest", 8), ("kbest", 16)],
    "model": [("logreg", 0.1), ("logreg", 1.0), ("logreg", 10.0), ("forest", 4), ("forest", 8),
              ("hgb", 0.05), ("hgb", 0.2)],
}

# --------------------------------------------------------------------------- (d) digits, costly prefix


def load_digits_split(seed: int = 0) -> dict:
    X, y = load_digits(return_X_y=True)
    return _split(X, y, seed)


def poly_pca(data: dict, k: int) -> dict:
    """Degree-2 polynomial features (2,145 columns) then a full-SVD PCA: the costly shared step."""
    return _transform(data, make_pipeline(PolynomialFeatures(2), PCA(n_components=k, svd_solver="full")))


DIGITS = {
    "scaler": ["standard", "minmax"],
    "features": [("poly_pca", 16), ("poly_pca", 32)],
    "model": [("logreg", 0.1), ("logreg", 1.0), ("logreg", 10.0), ("svc", 1.0), ("svc", 10.0)],
}

STEPS = {"pca": pca, "kbest": kbest, "poly_pca": poly_pca, "logreg": logreg, "forest": forest, "hgb": hgb,
         "svc": svc}


def sk_transformer(kind: str, value):
    """The scikit-learn object for a (kind, value) of the grids above."""
    if kind == "pca":
        return PCA(n_components=value, random_state=0)
    if kind == "kbest":
        return SelectKBest(f_classif, k=value)
    if kind == "poly_pca":
        return make_pipeline(PolynomialFeatures(2), PCA(n_components=value, svd_solver="full"))
    if kind == "logreg":
        return LogisticRegression(C=value, max_iter=1000)
    if kind == "forest":
        return RandomForestClassifier(n_estimators=100, max_depth=value, random_state=0, n_jobs=1)
    if kind == "hgb":
        return HistGradientBoostingClassifier(learning_rate=value, random_state=0)
    if kind == "svc":
        return SVC(C=value)
    raise ValueError(kind)


def sk_grid(spec: dict) -> list[dict]:
    """The same grid as a scikit-learn ``param_grid`` for ``Pipeline([scaler, features, model])``."""
    return [{"scaler": [SCALERS[s]() for s in spec["scaler"]],
             "features": [sk_transformer(*f) for f in spec["features"]],
             "model": [sk_transformer(*m)]} for m in spec["model"]]


def branches(spec: dict) -> list[tuple[str, tuple, tuple]]:
    return [(s, f, m) for s in spec["scaler"] for f in spec["features"] for m in spec["model"]]


def predefined(data: dict):
    """Train + validation stacked, and the ``PredefinedSplit`` that scores on the validation part."""
    from sklearn.model_selection import PredefinedSplit

    X = np.vstack([data["X_train"], data["X_val"]])
    y = np.concatenate([data["y_train"], data["y_val"]])
    fold = np.r_[np.full(len(data["y_train"]), -1), np.zeros(len(data["y_val"]), dtype=int)]
    return X, y, PredefinedSplit(fold)
