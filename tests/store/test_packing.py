"""The fast list-to-array paths read every list exactly as numpy would."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rolltap.store.packing import id_list, logprob_list


@pytest.mark.parametrize(
    "values",
    [
        [5, 6, 7],
        [],
        [True, False],
        [True, 5],
        [5, True],
        [1.5, 2],
        [3, "4"],
        [-1, 2**31],
        [2**64],
        [np.int64(5), 6],
        [[1, 2]],
        (5, 6),
    ],
)
def test_ids_read_as_numpy_reads_them(values: Any) -> None:
    expected = np.asarray(values)
    got = id_list(values)
    assert got.dtype == expected.dtype
    assert got.tolist() == expected.tolist()


@pytest.mark.parametrize("values", [[-0.5, -1.25], [], [0, -1], [float("nan")], ["-0.5"]])
def test_logprobs_read_as_numpy_reads_them(values: Any) -> None:
    expected = np.asarray(values, dtype=np.float64)
    got = logprob_list(values)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
