"""pipeline/metrics.py's verdict on a validation loss that turns upward (the end-of-run summary
prints it)."""

from __future__ import annotations


def test_a_validation_loss_that_turns_upward_is_called_memorising():
    from pipeline.metrics import memorising

    issue_27 = [(250, 3.4), (500, 2.95), (750, 2.81), (1000, 3.3), (1500, 4.4), (2000, 5.07)]  # gpu-small, embedded
    assert memorising(issue_27) == (
        "valid loss rising since step 750 (min 2.810 at 750, 5.070 at 2000): the model "
        "memorises its data; more data or fewer steps"
    )
    assert memorising([(0, 5.0), (250, 4.0), (500, 3.5)]) is None  # still falling
    assert memorising([(0, 5.0), (250, 4.0), (500, 4.05), (750, 4.06)]) is None  # flat within 3%
    assert memorising([(0, 5.0), (250, 4.0), (500, 4.5)]) is None  # one point after the minimum
    assert memorising([(0, 4.0), (250, float("nan")), (500, 4.5), (750, 4.6)]) is not None
