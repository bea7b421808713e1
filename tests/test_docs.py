"""The user documentation stays short, linked and in sync with the measured results.

README.md is at most 350 lines; every relative link in README.md and docs/**/*.md points to an existing file
(no link into shared/papers/, which a user's checkout does not have); the tables between `<!-- table:NAME -->`
markers equal what benchmarks/make_tables.py renders from benchmarks/results/*.json.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
MARKDOWN = [README] + DOCS
# [text](target) outside code; images too.  Targets with a scheme (http:, mailto:) or only an anchor are external.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _make_tables():
    spec = importlib.util.spec_from_file_location("make_tables", os.path.join(ROOT, "benchmarks", "make_tables.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _links(path):
    with open(path, encoding="utf-8") as f:
        text = FENCE.sub("", f.read())
    return [m.group(1) for m in LINK.finditer(text)]


def _relative(target):
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")


def test_readme_is_short():
    with open(README, encoding="utf-8") as f:
        lines = f.read().count("\n")
    assert lines <= 350, f"README.md: expected at most 350 lines (user documentation; details go to docs/), got {lines}"


def test_docs_exist():
    names = {os.path.relpath(p, ROOT) for p in DOCS}
    expected = {"docs/architecture.md", "docs/performance.md", "docs/checkpoint-format.md"} | {
        f"docs/methods/{m}.md" for m in ("repavit", "nondeep", "dwconv", "usdc", "distill")
    }
    assert expected <= names, f"missing: {sorted(expected - names)}"


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: os.path.relpath(p, ROOT))
def test_relative_links_point_to_files(path):
    broken = []
    for target in _links(path):
        if not _relative(target):
            continue
        file_part = target.split("#", 1)[0]
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
        if not os.path.exists(resolved):
            broken.append(target)
    assert not broken, f"{os.path.relpath(path, ROOT)}: links to missing files: {broken}"


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: os.path.relpath(p, ROOT))
def test_anchors_exist(path):
    """A link `file.md#anchor` (or `#anchor`) names a heading of that file (GitHub's slug rules)."""
    def slugs(md):
        with open(md, encoding="utf-8") as f:
            text = FENCE.sub("", f.read())
        heads = re.findall(r"^#+\s+(.*)$", text, re.M)
        return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}

    bad = []
    for target in _links(path):
        if not _relative(target) and not target.startswith("#"):
            continue
        file_part, _, anchor = target.partition("#")
        if not anchor:
            continue
        md = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if md.endswith(".md") and os.path.isfile(md) and anchor not in slugs(md):
            bad.append(target)
    assert not bad, f"{os.path.relpath(path, ROOT)}: links to missing headings: {bad}"


@pytest.mark.parametrize("path", MARKDOWN + glob.glob(os.path.join(ROOT, "benchmarks", "results", "*.json")),
                         ids=lambda p: os.path.relpath(p, ROOT))
def test_no_link_to_shared_papers(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert "shared/papers" not in text, f"{os.path.relpath(path, ROOT)}: cites shared/papers/, which users do not have"


def test_tables_match_results():
    make_tables = _make_tables()
    results = make_tables.load_results()
    stale = []
    for path in make_tables.markdown_files():
        with open(path, encoding="utf-8") as f:
            if f.read() != make_tables.update(path, results):
                stale.append(os.path.relpath(path, ROOT))
    assert not stale, f"tables out of date in {stale}: run python benchmarks/make_tables.py"


def test_every_table_block_names_a_result_and_readme_has_one():
    make_tables = _make_tables()
    names = set(make_tables.all_names(make_tables.load_results()))
    for path in MARKDOWN:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        opened = re.findall(r"<!-- table:([^ >]+) -->", text)
        assert len(opened) == text.count("<!-- /table -->"), f"{path}: unbalanced table markers"
        assert set(opened) <= names, f"{path}: unknown tables {sorted(set(opened) - names)}"
        if path == README:
            assert len(opened) == 1, f"README.md: expected one results table, got {len(opened)}"


def test_check_mode_fails_on_a_stale_table(tmp_path):
    make_tables = _make_tables()
    stale = tmp_path / "stale.md"
    name = make_tables.all_names(make_tables.load_results())[0]
    stale.write_text(f"<!-- table:{name} -->\n| old |\n<!-- /table -->\n", encoding="utf-8")
    assert make_tables.main(["--check", str(stale)]) == 1
    assert make_tables.main([str(stale)]) == 0
    assert make_tables.main(["--check", str(stale)]) == 0
