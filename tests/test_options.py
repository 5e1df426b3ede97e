"""The integer check the Python API's entry points share: a bool, a float or a number below the minimum is
refused with the argument's name, at every entry that takes a count."""

import numpy as np
import pytest

from workbench.data.tts import join_sentences
from workbench.options import check_int
from workbench.training.data import loader_for_sampler


@pytest.mark.parametrize("value, minimum", [(True, 0), (False, 0), (1.0, 0), ("3", 0), (None, 0), (-1, 0), (0, 1)])
def test_check_int_refuses_what_is_not_an_integer_in_range(value, minimum):
    with pytest.raises(ValueError, match=rf"^count: must be an integer >= {minimum}, got {value!r}$"):
        check_int(value, "count", minimum)


def test_check_int_takes_numpy_integers_and_returns_an_int():
    got = check_int(np.int64(3), "count", 1)
    assert got == 3 and type(got) is int


@pytest.mark.parametrize("call, needle", [
    (lambda: loader_for_sampler([], [], num_workers=True), "num_workers: must be an integer >= 0, got True"),
    (lambda: loader_for_sampler([], [], num_workers=0, prefetch_factor=True),
     "prefetch_factor: must be an integer >= 1, got True"),
    (lambda: join_sentences(["a"], True), "join (--join): must be an integer >= 1, got True"),
])
def test_a_bool_is_not_a_count_at_the_api_entries(call, needle):
    with pytest.raises(ValueError) as error:
        call()
    assert needle in str(error.value)
