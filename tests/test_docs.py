"""The documentation's links: every relative link in README.md and docs/*.md names a file that exists, and
every #anchor a heading of the page it points to (GitHub's heading ids)."""
import re
import unicodedata
from pathlib import Path

import pytest

from tests.conftest import ROOT

PAGES = sorted([Path(ROOT) / "README.md", *(Path(ROOT) / "docs").glob("*.md")])
LINK = re.compile(r"(?<!\!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def prose(text: str) -> str:
    """The text without code blocks or code spans, where brackets are code, not links."""
    return CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's id for a heading: lower case, markup and punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.replace("`", "").strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            out.add(base if count == 0 else f"{base}-{count}")
    out.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", page.read_text()))
    return out


def links(page: Path) -> list[str]:
    return [target for target in LINK.findall(prose(page.read_text()))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: are not checked here


def test_the_slug_rule_on_headings_of_these_pages():
    assert slug("Decisions where the contract was silent") == "decisions-where-the-contract-was-silent"
    assert slug("`rollout-mainstream` (default)") == "rollout-mainstream-default"
    assert slug("`grpo_passk` — pass@k") == "grpo_passk--passk"
    assert links(Path(ROOT) / "README.md"), "the README has relative links"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_link_and_anchor_resolves(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


MENTION = re.compile(r"docs/([a-z-]+\.md)(?:#([a-z0-9_-]+)|, \"([^\"]+)\")?")


def test_every_mention_of_a_docs_page_in_the_code_resolves():
    """`docs/x.md`, `docs/x.md#anchor` and `docs/x.md, "Heading"` in code, configs and other READMEs."""
    broken = []
    files = [p for p in Path(ROOT).rglob("*") if p.suffix in (".py", ".toml", ".md", ".yaml", ".cfg")
             and p != Path(__file__)
             and not any(part.startswith(".") or part in ("build", "docs") for part in p.relative_to(ROOT).parts)]
    for path in files:
        for name, anchor, heading in MENTION.findall(path.read_text(errors="replace")):
            page = Path(ROOT) / "docs" / name
            if not page.exists():
                broken.append(f"{path.relative_to(ROOT)}: docs/{name}")
            elif (anchor or heading) and (anchor or slug(heading)) not in anchors(page):
                broken.append(f"{path.relative_to(ROOT)}: docs/{name} {anchor or heading!r}")
    assert len(files) > 50
    assert not broken, broken
