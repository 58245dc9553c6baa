"""A replica group: k copies of one model trained together on one device (vmap), SMA or S-SGD.

The replicas' weights live in one flat tensor ``weights`` ``[k, n]`` (momenta ``[k, n]``,
central model ``z`` ``[n]``), the layout :mod:`gpu.sma` works on; the model's parameters
are views into it (``torch.func.functional_call``), and per-replica gradients come from
``torch.func.vmap(torch.func.grad(...))``, or, for a plain ReLU MLP with cross-entropy, from
batched matrix products and one autograd pass (the same gradients, without vmap's per-call cost;
``_FunctionalModel.row_grads`` owns the choice). Inputs are stacked per replica: ``x`` ``[k, b, ...]``,
``y`` ``[k, b]``. Everything runs on the device of the model's parameters (CPU or CUDA).

One training round, alone or across workers (``allreduce`` sums ``[n]`` over workers)::

    losses = group.train_step(x, y, allreduce=None)   # local step; sync every τ steps

or, with the sync split open for a hierarchical all-reduce::

    group.local_step(x, y)
    if group.sync_due:
        c = group.group_correction()       # Σ_j c_j over this group, [n]
        group.apply_central(allreduce(c))  # z ← z + Δ (central momentum)

>>> import torch
>>> from gpu.models import MLP
>>> _ = torch.manual_seed(0)
>>> group = ReplicaGroup(MLP(4, 3, hidden=(8,)), replicas=2)
>>> group.weights.shape, group.z.shape
(torch.Size([2, 67]), torch.Size([67]))
>>> x, y = torch.randn(2, 5, 4), torch.randint(0, 3, (2, 5))
>>> group.train_step(x, y).shape        # one loss per replica
torch.Size([2])
>>> group.add_replica(); group.replicas
3
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from .sma import (
    AllReduce,
    SMAConfig,
    SMAState,
    central_update,
    local_correction,
    local_step,
    reset_replicas,
    ssgd_step,
)

__all__ = ["ParamLayout", "ReplicaGroup", "SSGDGroup", "replica_batches"]

LossFn = Callable[[Tensor, Tensor], Tensor]


class ParamLayout:
    """Where each parameter of a module sits in the flat vector (``named_parameters`` order).

    >>> lay = ParamLayout(nn.Linear(3, 2))
    >>> lay.names, lay.shapes, lay.numel
    (['weight', 'bias'], [torch.Size([2, 3]), torch.Size([2])], 8)
    >>> {k: tuple(v.shape) for k, v in lay.views(torch.zeros(5, 8)).items()}
    {'weight': (5, 2, 3), 'bias': (5, 2)}
    """

    def __init__(self, module: nn.Module) -> None:
        named = list(module.named_parameters())
        if not named:
            raise ValueError("ParamLayout: the model has no parameters; pass a model with trainable weights")
        self.names = [name for name, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.sizes = [p.numel() for _, p in named]
        self.numel = sum(self.sizes)

    def flatten(self, module: nn.Module) -> Tensor:
        """A detached flat copy ``[n]`` of the module's parameters."""
        params = dict(module.named_parameters())
        return torch.cat([params[name].detach().reshape(-1) for name in self.names])

    def views(self, flat: Tensor) -> dict[str, Tensor]:
        """Parameter-shaped views into ``flat`` ``[n]`` or ``[k, n]`` (no copies)."""
        if flat.shape[-1] != self.numel or flat.dim() not in (1, 2):
            raise ValueError(f"ParamLayout.views: expected [n] or [k, n] with n={self.numel}; got {tuple(flat.shape)}")
        lead = flat.shape[:-1]
        out: dict[str, Tensor] = {}
        offset = 0
        for name, shape, size in zip(self.names, self.shapes, self.sizes):
            out[name] = flat[..., offset : offset + size].view(*lead, *shape)
            offset += size
        return out

    def flatten_grads(self, grads: dict[str, Tensor], replicas: int) -> Tensor:
        """Stack per-replica gradient dicts (``[k, *shape]`` each) into ``[k, n]``."""
        return torch.cat([grads[name].reshape(replicas, -1) for name in self.names], dim=1)

    @torch.no_grad()
    def load(self, module: nn.Module, flat: Tensor) -> nn.Module:
        """Copy the flat weights ``[n]`` into the module's parameters; returns the module."""
        params = dict(module.named_parameters())
        for name, view in self.views(flat).items():
            params[name].copy_(view)
        return module


def _check_model(model: nn.Module, who: str) -> None:
    if not isinstance(model, nn.Module):
        raise ValueError(f"{who}: model must be a torch nn.Module; got {type(model).__name__}")
    for name, mod in model.named_modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm) and mod.track_running_stats:
            raise ValueError(
                f"{who}: module {name!r} is a BatchNorm with running statistics, which replicas cannot "
                "update under vmap; use nn.GroupNorm (as gpu.models.SmallResNet does) or "
                "track_running_stats=False"
            )


def _stacked_layers(model: nn.Module, loss_fn: Any, layout: ParamLayout) -> list | None:
    """The layers of a plain ReLU MLP trained with cross-entropy, as ``("flatten",)``,
    ``("relu",)`` and ``("linear", weight name, bias name or None)`` (``layout``'s names);
    ``None`` for any other model or loss (they take ``vmap``)."""
    from .models import MLP

    if loss_fn is not nn.functional.cross_entropy:
        return None
    if type(model) is MLP:
        seq, prefix = model.net, "net."
    elif type(model) is nn.Sequential:
        seq, prefix = model, ""
    else:
        return None
    offsets = set(layout.names)
    covered: set = set()
    plan: list = []
    for i, layer in enumerate(seq):
        if type(layer) is nn.Flatten and layer.start_dim == 1 and layer.end_dim == -1 and i == 0:
            plan.append(("flatten",))
        elif type(layer) is nn.ReLU:
            plan.append(("relu",))
        elif type(layer) is nn.Linear:
            w, b = f"{prefix}{i}.weight", f"{prefix}{i}.bias"
            if w not in offsets or (layer.bias is not None and b not in offsets):
                return None
            covered |= {w, b} if layer.bias is not None else {w}
            plan.append(("linear", w, b if layer.bias is not None else None))
        else:
            return None
    if covered != set(layout.names):
        return None  # parameters the plan does not cover (registered elsewhere in the module)
    return plan


def _stacked_loss(plan: list, params: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
    """Each row's mean cross-entropy ``[R]`` for the MLP ``plan``, row ``r``'s parameters
    (``params``: ``[R, *shape]`` each) on ``x[r]`` ``[b, ...]``, ``y[r]`` ``[b]``: one batched
    product per layer for all rows. Activations are kept transposed (``[R, features, b]``,
    ``weight @ h``), so each weight's gradient comes out contiguous in the weight's own layout
    (with ``h @ weight.T`` it is a transposed view, and copying it back cost more than the products)."""
    R, b = x.shape[0], x.shape[1]
    h = x.reshape(R, b, -1).transpose(1, 2)  # a leading Flatten, or features already flat
    for step in plan:
        if step[0] == "relu":
            h = h.relu()
        elif step[0] == "linear" and step[2] is None:
            h = torch.bmm(params[step[1]], h)
        elif step[0] == "linear":
            h = torch.baddbmm(params[step[2]].unsqueeze(2), params[step[1]], h)
    per_sample = nn.functional.cross_entropy(h, y, reduction="none")  # h: logits [R, classes, b]
    return per_sample.mean(dim=1)


class _FunctionalModel:
    """The shared machinery: a template module, its layout, its loss, per-row gradients
    (:meth:`row_grads`), evaluation."""

    def __init__(self, model: nn.Module, loss_fn: LossFn | None, who: str) -> None:
        _check_model(model, who)
        if loss_fn is not None and not callable(loss_fn):
            raise ValueError(f"{who}: loss_fn must be callable(logits, targets) -> scalar loss")
        self._who = who
        self.template = copy.deepcopy(model)
        self.layout = ParamLayout(self.template)
        self.loss_fn: LossFn = loss_fn or nn.functional.cross_entropy
        self._buffers = dict(self.template.named_buffers())
        first = next(self.template.parameters())
        self.device, self.dtype = first.device, first.dtype

        self._stacked = _stacked_layers(self.template, self.loss_fn, self.layout)
        self._vmap_grad = vmap(grad_and_value(self.loss), in_dims=(0, 0, 0), randomness="different")

    def forward(self, params: dict[str, Tensor], x: Tensor) -> Tensor:
        return functional_call(self.template, (params, self._buffers), (x,))

    def row_grads(self, W: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """Each row's loss gradient ``[R, n]`` and loss ``[R]``: row ``r`` of ``W`` ``[R, n]`` on its
        own batch ``x[r]``, ``y[r]`` (inputs checked by :meth:`inputs`).

        The one owner of per-row gradients for every group (replicas, S-SGD, packed members).
        A plain ReLU MLP with cross-entropy (``gpu.MLP``, or an ``nn.Sequential`` of ``Flatten``,
        ``Linear`` and ``ReLU``) takes batched matrix products and one autograd pass over all
        rows (:func:`_stacked_loss`): the same gradients as ``vmap(grad(functional_call))``
        without its per-call cost (~1 ms a step on a CPU core, more than the MLP's arithmetic
        at batch 16; ``benchmarks/packing.py``). Any other model goes through ``vmap``.
        """
        if self._stacked is None or (x.dim() != 3 and self._stacked[0][0] != "flatten"):
            grads, losses = self._vmap_grad(self.layout.views(W), x, y)
            return self.layout.flatten_grads(grads, W.shape[0]), losses.detach()
        with torch.enable_grad():  # one leaf per parameter: a gradient into views of one [R, n]
            # leaf would add a zero-filled [R, n] per parameter (slower than vmap at 12 rows)
            leaves = [v.detach().requires_grad_(True) for v in self.layout.views(W.detach()).values()]
            losses = _stacked_loss(self._stacked, dict(zip(self.layout.names, leaves)), x, y)
            grads = torch.autograd.grad(losses.sum(), leaves)
        return torch.cat([g.reshape(W.shape[0], -1) for g in grads], dim=1), losses.detach()

    def loss(self, params: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        return self.loss_fn(self.forward(params, x), y)

    def inputs(self, x: Tensor, y: Tensor, replicas: int) -> tuple[Tensor, Tensor]:
        if not isinstance(x, Tensor) or not isinstance(y, Tensor):
            raise ValueError(f"{self._who}: x and y must be tensors stacked per replica: x [k, b, ...], y [k, b]")
        if x.dim() < 2 or y.dim() < 2 or x.shape[0] != replicas or y.shape[:2] != x.shape[:2]:
            raise ValueError(
                f"{self._who}: expected x [k, b, ...] and y [k, b] with k={replicas} replicas; got "
                f"x {tuple(x.shape)}, y {tuple(y.shape)} (use gpu.replica_batches to stack batches)"
            )
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    @torch.no_grad()
    def evaluate(self, flat: Tensor, x: Tensor, y: Tensor, batch_size: int) -> dict[str, float]:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"evaluate: batch_size={batch_size!r} must be an int >= 1")
        if len(x) != len(y) or len(x) == 0:
            raise ValueError(f"evaluate: x and y must be non-empty and equally long; got {len(x)} and {len(y)}")
        params = self.layout.views(flat)
        total_loss = torch.zeros((), device=self.device, dtype=torch.float64)
        correct = torch.zeros((), device=self.device, dtype=torch.int64)
        for start in range(0, len(x), batch_size):
            xb = x[start : start + batch_size].to(self.device)
            yb = y[start : start + batch_size].to(self.device)
            out = self.forward(params, xb)
            total_loss += self.loss_fn(out, yb).double() * len(xb)
            if out.dim() == 2 and yb.dim() == 1:
                correct += (out.argmax(dim=1) == yb).sum()
        result = {"loss": float(total_loss) / len(x), "accuracy": float(correct) / len(x)}
        return result

    def module(self, flat: Tensor) -> nn.Module:
        return self.layout.load(copy.deepcopy(self.template), flat)


def _check_group_args(who: str, replicas: Any, config: Any) -> None:
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        raise ValueError(f"{who}: replicas={replicas!r} must be an int >= 1")
    if config is not None and not isinstance(config, SMAConfig):
        raise ValueError(f"{who}: config must be a gpu.SMAConfig, e.g. SMAConfig(lr=0.1)")


class ReplicaGroup:
    """k replicas of ``model`` trained with SMA on the model's device.

    Every replica starts from the model's weights, which are also the first central model
    ``z``. Use the same seeded model on every worker so their ``z`` agree.

    >>> import torch
    >>> group = ReplicaGroup(nn.Linear(2, 2), replicas=3, config=SMAConfig(lr=0.05))
    >>> group.spread()                      # distances ‖w_j − z‖ (all start at z)
    [0.0, 0.0, 0.0]
    >>> group.resize(1).replicas
    1
    >>> ReplicaGroup(nn.Linear(2, 2), replicas=0)
    Traceback (most recent call last):
        ...
    ValueError: ReplicaGroup: replicas=0 must be an int >= 1
    """

    def __init__(
        self,
        model: nn.Module,
        replicas: int = 1,
        config: SMAConfig | None = None,
        *,
        loss_fn: LossFn | None = None,
    ) -> None:
        _check_group_args("ReplicaGroup", replicas, config)
        self._fm = _FunctionalModel(model, loss_fn, "ReplicaGroup")
        self.config = config or SMAConfig()
        w0 = self._fm.layout.flatten(self._fm.template)
        self.weights: Tensor = w0.unsqueeze(0).repeat(replicas, 1)
        self.momenta: Tensor = torch.zeros_like(self.weights)
        self._wbar: Tensor = self.weights.clone()
        self.state = SMAState.from_weights(w0)

    # --- shape and placement -------------------------------------------------------------
    @property
    def replicas(self) -> int:
        """Number of replicas k in this group."""
        return self.weights.shape[0]

    @property
    def num_params(self) -> int:
        """Length n of the flat parameter vector."""
        return self._fm.layout.numel

    @property
    def device(self) -> torch.device:
        return self._fm.device

    @property
    def layout(self) -> ParamLayout:
        return self._fm.layout

    @property
    def z(self) -> Tensor:
        """The central model ``[n]`` (the trained model)."""
        return self.state.z

    @property
    def sync_due(self) -> bool:
        """True right after every τ-th local step."""
        return self.state.steps > 0 and self.state.steps % self.config.sync_every == 0

    # --- training ------------------------------------------------------------------------
    def gradients(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """Per-replica loss gradients ``[k, n]`` and losses ``[k]`` at the current weights."""
        x, y = self._fm.inputs(x, y, self.replicas)
        return self._fm.row_grads(self.weights, x, y)

    def local_step(self, x: Tensor, y: Tensor) -> Tensor:
        """Every replica takes one momentum-SGD step on its own batch; returns losses ``[k]``."""
        G, losses = self.gradients(x, y)
        local_step(self.weights, self.momenta, G, self.config, self._wbar)
        self.state.steps += 1
        return losses

    def group_correction(self) -> Tensor:
        """Apply ``w_j ← w_j − c_j`` to every replica; return the group's ``Σ_j c_j`` ``[n]``."""
        return local_correction(self.weights, self._wbar, self.state.z, self.config)

    def apply_central(self, delta: Tensor) -> Tensor:
        """Central update with the all-reduced ``Δ`` ``[n]``; returns ``z``."""
        return central_update(self.state, delta.to(self.device), self.config)

    def sync(self, allreduce: AllReduce | None = None) -> Tensor:
        """Correction, all-reduce (``None``: this group alone), central update; returns ``z``."""
        c = self.group_correction()
        return self.apply_central(allreduce(c) if allreduce is not None else c)

    def train_step(self, x: Tensor, y: Tensor, allreduce: AllReduce | None = None) -> Tensor:
        """Local step, then a sync when due (every τ steps); returns per-replica losses ``[k]``."""
        losses = self.local_step(x, y)
        if self.sync_due:
            self.sync(allreduce)
        return losses

    def reset_to_central(self) -> None:
        """Every ``w_j ← z`` (what SMA does at a learning-rate drop)."""
        reset_replicas(self.weights, self.state.z)

    def drop_lr(self, factor: float = 0.1) -> SMAConfig:
        """Multiply the learning rate by ``factor`` and reset the replicas to ``z``."""
        if not (isinstance(factor, (int, float)) and 0 < factor and math.isfinite(factor)):
            raise ValueError(f"drop_lr: factor={factor!r} must be a positive number, e.g. 0.1")
        self.config = self.config.with_lr(self.config.lr * factor)
        self.reset_to_central()
        return self.config

    # --- membership (auto-tuning) ---------------------------------------------------------
    def add_replica(self) -> None:
        """Add one replica that starts from ``z`` with zero momentum."""
        z = self.state.z.unsqueeze(0)
        self.weights = torch.cat([self.weights, z])
        self.momenta = torch.cat([self.momenta, torch.zeros_like(z)])
        self._wbar = torch.cat([self._wbar, z])

    def remove_replica(self, index: int = -1) -> None:
        """Remove one replica (the last by default); at least one must remain."""
        k = self.replicas
        if k == 1:
            raise ValueError("remove_replica: the group has a single replica; a group needs at least one")
        if not isinstance(index, int) or not -k <= index < k:
            raise ValueError(f"remove_replica: index={index!r} is out of range for {k} replicas")
        keep = [j for j in range(k) if j != index % k]
        self.weights, self.momenta, self._wbar = (t[keep].clone() for t in (self.weights, self.momenta, self._wbar))

    def resize(self, replicas: int) -> "ReplicaGroup":
        """Add or remove replicas (last first) until there are ``replicas``; returns self."""
        if not isinstance(replicas, int) or replicas < 1:
            raise ValueError(f"resize: replicas={replicas!r} must be an int >= 1")
        while self.replicas < replicas:
            self.add_replica()
        while self.replicas > replicas:
            self.remove_replica()
        return self

    # --- inspection ----------------------------------------------------------------------
    def evaluate(self, x: Tensor, y: Tensor, batch_size: int = 1024, replica: int | None = None) -> dict[str, float]:
        """Mean loss and accuracy of ``z`` (or of one replica) on ``x`` ``[N, ...]``, ``y`` ``[N]``."""
        flat = self.state.z if replica is None else self.weights[replica]
        return self._fm.evaluate(flat, x, y, batch_size)

    def spread(self) -> list[float]:
        """Per-replica L2 distance ``‖w_j − z‖``."""
        return (self.weights - self.state.z).norm(dim=1).tolist()

    def central_module(self) -> nn.Module:
        """A fresh copy of the model holding ``z``."""
        return self._fm.module(self.state.z)


class SSGDGroup:
    """The synchronous-SGD baseline: one model, k replicas computing gradients on k batches.

    Each step averages the gradients over all replicas on all workers, then takes one
    momentum-SGD step (``lr``, ``momentum``, ``weight_decay`` from the config).

    >>> import torch
    >>> g = SSGDGroup(nn.Linear(2, 2), replicas=2)
    >>> g.train_step(torch.randn(2, 3, 2), torch.randint(0, 2, (2, 3))).shape
    torch.Size([2])
    """

    def __init__(
        self,
        model: nn.Module,
        replicas: int = 1,
        config: SMAConfig | None = None,
        *,
        loss_fn: LossFn | None = None,
    ) -> None:
        _check_group_args("SSGDGroup", replicas, config)
        self._fm = _FunctionalModel(model, loss_fn, "SSGDGroup")
        self.replicas = replicas
        self.config = config or SMAConfig()
        self.weights: Tensor = self._fm.layout.flatten(self._fm.template)
        self.momentum: Tensor = torch.zeros_like(self.weights)

    @property
    def num_params(self) -> int:
        return self._fm.layout.numel

    @property
    def device(self) -> torch.device:
        return self._fm.device

    def gradients(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """Per-replica gradients ``[k, n]`` and losses ``[k]``, all at the single model."""
        x, y = self._fm.inputs(x, y, self.replicas)
        return self._fm.row_grads(self.weights.expand(self.replicas, -1), x, y)

    def train_step(
        self, x: Tensor, y: Tensor, allreduce: AllReduce | None = None, world_replicas: int | None = None
    ) -> Tensor:
        """One S-SGD step; ``allreduce`` sums gradients over workers, ``world_replicas`` is the total k."""
        G, losses = self.gradients(x, y)
        ssgd_step(self.weights, self.momentum, G, self.config, allreduce=allreduce, world_replicas=world_replicas)
        return losses

    def evaluate(self, x: Tensor, y: Tensor, batch_size: int = 1024) -> dict[str, float]:
        """Mean loss and accuracy of the model on ``x`` ``[N, ...]``, ``y`` ``[N]``."""
        return self._fm.evaluate(self.weights, x, y, batch_size)

    def central_module(self) -> nn.Module:
        """A fresh copy of the model holding the current weights."""
        return self._fm.module(self.weights)


def replica_batches(
    x: Tensor,
    y: Tensor,
    replicas: int,
    batch_size: int,
    *,
    generator: torch.Generator | None = None,
    shuffle: bool = True,
) -> Iterator[tuple[Tensor, Tensor]]:
    """One epoch of stacked batches ``([k, b, ...], [k, b])``: each replica its own ``b`` samples.

    The dataset is (optionally) shuffled with ``generator`` and cut into ``k·b`` chunks; a
    last incomplete chunk is dropped.

    >>> import torch
    >>> xs, ys = torch.arange(20.).reshape(10, 2), torch.arange(10)
    >>> [tuple(b[0].shape) for b in replica_batches(xs, ys, replicas=2, batch_size=2, shuffle=False)]
    [(2, 2, 2), (2, 2, 2)]
    """
    for name, v in (("replicas", replicas), ("batch_size", batch_size)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"replica_batches: {name}={v!r} must be an int >= 1")
    if len(x) != len(y):
        raise ValueError(f"replica_batches: x and y differ in length ({len(x)} vs {len(y)})")
    chunk = replicas * batch_size
    if len(x) < chunk:
        raise ValueError(
            f"replica_batches: {len(x)} samples cannot fill one step of replicas*batch_size={chunk}; "
            "use fewer replicas or a smaller batch_size"
        )
    order = torch.randperm(len(x), generator=generator) if shuffle else torch.arange(len(x))
    order = order.to(x.device)
    for start in range(0, len(x) - chunk + 1, chunk):
        idx = order[start : start + chunk]
        yield (
            x[idx].reshape(replicas, batch_size, *x.shape[1:]),
            y[idx.to(y.device)].reshape(replicas, batch_size, *y.shape[1:]),
        )
