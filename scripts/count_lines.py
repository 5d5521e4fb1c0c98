"""Code lines of the library, per folder: the lines that hold code, without blank lines,
comments or docstrings (counted with ``ast`` and ``tokenize``), and the longest functions.

    python scripts/count_lines.py [--longest 5] [FOLDER ...]

Folders default to the library's own (``poskernel_tl``, ``hooks``, ``analyses``); each
folder's count is of its own files, not its subfolders'.
"""

import argparse
import ast
import io
import tokenize
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
        tokenize.ENDMARKER}


def docstring_lines(tree: ast.Module) -> set[int]:
    """Line numbers of every module, class and function docstring."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.body and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant) \
                and isinstance(node.body[0].value.value, str):
            lines.update(range(node.body[0].lineno, node.body[0].end_lineno + 1))
    return lines


def code_lines(source: str) -> set[int]:
    """The line numbers that hold a token of code (not a comment, not a docstring)."""
    docs = docstring_lines(ast.parse(source))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in SKIP:
            lines.update(n for n in range(tok.start[0], tok.end[0] + 1) if n not in docs)
    return lines


def functions(path: Path, source: str) -> list[tuple[int, str]]:
    """(code lines, "path:name") of every function in ``source``."""
    lines = code_lines(source)
    return [(sum(node.lineno <= n <= node.end_lineno for n in lines),
             f"{path.relative_to(ROOT)}:{node.name}")
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*", default=["poskernel_tl", "hooks", "analyses"])
    ap.add_argument("--longest", type=int, default=5, help="functions to list")
    args = ap.parse_args()
    per_folder, funcs = Counter(), []
    for folder in args.folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            per_folder[str(path.parent.relative_to(ROOT))] += len(code_lines(source))
            funcs += functions(path, source)
    for folder, n in sorted(per_folder.items()):
        print(f"{n:7,d}  {folder}/")
    print(f"{sum(per_folder.values()):7,d}  code lines in all")
    for n, name in sorted(funcs, reverse=True)[:args.longest]:
        print(f"{n:7d}  {name}")


if __name__ == "__main__":
    main()
