"""medianlib's own tests: `python3 tests/test_stats.py` in the repository."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from medianlib import mean, median


def main() -> None:
    assert mean([1, 2, 3, 4]) == 2.5
    assert median([3, 1, 2]) == 2
    print("ok")


if __name__ == "__main__":
    main()
