"""The newcomer's pipeline of issue 44, as written: steps import scikit-learn inside their bodies, and the
scalers travel as values to the model steps. Before the fix, on fresh `dask worker` processes, every
branch through `robust` failed with an import `_DeadlockError` in 6 of 6 runs while the CLI exited 0."""
from pipelines import Pipeline, grid


def load(seed):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    X, y = load_digits(return_X_y=True)
    X_tr, X_val, y_tr, y_val = train_test_split(X, y, test_size=0.3, random_state=seed, stratify=y)
    return {"X_tr": X_tr, "y_tr": y_tr, "X_val": X_val, "y_val": y_val}


def _scale(data, scaler):
    scaler.fit(data["X_tr"])
    return {**data, "X_tr": scaler.transform(data["X_tr"]), "X_val": scaler.transform(data["X_val"]),
            "scaler": scaler}


def standard(data):
    from sklearn.preprocessing import StandardScaler
    return _scale(data, StandardScaler())


def robust(data):
    from sklearn.preprocessing import RobustScaler
    return _scale(data, RobustScaler())


def minmax(data):
    from sklearn.preprocessing import MinMaxScaler
    return _scale(data, MinMaxScaler())


def logreg(data, C):
    from sklearn.linear_model import LogisticRegression
    m = LogisticRegression(C=C, max_iter=2000).fit(data["X_tr"], data["y_tr"])
    return {"accuracy": m.score(data["X_val"], data["y_val"]), "model": m, "scaler": data["scaler"]}


def svc(data, C):
    from sklearn.svm import SVC
    m = SVC(C=C).fit(data["X_tr"], data["y_tr"])
    return {"accuracy": m.score(data["X_val"], data["y_val"]), "model": m, "scaler": data["scaler"]}


def forest(data, n_estimators):
    from sklearn.ensemble import RandomForestClassifier
    m = RandomForestClassifier(n_estimators=n_estimators, random_state=0).fit(data["X_tr"], data["y_tr"])
    return {"accuracy": m.score(data["X_val"], data["y_val"]), "model": m, "scaler": data["scaler"]}


p = Pipeline("newcomer")
data = p.source(load, seed=0)
scaled = data.explore("scaler", standard=standard, robust=robust, minmax=minmax)
fitted = scaled.explore("model", grid(logreg, C=[0.1, 1.0]), grid(svc, C=[1.0, 10.0]), grid(forest, n_estimators=[20, 50]))
output = fitted.choose("accuracy", mode="max")
