"""The shape of the house: files per folder, the longest functions and classes, where the run
folder's paths are spelled, import circles among product modules, repeated blocks.

    python benchmarks/house.py            # a table for the closing note
    python benchmarks/house.py --json     # the same figures as JSON

Read from the source alone (ast), so it runs on any checkout, before and after a change.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("trainer", "telemetry", "console", "bench", "fleet")
# Entries of a run folder: a string literal naming one of these, joined onto a path or bound
# to a constant, is a place that spells the run folder's layout.
RUN_ENTRIES = (
    "checkpoints",
    "telemetry",
    "ranks",
    "control.key",
    "config.json",
    "ports.json",
    "launch",
    "alerts",
)


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every product module."""
    out = {}
    for pkg in PRODUCT:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Product modules `name` imports anywhere in its file (lazy and TYPE_CHECKING imports
    count: a circle closed inside a function is still a circle between two files)."""
    tree = ast.parse(path.read_text())
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def longest(mods: dict[str, Path], kind: type, most: int = 6) -> list[tuple[int, str]]:
    rows = []
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, kind) or (
                kind is ast.FunctionDef and isinstance(node, ast.AsyncFunctionDef)
            ):
                rows.append((node.end_lineno - node.lineno + 1, f"{name}.{node.name}"))
    return sorted(rows, reverse=True)[:most]


def spelled(mods: dict[str, Path]) -> dict[str, list[str]]:
    """Module -> the run-folder entries it spells: a literal joined onto a path (`p / "x"`,
    `Path(p, "x")`, `os.path.join(p, "x")`) or bound to a name (`DIR = "x"`)."""
    out = {}
    for name, path in mods.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                candidates = [node.right]
            elif isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in (
                "Path",
                "PurePosixPath",
                "join",
            ):
                candidates = node.args[1:]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                candidates = [node.value]
            else:
                continue
            for c in candidates:
                if isinstance(c, ast.Constant) and c.value in RUN_ENTRIES:
                    found.add(c.value)
        if found:
            out[name] = sorted(found)
    return out


def repeated_blocks() -> int | None:
    """Pairs of six-line blocks repeated inside product code (`duplicates`, if installed)."""
    if shutil.which("duplicates") is None:
        return None
    text = subprocess.run(
        ["duplicates", "--most", "200", "--seconds", "60"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout
    rows = [line for line in text.splitlines() if re.match(r"^D\d+ ", line)]
    inside = 0
    for row in rows:
        files = re.findall(r"(\S+?\.py):\d+", row)
        if len(files) == 2 and all(f.split("/")[0] in PRODUCT for f in files):
            inside += 1
    return inside


def figures() -> dict:
    mods = modules()
    known = set(mods)
    graph = {n: imports_of(n, p, known) for n, p in mods.items()}
    folders = Counter(str(p.parent.relative_to(ROOT)) for p in mods.values())
    for extra in ("tests", "benchmarks"):
        for p in (ROOT / extra).rglob("*.py"):
            folders[str(p.parent.relative_to(ROOT))] += 1
    return {
        "files_per_folder": dict(sorted(folders.items())),
        "longest_functions": longest(mods, ast.FunctionDef),
        "longest_classes": longest(mods, ast.ClassDef),
        "run_folder_spelled": spelled(mods),
        "import_circles": circles(graph),
        "imports_between_trainer_modules": sum(
            len([t for t in ts if t.startswith("trainer")])
            for n, ts in graph.items()
            if n.startswith("trainer")
        ),
        "repeated_blocks_in_product": repeated_blocks(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    f = figures()
    if args.json:
        print(json.dumps(f, indent=1))
        return 0
    print("files per folder:")
    for folder, n in f["files_per_folder"].items():
        print(f"  {folder:<28} {n}")
    print("longest functions:", ", ".join(f"{n} {name}" for n, name in f["longest_functions"]))
    print("longest classes:  ", ", ".join(f"{n} {name}" for n, name in f["longest_classes"]))
    print(f"modules spelling run-folder paths: {len(f['run_folder_spelled'])}")
    for name, entries in f["run_folder_spelled"].items():
        print(f"  {name}: {', '.join(entries)}")
    print(f"import circles: {len(f['import_circles'])}")
    for c in f["import_circles"]:
        print("  " + " <-> ".join(c))
    print(f"imports between trainer modules: {f['imports_between_trainer_modules']}")
    print(f"repeated six-line blocks in product code: {f['repeated_blocks_in_product']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
