"""Render the markdown tables of the docs from the measured results in benchmarks/results/*.json.

Each results file is `<date>-<machine>.json` (schema "vitfast.results/1"): the date, the machine, the software
versions and named tables, each with the script and command that measured it, the conditions, its columns (a label
and a format string over the row's fields) and its rows.  A table is named `<file stem>/<table>`, e.g.
`2026-11-27-epyc-zen3-avx2/cpu_grid`.

In a markdown file, a block between `<!-- table:NAME -->` and `<!-- /table -->` holds the rendered table NAME;
this script rewrites those blocks (default) or checks that they are up to date (`--check`, exit status 1 if not).

    python benchmarks/make_tables.py                 # rewrite README.md and docs/**/*.md in place
    python benchmarks/make_tables.py --check         # what tests/test_docs.py runs
    python benchmarks/make_tables.py --print 2026-11-27-epyc-zen3-avx2/cpu_grid
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import string
import sys
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
SCHEMA = "vitfast.results/1"
BLOCK = re.compile(r"(<!-- table:(?P<name>[^ >]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


def load_results(directory: str = RESULTS) -> Dict[str, dict]:
    """File stem -> parsed results file; every file must follow the schema."""
    results = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        stem = os.path.splitext(os.path.basename(path))[0]
        if data.get("schema") != SCHEMA:
            raise ValueError(f"{path}: expected schema {SCHEMA!r}, got {data.get('schema')!r}")
        if not stem.startswith(data["date"] + "-"):
            raise ValueError(f"{path}: the file name must start with its date {data['date']!r}")
        for key in ("machine", "software", "tables"):
            if key not in data:
                raise ValueError(f"{path}: missing {key!r}")
        results[stem] = data
    return results


def _cell(fmt: str, row: dict) -> str:
    fields = [name for _, name, _, _ in string.Formatter().parse(fmt) if name]
    if any(row.get(name) in (None, "") for name in fields):
        return ""
    return fmt.format(**row).replace("|", "\\|")


def render(name: str, results: Dict[str, dict], markdown_dir: str = ROOT) -> str:
    """The markdown of table `name` (`<file stem>/<table>`), its data link relative to `markdown_dir`."""
    stem, _, table_name = name.partition("/")
    if stem not in results or table_name not in results[stem]["tables"]:
        raise KeyError(f"no table {name!r} in {RESULTS} (have: {', '.join(all_names(results))})")
    data = results[stem]
    table = data["tables"][table_name]
    software = ", ".join(f"{k} {v}" for k, v in data["software"].items())
    link = os.path.relpath(os.path.join(RESULTS, stem + ".json"), markdown_dir).replace(os.sep, "/")
    caption = [f"*{table['title']}.*", f"{data['machine']['description']}; {software}; {data['date']}.",
               f"Measured with `{table['command']}`" + (f" ({table['script']})" if table["script"] not in table["command"] else "")
               + f"; {table['conditions']}.", f"Data: [{stem}.json]({link})."]
    lines = [" ".join(caption), ""]
    lines.append("| " + " | ".join(c["label"] for c in table["columns"]) + " |")
    lines.append("| " + " | ".join("---" for _ in table["columns"]) + " |")
    for row in table["rows"]:
        lines.append("| " + " | ".join(_cell(c["fmt"], row) for c in table["columns"]) + " |")
    return "\n".join(lines) + "\n"


def all_names(results: Dict[str, dict]) -> List[str]:
    return [f"{stem}/{t}" for stem, data in results.items() for t in data["tables"]]


def markdown_files() -> List[str]:
    files = [os.path.join(ROOT, "README.md")]
    files += sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    return [f for f in files if os.path.isfile(f)]


def update(path: str, results: Dict[str, dict]) -> str:
    """The text of markdown file `path` with every table block re-rendered."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    directory = os.path.dirname(os.path.abspath(path))
    return BLOCK.sub(lambda m: m.group(1) + render(m.group("name"), results, directory) + m.group(4), text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="markdown files [default: README.md and docs/**/*.md]")
    parser.add_argument("--check", action="store_true", help="exit 1 if a table block is out of date; write nothing")
    parser.add_argument("--print", metavar="NAME", help="print one rendered table")
    parser.add_argument("--list", action="store_true", help="list the table names")
    args = parser.parse_args(argv)
    results = load_results()
    if args.list:
        print("\n".join(all_names(results)))
        return 0
    if args.print:
        print(render(args.print, results), end="")
        return 0
    stale = []
    for path in args.files or markdown_files():
        with open(path, encoding="utf-8") as f:
            old = f.read()
        new = update(path, results)
        if new != old:
            stale.append(os.path.relpath(path, ROOT))
            if not args.check:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new)
    if args.check and stale:
        print(f"out of date: {', '.join(stale)} (run python benchmarks/make_tables.py)", file=sys.stderr)
        return 1
    if stale:
        print(f"rewrote: {', '.join(stale)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
