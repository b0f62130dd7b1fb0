"""Every relative link and #anchor in README.md and docs/*.md resolves, and every repository
path a page names in backticks exists.

Anchors are GitHub's heading ids: the heading's text lowercased, punctuation other than `-`
and `_` dropped, spaces turned into `-`, a repeat suffixed `-1`, `-2`, ... Links inside
fenced code blocks are code, not links, and are skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]+`")
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
# a backticked path that starts at one of the repository's own top folders, or names a page
TOP_FOLDERS = ("pynode/", "server/", "tests/", "e2e/", "docs/", "benchmarks/", "examples/",
               "units/", ".ci/")
TOP = "|".join(re.escape(top) for top in TOP_FOLDERS)
CODE_PATH = re.compile(rf"`((?:[\w.-]+/)*[\w.-]+\.md|(?:{TOP})[\w./-]*)`")
ELSEWHERE = {"tests/kat_vectors"}  # Random123's folder of known-answer vectors, not ours


def github_slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text, not its target
    text = text.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        slug = github_slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    text = FENCE.sub("", page.read_text())
    broken = []
    for target in LINK.findall(INLINE_CODE.sub("", text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or not linked.is_relative_to(root):
            broken.append(f"{target}: no file {path}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    return broken


def missing_code_paths(page: Path, root: Path = REPO) -> list[str]:
    named = CODE_PATH.findall(FENCE.sub("", page.read_text()))
    return [path for path in named if path not in ELSEWHERE
            and not any((base / path).exists() for base in (root, page.parent))]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_links_resolve(page: Path):
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_named_paths_exist(page: Path):
    assert missing_code_paths(page) == []


def test_the_checks_can_fail(tmp_path: Path):
    (tmp_path / "OTHER.md").write_text("# Other page\n## A `code` heading, twice\n"
                                       "## A `code` heading, twice\n")
    (tmp_path / "pynode" / "core").mkdir(parents=True)
    (tmp_path / "pynode" / "core" / "gpt.py").write_text("")
    page = tmp_path / "PAGE.md"
    page.write_text("# Title\n[ok](OTHER.md#a-code-heading-twice-1) [ok](#title)\n"
                    "[bad](OTHER.md#nothing) [bad](GONE.md) [bad](#nowhere)\n"
                    "```\n[in code](GONE.md)\n```\n`docs/NOT_THERE.md` `pynode/core/gpt.py`\n")
    assert [line.split(":")[0] for line in broken_links(page, tmp_path)] == [
        "OTHER.md#nothing", "GONE.md", "#nowhere"]
    assert missing_code_paths(page, tmp_path) == ["docs/NOT_THERE.md"]
