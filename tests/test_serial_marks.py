"""The suite's own rule for tests that share something outside their process (the Slurm
cluster): ``make test`` keeps each test file on one worker (``--dist loadfile``), so such
tests must live in one file, and collection refuses them spread over two."""

from pathlib import Path

import pytest
from conftest import SERIAL_MARKS, pytest_collection_modifyitems


class Item:
    def __init__(self, path: str, marks: tuple[str, ...] = ()):
        self.path, self.marks = Path(path), marks

    def get_closest_marker(self, name: str):
        return name if name in self.marks else None


def test_serial_tests_in_one_file_are_collected():
    mark = SERIAL_MARKS[0]
    pytest_collection_modifyitems(None, [Item("tests/test_a.py", (mark,)),
                                         Item("tests/test_a.py", (mark,)), Item("tests/test_b.py")])


def test_serial_tests_spread_over_two_files_are_refused():
    mark = SERIAL_MARKS[0]
    items = [Item("tests/test_a.py", (mark,)), Item("tests/test_b.py", (mark,))]
    with pytest.raises(pytest.UsageError, match=f"marked '{mark}'.*test_a.py.*test_b.py"):
        pytest_collection_modifyitems(None, items)

