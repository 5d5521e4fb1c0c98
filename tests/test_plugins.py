"""The one registration rule (``poskernel_tl/plugins.py``): every module or package of a
folder that defines the folder's attribute is found, in the order of the modules' names,
and two parts of one name are refused; each registry of the project is that rule."""

import sys

import pytest

from poskernel_tl import plugins


@pytest.fixture
def folder(tmp_path, monkeypatch):
    pkg = tmp_path / "parts_pkg"
    (pkg / "b_package").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "c_module.py").write_text("PART = 'c'\n")
    (pkg / "a_module.py").write_text("PART = 'a'\n")
    (pkg / "b_package" / "__init__.py").write_text("PART = 'b'\n")
    (pkg / "helper.py").write_text("OTHER = 1\n")
    (pkg / "wrong_kind.py").write_text("PART = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield pkg
    for name in [m for m in sys.modules if m.startswith("parts_pkg")]:
        del sys.modules[name]


def test_every_module_defining_the_attribute_is_found_in_name_order(folder):
    found = plugins.discover("parts_pkg", "PART", lambda x: isinstance(x, str))
    assert found == ["a", "b", "c"]
    (folder / "d_new.py").write_text("PART = 'd'\n")  # a new part: one module, no edit
    assert plugins.discover("parts_pkg", "PART", lambda x: isinstance(x, str))[-1] == "d"


def test_two_parts_of_one_name_are_refused():
    first = lambda s: s[0]
    assert plugins.by_name(["x1", "y1"], first, "parts") == {"x": "x1", "y": "y1"}
    with pytest.raises(ValueError, match="two parts are named 'x'"):
        plugins.by_name(["x1", "x2"], first, "parts")


def test_the_registries_are_the_rule():
    """Each registry holds what the rule finds in its folder, in its order."""
    from poskernel_tl.analyses.base import AnalysisSpec
    from poskernel_tl.analyses.registry import REGISTRY
    from poskernel_tl.statistics.registry import STATISTICS
    from poskernel_tl.statistics.statistic import StatisticSpec

    specs = plugins.discover("poskernel_tl.analyses", "SPEC",
                             lambda x: isinstance(x, AnalysisSpec))
    assert set(REGISTRY) == {s.name for s in specs} and len(specs) == 11
    assert list(REGISTRY)[0] == "spectral"  # the lowest order
    stats = plugins.discover("poskernel_tl.statistics", "STATISTIC",
                             lambda x: isinstance(x, StatisticSpec))
    assert list(STATISTICS) == [s.name for s in stats]
