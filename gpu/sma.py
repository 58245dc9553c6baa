"""The SMA update rule (Crossbow, VLDB 2019) and the S-SGD baseline, on flat tensors.

Pure, single-process maths; no modules, no communication. A replica group is held as
stacked flat views: weights ``W`` ``[k, n]``, momenta ``U`` ``[k, n]``, the pre-step
weights ``Wbar`` ``[k, n]``; the central model is ``state.z`` ``[n]``. One round::

    step (each replica, own small batch):  g = ∇loss(w_j) + λ·w_j ;  u_j ← μ·u_j − η·g
                                           w̄_j ← w_j ;  w_j ← w_j + u_j
    sync (every τ steps):                  c_j = α·(w̄_j − z) ;  w_j ← w_j − c_j
                                           Δ = Σ over all replicas on all workers of c_j
                                           Δ ← Δ + μ_c·Δ_prev ;  Δ_prev ← Δ ;  z ← z + Δ
    at a learning-rate drop:               every w_j ← z

The sync is split so that a cross-worker all-reduce fits between the group's local sum
and the central update (hierarchical: intra-worker sum, then inter-worker all-reduce)::

    wbar = local_step(W, U, G, cfg)            # every replica, own gradient G[j]
    c = local_correction(W, wbar, state.z, cfg)  # w_j -= c_j, returns Σ_j c_j   [n]
    delta = allreduce(c)                        # sum over all workers (identity when alone)
    central_update(state, delta, cfg)           # z += Δ (with central momentum)

Every worker keeps its own copy of ``z`` and ``Δ_prev``; they stay identical because
every worker applies the same all-reduced ``Δ``.

>>> import torch
>>> cfg = SMAConfig(lr=0.1, weight_decay=0.0)
>>> W = torch.zeros(2, 3); U = torch.zeros(2, 3); state = SMAState.from_weights(W[0])
>>> G = torch.ones(2, 3)
>>> [sma_step(W, U, G, state, cfg) for _ in range(2)]   # local step + sync (τ = 1)
[True, True]
>>> state.z
tensor([-0.0200, -0.0200, -0.0200])
>>> W
tensor([[-0.2800, -0.2800, -0.2800],
        [-0.2800, -0.2800, -0.2800]])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

import torch
from torch import Tensor

__all__ = [
    "AllReduce",
    "SMAConfig",
    "SMAState",
    "local_step",
    "local_correction",
    "central_update",
    "reset_replicas",
    "sma_step",
    "ssgd_update",
    "ssgd_step",
]

AllReduce = Callable[[Tensor], Tensor]
"""Sums a flat tensor over all workers and returns the sum (same shape, same device)."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True)
class SMAConfig:
    """Hyper-parameters of SMA (Crossbow's defaults) and of the S-SGD baseline.

    ``lr`` η, ``weight_decay`` λ, ``momentum`` μ (per replica), ``central_momentum`` μ_c,
    ``alpha`` α (correction strength), ``sync_every`` τ (local steps between syncs).
    S-SGD uses only ``lr``, ``weight_decay`` and ``momentum``.

    >>> SMAConfig()
    SMAConfig(lr=0.1, weight_decay=0.0001, momentum=0.9, central_momentum=0.9, alpha=0.1, sync_every=1)
    >>> SMAConfig(lr=0.1).with_lr(0.01).lr
    0.01
    >>> SMAConfig(alpha=2.0)
    Traceback (most recent call last):
        ...
    ValueError: SMAConfig: alpha=2.0 is out of range; use 0 <= alpha <= 1 (Crossbow uses 0.1)
    """

    lr: float = 0.1
    weight_decay: float = 1e-4
    momentum: float = 0.9
    central_momentum: float = 0.9
    alpha: float = 0.1
    sync_every: int = 1

    def __post_init__(self) -> None:
        def finite(name: str) -> float:
            value = getattr(self, name)
            _require(
                isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
                f"SMAConfig: {name}={value!r} must be a finite number",
            )
            return float(value)

        _require(finite("lr") > 0, f"SMAConfig: lr={self.lr!r} must be > 0; use e.g. lr=0.1")
        _require(
            finite("weight_decay") >= 0,
            f"SMAConfig: weight_decay={self.weight_decay!r} must be >= 0 (Crossbow uses 1e-4)",
        )
        _require(
            0 <= finite("momentum") < 1,
            f"SMAConfig: momentum={self.momentum!r} is out of range; use 0 <= momentum < 1 (Crossbow uses 0.9)",
        )
        _require(
            0 <= finite("central_momentum") < 1,
            f"SMAConfig: central_momentum={self.central_momentum!r} is out of range; "
            "use 0 <= central_momentum < 1 (Crossbow uses 0.9)",
        )
        _require(
            0 <= finite("alpha") <= 1,
            f"SMAConfig: alpha={self.alpha!r} is out of range; use 0 <= alpha <= 1 (Crossbow uses 0.1)",
        )
        _require(
            isinstance(self.sync_every, int) and not isinstance(self.sync_every, bool) and self.sync_every >= 1,
            f"SMAConfig: sync_every={self.sync_every!r} must be an int >= 1 (Crossbow uses 1)",
        )

    def with_lr(self, lr: float) -> "SMAConfig":
        """A copy with a new learning rate (for a learning-rate drop)."""
        return replace(self, lr=lr)


@dataclass
class SMAState:
    """The central model ``z`` ``[n]``, the previous central step ``delta_prev`` ``[n]``,
    and the number of local steps taken so far (``steps``; drives the τ schedule).

    >>> import torch
    >>> s = SMAState.from_weights(torch.tensor([1.0, 2.0]))
    >>> s.z, s.delta_prev, s.steps
    (tensor([1., 2.]), tensor([0., 0.]), 0)
    """

    z: Tensor
    delta_prev: Tensor = field(default=None)  # type: ignore[assignment]
    steps: int = 0

    def __post_init__(self) -> None:
        _require(isinstance(self.z, Tensor) and self.z.dim() == 1, "SMAState: z must be a flat tensor [n]")
        if self.delta_prev is None:
            self.delta_prev = torch.zeros_like(self.z)
        _require(
            isinstance(self.delta_prev, Tensor) and self.delta_prev.shape == self.z.shape,
            f"SMAState: delta_prev must have z's shape {tuple(self.z.shape)}",
        )

    @classmethod
    def from_weights(cls, w: Tensor) -> "SMAState":
        """Start the central model at a copy of the flat weights ``w`` ``[n]``."""
        _require(isinstance(w, Tensor) and w.dim() == 1, "SMAState.from_weights: w must be a flat tensor [n]")
        return cls(z=w.detach().clone())


def _check_group(W: Tensor, **others: Tensor) -> None:
    _require(isinstance(W, Tensor) and W.dim() == 2, f"W must be a tensor [k, n]; got {_shape(W)}")
    for name, t in others.items():
        _require(
            isinstance(t, Tensor) and t.shape == W.shape,
            f"{name} must have W's shape {tuple(W.shape)}; got {_shape(t)}",
        )


def _check_flat(name: str, t: Tensor, n: int) -> None:
    _require(
        isinstance(t, Tensor) and t.shape == (n,),
        f"{name} must be a flat tensor of shape ({n},); got {_shape(t)}",
    )


def _shape(t: object) -> str:
    return str(tuple(t.shape)) if isinstance(t, Tensor) else type(t).__name__


@torch.no_grad()
def local_step(W: Tensor, U: Tensor, G: Tensor, config: SMAConfig, Wbar: Tensor | None = None) -> Tensor:
    """One momentum-SGD step of every replica, in place on ``W`` and ``U``; returns ``w̄``.

    ``G[j]`` is replica j's loss gradient (weight decay is added here). ``w̄`` (the weights
    before the step) is written into ``Wbar`` when given, else into a new tensor.

    >>> import torch
    >>> W = torch.tensor([[1.0], [2.0]]); U = torch.zeros(2, 1)
    >>> wbar = local_step(W, U, torch.ones(2, 1), SMAConfig(lr=0.5, weight_decay=0.0))
    >>> wbar.flatten().tolist(), W.flatten().tolist(), U.flatten().tolist()
    ([1.0, 2.0], [0.5, 1.5], [-0.5, -0.5])
    """
    _check_group(W, U=U, G=G)
    if Wbar is None:
        Wbar = W.clone()
    else:
        _check_group(W, Wbar=Wbar)
        Wbar.copy_(W)
    g = G.add(W, alpha=config.weight_decay) if config.weight_decay else G
    U.mul_(config.momentum).add_(g, alpha=-config.lr)
    W.add_(U)
    return Wbar


@torch.no_grad()
def local_correction(W: Tensor, Wbar: Tensor, z: Tensor, config: SMAConfig) -> Tensor:
    """Apply ``w_j ← w_j − c_j`` with ``c_j = α·(w̄_j − z)``; return the group's ``Σ_j c_j`` ``[n]``.

    The returned sum is what the workers all-reduce before :func:`central_update`.

    >>> import torch
    >>> W = torch.tensor([[3.0], [5.0]]); Wbar = torch.tensor([[2.0], [4.0]])
    >>> local_correction(W, Wbar, torch.tensor([0.0]), SMAConfig(alpha=0.5))
    tensor([3.])
    >>> W.flatten().tolist()
    [2.0, 3.0]
    """
    _check_group(W, Wbar=Wbar)
    _check_flat("z", z, W.shape[1])
    C = Wbar.sub(z).mul_(config.alpha)
    W.sub_(C)
    return C[0] if C.shape[0] == 1 else C.sum(dim=0)  # one replica: its correction is the sum (no copy)


@torch.no_grad()
def central_update(state: SMAState, delta: Tensor, config: SMAConfig) -> Tensor:
    """``Δ ← Δ + μ_c·Δ_prev ; Δ_prev ← Δ ; z ← z + Δ``, in place on ``state``; returns ``z``.

    ``delta`` is the sum of all corrections over all replicas on all workers.

    >>> import torch
    >>> s = SMAState.from_weights(torch.zeros(1))
    >>> cfg = SMAConfig(central_momentum=0.5)
    >>> central_update(s, torch.ones(1), cfg); central_update(s, torch.ones(1), cfg)
    tensor([1.])
    tensor([2.5000])
    >>> s.delta_prev
    tensor([1.5000])
    """
    _check_flat("delta", delta, state.z.shape[0])
    state.delta_prev.mul_(config.central_momentum).add_(delta)  # Δ ← Δ + μ_c·Δ_prev ; Δ_prev ← Δ
    state.z.add_(state.delta_prev)
    return state.z


@torch.no_grad()
def reset_replicas(W: Tensor, z: Tensor) -> None:
    """At a learning-rate drop: every ``w_j ← z`` (in place; momenta are left as they are).

    >>> import torch
    >>> W = torch.zeros(2, 2); reset_replicas(W, torch.tensor([1.0, 2.0])); W
    tensor([[1., 2.],
            [1., 2.]])
    """
    _check_group(W)
    _check_flat("z", z, W.shape[1])
    W.copy_(z.expand_as(W))


@torch.no_grad()
def sma_step(
    W: Tensor,
    U: Tensor,
    G: Tensor,
    state: SMAState,
    config: SMAConfig,
    *,
    allreduce: AllReduce | None = None,
    Wbar: Tensor | None = None,
) -> bool:
    """One full SMA round: local step, then (every τ-th step) sync. Returns whether it synced.

    ``allreduce`` sums the group's correction over all workers (default: this group alone).

    >>> import torch
    >>> W = torch.zeros(1, 2); U = torch.zeros(1, 2); s = SMAState.from_weights(W[0])
    >>> cfg = SMAConfig(sync_every=2)
    >>> [sma_step(W, U, torch.ones(1, 2), s, cfg) for _ in range(4)]
    [False, True, False, True]
    """
    wbar = local_step(W, U, G, config, Wbar)
    state.steps += 1
    if state.steps % config.sync_every:
        return False
    c = local_correction(W, wbar, state.z, config)
    delta = allreduce(c) if allreduce is not None else c
    central_update(state, delta, config)
    return True


@torch.no_grad()
def ssgd_update(w: Tensor, u: Tensor, grad: Tensor, config: SMAConfig) -> Tensor:
    """One synchronous-SGD step of a single model, in place: ``g = grad + λ·w ; u ← μ·u − η·g ; w ← w + u``.

    ``grad`` is the loss gradient averaged over all replicas on all workers. With a
    constant η this is exactly ``torch.optim.SGD(lr=η, momentum=μ, weight_decay=λ)``
    (torch keeps ``b = −u/η``). Returns ``w``.

    >>> import torch
    >>> w = torch.ones(2); u = torch.zeros(2)
    >>> ssgd_update(w, u, torch.ones(2), SMAConfig(lr=0.5, weight_decay=0.0))
    tensor([0.5000, 0.5000])
    """
    _require(isinstance(w, Tensor) and w.dim() == 1, f"w must be a flat tensor [n]; got {_shape(w)}")
    _check_flat("u", u, w.shape[0])
    _check_flat("grad", grad, w.shape[0])
    g = grad.add(w, alpha=config.weight_decay) if config.weight_decay else grad
    u.mul_(config.momentum).add_(g, alpha=-config.lr)
    return w.add_(u)


@torch.no_grad()
def ssgd_step(
    w: Tensor,
    u: Tensor,
    G: Tensor,
    config: SMAConfig,
    *,
    allreduce: AllReduce | None = None,
    world_replicas: int | None = None,
) -> Tensor:
    """S-SGD step from this group's per-replica gradients ``G`` ``[k, n]`` (all taken at ``w``).

    The group sums its gradients, ``allreduce`` sums over workers, and the mean over
    ``world_replicas`` (default: this group's k) drives :func:`ssgd_update`.

    >>> import torch
    >>> w = torch.zeros(2); u = torch.zeros(2)
    >>> ssgd_step(w, u, torch.tensor([[1.0, 0.0], [3.0, 2.0]]), SMAConfig(lr=1.0, weight_decay=0.0))
    tensor([-2., -1.])
    """
    _require(isinstance(G, Tensor) and G.dim() == 2, f"G must be a tensor [k, n]; got {_shape(G)}")
    if G.shape[0] == 1 and allreduce is None and world_replicas in (None, 1):
        return ssgd_update(w, u, G[0], config)  # one replica alone: its gradient is the mean (no copies)
    total = G.sum(dim=0)
    if allreduce is not None:
        total = allreduce(total)
    count = G.shape[0] if world_replicas is None else world_replicas
    _require(
        isinstance(count, int) and count >= 1,
        f"world_replicas={world_replicas!r} must be an int >= 1 (replicas on all workers together)",
    )
    return ssgd_update(w, u, total.div_(count), config)
