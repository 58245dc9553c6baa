"""Dask collections as step values (docs/architecture.md §8): collection steps, their
graphs, and the values a run reads off them.

**Which steps are collection steps.** A source is one when its function is marked
:func:`mark_lazy` (``pipelines.lazy``): it is called on the client when the pipeline
compiles, and must return a Dask collection (``dask.dataframe``, ``dask.array``, a
Dask scalar or ``Delayed``, or a dict/list/tuple holding them).  A step (``then``, an
explore alternative, ``combine``) whose inputs are *all* collections is tried on the
client, on the lazy inputs, with computing refused (Dask's ``scheduler`` set to one
that raises): it is a collection step when it returns a collection (or a structure
holding one); it is a *plain* step when it tried to compute (``.compute()``,
``len(df)``, ``np.asarray``, ``df.set_index`` without divisions) or returned a plain
value: a plain step runs on a worker on the computed value, like any step.  A step
marked :func:`mark_lazy` ``(fn, False)`` (``pipelines.eager``) is plain without a
trial; a step marked lazy must be a collection step.  Any other error while it is
tried is a ``PipelineError`` naming the node, raised before anything runs.

**Keys and sharing.** The collection's own graph (``__dask_graph__``, Dask's
deterministic keys, not optimised per branch: fusing or projecting one branch's
graph would rename partitions other branches share) becomes part of the
exploration's graph, partition by partition, so a partition that several branches
reach (the same file read, the same cleaning) is one task.  Then a task only one
task reads, for the same partition, is fused into that reader (``Task.fuse``,
:meth:`CollectionSteps.fuse`), so what is shared stays shared.  A branch's
``lineage`` lists its partition tasks, so ``naive_tasks``/``unique_tasks``/
``executed_tasks`` count partitions.

**Values.** The branch's key names its *value task*, added when something reads it:
scalars (a Dask scalar, a 0-d array, ``Delayed``) are computed in it, and each
partitioned collection (a DataFrame, Series or an array of 1+ dimensions) appears as
a small :class:`Partitioned` record, computed from one tiny task per partition
(``dask.sizeof`` and length), so no partition moves.  An output branch holds its
partitions (``Branch.parts``) and the run hands them back as a persisted collection
(:func:`finish_value`).  A plain step reading a collection gets the computed value
from a separate task (``<step>:computed-<token>``), the whole collection on one
worker: a ``CollectionWarning`` says so at compile time, and the worker logs a
warning when the value is over :data:`LARGE_VALUE` bytes.

>>> is_lazy_marked(mark_lazy(len)), is_lazy_marked(mark_lazy(len, False)), is_lazy_marked(len)
(True, False, None)
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import PipelineError
from ..walk import postorder

__all__ = [
    "CollectionWarning",
    "ComputeRefused",
    "LARGE_VALUE",
    "LAZY_ATTR",
    "Partitioned",
    "apply_lazily",
    "chunk_bytes",
    "collection_tasks",
    "compute_value",
    "computed_task",
    "contains_collection",
    "finish_value",
    "is_lazy_marked",
    "is_partitioned",
    "mark_lazy",
    "partition_keys",
    "value_tasks",
]

logger = logging.getLogger(__name__)

#: the attribute that marks a function as a collection step (True) or a plain one (False)
LAZY_ATTR = "__quiver_lazy__"
#: the memory plan's first estimate of a value task or a partition's record (bytes)
SMALL_VALUE = 1024
#: bytes above which a plain step's computed collection input is logged as large
LARGE_VALUE = 256 * 2**20


class CollectionWarning(UserWarning):
    """A plain step receives a whole collection, computed, on one worker."""


class ComputeRefused(RuntimeError):
    """Raised by the scheduler Quiver installs while it applies a step to lazy collections."""


def mark_lazy(fn: Callable, lazy: bool = True) -> Callable:
    """``fn`` marked as a collection step (``lazy=True``) or a plain step (``False``): a
    wrapper with ``fn``'s name (``fn`` itself, e.g. ``dd.read_parquet``, is left untouched;
    the wrapper's key identity is ``fn``'s, through its closure)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    setattr(wrapper, LAZY_ATTR, bool(lazy))
    return wrapper


def is_lazy_marked(fn: Any) -> bool | None:
    """``True`` (marked lazy), ``False`` (marked eager) or ``None`` (unmarked)."""
    inner = getattr(fn, "func", None)  # functools.partial
    value = getattr(fn, LAZY_ATTR, None)
    if value is None and inner is not None and callable(inner):
        value = getattr(inner, LAZY_ATTR, None)
    return None if value is None else bool(value)


def _is_collection(x: Any) -> bool:
    from dask.base import is_dask_collection

    return is_dask_collection(x)


def contains_collection(value: Any) -> bool:
    """A Dask collection, or a list/tuple/dict/dataclass holding one (as ``dask.compute`` sees it)."""
    if _is_collection(value):
        return True
    if isinstance(value, (list, tuple, set, Mapping)) or _is_dataclass(value):
        from dask.base import unpack_collections

        return bool(unpack_collections(value)[0])
    return False


def _is_dataclass(x: Any) -> bool:
    import dataclasses

    return dataclasses.is_dataclass(x) and not isinstance(x, type)


def is_partitioned(x: Any) -> bool:
    """A collection whose value is made of partitions a run keeps distributed: a Dask
    DataFrame/Series/Index or an array with at least one dimension (not a Dask scalar, a
    0-d array or ``Delayed``)."""
    from dask.delayed import Delayed

    if not _is_collection(x) or isinstance(x, Delayed) or type(x).__name__ == "Scalar":
        return False
    ndim = getattr(x, "ndim", None)
    return isinstance(ndim, int) and ndim >= 1


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise ComputeRefused("a collection step must not compute its input while the pipeline compiles")


@contextlib.contextmanager
def _no_compute():
    import dask

    with dask.config.set(scheduler=_refuse):
        yield


def apply_lazily(where: str, label: str, fn: Callable, args: Sequence, kwargs: Mapping, marked: bool | None) -> Any:
    """Apply ``fn`` to lazy inputs on the client, refusing any compute.

    Returns the collection value, or ``None`` when ``fn`` is a plain step (it tried to
    compute, or returned no collection).  An error is a ``PipelineError`` naming the node.
    """
    try:
        with _no_compute():
            out = fn(*args, **kwargs)
    except ComputeRefused:
        if marked:
            raise PipelineError(
                f"{where}: step {label} is marked lazy but computes its input while the pipeline "
                "compiles (e.g. .compute(), len(), np.asarray, set_index without divisions). Make it "
                "lazy, or mark it pipelines.eager to run it on the computed value."
            ) from None
        return None
    except Exception as exc:  # re-raised as a PipelineError: the user's step may raise anything
        raise PipelineError(
            f"{where}: step {label} failed when applied to its Dask collection input at compile time "
            f"({type(exc).__name__}: {exc}). Collection steps run on the client, lazily, before anything "
            "runs on the cluster: fix the step (a wrong column name?), or mark it pipelines.eager to run "
            "it on the computed value instead."
        ) from exc
    if contains_collection(out):
        return out
    if marked:
        raise PipelineError(
            f"{where}: step {label} is marked lazy but returned {type(out).__name__}, not a Dask "
            "collection. Return a dask.dataframe/dask.array collection (or a dict of Dask scalars), "
            "or drop the mark."
        )
    return None


def call_source(where: str, label: str, fn: Callable, kwargs: Mapping) -> Any:
    """Call a lazy-marked source on the client; it must return a collection."""
    try:
        with _no_compute():
            out = fn(**kwargs)
    except ComputeRefused:
        raise PipelineError(
            f"{where}: source {label} is marked lazy but computes while the pipeline compiles. "
            "A collection source builds a lazy collection (dd.read_parquet, da.from_zarr, dd.from_map, ...); "
            "give meta= where Dask would otherwise compute a partition to infer it (dd.from_map, map_partitions)."
        ) from None
    except Exception as exc:  # re-raised as a PipelineError: the user's source may raise anything
        raise PipelineError(
            f"{where}: source {label} failed when called at compile time ({type(exc).__name__}: {exc}). "
            "Lazy sources run on the client before anything runs on the cluster: check its parameters "
            "(a path that does not exist?)."
        ) from exc
    if not contains_collection(out):
        raise PipelineError(
            f"{where}: source {label} is marked lazy but returned {type(out).__name__}, not a Dask "
            "collection. Return one (dd.read_parquet(...), da.from_array(...)), or drop the mark."
        )
    return out


def _fresh(value: Any) -> Any:
    """``value`` with each collection a shallow copy (same keys): a step that changes its
    input in place (``df["z"] = ...``, ``x[x < 0] = 0`` rebind the collection's graph) must
    not change the value other branches share, as a plain step's worker-side copy would not."""
    import copy

    from dask.base import unpack_collections

    colls, repack = unpack_collections(value)
    if not colls:
        return value
    return repack([copy.copy(c) for c in colls])[0]


# ---- graphs ------------------------------------------------------------------------------------
def collection_tasks(value: Any, layers: dict | None = None) -> dict:
    """Every task of the collections in ``value`` as ``dask.task_spec`` nodes, by Dask's keys,
    dependencies first (the order ``Branch.lineage`` lists them in).

    ``layers`` (``{expression name: its layer}``, kept by the caller) caches what a
    ``dask.dataframe`` expression's graph is made of, as ``__dask_graph__`` builds it
    (``lower_completely`` then one ``_layer()`` per expression): branches share their
    upstream expressions, so each layer is built once per compile instead of once per step."""
    from dask.base import unpack_collections

    from .._dask import convert_legacy_graph, has_expression_layers

    colls, _ = unpack_collections(value)
    dsk: dict = {}
    for c in colls:
        expr = getattr(c, "expr", None)
        if layers is not None and has_expression_layers(expr):
            dsk.update(_expr_graph(expr.lower_completely(), layers))
        else:
            dsk.update(dict(c.__dask_graph__()))
    graph = {k: _rekey(k, t) for k, t in convert_legacy_graph(dsk).items()}
    return _topological(graph)


def _expr_graph(expr: Any, layers: dict) -> dict:
    """``expr.__dask_graph__()`` (dask's ``Expr.__dask_graph__``: each expression's
    ``_layer()``, merged), with the layers of expressions already seen taken from ``layers``."""
    from .._dask import expression_layer

    out: dict = {}
    stack, seen = [expr], set()
    while stack:
        e = stack.pop()
        name, build = expression_layer(e)
        if name in seen:
            continue
        seen.add(name)
        layer = layers.get(name)
        if layer is None:
            layer = layers[name] = build()
        out.update(layer)
        stack.extend(e.dependencies())
    return out


def _rekey(key: Any, node: Any) -> Any:
    """``node`` under ``key``: Dask may file a node under another name than its own (a
    ``Delayed`` argument of ``map_partitions`` is filed as ``(name, 0)`` but keyed ``name``);
    fusing and recompute copies go by the node's own key, so the two must agree."""
    if getattr(node, "key", key) == key:
        return node
    from dask.task_spec import Alias

    if isinstance(node, Alias):
        return Alias(key, target=node.target)
    return node.substitute({}, key=key)


def _topological(graph: dict) -> dict:
    def deps(k):
        return [d for d in graph[k].dependencies if d in graph]

    return {k: graph[k] for k in postorder(graph, deps, set())}


def _index(key: Any) -> tuple:
    """A partition key's index: ``("fillna-ab12", 3)`` -> ``(3,)``; ``()`` for a plain key."""
    return key[1:] if isinstance(key, tuple) else ()


def _combines(deps: Any) -> bool:
    """Whether a task reads several partitions of one layer (a reduction's combine)."""
    layers = [d[0] for d in deps if isinstance(d, tuple)]
    return len(layers) != len(set(layers))


def _flat(keys: Any) -> list:
    if isinstance(keys, list):
        return [k for sub in keys for k in _flat(sub)]
    return [keys]


def partition_keys(value: Any) -> tuple:
    """The keys of the partitioned collections in ``value`` (what an output branch holds)."""
    from dask.base import unpack_collections

    colls, _ = unpack_collections(value)
    return tuple(k for c in colls if is_partitioned(c) for k in _flat(c.__dask_keys__()))


def chunk_bytes(value: Any) -> dict:
    """Each chunk's bytes for the ``dask.array`` arrays in ``value`` whose chunks and dtype are
    known before anything runs (shape x itemsize, exact unless a ``map_blocks`` declares the wrong
    chunks); arrays of objects or of unknown chunk sizes, and other collections, give nothing.
    The memory plan's first sizes (``size_hints``: a measured size replaces them).

    >>> import dask.array as da
    >>> x = da.ones((10, 4), chunks=(6, 4))
    >>> sorted(chunk_bytes(x).values())
    [128, 192]
    """
    import itertools
    import math

    from dask.base import unpack_collections

    out: dict = {}
    colls, _ = unpack_collections(value)
    for a in colls:
        chunks, dtype = getattr(a, "chunks", None), getattr(a, "dtype", None)
        itemsize = getattr(dtype, "itemsize", 0)
        if not is_partitioned(a) or not isinstance(chunks, tuple) or not itemsize or getattr(dtype, "hasobject", True):
            continue
        if any(math.isnan(n) for dim in chunks for n in dim):
            continue
        name = a.name
        for index in itertools.product(*(range(len(dim)) for dim in chunks)):
            out[(name, *index)] = int(math.prod(chunks[d][i] for d, i in enumerate(index)) * itemsize)
    return out


@dataclass(frozen=True)
class Partitioned:
    """What a branch's value task shows for a partitioned collection (its partitions stay
    where they are): its type, partition count, total ``dask.sizeof`` bytes and length
    (rows, or the first dimension)."""

    kind: str
    npartitions: int
    nbytes: int
    length: int | None

    def __repr__(self) -> str:
        from dask.utils import format_bytes

        rows = "" if self.length is None else f", {self.length} rows"
        return f"<{self.kind}: {self.npartitions} partitions, {format_bytes(self.nbytes)}{rows}>"


def part_info(part: Any) -> tuple[int, int | None]:
    """(bytes, length) of one partition (runs on the worker that holds it)."""
    from dask.sizeof import sizeof

    try:
        n = len(part)
    except TypeError:
        n = None
    return int(sizeof(part)), n


def _summarise(kind: str, infos: Sequence[tuple[int, int | None]]) -> Partitioned:
    lengths = [n for _, n in infos]
    return Partitioned(kind, len(infos), sum(b for b, _ in infos), None if None in lengths else sum(lengths))


def _nested_refs(keys: Any) -> Any:
    from dask.task_spec import List, TaskRef

    if isinstance(keys, list):
        return List(*[_nested_refs(k) for k in keys])
    return TaskRef(keys)


def _assemble(repack: Callable, pieces: list) -> Any:
    """The value task: finalize each collection's computed pieces, then rebuild the structure."""
    results = []
    for kind, fin, extra, data in pieces:
        results.append(_summarise(fin, data) if kind == "partitioned" else fin(data, *extra))
    return repack(results)[0]


def _computed(repack: Callable, pieces: list) -> Any:
    """The whole value, computed (a plain step's input): every partition on this worker."""
    from dask.sizeof import sizeof

    value = repack([fin(data, *extra) for fin, extra, data in pieces])[0]
    size = sizeof(value)
    if size > LARGE_VALUE:
        from dask.utils import format_bytes

        logger.warning(
            "quiver: a plain step receives a computed collection of %s on one worker; make the step a "
            "collection step (lazy), or reduce the collection first", format_bytes(size),
        )
    return value


def value_tasks(key: str, value: Any) -> dict:
    """The value task of a collection branch under ``key`` (and one ``part_info`` task per
    partition of each partitioned collection in ``value``)."""
    from dask.task_spec import List, Task, TaskRef
    from dask.base import tokenize, unpack_collections

    colls, repack = unpack_collections(value)
    tasks: dict = {}
    pieces = []
    for c in colls:
        if is_partitioned(c):
            keys = _flat(c.__dask_keys__())
            name = f"partinfo-{tokenize(key, keys)}"
            refs = []
            for i, k in enumerate(keys):
                tasks[(name, i)] = Task((name, i), part_info, TaskRef(k))
                refs.append(TaskRef((name, i)))
            pieces.append(List("partitioned", type(c).__name__, (), List(*refs)))
        else:
            fin, extra = c.__dask_postcompute__()
            pieces.append(List("scalar", fin, tuple(extra), _nested_refs(c.__dask_keys__())))
    tasks[key] = Task(key, _assemble, repack, List(*pieces))
    return tasks


def computed_key(key: str) -> str:
    """The key of a collection branch's fully computed value (what a plain step reads)."""
    name, _, token = str(key).rpartition("-")
    return f"{name}:computed-{token}" if name else f"{key}:computed"


def computed_task(key: str, value: Any) -> dict:
    """The task computing the whole of ``value`` (under :func:`computed_key`)."""
    from dask.task_spec import List, Task
    from dask.base import unpack_collections

    colls, repack = unpack_collections(value)
    pieces = []
    for c in colls:
        fin, extra = c.__dask_postcompute__()
        pieces.append(List(fin, tuple(extra), _nested_refs(c.__dask_keys__())))
    ck = computed_key(key)
    return {ck: Task(ck, _computed, repack, List(*pieces))}


def warn_plain(where: str, label: str, value: Any) -> None:
    """Say at compile time that a plain step will receive a whole collection on one worker."""
    from dask.base import unpack_collections

    colls, _ = unpack_collections(value)
    parts = sum(len(_flat(c.__dask_keys__())) for c in colls if is_partitioned(c))
    if parts:
        warnings.warn(
            f"{where}: step {label} is a plain step (it computes its input, or returns no Dask "
            f"collection), so it receives the computed collection ({parts} partitions) on one worker. "
            "If that is large, make the step lazy (return a collection or Dask scalars), or reduce the "
            "collection in a collection step first.",
            CollectionWarning,
            stacklevel=4,
        )


# ---- the kept value -----------------------------------------------------------------------------
def finish_value(client: Any, value: Any, gathered: Any, compute: bool) -> Any:
    """The kept branch's value for the user, from its lazy ``value`` and its value task's
    result ``gathered`` (scalars computed, :class:`Partitioned` records in place of
    partitioned collections): each partitioned collection persisted on the cluster (the run
    still holds its partitions, so nothing runs again), or with ``compute`` computed and
    gathered here."""
    from dask.base import unpack_collections

    colls, repack = unpack_collections(value)
    if not any(is_partitioned(c) for c in colls):
        return gathered
    slots: dict[int, Any] = {}
    _read_slots(repack([_Slot(i) for i in range(len(colls))])[0], gathered, slots)
    parts = [_held(client, c) for c in colls if is_partitioned(c)]
    if compute:
        done = client.gather(client.compute(parts, optimize_graph=False))
    else:
        done = parts
    it = iter(done)
    return repack([next(it) if is_partitioned(c) else slots[i] for i, c in enumerate(colls)])[0]


def _held(client: Any, c: Any) -> Any:
    """``c`` persisted from the partitions the run holds: a future per partition key, rebuilt
    with ``__dask_postpersist__`` (what ``client.persist`` does once it has submitted the graph).
    Submitting ``c``'s graph instead would send the scheduler every upstream task again, unfused,
    under keys the run filed fused tasks under (its "different run_spec" warning)."""
    from dask.core import flatten
    from distributed import Future

    keys = list(flatten(c.__dask_keys__()))
    if not all(k in client.futures for k in keys):  # not held by this client: submit the graph
        return client.persist(c, optimize_graph=False)
    rebuild, extra = c.__dask_postpersist__()
    return rebuild({k: Future(k, client) for k in keys}, *extra)


@dataclass(frozen=True)
class _Slot:
    i: int


def _read_slots(template: Any, actual: Any, out: dict) -> None:
    """Where ``template`` (a value repacked with slots) has slot ``i``, ``out[i]`` is ``actual``'s value."""
    if isinstance(template, _Slot):
        out[template.i] = actual
    elif isinstance(template, Mapping):
        for k, t in template.items():
            _read_slots(t, actual[k], out)
    elif isinstance(template, (list, tuple)):
        for t, a in zip(template, actual):
            _read_slots(t, a, out)
    elif _is_dataclass(template):
        import dataclasses

        for f in dataclasses.fields(template):
            _read_slots(getattr(template, f.name), getattr(actual, f.name), out)


def compute_value(client: Any, value: Any) -> Any:
    """``value`` with its collections computed through ``client`` (``value`` when it holds none)."""
    if not contains_collection(value):
        return value
    if client is None or getattr(client, "status", "running") in ("closing", "closed"):
        raise RuntimeError(
            "this result's collections need the cluster the run used, which is closed: call "
            "compute_value() before result.close() (inside its with-block), or run with compute_value=True"
        )
    from dask.base import unpack_collections

    colls, repack = unpack_collections(value)
    futures = client.compute(colls, optimize_graph=False)  # the run's keys: what it holds is not run again
    return repack(client.gather(futures))[0]


# ---- the compiler's side (one call site per kind of node in graph/compiling/compiler.py) -------------------
class CollectionSteps:
    """What the compiler asks about collections while it builds branches.

    ``graph`` and ``size_hints`` are the compiler's own (tasks are added to them);
    ``make_branch`` builds a ``graph.compiling.compiler.Branch``.
    """

    def __init__(self, graph: dict, size_hints: dict, make_branch: Callable):
        self.graph = graph
        self.size_hints = size_hints
        self.make_branch = make_branch
        self.values: dict[str, Any] = {}  # step key -> its lazy value (each step applied once)
        self.tasks: dict[str, tuple] = {}  # step key -> its value's collection tasks
        self.layers: dict[str, dict] = {}  # dask expression name -> its layer (built once)
        self.step_of: dict = {}  # a collection task's key -> the step key that first built it

    def _graph(self, where: str, call: Any, key: str, value: Any, marked: bool | None) -> bool:
        """Build ``value``'s tasks once, refusing any compute: Dask may compute while it builds a
        graph (``sort_values`` computes its divisions when lowered), and that would read the data
        on the client. ``False``: it computes, so the step is plain (an unmarked step)."""
        if key in self.tasks:
            return True
        try:
            with _no_compute():
                self.tasks[key] = tuple(collection_tasks(value, self.layers).items())
        except ComputeRefused:
            if marked:
                raise PipelineError(
                    f"{where}: step {call.label} is marked lazy but computes its input while its Dask graph "
                    "is built (e.g. sort_values or set_index without divisions compute quantiles). Make it "
                    "lazy (give divisions), or mark it pipelines.eager to run it on the computed value."
                ) from None
            return False
        return True

    def _branch(self, key: str, value: Any, call: Any, items: tuple, lineage: tuple, gates: tuple) -> Any:
        for k, task in self.tasks[key]:
            self.graph.setdefault(k, task)
            self.step_of.setdefault(k, key)
        if call.size_hint is not None:  # node.size_hint: bytes per partition of the step's output
            for k in partition_keys(value):
                self.size_hints[k] = int(call.size_hint)
        else:  # an array's chunks are sized before anything runs: the first plan need not guess them
            for k, n in chunk_bytes(value).items():
                if k in self.graph:
                    self.size_hints.setdefault(k, n)
        seen = set(lineage)
        lineage = lineage + tuple(k for k, _ in self.tasks[key] if k not in seen)
        return self.make_branch(items, key, lineage, gates, lazy=value)

    def source(self, where: str, call: Any, key: str) -> Any:
        """A lazy-marked source's branch (``None``: a plain source)."""
        if not is_lazy_marked(call.fn):
            return None
        if key not in self.values:
            self.values[key] = call_source(where, call.label, call.fn, call.param_dict)
        self._graph(where, call, key, self.values[key], True)
        return self._branch(key, self.values[key], call, (), (), ())

    def step(self, where: str, call: Any, key: str, inputs: Sequence[tuple[str | None, Any]],
             items: tuple, lineage: tuple, gates: tuple) -> Any:
        """A collection step's branch, or ``None`` when the step is plain."""
        marked = is_lazy_marked(call.fn)
        if marked is False or not inputs:
            return None
        if not all(b.lazy is not None for _, b in inputs):
            if marked:
                plain = [n or "its input" for n, b in inputs if b.lazy is None]
                raise PipelineError(
                    f"{where}: step {call.label} is marked lazy, but {', '.join(plain)} is a plain value "
                    "(computed on a worker, not known when the pipeline compiles). A collection step's "
                    "inputs must all be collections: make the upstream step lazy, or drop the mark."
                )
            return None
        if key not in self.values:
            args = [_fresh(b.lazy) for n, b in inputs if n is None]
            kwargs = {n: _fresh(b.lazy) for n, b in inputs if n is not None}
            self.values[key] = apply_lazily(where, call.label, call.fn, args, {**kwargs, **call.param_dict}, marked)
        value = self.values[key]
        if value is None:
            return None
        if not self._graph(where, call, key, value, marked):
            self.values[key] = None  # a plain step after all (asked again by the next branch)
            return None
        return self._branch(key, value, call, items, lineage, gates)

    def computed(self, where: str, label: str, b: Any) -> tuple[str, tuple]:
        """For a plain step reading branch ``b``: the key to read and the lineage to add."""
        if b.lazy is None:
            return b.key, ()
        warn_plain(where, label, b.lazy)
        tasks = computed_task(b.key, b.lazy)
        self.graph.update((k, t) for k, t in tasks.items() if k not in self.graph)
        (ck,) = tasks
        return ck, (ck,)

    def choose_input(self, where: str, b: Any) -> Any:
        """``b`` as a choose input: its metric is read off its value task, so the value must
        not be a whole partitioned collection (a choose needs a reduction)."""
        if b.lazy is not None and is_partitioned(b.lazy):
            raise PipelineError(
                f"{where}: the branches reaching this choose are Dask collections "
                f"({type(b.lazy).__name__}), and a choose reads one number per branch. Add a step "
                "before it that returns a dict of Dask scalars (a reduction over the partitions), e.g. "
                "lambda df: {'mse': ((df.pred - df.y) ** 2).mean()}."
            )
        return self.with_value(b)

    def with_value(self, b: Any, hold: bool = False) -> Any:
        """``b`` with its value task in the graph and lineage (a choose reads it, or it is an
        output: ``hold`` adds the partitions the run keeps for the user)."""
        import dataclasses

        if b.lazy is None:
            return b
        tasks = value_tasks(b.key, b.lazy)
        for k, t in tasks.items():
            self.graph.setdefault(k, t)
            # what the collection's metadata says: a partition's (bytes, length) record and a
            # value of scalars are tiny (not the plan's 1 MiB default; measured sizes replace them)
            self.size_hints.setdefault(k, SMALL_VALUE)
        seen = set(b.lineage)
        b = dataclasses.replace(b, lineage=b.lineage + tuple(k for k in tasks if k not in seen))
        if hold:
            b = dataclasses.replace(b, parts=partition_keys(b.lazy))
        return b

    def fuse(self, metric_graph: Mapping, branches: list, chooses: list) -> list:
        """Fuse each collection task into the one task that reads it, partition by partition,
        with Dask's ``Task.fuse`` (the fused task keeps its reader's key): fewer tasks and no
        intermediate results to hold. A task is fused into its reader only when nothing else
        reads it (so a partition two branches share stays one task), it is the same partition
        (same index), it has no ``size_hint`` and the reader is not a combine of several
        partitions of one layer (a reduction tree: fusing would move partitions to it).
        Rewrites the lineages; returns the new ``branches``."""
        import dataclasses

        from dask.task_spec import Task

        coll = {k for tasks in self.tasks.values() for k, _ in tasks}
        dependents: dict = {}
        for g in (self.graph, metric_graph):
            for k, t in g.items():
                for d in t.dependencies:
                    dependents.setdefault(d, []).append(k)
        into = {}  # d -> the task it is fused into
        for d in coll:
            readers = dependents.get(d, ())
            if len(readers) != 1 or d in self.size_hints:
                continue
            (k,) = readers
            if k in coll and _index(d) == _index(k) and not _combines(self.graph[k].dependencies):
                into[d] = k
        if not into:
            return branches

        def root(k: Any) -> Any:
            while k in into:
                k = into[k]
            return k

        groups: dict = {}
        for d in into:
            groups.setdefault(root(d), []).append(d)
        order = {k: i for i, k in enumerate(self.graph)}  # the graph lists inputs before readers
        for r, members in groups.items():
            tasks = [self.graph[k] for k in sorted(members, key=order.__getitem__)] + [self.graph[r]]
            self.graph[r] = Task.fuse(*tasks, key=r)
        removed = set(into)
        for k in removed:
            del self.graph[k]

        def trim(b: Any) -> Any:
            return dataclasses.replace(b, lineage=tuple(k for k in b.lineage if k not in removed))

        for cp in chooses:
            cp.inputs = [trim(b) for b in cp.inputs]
        return [trim(b) for b in branches]
