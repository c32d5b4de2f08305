"""jaxstale.tasks: a field's metric and direction; a task's chance level, cells and reading."""

import math

import pytest

from jaxstale import tasks


def test_metric_and_direction_come_from_the_field_name():
    assert tasks.metric_of("final_val_loss") == "loss"
    assert tasks.metric_of("val_accuracy/recomputed_stats") == "accuracy"
    assert tasks.higher_is_better("final_val_accuracy")
    assert not tasks.higher_is_better("val_loss")
    assert tasks.higher_is_better("my_score")  # a field of your own is maximised, as before
    with pytest.raises(ValueError, match="no known metric"):
        tasks.metric_of("final_val_error")


def test_classification_and_language_model():
    c, lm = tasks.classification(10), tasks.language_model(83)
    assert (c.metric, c.chance, c.scale, c.final("test")) == (
        "accuracy",
        0.1,
        100.0,
        "final_test_accuracy",
    )
    assert (lm.metric, lm.chance, lm.key("val")) == ("loss", math.log(83), "val_loss")
    assert c.better(0.9, 0.8) and lm.better(1.5, 1.6) and not lm.better(1.6, 1.5)
    assert c.reached(0.95, 0.95) and lm.reached(2.0, 2.0) and not lm.reached(2.1, 2.0)
    # a loss not below the uniform loss learned nothing; an accuracy always "learned"
    assert lm.learned(4.0) and not lm.learned(math.log(83)) and not lm.learned(float("nan"))
    assert not lm.learned(None) and c.learned(0.05)
    with pytest.raises(ValueError):
        tasks.language_model(1)
    with pytest.raises(ValueError):
        tasks.classification(0)
