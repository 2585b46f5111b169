"""The verifier's tests of medianlib, kept out of the agent's sight until verification."""

import sys

sys.path.insert(0, "/app")

from medianlib import mean, median


def main() -> None:
    assert median([1, 2, 3, 4]) == 2.5, median([1, 2, 3, 4])
    assert median([10, 2, 8, 4]) == 6
    assert median([5, 1, 4, 2, 3, 6]) == 3.5
    assert median([3, 1, 2]) == 2
    assert median([7]) == 7
    assert mean([1, 2, 3, 4]) == 2.5
    print("ok")


if __name__ == "__main__":
    main()
