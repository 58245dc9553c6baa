"""Step values that travel as parcels, unpickled on the consuming task's thread (issue 44), the
import-deadlock retry, and the failure-kind rules: pure tests with literal inputs and hypothesis,
then a real cluster."""

from __future__ import annotations

import pickle
import sys
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from graph import parcels
from graph.parcels import Parcel, ValueCannotTravel, is_import_deadlock, opened, opened_args, retrying
from graph.state.failures import exit_status, failed_everywhere, failure_kind

Deadlock = sys.modules["importlib._bootstrap"]._DeadlockError


def test_a_received_parcel_holds_frames_until_opened_and_keeps_large_arrays_out_of_band():
    big = np.arange(1_000_000, dtype="float64")
    buffers = []
    head = pickle.dumps(Parcel({"x": big}), protocol=5, buffer_callback=buffers.append)
    assert len(head) < 10_000 and sum(memoryview(b).nbytes for b in buffers) >= big.nbytes  # not copied in-band
    got = pickle.loads(head, buffers=buffers)
    assert not got.is_open() and sys.getsizeof(got) >= big.nbytes  # Dask's sizeof sees the frames
    assert np.array_equal(got.open()["x"], big) and got.is_open()


def test_a_parcel_pickles_in_band_under_an_older_protocol():
    got = pickle.loads(pickle.dumps(Parcel([1, 2]), protocol=4))
    assert opened(got) == [1, 2]


def test_opened_args_opens_parcels_at_the_top_and_in_combines_containers():
    args, kwargs = opened_args((Parcel(1), [Parcel(2), 3], {"a": Parcel(4)}), {"k": Parcel(5), "n": 6})
    assert args == (1, [2, 3], {"a": 4}) and kwargs == {"k": 5, "n": 6}


def test_a_value_that_cannot_be_pickled_names_the_step_the_entry_and_the_type(monkeypatch):
    monkeypatch.setattr(parcels, "_client_process", False)  # as on a worker in its own process
    with pytest.raises(ValueCannotTravel, match=r"step fit returned a dict whose entry 'lock' \(a _thread.lock\)"):
        Parcel({"acc": 0.9, "lock": threading.Lock()}, "fit").check()


def test_the_deadlock_retry_tries_again_only_for_the_import_systems_deadlock():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise Deadlock("deadlock detected by _ModuleLock('pkg.sub')")
        return "done"

    before = len(parcels.deadlock_retries)
    assert retrying(flaky) == "done" and len(calls) == 2
    assert len(parcels.deadlock_retries) == before + 1

    def user_error():
        calls.append(1)
        raise ValueError("the user's own")

    calls.clear()
    with pytest.raises(ValueError):
        retrying(user_error)
    assert len(calls) == 1  # never retried: the step's own error


def test_in_the_clients_process_a_value_is_not_pickled_to_be_checked(monkeypatch):
    monkeypatch.setattr(parcels, "_client_process", True)  # workers there share the client's memory
    lock = threading.Lock()
    assert Parcel({"lock": lock}, "fit").check().open()["lock"] is lock


def test_the_deadlock_retry_is_bounded():
    calls = []

    def always():
        calls.append(1)
        raise ImportError("cannot import") from Deadlock("deadlock detected")

    with pytest.raises(ImportError):
        retrying(always)
    assert len(calls) == parcels.IMPORT_DEADLOCK_ATTEMPTS
    assert is_import_deadlock(ImportError("x")) is False


@given(st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from(["ok", "failed", "dropped"])), min_size=1, max_size=30))
def test_an_alternative_is_reported_iff_every_branch_through_it_failed(rows):
    found = {lab for _, lab, _, _ in failed_everywhere(({"x": lab}, status, "E: e" if status == "failed" else None)
                                                        for lab, status in rows)}
    expected = {lab for lab in {r[0] for r in rows} if all(s == "failed" for l2, s in rows if l2 == lab)}
    assert found == expected


@given(st.lists(st.sampled_from(["step", "infrastructure", "serialisation", "memory", None]), max_size=10), st.booleans())
def test_exit_status_is_one_exactly_when_a_failure_is_not_the_steps_own_or_strict_sees_any(kinds, strict):
    real = [k for k in kinds if k]
    expected = 1 if (real if strict else [k for k in real if k != "step"]) else 0
    assert exit_status(kinds, strict=strict) == expected


def test_failure_kinds_of_literal_errors():
    assert failure_kind("ImportError: deadlock detected by _ModuleLock('sklearn.preprocessing._data')") == "infrastructure"
    assert failure_kind("CommClosedError: in <TCP (closed)>") == "infrastructure"
    assert failure_kind("TypeError: Could not serialize object of type lock") == "serialisation"
    assert failure_kind("ModuleNotFoundError: No module named 'x'") == "step"
    assert failure_kind("step 'big' produced a result of 300 MiB, more than one worker's share of the memory "
                        "budget for results (200 MiB); ...") == "memory"


# ---- a real cluster -----------------------------------------------------------------------------

def _with_lock(x):
    return {"accuracy": float(x), "lock": threading.Lock()}


def _plain(x):
    return {"accuracy": float(x)}


@pytest.mark.slow
def test_a_value_that_cannot_leave_its_worker_ends_the_run_naming_it_and_the_others_are_kept(client):
    """Issue 44 item 4: a RunError naming the branch, the step and the type; nothing lost (the
    error carries the whole result: the table, the other branches' values)."""
    import graph
    from pipelines import Pipeline

    p = Pipeline("travel")
    src = p.source(lambda: 1.0)
    out = src.explore("fit", lock=_with_lock, plain=_plain).choose("accuracy", mode="max")
    with pytest.warns(UserWarning, match="every branch through fit=lock failed"), \
            pytest.raises(graph.RunError, match=r"branch 0 \(fit=lock\): ValueCannotTravel: step _with_lock "
                                                r"returned a dict whose entry 'lock' \(a _thread.lock\)") as caught:
        out.run(client, progress=False)
    result = caught.value.result
    assert caught.value.table is result.table
    table = result.table.set_index("fit")
    assert table.at["lock", "status"] == "failed" and table.at["lock", "error_kind"] == "serialisation"
    assert "step _with_lock returned a dict whose entry 'lock'" in table.at["lock", "error"]
    assert table.at["plain", "status"] == "ok" and result.value == {"accuracy": 1.0}
    assert result.stats["infrastructure_retries"] == 0


def test_a_buffer_received_at_an_odd_address_is_unpickled_aligned():
    """Issue 47: arrays fetched from another worker came unaligned (an odd address inside Dask's
    frames), and numpy's slow path made a scikit-learn fit on them 10x slower."""
    import pickle

    import numpy as np

    from graph.parcels import ALIGNMENT, _loads

    a = np.arange(1000, dtype=float)
    buffers: list = []
    head = pickle.dumps(a, protocol=5, buffer_callback=buffers.append)
    data = bytes(buffers[0].raw())
    raw = bytearray(len(data) + 1)
    raw[1:] = data
    odd = memoryview(raw)[1:]
    assert np.frombuffer(odd, dtype=np.uint8).ctypes.data % ALIGNMENT != 0
    value = _loads(head, (odd,))
    assert value.flags.aligned and value.ctypes.data % ALIGNMENT == 0
    assert np.array_equal(value, a)
