"""scripts/count_lines.py counts the lines that hold code: no blank lines, comments or
docstrings, a statement over several lines counted whole."""

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("count_lines", ROOT / "scripts" / "count_lines.py")
count_lines = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(count_lines)

SAMPLE = '''"""A module docstring
over two lines."""

import math  # a comment after code


# a comment alone
def f(x):
    """A docstring."""
    y = (x +
         1)
    return "not a docstring"


class C:
    """Another."""

    z = 1
'''


def test_code_lines_leave_out_blanks_comments_and_docstrings():
    assert sorted(count_lines.code_lines(SAMPLE)) == [4, 8, 10, 11, 12, 15, 18]
    path = ROOT / "scripts" / "sample.py"
    assert count_lines.functions(path, SAMPLE) == [(4, "scripts/sample.py:f")]


def test_the_script_prints_folders_and_the_longest_functions():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "count_lines.py"),
                          "--longest", "3", "hooks"], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0].endswith("hooks/") and out[1].endswith("code lines in all")
    assert out[0].split()[0] == out[1].split()[0] and len(out) == 5
    assert all(line.split()[1].startswith("hooks/") for line in out[2:])
