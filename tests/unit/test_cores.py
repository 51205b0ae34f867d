"""N_start for SODA's adaptive CPU allocator (masterd.core.cores)."""

from __future__ import annotations

from typing import Any

import pytest

from masterd.core.cores import (
    category_of,
    declared_traits,
    initial_cores,
    remember,
    start_point,
)
from shared.model import CpuTraits, JobSpec


def spec(**kwargs: Any) -> JobSpec:
    base: dict[str, Any] = {"name": "job", "command": ("train",), "user": "alice", "gpus": 1}
    base.update(kwargs)
    return JobSpec(**base)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"model_family": "cv"}, 3),
        ({"model_family": "NLP"}, 5),
        ({"model_family": "speech"}, 5),
        ({"model_type": "resnet50"}, 3),
        ({"model_type": "Inception-V3"}, 3),
        ({"model_type": "bert-base-uncased"}, 5),
        ({"model_type": "Bi-Att-Flow"}, 5),
        ({"model_type": "wavenet"}, 5),
        ({"model_type": "DeepSpeech2"}, 5),
        # A declared family wins over a guess from the model name.
        ({"model_family": "speech", "model_type": "resnet50"}, 5),
    ],
)
def test_first_job_uses_the_category_default(kwargs: dict[str, Any], expected: int) -> None:
    start = start_point(spec(**kwargs), {})
    assert start.cores == expected
    assert not start.from_history


def test_unknown_category_without_history_uses_the_largest_default() -> None:
    assert initial_cores(spec(model_type="mystery-net"), {}) == 5
    assert category_of(spec(model_type="mystery-net")) is None
    # An unlisted family is its own category: history applies, the default does not.
    assert category_of(spec(model_family="RecSys")) == "recsys"
    assert initial_cores(spec(model_family="recsys"), {}) == 5


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"TRELLIS_PIPELINED_INPUT": "1"}, 2),
        ({"TRELLIS_LARGE_WEIGHTS": "yes"}, 2),
        ({"TRELLIS_HEAVY_PREPROCESSING": "true"}, 4),
        ({"TRELLIS_PIPELINED_INPUT": "1", "TRELLIS_LARGE_WEIGHTS": "1"}, 1),
        ({"TRELLIS_PIPELINED_INPUT": "on", "TRELLIS_HEAVY_PREPROCESSING": "1"}, 3),
        ({"TRELLIS_PIPELINED_INPUT": "0", "TRELLIS_LARGE_WEIGHTS": "off"}, 3),
    ],
)
def test_declared_traits_adjust_n_start(env: dict[str, str], expected: int) -> None:
    assert initial_cores(spec(model_family="cv", env=env), {}) == expected


def test_bad_trait_value_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="TRELLIS_LARGE_WEIGHTS"):
        initial_cores(spec(model_family="cv", env={"TRELLIS_LARGE_WEIGHTS": "maybe"}), {})


def test_history_of_the_same_owner_and_category_wins() -> None:
    history = {("alice", "cv"): 7, ("alice", "nlp"): 12, ("bob", "cv"): 20}
    start = start_point(spec(model_type="vgg16"), history)
    assert start.cores == 7 and start.from_history and start.category == "cv"
    assert initial_cores(spec(model_family="nlp"), history) == 12
    # Another owner's history does not count; nor does alice's other category.
    assert initial_cores(spec(user="carol", model_family="cv"), history) == 3
    assert initial_cores(spec(model_family="speech"), history) == 5


def test_history_is_adjusted_by_traits_too() -> None:
    history = {("alice", "cv"): 7}
    job = spec(model_family="cv", env={"TRELLIS_HEAVY_PREPROCESSING": "1"})
    assert initial_cores(job, history) == 8


def test_no_category_falls_back_to_the_owners_largest_history() -> None:
    history = {("alice", "cv"): 7, ("alice", "nlp"): 9, ("bob", "nlp"): 30}
    start = start_point(spec(), history)
    assert start.cores == 9 and start.from_history


def test_result_is_clamped_to_available_cores_and_at_least_one() -> None:
    assert initial_cores(spec(model_family="nlp"), {}, available=2) == 2
    history = {("alice", "cv"): 1}
    job = spec(model_family="cv", env={"TRELLIS_PIPELINED_INPUT": "1",
                                       "TRELLIS_LARGE_WEIGHTS": "1"})
    assert initial_cores(job, history) == 1
    assert initial_cores(spec(model_family="cv"), {("alice", "cv"): 64}, available=16) == 16
    with pytest.raises(ValueError, match="available"):
        initial_cores(spec(model_family="cv"), {}, available=0)


def test_remember_keeps_the_largest_converged_count() -> None:
    history: dict[tuple[str, str], int] = {}
    job = spec(model_type="resnet101")
    remember(history, job, 6)
    remember(history, job, 4)
    assert history == {("alice", "cv"): 6}
    assert initial_cores(spec(model_family="cv"), history) == 6
    remember(history, spec(), 9)  # no category: kept for the owner's category-less jobs
    assert initial_cores(spec(), history) == 9
    with pytest.raises(ValueError, match="at least 1"):
        remember(history, job, 0)


def test_trait_fields_take_precedence_over_env() -> None:
    job = JobSpec(
        name="job", command=("train",), user="alice", gpus=1, model_family="cv",
        env={"TRELLIS_PIPELINED_INPUT": "1"},
        traits=CpuTraits(pipelined_input=False, heavy_preprocessing=True),
    )
    traits = declared_traits(job)
    assert (traits.pipelined_input, traits.large_weights, traits.heavy_preprocessing) == (
        False, False, True,
    )
    assert initial_cores(job, {}) == 4
