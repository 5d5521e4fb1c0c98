"""The docs' generated tables, regenerated from the code: the command line (from the
``poskernel`` parser), every field of a result (from the parts' declarations), the
registered analyses and statistics, and the pre-registered criteria of the verdicts.
Each lives in a docs page between the markers ``<!-- generated: NAME -->`` and
``<!-- end generated -->``.

    python scripts/docs_tables.py           # rewrite every generated block in docs/
    python scripts/docs_tables.py --check   # exit 1 naming each block that differs
"""

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)",
                   re.S)


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _actions(parser):
    import argparse as ap

    for action in parser._actions:
        if isinstance(action, (ap._HelpAction, ap._SubParsersAction)):
            continue
        yield action


def _flag_table(parser) -> list[str]:
    import argparse as ap

    rows = ["| argument | default | what it sets |", "|---|---|---|"]
    for a in _actions(parser):
        name = ", ".join(f"`{o}`" for o in a.option_strings) or f"`{a.dest.upper()}`"
        if a.choices and not isinstance(a, ap._StoreConstAction):
            name += " {" + ", ".join(str(c) for c in a.choices) + "}"
        default = "" if a.default in (None, ap.SUPPRESS) or isinstance(
            a, (ap._StoreTrueAction, ap._StoreFalseAction)) else f"`{a.default}`"
        if a.required and a.option_strings:
            default = "required"
        rows.append(f"| {_cell(name)} | {_cell(default)} | {_cell(a.help or '')} |")
    return rows if len(rows) > 2 else []


def _subparsers(parser):
    import argparse as ap

    for action in parser._actions:
        if isinstance(action, ap._SubParsersAction):
            helps = {c.dest: c.help for c in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _usage(parser) -> list[str]:
    usage = " ".join(parser.format_usage().split())
    return ["```text", usage.removeprefix("usage: "), "```"]


def cli() -> str:
    """Every subcommand of ``poskernel``: its usage and a table of its arguments."""
    from poskernel_tl.apps.cli import build_parser

    parser = build_parser(None)
    out = [*_usage(parser), "", _cell(parser.description), ""]
    for name, help_, sub in _subparsers(parser):
        out += [f"## `poskernel {name}`", "", _cell(help_ or "") + ".", ""]
        if sub.description and sub.description != help_:
            out += [_cell(sub.description), ""]
        out += [*_usage(sub), ""]
        table = _flag_table(sub)
        out += [*table, ""] if table else []
        for inner, inner_help, subsub in _subparsers(sub):
            out += [f"### `poskernel {name} {inner}`", "", _cell(inner_help) + ".", ""]
            if subsub.description:
                out += [_cell(subsub.description), ""]
            out += [*_flag_table(subsub), ""]
    return "\n".join(out)


def analyses() -> str:
    """The registered analyses: name, title, what it reads, how to read it."""
    from poskernel_tl.analyses.registry import REGISTRY

    rows = ["| `poskernel analyze NAME` | what | needs | how to read it |", "|---|---|---|---|"]
    for spec in REGISTRY.values():
        needs = ", ".join(n for n, on in (("the model", spec.needs_model),
                                          ("a measured condition", spec.needs_result)) if on)
        needs += "; encoders too" if spec.bidirectional else ""
        rows.append(f"| `{spec.name}` | {_cell(spec.title)} | {_cell(needs or 'nothing')} "
                    f"| {_cell(spec.guide)} |")
    return "\n".join(rows) + "\n"


def statistics() -> str:
    """The registered per-head statistics: name, description and heads.csv columns."""
    from poskernel_tl.statistics.registry import STATISTICS

    rows = ["| statistic | what it measures | columns of `heads.csv` |", "|---|---|---|"]
    for stat in STATISTICS.values():
        cols = ", ".join(f"`{c}`" for c in stat.head_columns) or "—"
        rows.append(f"| `{stat.name}` | {_cell(stat.description)} | {cols} |")
    return "\n".join(rows) + "\n"


def criteria() -> str:
    """The protocol's pre-registered criteria, as the verdicts evaluate them."""
    from poskernel_tl.report.verdicts import CRITERIA

    rows = ["| id | criterion | track | threshold |", "|---|---|---|---|"]
    for cid, text, track, threshold in CRITERIA:
        rows.append(f"| `{cid}` | {_cell(text)} | {track} | {_cell(threshold)} |")
    return "\n".join(rows) + "\n"


def fields() -> str:
    """Every field of a result's parts, from its declaration: where it is saved (an array
    of a file, or a column of a tidy table), its axes, and its per-head column."""
    import dataclasses

    from poskernel_tl.measurement.parts import UNSHOWN, head_columns, part_classes
    from poskernel_tl.schema import axes

    per_head = {attr: col for col, (_, attr, _) in head_columns().items()}
    rows = ["| part | `res.` field | axes | saved as | `heads.csv` column |",
            "|---|---|---|---|---|"]
    for cls in part_classes():
        hints = __import__("typing").get_type_hints(cls)
        for f in dataclasses.fields(cls):
            meta = f.metadata
            if f.name in UNSHOWN or not ("file" in meta or "table" in meta):
                continue
            if "file" in meta:
                where = f"`…_{meta['file']}`" + (f" [`{meta['key']}`]" if meta["key"] else "")
            else:
                where = f"`…_{meta['table']}.csv` column `{meta['column']}`"
            dims = axes(hints.get(f.name))
            head = f"`{per_head[f.name]}`" if f.name in per_head else ""
            rows.append(f"| `{cls.NAME}` | `{f.name}` | {' '.join(dims) if dims else ''} "
                        f"| {where} | {head} |")
    return "\n".join(rows) + "\n"


GENERATORS = {"cli": cli, "fields": fields, "analyses": analyses, "statistics": statistics,
              "criteria": criteria}


def blocks() -> list[tuple[Path, str, str]]:
    """(page, block name, its text as committed) of every generated block in docs/."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        for m in BLOCK.finditer(page.read_text()):
            found.append((page, m["name"], m["body"]))
    return found


def regenerate(write: bool) -> list[str]:
    """Regenerate every block; write the pages (``write``) or return what differs."""
    cache: dict[str, str] = {}
    stale = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()

        def fresh(m, page=page):
            name = m["name"]
            if name not in GENERATORS:
                stale.append(f"{page.relative_to(ROOT)}: unknown generated block {name!r}")
                return m[0]
            cache.setdefault(name, GENERATORS[name]())
            if m["body"] != cache[name]:
                stale.append(f"{page.relative_to(ROOT)}: block {name!r} differs from the code")
            return m[1] + cache[name] + m[4]

        new = BLOCK.sub(fresh, text)
        if write and new != text:
            page.write_text(new)
    return stale


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare, write nothing")
    args = ap.parse_args()
    stale = regenerate(write=not args.check)
    for line in stale:
        print(line, file=sys.stderr)
    if args.check and stale:
        print("run `python scripts/docs_tables.py` and commit the pages", file=sys.stderr)
        return 1
    print(f"{len(blocks())} generated blocks {'checked' if args.check else 'written'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
