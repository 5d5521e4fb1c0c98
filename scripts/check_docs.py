"""Check the docs site's sources (docs/ and README.md) beyond what `mkdocs build --strict`
checks (links to pages and anchors, the nav):

- every python or bash block is marked: ``<!-- docs: run -->`` (run here),
  ``<!-- docs: tested by tests/FILE.py -->`` (that test reads this page) or
  ``<!-- docs: not run: REASON -->``;
- every page opens with a title and a one-line summary, and is reachable from the home
  page in at most two clicks; the README's relative links resolve;
- every generated table matches the code (``scripts/docs_tables.py --check``);
- with ``--run``: every block marked to run runs — a page's blocks in order, in one
  scratch folder, its python blocks in one namespace (as a notebook would), its bash
  blocks in ``bash -euo pipefail`` with this interpreter's ``poskernel`` on the PATH.

    python scripts/check_docs.py [--run] [--page docs/tutorials/first-measurement.md]
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT / "scripts"))
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>\w*)[^\n]*\n(?P<code>.*?)^(?P=indent)```",
                   re.S | re.M)
MARK = re.compile(r"<!-- docs: (?P<kind>run|tested by (?P<test>\S+)|not run: (?P<why>.+?)) -->\s*$")
LINK = re.compile(r"\]\(([^)\s]+)\)")
CHECKED = ("python", "bash")


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def blocks(page: Path) -> list[dict]:
    """Every fenced block of ``page``: its language, code, line and marker (None: none)."""
    text = page.read_text()
    found = []
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").splitlines()
        mark = MARK.search(before[-1]) if before else None
        code = "\n".join(line[len(m["indent"]):] for line in m["code"].splitlines())
        found.append({"lang": m["lang"], "code": code, "line": text.count("\n", 0, m.start()) + 1,
                      "mark": mark})
    return found


def check_marks() -> list[str]:
    errors = []
    for page in pages():
        rel = page.relative_to(ROOT)
        for b in blocks(page):
            if b["lang"] not in CHECKED:
                continue
            where = f"{rel}:{b['line']}"
            if b["mark"] is None:
                errors.append(f"{where}: a {b['lang']} block without `<!-- docs: run -->`, "
                              "`<!-- docs: tested by tests/FILE.py -->` or "
                              "`<!-- docs: not run: REASON -->`")
            elif b["mark"]["test"]:
                test = ROOT / b["mark"]["test"]
                if not test.is_file():
                    errors.append(f"{where}: {b['mark']['test']} does not exist")
                elif page.name not in test.read_text():
                    errors.append(f"{where}: {b['mark']['test']} does not read {page.name}")
    return errors


def check_summaries() -> list[str]:
    """A page opens with `# Title`, a blank line, then a sentence of prose."""
    errors = []
    for page in pages():
        lines = page.read_text().splitlines()
        ok = len(lines) > 2 and lines[0].startswith("# ") and not lines[1].strip() and \
            lines[2].strip() and not re.match(r"[#|`<!>]|[-*] ", lines[2].strip())
        if not ok:
            errors.append(f"{page.relative_to(ROOT)}: does not open with a title and a "
                          "one-line summary")
    return errors


def links(page: Path) -> set[Path]:
    out = set()
    for target in LINK.findall(page.read_text()):
        path = target.split("#")[0]
        if path and not re.match(r"\w+:", path) and path.endswith(".md"):
            out.add((page.parent / path).resolve())
    return out


def check_reachable() -> list[str]:
    home = (DOCS / "index.md").resolve()
    near = {home} | links(home)
    for page in list(near):
        if page.is_file():
            near |= links(page)
    return [f"{p.relative_to(ROOT)}: not reachable from the home page in two clicks"
            for p in pages() if p.resolve() not in near]


def check_readme() -> list[str]:
    errors = []
    for target in LINK.findall((ROOT / "README.md").read_text()):
        path = target.split("#")[0]
        if path and not re.match(r"\w+:", path) and not (ROOT / path).exists():
            errors.append(f"README.md: link to {target}, which does not exist")
    return errors


def check_tables() -> list[str]:
    from docs_tables import regenerate

    return regenerate(write=False)


def static_checks() -> list[str]:
    return check_marks() + check_summaries() + check_reachable() + check_readme()


def _cached_loader():
    """``pk.load_model`` that loads each registry model once for all pages."""
    import poskernel_tl as pk

    load, cache = pk.load_model, {}

    def load_model(name, *args, **kwargs):
        if not str(name).startswith("hf:"):
            if name not in cache:
                cache[name] = load(name, *args, **kwargs)
            return cache[name]
        return load(name, *args, **kwargs)

    return load_model


def run_page(page: Path, env: dict, scope_extra: dict) -> list[str]:
    """Run the page's marked blocks in order in a scratch folder; the failures."""
    todo = [b for b in blocks(page) if b["mark"] and b["mark"]["kind"] == "run"]
    if not todo:
        return []
    rel, errors, cwd = page.relative_to(ROOT), [], os.getcwd()
    with tempfile.TemporaryDirectory(prefix="docs-") as tmp:
        os.chdir(tmp)
        scope = {"__name__": "__docs__", **scope_extra}
        try:
            for b in todo:
                start = time.perf_counter()
                try:
                    if b["lang"] == "python":
                        exec(compile(b["code"], f"{rel}:{b['line']}", "exec"), scope)
                    else:
                        subprocess.run(["bash", "-euo", "pipefail", "-c", b["code"]], cwd=tmp,
                                       env=env, check=True)
                except Exception as err:  # noqa: BLE001  (reported, the next page runs)
                    errors.append(f"{rel}:{b['line']}: {type(err).__name__}: {err}")
                    break
                finally:
                    print(f"  {rel}:{b['line']} ({b['lang']}) {time.perf_counter() - start:.1f} s",
                          flush=True)
        finally:
            os.chdir(cwd)
    return errors


def run_blocks(selected: list[Path]) -> list[str]:
    import poskernel_tl as pk

    pk.load_model = _cached_loader()
    env = dict(os.environ, HF_HUB_OFFLINE=os.environ.get("HF_HUB_OFFLINE", "1"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    errors = []
    for page in selected:
        errors += run_page(page, env, {})
    return errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="store_true", help="also run every block marked to run")
    ap.add_argument("--page", action="append", help="only this page's blocks (with --run)")
    args = ap.parse_args()
    start = time.perf_counter()
    errors = static_checks() + check_tables()
    if args.run:
        selected = [Path(p).resolve() for p in args.page] if args.page else pages()
        errors += run_blocks(selected)
    for line in errors:
        print(line, file=sys.stderr)
    n = sum(1 for p in pages() for b in blocks(p) if b["lang"] in CHECKED)
    print(f"docs: {len(pages())} pages, {n} python/bash blocks; "
          f"{'ran the marked ones; ' if args.run else ''}{len(errors)} problems "
          f"({time.perf_counter() - start:.0f} s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
