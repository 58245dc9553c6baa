"""Packed training: several ``gpu.train`` runs (members) trained together as one stacked group.

Members share a model factory, data, batch size, replicas per member ``k``, sync period and
central momentum; each has its own ``lr``, ``momentum``, ``weight_decay``, ``alpha``, ``seed``,
``epochs`` and ``target_accuracy``. Their replicas' weights are rows of one ``[m·k, n]`` tensor
in :class:`gpu.replicas.ParamLayout`'s flat layout, and one ``vmap(grad(functional_call))``
computes every row's gradient in one call (the expensive part, filled by ``m`` members instead
of ``k`` replicas). The SMA update itself runs per member block with that member's own
:class:`gpu.SMAConfig` through :mod:`gpu.sma`'s functions, so a member's update is the one its
solo run makes (the elementwise update is memory-bound: ``m`` block calls move the same bytes as
one call over every row). Each member draws its batches from its own generator, seeded as its
solo run seeds it, and is evaluated alone (``z`` of its block): a member's reports equal its solo
``gpu.train(..., workers=1, replicas=k, seed=s)`` run's within float tolerance (the batched
gradient kernels may round differently), tested in ``tests/test_packing.py``.

A member leaves the group when it finishes (its ``epochs``, or its ``target_accuracy``) or is
removed (pruned): its rows are dropped and the others go on unchanged. Members beyond
``active`` wait and join (from their seeded start, at their own epoch 0) when a place frees.
``active="auto"`` picks how many members train at once by Crossbow's rule
(:func:`tune_members`: add a member while samples/s rises by more than 10%), measured on a
scratch group with its own batches and random state, so tuning changes no member's training.

>>> import functools, gpu
>>> data = gpu.load_digits_tensors(seed=0)                                   # doctest: +SKIP
>>> pack = PackedTrainer(data, functools.partial(gpu.MLP, 64, 10),
...                      {"a": {"lr": 0.05, "seed": 0}, "b": {"lr": 0.1, "seed": 1}},
...                      batch_size=16, epochs=3)                             # doctest: +SKIP
>>> sorted(pack.epoch())                                                     # doctest: +SKIP
['a', 'b']
>>> pack.remove("b"); pack.epoch().keys()                                    # doctest: +SKIP
dict_keys(['a'])
>>> pack.result("a")["accuracy"] > 0.5                                       # doctest: +SKIP
True
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from .algorithms import Timer
from .engine import TrainConfig, _measure, _own_rng
from .replicas import _FunctionalModel, replica_batches
from .sma import SMAState, central_update, local_correction, local_step, reset_replicas, ssgd_step
from .tuning import ReplicaTuner

__all__ = ["MEMBER_PARAMS", "SHARED_PARAMS", "Membership", "PackedGroup", "PackedTrainer", "members_memo_key", "tune_members"]

_REPEATS = 3  # measurements per member count when tuning (the best one counts)

#: ``gpu.train`` arguments that may differ between the members of one packed group.
MEMBER_PARAMS = ("lr", "momentum", "weight_decay", "alpha", "seed", "epochs", "target_accuracy")
#: ``gpu.train`` arguments the group shares (they must be equal for branches to be packed).
SHARED_PARAMS = ("batch_size", "replicas", "sync_every", "central_momentum", "lr_drops", "lr_drop_factor",
                 "algorithm", "partitions")


def tune_members(measure: Callable[[int], float], most: int, threshold: float = 0.10) -> tuple[int, list]:
    """Crossbow's rule over members: measure ``1, 2, ...`` members (samples/s) and keep adding
    one while throughput rises by more than ``threshold``; at most ``most``. Returns the chosen
    count and the ``(members, samples/s)`` curve (:class:`gpu.ReplicaTuner` decides).

    >>> rates = {1: 100.0, 2: 180.0, 3: 195.0, 4: 400.0}
    >>> tune_members(rates.__getitem__, most=4)
    (2, [(1, 100.0), (2, 180.0), (3, 195.0)])
    >>> tune_members(rates.__getitem__, most=1)
    (1, [(1, 100.0)])
    """
    if not isinstance(most, int) or isinstance(most, bool) or most < 1:
        raise ValueError(f"tune_members: most={most!r} must be an int >= 1 (the members there are)")
    tuner = ReplicaTuner(threshold=threshold, max_replicas=most)
    while (m := tuner.propose()) is not None:
        tuner.observe(m, float(measure(m)))
    return tuner.best, tuner.curve


def members_memo_key(model: Callable, data: Any, shared: Mapping, members: int) -> list[str] | None:
    """Where the scheduler remembers a packed task's tuned member count (``set_metadata``), as
    ``gpu.train`` remembers a tuned replica count: everything :meth:`PackedTrainer._tune`'s choice
    depends on (the model, the data's shapes, the shared arguments: batch, replicas, sync period,
    tuner threshold..., and how many members the task holds), nothing it does not (the members'
    learning rates, seeds...). ``None`` when the model has no deterministic token (then every
    packed task tunes).

    >>> import functools, torch, gpu
    >>> data = gpu.DataSplit(torch.zeros(8, 4), torch.zeros(8, dtype=torch.long), torch.zeros(2, 4),
    ...                      torch.zeros(2, dtype=torch.long))
    >>> mlp = functools.partial(gpu.MLP, 4, 2)
    >>> members_memo_key(mlp, data, {"batch_size": 4}, 6) == members_memo_key(mlp, data, {"batch_size": 4}, 6)
    True
    >>> members_memo_key(mlp, data, {"batch_size": 4}, 6) == members_memo_key(mlp, data, {"batch_size": 8}, 6)
    False
    """
    from .training import _as_data, memo_key

    try:
        d = _as_data(data)
    except ValueError:  # data train refuses: nothing memoized
        return None
    return memo_key("members-auto", model, d, sorted(shared.items()), members)


def _member_config(params: Mapping, shared: Mapping) -> TrainConfig:
    unknown = sorted(set(params) - set(MEMBER_PARAMS))
    if unknown:
        raise ValueError(f"PackedTrainer: member parameters {unknown} cannot differ inside a packed group; "
                         f"members may set {list(MEMBER_PARAMS)}, the rest is shared")
    cfg = TrainConfig(**{**shared, **params})
    if cfg.algorithm not in ("sma", "ssgd"):
        raise ValueError(f"PackedTrainer: packs SMA and S-SGD runs (algorithm={cfg.algorithm!r})")
    if not isinstance(cfg.replicas, int):
        raise ValueError("PackedTrainer: replicas per member must be a whole number (replicas='auto' tunes a "
                         "solo run; a packed group tunes its members instead), e.g. replicas=1")
    if cfg.partitions != 1:
        raise ValueError(f"PackedTrainer: partitions={cfg.partitions!r}: a packed group does not split its sync "
                         "(it has no peers); use partitions=1")
    return cfg


class _Member:
    """One member's state besides its rows: config, generator, history, and the model it is
    evaluated on (``state.z``: SMA's central model, or S-SGD's one model)."""

    def __init__(self, name: Hashable, cfg: TrainConfig, z: Tensor):
        self.name, self.cfg = name, cfg
        self.sma = cfg.sma()
        self.state = SMAState.from_weights(z)
        self.gen = torch.Generator().manual_seed(cfg.seed * 1000)  # as the solo run's rank 0 seeds it
        self.history: list[dict] = []
        self.epoch = 0
        self.lr = cfg.lr
        self.losses: list[float] = []
        self.t_start: float | None = None
        self.outcome: str | None = None  # None (training or waiting), "finished", "removed"


class PackedGroup:
    """The stacked rows of the active members and one training step over all of them.

    ``W``, ``U``, ``Wbar`` ``[m·k, n]`` (member ``i`` owns rows ``i·k .. i·k+k-1``); each member
    keeps its own ``z`` and ``Δ_prev`` (``_Member.state``). ``step(x, y)`` takes stacked batches
    ``[m·k, b, ...]`` and returns the losses ``[m·k]``; ``timer`` counts as the algorithms' do.
    """

    def __init__(self, model: nn.Module, replicas: int, device: torch.device | None = None):
        self.fm = _FunctionalModel(model, None, "PackedTrainer")
        self.k = replicas
        self.members: list[_Member] = []
        n = self.fm.layout.numel
        self.W = torch.zeros(0, n, device=self.fm.device, dtype=self.fm.dtype)
        self.U, self.Wbar = self.W.clone(), self.W.clone()
        self.timer = Timer()

    @property
    def replicas(self) -> int:
        """Rows (members × replicas): what one step trains."""
        return self.W.shape[0]

    def add(self, member: _Member, w0: Tensor) -> None:
        rows = w0.to(self.W).unsqueeze(0).repeat(self.k, 1)
        self.W = torch.cat([self.W, rows])
        self.U = torch.cat([self.U, torch.zeros_like(rows)])
        self.Wbar = torch.cat([self.Wbar, rows])
        self.members.append(member)

    def drop(self, member: _Member) -> None:
        i = self.members.index(member)
        keep = [r for r in range(self.replicas) if not i * self.k <= r < (i + 1) * self.k]
        self.W, self.U, self.Wbar = (t[keep].clone() for t in (self.W, self.U, self.Wbar))
        self.members.pop(i)

    def block(self, t: Tensor, i: int) -> Tensor:
        return t[i * self.k:(i + 1) * self.k]  # a view: in-place updates write through

    def step(self, x: Tensor, y: Tensor) -> Tensor:
        t0 = time.perf_counter()
        x, y = self.fm.inputs(x, y, self.replicas)
        G, losses = self.fm.row_grads(self.W, x, y)
        for i, m in enumerate(self.members):  # per member block, with its own hyper-parameters
            W, U = self.block(self.W, i), self.block(self.U, i)
            m.state.steps += 1
            if m.cfg.algorithm == "ssgd":  # the block's k rows all sit at the member's one model
                ssgd_step(m.state.z, U[0], self.block(G, i), m.sma)
                W.copy_(m.state.z.expand_as(W))
                continue
            Wbar = self.block(self.Wbar, i)
            local_step(W, U, self.block(G, i), m.sma, Wbar)
            if m.state.steps % m.sma.sync_every == 0:
                central_update(m.state, local_correction(W, Wbar, m.state.z, m.sma), m.sma)
        self.timer.compute += time.perf_counter() - t0
        self.timer.samples += x.shape[0] * x.shape[1]
        self.timer.steps += 1
        return losses.detach()


class Membership:
    """Who trains now and who waits: the membership rules a packed group's trainers share
    (:class:`PackedTrainer`, :class:`gpu.PackedLoop`). A subclass holds ``configs`` (every
    member's own settings, by name), ``waiting`` (names in joining order), ``members`` (started
    members, by name, each with an ``outcome``: ``None`` while training, ``"finished"``,
    ``"removed"``) and ``active_limit``, and says how a member starts (:meth:`_start`), leaves
    its rows (:meth:`_leave`), which members train now (:meth:`_training`) and how its own
    settings are checked (:meth:`_config`)."""

    configs: dict
    waiting: list
    members: dict
    active_limit: int
    _resume: dict  # name -> snapshot(): members that go on where another trainer of the group left them
    publish: bool = False  # inside a Dask task: each member's curve on the dashboard, under its name
    #: whether a member's state can leave (:meth:`snapshot`) and join another trainer of the group
    #: (``add(..., resume=state)``): a packed task's take-over then moves it instead of replaying it
    resumes: bool = False

    def _training(self) -> list:
        raise NotImplementedError

    def _start(self, name: Hashable) -> None:
        raise NotImplementedError

    def _leave(self, m: Any, outcome: str) -> None:
        raise NotImplementedError

    def _config(self, name: Hashable, params: Mapping) -> Any:
        raise NotImplementedError

    def _tell(self, name: Hashable, msg: dict) -> None:
        """Publish a member's progress on the ``quiver-training`` topic as ``gpu.train`` does
        (the member's name is its task key; nothing happens outside a worker or unless asked)."""
        if not self.publish:
            return
        publishers = self.__dict__.setdefault("_publishers", {})
        if name not in publishers:
            from .training import _publisher

            publishers[name] = _publisher(str(name), 0, 1)
        publishers[name](msg)

    def snapshot(self, name: Hashable) -> Any:
        """A training member's state, to go on in another trainer of its group
        (``add(name, params, resume=...)``): ``None`` for a member still waiting to start."""
        raise NotImplementedError(f"{type(self).__name__} does not hand members over")

    def _resumes_from(self, resume: Mapping[Hashable, Any] | None) -> dict:
        """The constructor's ``resume`` (``{member: snapshot}``), checked: members that go on
        where another trainer of the group left them."""
        unknown = sorted(map(str, set(resume or ()) - set(self.configs)))
        if unknown:
            raise ValueError(f"{type(self).__name__}: resume names {unknown}, which are not members")
        if resume and not self.resumes:
            raise ValueError(f"{type(self).__name__}: cannot resume snapshots; this trainer starts members "
                             "from their seeds")
        return dict(resume or {})

    def _fill(self) -> None:
        while self.waiting and len(self._training()) < self.active_limit:
            self._start(self.waiting.pop(0))

    @property
    def active(self) -> list:
        """Names of the members training now (in the group's row order)."""
        return [m.name for m in self._training()]

    @property
    def pending(self) -> list:
        """Names of members that are training or waiting to join."""
        return self.active + list(self.waiting)

    def add(self, name: Hashable, params: Mapping, resume: Any = None) -> None:
        """A new member (own parameters ``params``): it waits, and joins when a place frees
        (at once when the group has one), at its own epoch 0, or where ``resume`` (a
        :meth:`snapshot` of it in another trainer of the group) left it."""
        if name in self.configs:
            raise ValueError(f"{type(self).__name__}.add: member {name!r} is in the group already")
        if resume is not None:
            if not self.resumes:
                raise ValueError(f"{type(self).__name__}.add: member {name!r} cannot resume a snapshot here; "
                                 "this trainer starts members from their seeds")
            self._resume[name] = resume
        self.configs[name] = self._config(name, params)
        self.waiting.append(name)
        self._fill()

    def remove(self, name: Hashable) -> None:
        """Take a member out (pruned): its rows leave, the others go on; a waiting one joins."""
        if name in self.waiting:
            self.waiting.remove(name)
            return
        m = self.members.get(name)
        if m is None:
            raise KeyError(f"{type(self).__name__}.remove: no member {name!r}; members are "
                           f"{sorted(map(str, self.configs))}")
        if m.outcome is None:
            self._leave(m, "removed")
            self._fill()

    def finish(self, name: Hashable) -> None:
        """End an active member's training now (e.g. at a pruning rule's ``max_iter``): it
        leaves the group with what it has learnt, and ``result`` gives it."""
        m = self.members.get(name)
        if m is None or m.outcome is not None:
            raise ValueError(f"{type(self).__name__}.finish: member {name!r} is not training")
        self._leave(m, "finished")
        self._fill()


class PackedTrainer(Membership):
    """Train the members ``{name: {param: value}}`` (``param`` in :data:`MEMBER_PARAMS`) as one
    packed group; every other ``gpu.train`` argument (``batch_size``, ``replicas``, ``epochs``,
    ...) is given once, as a keyword, and shared (a member's own ``epochs``/``seed``/... win).

    ``active``: members training at once (an int, ``None``: all, ``"auto"``: tuned by
    :func:`tune_members`, up to ``most`` members, default: as many as given); the others wait
    and join as places free. :meth:`add` brings a member later (``graph.compiling.packing``'s packed
    tasks claim members at run time). ``tuning``: the
    ``(members, samples/s)`` curve an earlier tuning chose a given ``active`` from (reported in
    :meth:`result`'s ``packing``; see :func:`members_memo_key`). ``epoch()`` trains every
    active member one epoch and returns ``{name: report}`` (the solo run's history record,
    plus ``members``: how many trained together); a member that reached its ``epochs`` or
    ``target_accuracy`` leaves the group then (``finished``). ``remove(name)`` takes a member
    out (pruned); ``result(name)`` is a finished member's ``gpu.train``-like result dict.
    """

    def __init__(self, data: Any, model: Callable[[], nn.Module], members: Mapping[Hashable, Mapping], *,
                 active: int | str | None = None, publish: bool = False, tuning: list | None = None,
                 most: int | None = None, resume: Mapping[Hashable, Any] | None = None, **shared: Any) -> None:
        from .training import _as_data

        if not callable(model):
            raise ValueError("PackedTrainer: model must be a zero-argument callable building the nn.Module")
        if not members:
            raise ValueError("PackedTrainer: members is empty; give {name: {'lr': ..., 'seed': ...}, ...}")
        shared = {"replicas": 1, **shared}
        bad = sorted(set(shared) - set(SHARED_PARAMS) - set(MEMBER_PARAMS) - {"eval_batch_size"})
        if bad:
            raise ValueError(f"PackedTrainer: unknown shared parameters {bad}; shared ones are {list(SHARED_PARAMS)}")
        self.t_call = time.perf_counter()
        self.data = _as_data(data)
        self.model = model
        self.shared = shared
        self.configs = {name: _member_config(params, shared) for name, params in members.items()}
        first = next(iter(self.configs.values()))
        self.k, self.batch_size = first.replicas, first.batch_size
        torch.manual_seed(first.seed)
        template = model()
        self.group = PackedGroup(template, self.k)
        device = self.group.fm.device
        d = self.data
        self.x_train, self.y_train = d.x_train.to(device), d.y_train.to(device)
        self.x_test, self.y_test = d.x_test.to(device), d.y_test.to(device)
        self.steps = len(self.x_train) // (self.k * self.batch_size)
        if self.steps < 1:
            raise ValueError(f"PackedTrainer: {len(self.x_train)} training samples cannot fill one step of "
                             f"{self.k} replica(s) x batch_size={self.batch_size}; use a smaller batch")
        self.waiting: list[Hashable] = list(self.configs)
        self.members: dict[Hashable, _Member] = {}
        self._resume = self._resumes_from(resume)
        self.publish = publish
        self.tuning: list = [tuple(p) for p in tuning or ()]  # given: a remembered curve (with an int active)
        self.tuning_s = 0.0
        if active == "auto":
            t0 = time.perf_counter()
            active, self.tuning = self._tune(most or len(self.waiting))
            self.tuning_s = time.perf_counter() - t0
        if active is None:
            active = len(self.waiting)
        if not isinstance(active, int) or isinstance(active, bool) or active < 1:
            raise ValueError(f"PackedTrainer: active={active!r} must be an int >= 1, None (all) or 'auto'")
        self.active_limit = active
        self._fill()

    # --- membership -------------------------------------------------------------------------
    resumes = True
    _ROWS = ("W", "U", "Wbar")  # a member's blocks of the group's rows (S-SGD's momentum is its U row)

    def snapshot(self, name: Hashable) -> dict | None:
        """Member ``name``'s training state, to go on in another :class:`PackedTrainer` of its
        group (``add(name, params, resume=state)``; a packed task's take-over moves it so): its
        blocks of the stacked rows (weights, momentum, SMA's reference weights), its central
        model, SMA's last central step and step count, its batch order's generator, learning rate
        (after drops), ``epoch`` and ``history``. ``None`` for a member still waiting to start.

        >>> import functools, gpu
        >>> mlp, data = functools.partial(gpu.MLP, 64, 10), gpu.load_digits_tensors(seed=0)
        >>> a = PackedTrainer(data, mlp, {"m": {"lr": 0.1}}, batch_size=16, replicas=2, epochs=3)
        >>> _ = a.epoch()
        >>> b = PackedTrainer(data, mlp, {"m": {"lr": 0.1}}, batch_size=16, replicas=2, epochs=3,
        ...                   resume={"m": a.snapshot("m")})
        >>> b.epoch()["m"]["accuracy"] == a.epoch()["m"]["accuracy"]
        True
        """
        m = self.members.get(name)
        if m is None or m.outcome is not None:
            return None
        g = self.group
        i = g.members.index(m)
        return {"rows": {r: g.block(getattr(g, r), i).detach().clone() for r in self._ROWS},
                "z": m.state.z.detach().clone(), "delta_prev": m.state.delta_prev.detach().clone(),
                "steps": m.state.steps, "generator": m.gen.get_state(), "lr": m.lr, "epoch": m.epoch,
                "history": list(m.history), "elapsed_s": time.perf_counter() - m.t_start}

    def _start(self, name: Hashable) -> None:
        cfg = self.configs[name]
        torch.manual_seed(cfg.seed)  # the member's own seeded weights, as its solo run builds them
        w0 = self.group.fm.layout.flatten(self.model()).to(self.group.fm.device)
        m = _Member(name, cfg, w0)
        m.t_start = time.perf_counter()
        moved = self._resume.pop(name, None)
        if moved is not None:  # where another pack of the group left it (snapshot)
            m.state = SMAState(z=moved["z"].to(w0), delta_prev=moved["delta_prev"].to(w0), steps=int(moved["steps"]))
            m.gen.set_state(moved["generator"])
            m.lr, m.epoch, m.history = float(moved["lr"]), int(moved["epoch"]), list(moved["history"])
            m.sma = cfg.sma(m.lr)
            m.t_start -= float(moved["elapsed_s"])
        self.members[name] = m
        self.group.add(m, w0)
        if moved is not None:
            i = len(self.group.members) - 1
            for r in self._ROWS:
                self.group.block(getattr(self.group, r), i).copy_(moved["rows"][r])
        self._tell(name, {"kind": "start", "algorithm": cfg.algorithm, "epochs": cfg.epochs, "lr": cfg.lr,
                          "batch_size": cfg.batch_size, "replicas": str(self.k)})

    def _training(self) -> list:
        return self.group.members

    def _config(self, name: Hashable, params: Mapping) -> TrainConfig:
        return _member_config(params, self.shared)

    def _leave(self, m: _Member, outcome: str) -> None:
        self.group.drop(m)
        m.outcome = outcome
        self._tell(m.name, {"kind": "end", "epochs_done": m.epoch})

    # --- training ---------------------------------------------------------------------------
    def epoch(self) -> dict:
        """One epoch of every active member; ``{name: report}`` (empty once nobody is left)."""
        g = self.group
        members = list(g.members)
        if not members:
            return {}
        for m in members:
            if m.epoch in m.cfg.lr_drops:  # SMA at a drop: lr × factor and every w_j <- z
                m.lr *= m.cfg.lr_drop_factor
                m.sma = m.sma.with_lr(m.lr)
                reset_replicas(g.block(g.W, g.members.index(m)), m.state.z)
            m.losses = []
        g.timer.reset()
        t0 = time.perf_counter()
        streams = [replica_batches(self.x_train, self.y_train, self.k, self.batch_size, generator=m.gen)
                   for m in members]
        for _ in range(self.steps):
            batches = [next(s) for s in streams]
            x = torch.cat([b[0] for b in batches])
            y = torch.cat([b[1] for b in batches])
            losses = g.step(x, y).view(len(members), self.k)
            for m, loss in zip(members, losses.mean(dim=1).tolist()):
                m.losses.append(loss)
        for s in streams:
            s.close()
        seconds = time.perf_counter() - t0
        reports = {}
        for i, m in enumerate(members):
            t1 = time.perf_counter()
            ev = g.fm.evaluate(m.state.z, self.x_test, self.y_test, m.cfg.eval_batch_size)
            spread = (g.block(g.W, i) - m.state.z).norm(dim=1).max().item()
            samples = self.steps * self.k * self.batch_size
            m.epoch += 1
            rec = {
                "epoch": m.epoch,
                "train_loss": float(sum(m.losses) / max(len(m.losses), 1)),
                "test_loss": ev["loss"],
                "accuracy": ev["accuracy"],
                "samples_per_s": samples / seconds if seconds > 0 else float("nan"),
                "group_samples_per_s": g.timer.samples / seconds if seconds > 0 else float("nan"),
                "compute_s": g.timer.compute,
                "sync_s": 0.0,
                "sync_rounds": self.steps if m.cfg.algorithm == "ssgd" else self.steps // m.sma.sync_every,
                "bytes_sent": 0,
                "train_s": seconds,
                "eval_s": time.perf_counter() - t1,
                "replicas": self.k,
                "members": len(members),
                "lr": m.lr,
                "spread": spread,
                "samples": samples,
                "elapsed_s": time.perf_counter() - m.t_start,
            }
            m.history.append(rec)
            reports[m.name] = rec
            self._tell(m.name, {"kind": "epoch", "epochs": m.cfg.epochs, **rec})
        for m in members:
            target = m.cfg.target_accuracy
            if m.epoch >= m.cfg.epochs or (target is not None and m.history[-1]["accuracy"] >= target):
                self._leave(m, "finished")
        self._fill()
        return reports

    def run(self) -> dict:
        """Train every member to its end; ``{name: result}``."""
        while self.group.members:
            self.epoch()
        return {name: self.result(name) for name, m in self.members.items() if m.outcome == "finished"}

    def result(self, name: Hashable) -> dict:
        """A finished member's result, as ``gpu.train`` returns it (``model``, ``accuracy``,
        ``history``...), plus ``packed`` (the most members that trained together) and
        ``packing`` (the member tuner's ``(members, samples/s)`` curve)."""
        from .training import _summarise

        m = self.members.get(name)
        if m is None or m.outcome != "finished":
            state = "waiting" if name in self.waiting else (m.outcome or "training") if m else "unknown"
            raise ValueError(f"PackedTrainer.result: member {name!r} has not finished (it is {state})")
        out = {"z": m.state.z.detach().cpu().clone(), "history": list(m.history), "replicas": self.k,
               "replicas_source": "given", "tuning": [], "partitions": 1,
               "timings": {"tuning_s": self.tuning_s}}
        result = _summarise(out, self.model, m.cfg, 1, 0)
        result["packed"] = max((h["members"] for h in m.history), default=1)
        result["packing"] = [list(p) for p in self.tuning]
        return result

    # --- tuning -----------------------------------------------------------------------------
    def _tune(self, most: int) -> tuple[int, list]:
        """Members per group by Crossbow's rule, measured on a scratch group (the first member's
        configuration repeated, its own batches and random state): training is unchanged."""
        cfg = next(iter(self.configs.values()))
        gen = torch.Generator().manual_seed(cfg.seed * 1000 + 500_000)
        enough = len(self.x_train) // (self.k * self.batch_size)

        def measure(m: int) -> float:
            if m > enough:  # a step of m members would need more samples than there are
                return 0.0
            with _own_rng(self.x_train):
                torch.manual_seed(cfg.seed)
                scratch = PackedGroup(self.model(), self.k)
                w0 = scratch.fm.layout.flatten(scratch.fm.template)
                for j in range(m):
                    scratch.add(_Member(j, cfg, w0), w0)
                # best of a few short measurements: a worker sharing its cores with others is
                # slowed at random moments, and only the fastest run shows what the count can do
                return max(_measure(scratch, self.x_train, self.y_train, cfg, gen)[1] for _ in range(_REPEATS))

        return tune_members(measure, most, cfg.tune_threshold)


