"""Your own training loop, declared so that a run can pack it: :class:`Loop` and :func:`train_loop`.

A plain generator step (``def train(data, lr): ... yield {"accuracy": ...}``) is opaque code
with its own loop: a run trains it one configuration per task. Declaring the loop's parts
instead lets a run *pack* several configurations of the same loop into one task, trained
together as rows of stacked weights (docs/architecture.md §7.3): one batched gradient call for
every member instead of one small call each, which on a CPU core at batch 16 is where the time
goes (``benchmarks/packing_loop.py``). A loop declares

* ``model``: a zero-argument callable building the ``nn.Module`` (each member seeds torch with
  its ``seed`` first, as a solo run does);
* ``loss(logits, y)``: the mean training loss (default ``F.cross_entropy``);
* ``evaluate(module, data)``: the report's metrics after an epoch, a mapping of numbers
  (default: ``accuracy`` and ``test_loss`` on ``data.x_test``/``data.y_test``);
* ``batches(data, batch_size, generator)``: one epoch's ``(x, y)`` batches (default: the
  training split in an order drawn from ``generator``, the last incomplete batch dropped, as
  ``examples/tune_mnist.py``'s ``train_mlp`` does); each member draws from its own generator,
  seeded ``seed * 1000``;
* the training step: by default momentum SGD, exactly ``torch.optim.SGD(lr, momentum,
  weight_decay)``, with ``lr``, ``momentum`` and ``weight_decay`` as each member's own
  hyper-parameters; or ``step(forward, state, batch, hp) -> (state, loss)``, a pure function
  of one member's ``state`` (a dict of tensors holding ``"params"``, from ``init(params, hp)``,
  default ``{"params": params}``), its batch and its hyper-parameters ``hp`` (a dict of 0-d
  tensors: every keyword of :func:`train_loop` but ``loop``, ``batch_size``, ``epochs`` and
  ``seed``); ``forward(params, x)`` calls the model with those parameters. A packed group runs
  it for every member at once with ``torch.func.vmap`` (random operations inside it draw
  differently for each member, so only a step without them repeats its solo reports).

The built-in step on a plain ReLU MLP (``gpu.MLP``, or ``nn.Sequential`` of ``Flatten``,
``Linear``, ``ReLU``) with cross-entropy takes batched matrix products for every member at once
(``gpu.replicas``' stacked path); any other model takes ``vmap``. Reports of a packed member equal
its solo run's within float tolerance (``tests/test_loops.py``).

>>> import functools, gpu
>>> loop = gpu.Loop(model=functools.partial(gpu.MLP, 64, 10))
>>> data = gpu.load_digits_tensors(seed=0)
>>> reports = list(gpu.train_loop(data, loop=loop, lr=0.1, momentum=0.9, batch_size=16, epochs=2))
>>> [r["epoch"] for r in reports], reports[-1]["accuracy"] > 0.8
([1, 2], True)

In an exploration, ``grid(gpu.train_loop, loop=[loop], lr=[...], batch_size=[16])`` with
``choose("accuracy", prune=halving(3))``: branches of the same loop, data and batch size are
packed (``run(pack=False)`` trains them one by one).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from . import lr_schedules
from .packing import Membership, tune_members

__all__ = ["DEFAULT_EPOCHS", "LOOP_SHARED", "SGD_PARAMS", "Checkpoint", "Loop", "PackedLoop", "loop_members_memo_key",
           "split_loop_params", "train_loop"]

#: the built-in step's hyper-parameters (its defaults: ``momentum=0``, ``weight_decay=0``)
SGD_PARAMS = ("lr", "momentum", "weight_decay")
#: :func:`train_loop` arguments that members of one packed group share; every other one is a member's own
LOOP_SHARED = ("loop", "batch_size")
_OWN = ("seed", "epochs", "schedule")
#: :func:`train_loop`'s ``epochs`` when a member does not say
DEFAULT_EPOCHS = 10  # a member's own, but not a hyper-parameter its step reads
_SGD_DEFAULTS = {"momentum": 0.0, "weight_decay": 0.0}
#: measurements per member count when tuning (the best one counts), and the steps of each (0.3 s
#: of a packed task's start on benchmarks/train_explore.py's MLP). 2 x 10 cost 0.1 s and chose the
#: same counts on a quiet core, but on a busy test machine it chose 1 member (no packing) in 2 of 8
#: runs of tests/test_staged_training.py's packed test, against 0 of 8 with 3 x 20
_REPEATS = 3
_TUNE_STEPS = 20


@dataclass(frozen=True)
class Loop:
    """A training loop's parts (see the module's text): ``model`` is required, the rest default."""

    model: Callable[[], nn.Module]
    loss: Callable[[Tensor, Tensor], Tensor] | None = None
    evaluate: Callable[[nn.Module, Any], Mapping] | None = None
    batches: Callable[[Any, int, torch.Generator], Iterator] | None = None
    step: Callable | None = None
    init: Callable | None = None

    def __post_init__(self) -> None:
        if not callable(self.model) or isinstance(self.model, nn.Module):
            raise ValueError("gpu.Loop: model must be a zero-argument callable that builds the nn.Module "
                             "(e.g. functools.partial(gpu.MLP, 784, 10)), not a module: each member builds its own")
        for name in ("loss", "evaluate", "batches", "step", "init"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise ValueError(f"gpu.Loop: {name} must be callable; got {type(value).__name__}")
        if self.init is not None and self.step is None:
            raise ValueError("gpu.Loop: init= makes the state of your own step=; the built-in SGD step keeps its own")

    def hyper(self, params: Mapping[str, Any], base: Mapping[str, float] | None = None) -> dict[str, float]:
        """One member's hyper-parameters from its :func:`train_loop` keywords (``seed``,
        ``epochs`` and ``schedule`` aside), checked: numbers only, and for the built-in step only
        ``lr``, ``momentum`` and ``weight_decay`` (the last two default to 0). ``base``: the
        values a member continuing a :class:`Checkpoint` inherits where it does not set them."""
        hp = {**(base or {}), **{k: v for k, v in params.items() if k not in _OWN}}
        bad = {k: v for k, v in hp.items() if isinstance(v, bool) or not isinstance(v, (int, float))}
        if bad:
            raise ValueError(f"train_loop: hyper-parameters must be numbers (each member's are stacked into "
                             f"tensors); got {bad}")
        if self.step is None:
            unknown = sorted(set(hp) - set(SGD_PARAMS))
            if unknown:
                raise ValueError(f"train_loop: {unknown} are not parameters of the built-in SGD step, which takes "
                                 f"{list(SGD_PARAMS)}; give gpu.Loop(step=...) for a step of your own")
            if "lr" not in hp:
                raise ValueError("train_loop: lr= is required by the built-in SGD step, e.g. lr=0.1 (a member "
                                 "continuing a checkpoint inherits its lr)")
            hp = {**_SGD_DEFAULTS, **hp}
        return {k: float(v) for k, v in hp.items()}


def split_loop_params(kwargs: Mapping[str, Any]) -> tuple[dict, dict]:
    """A :func:`train_loop` task's keywords as ``(shared, own)``: what every member of a packed
    group must agree on (:data:`LOOP_SHARED`) and what each member sets for itself (the rest).

    >>> split_loop_params({"loop": "L", "batch_size": 16, "lr": 0.1, "seed": 2})
    ({'loop': 'L', 'batch_size': 16}, {'lr': 0.1, 'seed': 2})
    """
    shared = {k: v for k, v in kwargs.items() if k in LOOP_SHARED}
    return shared, {k: v for k, v in kwargs.items() if k not in LOOP_SHARED}


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """Where a finished :func:`train_loop` member stopped, to continue from: a second stage's
    ``train_loop`` whose input is the first stage's result (which holds this as
    ``"checkpoint"``) starts every member from it instead of from fresh weights.

    ``data``: the split it trained on (a reference, not a copy: a later stage trains on the
    same data); ``weights``: the model's parameters by name; ``rows``: the step's own state
    (the built-in step's momentum buffer, or a ``step=``'s state) and ``step_kind`` which step
    made it (``"sgd"`` or ``"step"``); ``hp``: the member's hyper-parameters, the defaults of a
    continuing member; ``generator``: the batch order's random state (a continuing member's
    order goes on from it); ``epochs``: the epochs it trained. Tensors only, no module: it
    pickles and moves between workers like any value.
    """

    data: Any
    weights: dict
    rows: Any
    step_kind: str
    hp: dict
    generator: Tensor
    epochs: int


def _checkpoint(data: Any) -> Checkpoint | None:
    """The checkpoint a step's input continues from: the input itself, or the ``"checkpoint"``
    of an earlier ``train_loop``'s result; ``None`` for plain data."""
    if isinstance(data, Checkpoint):
        return data
    if isinstance(data, Mapping) and isinstance(data.get("checkpoint"), Checkpoint):
        return data["checkpoint"]
    return None


def _data_split(data: Any) -> Any:
    from .training import _as_data

    start = _checkpoint(data)
    return _as_data(start.data if start is not None else data)


def _default_evaluate(loss: Callable) -> Callable[[nn.Module, Any], dict]:
    def evaluate(module: nn.Module, data: Any) -> dict:
        d = _data_split(data)
        logits = module(d.x_test)
        return {"accuracy": float((logits.argmax(dim=1) == d.y_test).float().mean()),
                "test_loss": float(loss(logits, d.y_test))}

    return evaluate


class _Member:
    """One member's state besides its rows; ``cfg``: what :meth:`PackedLoop._config` made of its
    keywords (``hp``, ``seed``, ``epochs``)."""

    def __init__(self, name: Hashable, cfg: Mapping) -> None:
        self.name, self.hp = name, cfg["hp"]
        self.seed, self.epochs, self.schedule = cfg["seed"], cfg["epochs"], cfg["schedule"]
        self.gen = torch.Generator().manual_seed(self.seed * 1000)
        self.epoch = 0
        self.steps = 0  # training steps taken (the schedule's clock)
        self.history: list[dict] = []
        self.final: Any = None  # its parameters when it finished
        self.rows_state: Any = None  # and its step's state (momentum buffer, a step=' state)
        self.outcome: str | None = None  # None (training or waiting), "finished", "removed"


def _stack(trees: list) -> Any:
    from torch.utils._pytree import tree_map

    return tree_map(lambda *leaves: torch.stack(leaves), *trees) if len(trees) > 1 else \
        tree_map(lambda leaf: leaf.unsqueeze(0), trees[0])


def _rows(tree: Any, keep: list[int] | int) -> Any:
    from torch.utils._pytree import tree_map

    return tree_map(lambda leaf: leaf[keep], tree)


def _cat(a: Any, b: Any) -> Any:
    from torch.utils._pytree import tree_map

    return tree_map(lambda x, y: torch.cat([x, y]), a, b)


class _SGDRows:
    """The built-in step over stacked members: flat weights ``W`` ``[m, n]``, momentum buffers
    ``V`` ``[m, n]`` and per-member ``lr``/``momentum``/``weight_decay`` columns ``[m, 1]``;
    ``torch.optim.SGD``'s update (``d = g + wd·w``, ``v = μ·v + d``, ``w -= lr·v``) for every
    row in three elementwise calls."""

    def __init__(self, template: nn.Module, loss: Callable | None) -> None:
        from .replicas import _FunctionalModel

        self.fm = _FunctionalModel(template, loss, "gpu.Loop")
        n = self.fm.layout.numel
        self.W = torch.zeros(0, n, dtype=self.fm.dtype, device=self.fm.device)
        self.V = self.W.clone()
        self.hp = torch.zeros(0, 3, dtype=self.fm.dtype, device=self.fm.device)

    kind = "sgd"

    def add(self, module: nn.Module, hp: dict[str, float], resume: Any = None) -> None:
        w = self.fm.layout.flatten(module).to(self.W).unsqueeze(0)
        self.W = torch.cat([self.W, w])
        v = torch.zeros_like(w) if resume is None else resume["momentum"].to(w).reshape(w.shape)
        self.V = torch.cat([self.V, v])
        self.hp = torch.cat([self.hp, torch.tensor([[hp[k] for k in SGD_PARAMS]]).to(self.hp)])

    def drop(self, i: int) -> None:
        keep = [r for r in range(self.W.shape[0]) if r != i]
        self.W, self.V, self.hp = self.W[keep], self.V[keep], self.hp[keep]

    def step(self, x: Tensor, y: Tensor, scale: Tensor | None = None) -> Tensor:
        G, losses = self.fm.row_grads(self.W, x, y)
        lr, mom, wd = (self.hp[:, j:j + 1] for j in range(3))
        if scale is not None:  # each member's schedule factor this step
            lr = lr * scale.to(lr).unsqueeze(1)
        G.addcmul_(wd, self.W)
        self.V.mul_(mom).add_(G)
        self.W.addcmul_(lr, self.V, value=-1.0)
        return losses

    def member_state(self, i: int) -> dict:
        return {"momentum": self.V[i].clone()}

    def load(self, module: nn.Module, i: int) -> nn.Module:
        return self.fm.layout.load(module, self.W[i])

    def params(self, i: int) -> Tensor:
        return self.W[i].clone()

    def load_params(self, module: nn.Module, params: Tensor) -> nn.Module:
        return self.fm.layout.load(module, params)


class _StepRows:
    """A step of the user's own over stacked members: the state's every tensor ``[m, ...]``,
    hyper-parameters ``{name: [m]}``, one ``vmap`` call of the step for every member."""

    def __init__(self, template: nn.Module, step: Callable, init: Callable | None) -> None:
        from torch.func import functional_call, vmap

        from .replicas import _check_model

        _check_model(template, "gpu.Loop")
        self.template = copy.deepcopy(template)
        buffers = dict(self.template.named_buffers())

        def forward(params: Mapping[str, Tensor], x: Tensor) -> Tensor:
            return functional_call(self.template, (dict(params), buffers), (x,))

        self._init = init or (lambda params, hp: {"params": params})
        self._vstep = vmap(lambda state, x, y, hp: step(forward, state, (x, y), hp), randomness="different")
        self.state: Any = None
        self.hp: Any = None

    kind = "step"

    def add(self, module: nn.Module, hp: dict[str, float], resume: Any = None) -> None:
        params = {k: v.detach().clone() for k, v in module.named_parameters()}
        hpt = {k: torch.tensor(v) for k, v in hp.items()}
        state = self._init(params, hpt) if resume is None else resume
        if not isinstance(state, Mapping) or "params" not in state:
            raise ValueError("gpu.Loop: init(params, hp) must return a dict of tensors holding 'params' "
                             f"(the model's parameters by name); got {type(state).__name__}")
        one, one_hp = _stack([dict(state)]), _stack([hpt])
        self.state = one if self.state is None else _cat(self.state, one)
        self.hp = one_hp if self.hp is None else _cat(self.hp, one_hp)

    def drop(self, i: int) -> None:
        rows = next(iter(self.state["params"].values())).shape[0]  # members: the state has one row each
        keep = [r for r in range(rows) if r != i]
        self.state, self.hp = (_rows(self.state, keep), _rows(self.hp, keep)) if keep else (None, None)

    def step(self, x: Tensor, y: Tensor, scale: Tensor | None = None) -> Tensor:
        hp = self.hp if scale is None else {**self.hp, "lr": self.hp["lr"] * scale.to(self.hp["lr"])}
        state, losses = self._vstep(self.state, x, y, hp)
        if not isinstance(state, Mapping) or "params" not in state:
            raise ValueError("gpu.Loop: step(forward, state, batch, hp) must return (state, loss) with the "
                             "state a dict holding 'params'")
        self.state = dict(state)
        return losses.detach()

    def params(self, i: int) -> dict[str, Tensor]:
        return {k: v[i].detach().clone() for k, v in self.state["params"].items()}

    def member_state(self, i: int) -> Any:
        from torch.utils._pytree import tree_map

        return tree_map(lambda leaf: leaf[i].detach().clone(), self.state)

    @torch.no_grad()
    def load_params(self, module: nn.Module, params: Mapping[str, Tensor]) -> nn.Module:
        own = dict(module.named_parameters())
        missing = sorted(set(own) - set(params))
        if missing:
            raise ValueError(f"gpu.Loop: the step's state['params'] lacks the model's parameters {missing}")
        for name, p in own.items():
            p.copy_(params[name])
        return module

    def load(self, module: nn.Module, i: int) -> nn.Module:
        return self.load_params(module, self.params(i))


class PackedLoop(Membership):
    """Train the members ``{name: {keyword: value}}`` of one :class:`Loop` together.

    The same interface as :class:`gpu.PackedTrainer` (``graph.compiling.packing``'s packed tasks drive
    either): ``active`` members train at once (an int, ``None``: all, ``"auto"``: Crossbow's
    rule, :func:`gpu.tune_members`, up to ``most``), the others wait and join as places free;
    :meth:`epoch` trains every active member one epoch and returns ``{name: report}``;
    :meth:`add`, :meth:`remove`, :meth:`finish`, :meth:`result`. ``shared``: ``batch_size``
    (default 32). ``publish``: inside a Dask task, each member's start, epochs and end go to the
    dashboard's training page under its name (its task key), as a packed ``gpu.train``'s do.

    >>> import functools, gpu
    >>> loop = gpu.Loop(model=functools.partial(gpu.MLP, 64, 10))
    >>> pack = PackedLoop(gpu.load_digits_tensors(seed=0), loop,
    ...                   {"a": {"lr": 0.05}, "b": {"lr": 0.1, "seed": 1}}, batch_size=16)
    >>> sorted(pack.epoch()), pack.epoch()["b"]["members"]
    (['a', 'b'], 2)
    """

    def __init__(self, data: Any, model: Loop, members: Mapping[Hashable, Mapping], *,
                 active: int | str | None = None, publish: bool = False, tuning: list | None = None,
                 most: int | None = None, resume: Mapping[Hashable, Any] | None = None, **shared: Any) -> None:
        if not isinstance(model, Loop):
            raise ValueError(f"PackedLoop: expected a gpu.Loop; got {type(model).__name__}")
        if not members:
            raise ValueError("PackedLoop: members is empty; give {name: {'lr': ..., 'seed': ...}, ...}")
        bad = sorted(set(shared) - {"batch_size"})
        if bad:
            raise ValueError(f"PackedLoop: unknown shared parameters {bad}; members share only batch_size")
        self.publish = publish
        self.start = _checkpoint(data)  # members continue from it (a second stage), or start fresh
        self.data, self.loop = (self.start.data if self.start is not None else data), model
        self.batch_size = int(shared.get("batch_size", 32))
        if self.batch_size < 1:
            raise ValueError(f"train_loop: batch_size={self.batch_size} must be >= 1")
        self.shared = {"batch_size": self.batch_size}
        self.configs: dict[Hashable, dict] = {}
        for name, own in members.items():
            self.configs[name] = self._config(name, own)
        loss = model.loss or nn.functional.cross_entropy
        self._evaluate = model.evaluate or _default_evaluate(loss)
        first = next(iter(self.configs.values()))
        self._module = self._build(first["seed"])
        self._rows_kind = (lambda t: _SGDRows(t, model.loss)) if model.step is None else \
            (lambda t: _StepRows(t, model.step, model.init))
        self.rows = self._rows_kind(self._module)
        self._default_batches = model.batches is None
        if self._default_batches:
            d = _data_split(data)
            self.x_train, self.y_train = d.x_train, d.y_train
            self.steps = len(self.x_train) // self.batch_size
            if self.steps < 1:
                raise ValueError(f"train_loop: {len(self.x_train)} training samples cannot fill one batch of "
                                 f"{self.batch_size}; use a smaller batch_size")
        self._resume = self._resumes_from(resume)
        self.members: dict[Hashable, _Member] = {}
        self.order: list[_Member] = []  # the active members, in row order
        self.waiting: list[Hashable] = list(self.configs)
        self.tuning: list = [tuple(p) for p in tuning or ()]
        self.tuning_s = 0.0
        if active == "auto":
            t0 = time.perf_counter()
            active, self.tuning = tune_members(self._measure, most or len(self.waiting))
            self.tuning_s = time.perf_counter() - t0
        if active is None:
            active = len(self.waiting)
        if not isinstance(active, int) or isinstance(active, bool) or active < 1:
            raise ValueError(f"PackedLoop: active={active!r} must be an int >= 1, None (all) or 'auto'")
        self.active_limit = active
        self._fill()

    def _config(self, name: Hashable, own: Mapping) -> dict:
        bad = sorted(set(own) & set(LOOP_SHARED))
        if bad:
            raise ValueError(f"PackedLoop: member {name!r} sets {bad}, which members share")
        hp = self.loop.hyper(own, base=self.start.hp if self.start is not None else None)
        schedule = lr_schedules.check(own.get("schedule", "constant"))
        if schedule != "constant" and "lr" not in hp:
            raise ValueError(f"train_loop: member {name!r} has schedule={schedule!r} but its step takes no lr= to "
                             "scale; give lr=... (the schedule multiplies it before every step)")
        return {"hp": hp, "seed": int(own.get("seed", 0)), "epochs": int(own.get("epochs", DEFAULT_EPOCHS)),
                "schedule": schedule}

    def _build(self, seed: int) -> nn.Module:
        torch.manual_seed(seed)  # the member's own seeded weights, as its solo run builds them
        module = self.loop.model()
        if not isinstance(module, nn.Module):
            raise ValueError(f"gpu.Loop: model() must build a torch nn.Module; it returned {type(module).__name__}")
        return module

    # --- membership (gpu.packing.Membership's rules) -----------------------------------------
    resumes = True

    def _training(self) -> list:
        return self.order

    def snapshot(self, name: Hashable) -> dict | None:
        """Member ``name``'s training state, to go on in another :class:`PackedLoop` of its group
        (``add(name, params, resume=state)``; a packed task's take-over moves it so): its
        parameters and step state (momentum, or a ``step=``'s state), its batch order's generator,
        ``epoch`` (epochs done), ``steps`` (the schedule's clock) and ``history`` (its reports so
        far). ``None`` for a member still waiting to start. Tensors and numbers only: it pickles.

        >>> import functools, gpu
        >>> loop = gpu.Loop(model=functools.partial(gpu.MLP, 64, 10))
        >>> data = gpu.load_digits_tensors(seed=0)
        >>> a = PackedLoop(data, loop, {"m": {"lr": 0.1}}, batch_size=16)
        >>> _ = a.epoch()
        >>> b = PackedLoop(data, loop, {"m": {"lr": 0.1}}, batch_size=16, resume={"m": a.snapshot("m")})
        >>> b.epoch()["m"]["epoch"] == a.epoch()["m"]["epoch"] == 2
        True
        """
        m = self.members.get(name)
        if m is None or m.outcome is not None:
            return None
        i = self.order.index(m)
        return {"params": self.rows.params(i), "rows": self.rows.member_state(i), "generator": m.gen.get_state(),
                "epoch": m.epoch, "steps": m.steps, "history": list(m.history)}

    def _start(self, name: Hashable) -> None:
        cfg = self.configs[name]
        m = _Member(name, cfg)
        module, resume = self._build(m.seed), None
        if self.start is not None:  # continue the checkpoint: its weights, batch order and step state
            self._load_weights(module, self.start.weights)
            m.gen.set_state(self.start.generator)
            resume = self.start.rows if self.start.step_kind == self.rows.kind else None
        moved = self._resume.pop(name, None)
        if moved is not None:  # where another pack of the group left it (snapshot)
            self.rows.load_params(module, moved["params"])
            m.gen.set_state(moved["generator"])
            m.epoch, m.steps, m.history = int(moved["epoch"]), int(moved["steps"]), list(moved["history"])
            resume = moved["rows"]
        self.rows.add(module, m.hp, resume)
        self.members[name] = m
        self.order.append(m)
        self._tell(name, {"kind": "start", "algorithm": "loop" if self.loop.step is None else "loop (own step)",
                          "epochs": m.epochs, "lr": m.hp.get("lr"), "batch_size": self.batch_size, "replicas": "1"})

    def _leave(self, m: _Member, outcome: str) -> None:
        i = self.order.index(m)
        if outcome == "finished":
            m.final, m.rows_state = self.rows.params(i), self.rows.member_state(i)
        self.rows.drop(i)
        self.order.pop(i)
        m.outcome = outcome
        self._tell(m.name, {"kind": "end", "epochs_done": m.epoch})

    # --- training ---------------------------------------------------------------------------
    def _epoch_batches(self, members: list[_Member]) -> Iterator[tuple[Tensor, Tensor]]:
        if self._default_batches:
            orders = torch.stack([torch.randperm(len(self.x_train), generator=m.gen) for m in members])
            b = self.batch_size
            for i in range(self.steps):
                idx = orders[:, i * b:(i + 1) * b]
                yield self.x_train[idx], self.y_train[idx]
            return
        streams = [iter(self.loop.batches(self.data, self.batch_size, m.gen)) for m in members]
        while True:
            got = [next(s, None) for s in streams]
            if all(g is None for g in got):
                return
            if any(g is None for g in got) or len({tuple(g[0].shape) for g in got}) > 1:
                raise ValueError("gpu.Loop: batches(data, batch_size, generator) must give every member the same "
                                 "number of batches of the same shapes (drop the last incomplete batch)")
            yield torch.stack([g[0] for g in got]), torch.stack([g[1] for g in got])

    @staticmethod
    @torch.no_grad()
    def _load_weights(module: nn.Module, weights: Mapping[str, Tensor]) -> None:
        own = dict(module.named_parameters())
        if set(own) != set(weights) or any(own[k].shape != weights[k].shape for k in own):
            raise ValueError("train_loop: the checkpoint's weights do not fit this loop's model (parameters "
                             f"{sorted((k, tuple(v.shape)) for k, v in weights.items())} vs "
                             f"{sorted((k, tuple(v.shape)) for k, v in own.items())}); continue it with a Loop "
                             "whose model() builds the same architecture")
        for k, p in own.items():
            p.copy_(weights[k])

    def epoch(self) -> dict:
        """One epoch of every active member; ``{name: report}`` (empty once nobody is left)."""
        members = list(self.order)
        if not members:
            return {}
        t0 = time.perf_counter()
        total = torch.zeros(len(members))
        steps = 0
        batches = self._epoch_batches(members)
        scheduled = any(m.schedule != "constant" for m in members)
        if scheduled and not self._default_batches:
            batches = list(batches)  # a schedule needs the epoch's length
        per_epoch = (self.steps if self._default_batches else len(batches)) if scheduled else 0
        for x, y in batches:
            scale = None
            if scheduled:
                scale = torch.tensor([lr_schedules.factor(m.schedule, m.steps + steps, m.epochs * per_epoch)
                                      for m in members])
            total += self.rows.step(x, y, scale).to(total)
            steps += 1
        for m in members:
            m.steps += steps
        seconds = time.perf_counter() - t0
        samples = steps * self.batch_size
        reports = {}
        for i, m in enumerate(members):
            t1 = time.perf_counter()
            with torch.no_grad():
                metrics = dict(self._evaluate(self.rows.load(self._module, i), self.data))
            m.epoch += 1
            rec = {"epoch": m.epoch, "loss": float(total[i]) / max(steps, 1), **metrics,
                   "samples_per_s": samples / seconds if seconds > 0 else float("nan"),
                   "group_samples_per_s": samples * len(members) / seconds if seconds > 0 else float("nan"),
                   "members": len(members), "train_s": seconds, "eval_s": time.perf_counter() - t1}
            m.history.append(rec)
            reports[m.name] = rec
            self._tell(m.name, {"kind": "epoch", "epochs": m.epochs, "train_loss": rec["loss"], "replicas": 1,
                                "compute_s": seconds, **rec})
        for m in members:
            if m.epoch >= m.epochs:
                self._leave(m, "finished")
        self._fill()
        return reports

    def result(self, name: Hashable) -> dict:
        """A finished member's value: its last report, ``history`` and ``model`` (an
        ``nn.Module`` with its trained weights), plus ``packed`` (the most members that trained
        together) and ``packing`` (the member tuner's ``(members, samples/s)`` curve)."""
        m = self.members.get(name)
        if m is None or m.outcome != "finished":
            state = "waiting" if name in self.waiting else (m.outcome or "training") if m else "unknown"
            raise ValueError(f"PackedLoop.result: member {name!r} has not finished (it is {state})")
        module = self.rows.load_params(self._build(m.seed), m.final)
        last = m.history[-1] if m.history else {}
        checkpoint = Checkpoint(
            data=self.data, weights={k: v.detach().clone() for k, v in module.named_parameters()},
            rows=m.rows_state, step_kind=self.rows.kind, hp=dict(m.hp), generator=m.gen.get_state(),
            epochs=m.epoch + (self.start.epochs if self.start is not None else 0))
        return {**last, "model": module, "history": list(m.history), "checkpoint": checkpoint,
                "packed": max((h["members"] for h in m.history), default=1),
                "packing": [list(p) for p in self.tuning]}

    # --- tuning -----------------------------------------------------------------------------
    def _measure(self, count: int) -> float:
        """Samples/s of ``count`` copies of the first member on a scratch group (its own random
        state: training is unchanged); the best of a few short measurements."""
        first = self.configs[self.waiting[0]]
        best = 0.0
        with torch.random.fork_rng(devices=[]):
            scratch = self._rows_kind(self._module)
            for _ in range(count):
                scratch.add(self._module, first["hp"])
            gen = torch.Generator().manual_seed(first["seed"] * 1000 + 500_000)
            fake = [_Member(j, first) for j in range(count)]
            for m in fake:
                m.gen = gen
            for _ in range(_REPEATS):
                batches = self._epoch_batches(fake)
                done, t0 = 0, time.perf_counter()
                for x, y in batches:
                    scratch.step(x, y)
                    done += 1
                    if done >= _TUNE_STEPS:
                        break
                seconds = time.perf_counter() - t0
                if done:
                    best = max(best, done * self.batch_size * count / seconds)
        return best


def loop_members_memo_key(loop: Loop, data: Any, shared: Mapping, members: int) -> list[str] | None:
    """Where the scheduler remembers a packed loop task's tuned member count (as
    :func:`gpu.packing.members_memo_key` does for ``gpu.train``): the loop, the data's shapes,
    the batch size and the group's size. ``None`` when the loop or the data has no fingerprint."""
    from .training import memo_key

    try:
        d = _data_split(data)
    except ValueError:
        return None
    return memo_key("loop-members-auto", loop, d, sorted(shared.items()), members)


def train_loop(data: Any, *, loop: Loop, batch_size: int = 32, epochs: int = DEFAULT_EPOCHS, seed: int = 0,
               **hp: float):
    """Train one configuration of ``loop``; yield one report per epoch and return the trained
    result (:meth:`PackedLoop.result`: the last report, ``history`` and ``model``).

    An iterative step (a generator) like any other: ``choose(..., prune=halving(...))`` stops
    it at a rung. A run packs branches of the same ``loop``, data and ``batch_size`` into
    groups (module text). ``hp``: the step's hyper-parameters (the built-in SGD step: ``lr``,
    ``momentum``, ``weight_decay``).

    >>> import functools, gpu
    >>> loop = gpu.Loop(model=functools.partial(gpu.MLP, 64, 10))
    >>> first = next(train_loop(gpu.load_digits_tensors(seed=0), loop=loop, lr=0.1, batch_size=16))
    >>> sorted(first)[:3]
    ['accuracy', 'epoch', 'eval_s']
    """
    from .training import _current_task

    name = _current_task() or "solo"  # in a Dask task, its curve goes to the training page under its key
    pack = PackedLoop(data, loop, {name: {"epochs": epochs, "seed": seed, **hp}}, active=1, batch_size=batch_size,
                      publish=True)
    while pack.active:
        yield pack.epoch()[name]
    return pack.result(name)
