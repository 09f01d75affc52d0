"""The README and docs/ link only to what exists: every relative link names a file of the
repository, and its #fragment a heading of that file (GitHub's anchors)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped but hyphens and
    underscores, each space a hyphen."""
    text = re.sub(r"`|\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings (outside code blocks); a repeated heading's get -1, -2."""
    seen: dict[str, int] = {}
    found, fenced = set(), False
    for line in page.read_text().splitlines():
        fenced ^= line.startswith("```")
        match = None if fenced else HEADING.match(line)
        if match:
            slug = anchor(match.group(1))
            found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return found


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)  # (code is not links)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_the_anchor_rule_on_headings_whose_anchor_is_known():
    assert (
        anchor("Full Corridor: methods on held-out seeds")
        == "full-corridor-methods-on-held-out-seeds"
    )
    assert (
        anchor("10M steps: the `three` tasks, seeds 200-202")
        == "10m-steps-the-three-tasks-seeds-200-202"
    )


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page):
    broken = []
    for target in relative_links(page):
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)
