"""A worker's memory under a budget: its share of the budget, Dask's thresholds, the room for results.

The one owner of three rules the planner, the run's budget and the clusters share:

* the **split**: a total budget is split evenly over the workers (:func:`worker_limits`; written
  once, in :func:`gpu.clusters.worker_share`, the lowest package, which ``gpu.cluster`` uses too);
* **Dask's thresholds** (``distributed.worker.memory.target/spill/pause/terminate``), read from
  ``dask.config`` rather than written down again (:func:`dask_thresholds`);
* the **room for results** on one worker (:func:`data_share`): up to the fraction of its limit at
  which Dask starts moving results out of memory, less an idle worker's own memory.

>>> t = Thresholds(target=0.6, spill=0.7, pause=0.8, terminate=0.95)
>>> t.results_fraction
0.7
>>> data_share(1000, workers=2, baseline=100, thresholds=t)
250
>>> Thresholds(target=False, spill=False, pause=0.8, terminate=0.95).results_fraction  # no spilling: pause
0.8
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .sizes import parse_bytes

__all__ = ["HEAVY_LIBRARIES", "Thresholds", "dask_thresholds", "data_share", "idle_memory_note", "worker_limits"]

#: libraries that make an idle worker large once imported, and how one may be there unasked
HEAVY_LIBRARIES: dict[str, str] = {
    "torch": "", "tensorflow": "", "jax": "", "cupy": "", "sklearn": "", "scipy": "", "pandas": "",
    "pyarrow": "", "polars": "", "xgboost": "", "lightgbm": "",
    "numba": "dask.array imports it through the sparse package wherever that is installed (dask-ml's "
             "dask-glm depends on it), about 110 MiB a worker",
}


def idle_memory_note(loaded: Any) -> str:
    """What the idle workers had imported, for the error that finds no room for results: the
    libraries of :data:`HEAVY_LIBRARIES` among ``loaded`` (module names), with why a library may be
    there that no step asked for.

    >>> print(idle_memory_note(["pandas", "numba", "json"]))  # doctest: +ELLIPSIS
    The idle workers had imported numba, pandas (numba: dask.array imports it through the sparse package...).
    >>> idle_memory_note(["json"])
    ''
    """
    heavy = sorted({m.split(".")[0] for m in loaded} & HEAVY_LIBRARIES.keys())
    if not heavy:
        return ""
    why = "; ".join(f"{m}: {HEAVY_LIBRARIES[m]}" for m in heavy if HEAVY_LIBRARIES[m])
    return f"The idle workers had imported {', '.join(heavy)}" + (f" ({why})." if why else ".")

_NAMES = ("target", "spill", "pause", "terminate")


@dataclass(frozen=True)
class Thresholds:
    """Dask's worker memory thresholds, as fractions of ``memory_limit`` (``False``: off).

    ``target``: the spill buffer writes results to disk above it (managed bytes); ``spill``:
    process memory above it makes the worker evict results down to ``target``; ``pause``:
    the worker stops running tasks; ``terminate``: its nanny restarts it.
    """

    target: float | bool = 0.6
    spill: float | bool = 0.7
    pause: float | bool = 0.8
    terminate: float | bool = 0.95

    @property
    def results_fraction(self) -> float:
        """The share of a worker's limit its process may reach before Dask acts on it: the first
        threshold that is on, of ``spill``, ``pause``, ``terminate`` (1.0 when all are off)."""
        for v in (self.spill, self.pause, self.terminate):
            if v is not False and v is not None:
                return float(v)
        return 1.0


def dask_thresholds() -> Thresholds:
    """The thresholds ``dask.config`` gives new workers (``distributed.worker.memory.*``).

    >>> import dask
    >>> with dask.config.set({"distributed.worker.memory.spill": 0.5}):
    ...     dask_thresholds().spill
    0.5
    """
    import dask
    import distributed  # noqa: F401  (registers the distributed.* defaults in dask.config)

    got = {n: dask.config.get(f"distributed.worker.memory.{n}", default=None) for n in _NAMES}
    for n, v in got.items():
        if v is not False and v is not None and not (isinstance(v, (int, float)) and 0 < v <= 1):
            raise ValueError(
                f"dask config distributed.worker.memory.{n} = {v!r}: it must be a fraction of the worker's "
                "memory_limit in (0, 1], or False; fix it in your dask config (e.g. ~/.config/dask/*.yaml)"
            )
    return Thresholds(**{n: Thresholds.__dataclass_fields__[n].default if v is None else v for n, v in got.items()})


def worker_limits(budget: Any, workers: int) -> int:
    """Each worker's ``memory_limit`` for a total ``budget`` split evenly.

    >>> worker_limits("1 GiB", 2)
    536870912
    """
    from gpu.clusters import worker_share  # the one split (gpu is the lowest package: graph may import it)

    return worker_share(parse_bytes(budget), workers)


def data_share(budget: Any, *, workers: int, baseline: int, thresholds: Thresholds | None = None) -> int:
    """Bytes of results one worker may hold: its limit times ``results_fraction``, less its idle
    memory ``baseline`` (zero or less: no room)."""
    t = dask_thresholds() if thresholds is None else thresholds
    return int(worker_limits(budget, workers) * t.results_fraction) - int(baseline)
