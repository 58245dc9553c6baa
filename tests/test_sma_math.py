"""The SMA maths in gpu.sma against a plain, per-replica transcription of docs/architecture.md §5."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu.sma import (
    SMAConfig,
    SMAState,
    central_update,
    local_correction,
    local_step,
    reset_replicas,
    sma_step,
    ssgd_step,
    ssgd_update,
)

torch.set_num_threads(1)


# --- an independent transcription: numpy, one replica at a time ----------------------------
def transcribe(W0, z0, grad, cfg: SMAConfig, steps: int, drops=()):
    """Run docs/architecture.md §5 literally. ``grad(j, t, w)`` is ∇loss of replica j at step t."""
    eta, lam, mu, muc, alpha, tau = (
        cfg.lr, cfg.weight_decay, cfg.momentum, cfg.central_momentum, cfg.alpha, cfg.sync_every,
    )
    k = len(W0)
    w = [np.array(W0[j], dtype=np.float64) for j in range(k)]
    u = [np.zeros_like(w[j]) for j in range(k)]
    wbar = [None] * k
    z = np.array(z0, dtype=np.float64)
    dprev = np.zeros_like(z)
    for t in range(1, steps + 1):
        for j in range(k):
            g = grad(j, t, w[j]) + lam * w[j]
            u[j] = mu * u[j] - eta * g
            wbar[j] = w[j].copy()
            w[j] = w[j] + u[j]
        if t % tau == 0:
            delta = np.zeros_like(z)
            for j in range(k):
                c = alpha * (wbar[j] - z)
                w[j] = w[j] - c
                delta = delta + c
            delta = delta + muc * dprev
            dprev = delta
            z = z + delta
        if t in drops:
            for j in range(k):
                w[j] = z.copy()
    return np.stack(w), np.stack(u), z


def linear_grads(k, n, steps, seed):
    """Gradients that depend on the weights: g_j(t, w) = A_j w + b_{j,t}."""
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(k, n, n)) * 0.3
    B = rng.normal(size=(steps + 1, k, n))

    def grad_np(j, t, w):
        return A[j] @ w + B[t, j]

    def grad_torch(t, W):
        return torch.einsum("kij,kj->ki", torch.from_numpy(A), W) + torch.from_numpy(B[t])

    return grad_np, grad_torch


def run_torch(W0, z0, grad_torch, cfg, steps, drops=()):
    W = torch.tensor(W0, dtype=torch.float64)
    U = torch.zeros_like(W)
    state = SMAState(z=torch.tensor(z0, dtype=torch.float64))
    for t in range(1, steps + 1):
        sma_step(W, U, grad_torch(t, W), state, cfg)
        if t in drops:
            reset_replicas(W, state.z)
    return W.numpy(), U.numpy(), state.z.numpy()


def test_matches_transcription_several_steps_and_replicas():
    k, n, steps = 3, 5, 7
    rng = np.random.default_rng(0)
    W0 = rng.normal(size=(k, n))
    z0 = rng.normal(size=n)
    grad_np, grad_torch = linear_grads(k, n, steps, seed=1)
    cfg = SMAConfig(lr=0.05)  # Crossbow defaults otherwise
    want = transcribe(W0, z0, grad_np, cfg, steps, drops={4})
    got = run_torch(W0, z0, grad_torch, cfg, steps, drops={4})
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_hierarchical_allreduce_slot_matches_one_big_group():
    """Two workers with 2 replicas each, summing corrections across, equal 4 replicas in one group."""
    k, n, steps = 4, 3, 6
    rng = np.random.default_rng(2)
    W0 = rng.normal(size=(k, n))
    z0 = W0.mean(axis=0)
    grad_np, grad_torch = linear_grads(k, n, steps, seed=3)
    cfg = SMAConfig(lr=0.1, sync_every=2)
    want_W, _, want_z = transcribe(W0, z0, grad_np, cfg, steps)

    W = torch.tensor(W0)
    parts = [W[:2].clone(), W[2:].clone()]
    moms = [torch.zeros_like(p) for p in parts]
    bars = [torch.zeros_like(p) for p in parts]
    states = [SMAState(z=torch.tensor(z0)) for _ in parts]
    for t in range(1, steps + 1):
        G = grad_torch(t, torch.cat(parts))
        for i, (Wi, Ui, Bi) in enumerate(zip(parts, moms, bars)):
            local_step(Wi, Ui, G[2 * i : 2 * i + 2], cfg, Bi)
            states[i].steps += 1
        if t % cfg.sync_every == 0:
            sums = [local_correction(Wi, Bi, s.z, cfg) for Wi, Bi, s in zip(parts, bars, states)]
            delta = sums[0] + sums[1]  # the all-reduce
            for s in states:
                central_update(s, delta.clone(), cfg)
    np.testing.assert_allclose(torch.cat(parts).numpy(), want_W, rtol=1e-12, atol=1e-12)
    for s in states:
        np.testing.assert_allclose(s.z.numpy(), want_z, rtol=1e-12, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(1, 4),
    n=st.integers(1, 6),
    steps=st.integers(1, 6),
    tau=st.integers(1, 3),
    lr=st.floats(1e-3, 0.5),
    wd=st.floats(0.0, 1e-2),
    mu=st.floats(0.0, 0.99),
    muc=st.floats(0.0, 0.99),
    alpha=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
)
def test_property_matches_transcription(k, n, steps, tau, lr, wd, mu, muc, alpha, seed):
    rng = np.random.default_rng(seed)
    W0 = rng.normal(size=(k, n))
    z0 = rng.normal(size=n)
    grad_np, grad_torch = linear_grads(k, n, steps, seed)
    cfg = SMAConfig(lr=lr, weight_decay=wd, momentum=mu, central_momentum=muc, alpha=alpha, sync_every=tau)
    want = transcribe(W0, z0, grad_np, cfg, steps)
    got = run_torch(W0, z0, grad_torch, cfg, steps)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


# --- limits -----------------------------------------------------------------------------------
def _torch_sgd_reference(steps, lr, mu, wd, seed=0):
    """torch.optim.SGD on a tiny linear model with a real loss; yields (flat weights, flat grad)."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2).double()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=mu, weight_decay=wd)
    x = torch.randn(steps, 8, 3, dtype=torch.float64)
    y = torch.randint(0, 2, (steps, 8))
    w0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    return model, opt, x, y, w0


def _grad_at(w, x, y):
    """Cross-entropy gradient of the Linear(3, 2) model at flat weights w."""
    w = w.detach().clone().requires_grad_(True)
    weight, bias = w[:6].view(2, 3), w[6:]
    loss = torch.nn.functional.cross_entropy(x @ weight.T + bias, y)
    (g,) = torch.autograd.grad(loss, w)
    return g


def test_one_replica_alpha_zero_is_torch_momentum_sgd():
    """u ← μu − ηg ; w ← w + u  equals torch's  b ← μb + g ; w ← w − ηb  with u = −ηb (η constant)."""
    lr, mu, wd, steps = 0.1, 0.9, 1e-4, 12
    model, opt, x, y, w0 = _torch_sgd_reference(steps, lr, mu, wd)
    W = w0.clone().unsqueeze(0)
    U = torch.zeros_like(W)
    state = SMAState.from_weights(w0)
    cfg = SMAConfig(lr=lr, momentum=mu, weight_decay=wd, alpha=0.0)
    for t in range(steps):
        sma_step(W, U, _grad_at(W[0], x[t], y[t]).unsqueeze(0), state, cfg)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[t]), y[t]).backward()
        opt.step()
        ref = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
        torch.testing.assert_close(W[0], ref, rtol=1e-12, atol=1e-12)
        # torch's momentum buffer b relates to ours by u = −η b
        buf = torch.cat([opt.state[p]["momentum_buffer"].reshape(-1) for p in model.parameters()])
        torch.testing.assert_close(U[0], -lr * buf, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(state.z, w0)  # α = 0: z never moves


def test_ssgd_update_is_torch_momentum_sgd():
    lr, mu, wd, steps = 0.05, 0.8, 1e-3, 10
    model, opt, x, y, w0 = _torch_sgd_reference(steps, lr, mu, wd, seed=1)
    w, u = w0.clone(), torch.zeros_like(w0)
    cfg = SMAConfig(lr=lr, momentum=mu, weight_decay=wd)
    for t in range(steps):
        # two replicas, half a batch each: the mean of their mean-loss gradients is the full-batch gradient
        G = torch.stack([_grad_at(w, x[t, :4], y[t, :4]), _grad_at(w, x[t, 4:], y[t, 4:])])
        ssgd_step(w, u, G, cfg)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[t]), y[t]).backward()
        opt.step()
        ref = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
        torch.testing.assert_close(w, ref, rtol=1e-12, atol=1e-12)


def test_ssgd_allreduce_and_world_replicas():
    w, u = torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    G = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    other_worker = torch.tensor([3.0, 4.0], dtype=torch.float64)
    ssgd_step(w, u, G, SMAConfig(lr=1.0, weight_decay=0.0), allreduce=lambda s: s + other_worker, world_replicas=2)
    torch.testing.assert_close(w, torch.tensor([-2.0, -3.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="world_replicas"):
        ssgd_step(w, u, G, SMAConfig(), world_replicas=0)
    with pytest.raises(ValueError, match="grad must"):
        ssgd_update(w, u, torch.zeros(3, dtype=torch.float64), SMAConfig())


def test_identical_replicas_stay_identical_and_z_follows():
    """k identical replicas with k·α = 1 and μ_c = 0: after every sync z is exactly the common w̄."""
    k, n, steps = 4, 5, 8
    rng = np.random.default_rng(4)
    w0 = torch.tensor(rng.normal(size=n))
    A = torch.tensor(rng.normal(size=(n, n)) * 0.2)
    W = w0.repeat(k, 1)
    U = torch.zeros_like(W)
    state = SMAState.from_weights(w0)
    cfg = SMAConfig(lr=0.1, alpha=1.0 / k, central_momentum=0.0)
    for _ in range(steps):
        G = (W @ A.T) + 1.0  # the same gradient for identical weights
        wbar = local_step(W, U, G, cfg)
        c = local_correction(W, wbar, state.z, cfg)
        central_update(state, c, cfg)
        assert torch.equal(W, W[0].expand_as(W))
        torch.testing.assert_close(state.z, wbar[0], rtol=1e-12, atol=1e-12)


def test_identical_replicas_default_hyperparameters_converge_to_z():
    """With no gradient and no decay, identical replicas and z settle on one common point."""
    k, n = 3, 4
    W = torch.ones(k, n, dtype=torch.float64) * 2.0
    U = torch.zeros_like(W)
    state = SMAState(z=torch.zeros(n, dtype=torch.float64))
    cfg = SMAConfig(weight_decay=0.0)
    for _ in range(400):
        sma_step(W, U, torch.zeros_like(W), state, cfg)
        assert torch.equal(W, W[0].expand_as(W))
    torch.testing.assert_close(W[0], state.z, rtol=1e-6, atol=1e-6)


def test_alpha_one_tau_one():
    """α = 1, τ = 1: after a sync w_j = z_old + u_j; with one replica and μ_c = 0, z = w̄."""
    k, n, steps = 3, 4, 5
    rng = np.random.default_rng(5)
    W = torch.tensor(rng.normal(size=(k, n)))
    U = torch.zeros_like(W)
    state = SMAState(z=torch.tensor(rng.normal(size=n)))
    cfg = SMAConfig(lr=0.1, alpha=1.0, sync_every=1)
    for t in range(steps):
        z_old = state.z.clone()
        wbar = local_step(W, U, torch.tensor(rng.normal(size=(k, n))), cfg)
        c = local_correction(W, wbar, state.z, cfg)
        torch.testing.assert_close(W, z_old + U, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(c, (wbar - z_old).sum(0), rtol=1e-12, atol=1e-12)
        central_update(state, c, cfg)

    W1 = torch.tensor(rng.normal(size=(1, n)))
    U1 = torch.zeros_like(W1)
    s1 = SMAState(z=torch.zeros(n, dtype=torch.float64))
    cfg1 = SMAConfig(lr=0.1, alpha=1.0, central_momentum=0.0)
    for t in range(steps):
        wbar = W1[0].clone()
        sma_step(W1, U1, torch.tensor(rng.normal(size=(1, n))), s1, cfg1)
        torch.testing.assert_close(s1.z, wbar, rtol=1e-12, atol=1e-12)


def test_sync_every_tau_only_syncs_on_schedule():
    W, U = torch.zeros(2, 3), torch.zeros(2, 3)
    state = SMAState.from_weights(torch.ones(3))
    cfg = SMAConfig(sync_every=3)
    synced = [sma_step(W, U, torch.ones(2, 3), state, cfg) for _ in range(7)]
    assert synced == [False, False, True, False, False, True, False]
    assert state.steps == 7


def test_reset_replicas_sets_every_replica_to_z():
    W = torch.randn(3, 4)
    z = torch.randn(4)
    reset_replicas(W, z)
    assert torch.equal(W, z.expand(3, 4))


# --- input checking ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"lr": 0.0}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"weight_decay": -1.0}, "weight_decay"),
        ({"momentum": 1.0}, "momentum"),
        ({"central_momentum": -0.1}, "central_momentum"),
        ({"alpha": 1.5}, "alpha"),
        ({"sync_every": 0}, "sync_every"),
        ({"sync_every": 1.5}, "sync_every"),
    ],
)
def test_config_rejects_bad_values_naming_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=rf"SMAConfig: {name}="):
        SMAConfig(**kwargs)


def test_shape_errors_are_clear():
    W, U = torch.zeros(2, 3), torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"G must have W's shape \(2, 3\)"):
        local_step(W, U, torch.zeros(2, 4), SMAConfig())
    with pytest.raises(ValueError, match=r"W must be a tensor \[k, n\]"):
        local_step(torch.zeros(3), U, U, SMAConfig())
    with pytest.raises(ValueError, match=r"z must be a flat tensor of shape \(3,\)"):
        local_correction(W, W.clone(), torch.zeros(4), SMAConfig())
    with pytest.raises(ValueError, match="delta must be"):
        central_update(SMAState.from_weights(torch.zeros(3)), torch.zeros(2), SMAConfig())
