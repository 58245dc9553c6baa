"""An embedded cluster that fails to close after a failed run never hides the run's own error."""

from __future__ import annotations

import pytest
from distributed import LocalCluster

from graph.cluster.connect import connect

pytestmark = pytest.mark.slow  # starts and closes clusters


def test_the_runs_error_wins_over_a_failing_close(monkeypatch, capsys):
    real_close = LocalCluster.close

    def close_then_time_out(self, *args, **kwargs):  # fault injection: the real close runs first
        real_close(self, *args, **kwargs)
        raise TimeoutError("closing the cluster timed out")

    monkeypatch.setattr(LocalCluster, "close", close_then_time_out)
    with pytest.raises(ValueError, match="the step failed"):
        with connect(n_workers=1, quiet=True):
            raise ValueError("the step failed")
    assert "closing the embedded cluster after an error also failed: TimeoutError" in capsys.readouterr().err
    # without an error in the body, a failing close is the error
    with pytest.raises(TimeoutError):
        with connect(n_workers=1, quiet=True):
            pass
