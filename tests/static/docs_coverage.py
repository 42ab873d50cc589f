#!/usr/bin/env python3
"""The API reference's concept pages (docs/*.md, scripts/docs) against the README they point to.

Each page names the README sections it belongs with by their titles, as the headers do: README, "Loading data".
Checked here, so that the pages cannot drift from the README:
  - every README section a page names is a heading of README.md (any level, outside code blocks);
  - every page but the main one names at least one, and is listed by the main page (docs/index.md, `\\subpage`);
  - every page has a label (`# Title {#label}`), and the main page lists no page that does not exist.

Usage: docs_coverage.py ROOT. Prints each problem, then "N pages checked, K problem(s)" (the test's pass line).
"""
import pathlib
import re
import sys

CITATION = re.compile(r'README, "([^"]+)"')
LABEL = re.compile(r"^#\s+.*\{#([A-Za-z0-9_]+)\}\s*$")
SUBPAGE = re.compile(r"\\subpage\s+([A-Za-z0-9_]+)")


def readme_sections(readme: pathlib.Path) -> set[str]:
    sections, fenced = set(), False
    for line in readme.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = re.match(r"^#{1,6}\s+(.+?)\s*#*\s*$", line)
        if m and not fenced:
            sections.add(m.group(1))
    return sections


def main(root: pathlib.Path) -> int:
    sections = readme_sections(root / "README.md")
    docs = root / "docs"
    pages = sorted(docs.glob("*.md"))
    problems: list[str] = []
    labels: dict[str, pathlib.Path] = {}
    for page in pages:
        text = page.read_text(encoding="utf-8")
        rel = page.relative_to(root)
        first = text.splitlines()[0] if text else ""
        m = LABEL.match(first)
        if not m:
            problems.append(f"{rel}:1: the first line is not a title with a label (`# Title {{#label}}`)")
        else:
            labels[m.group(1)] = page
        # A title may be broken across lines in the page's source: read it with its line breaks as spaces.
        cited = CITATION.findall(re.sub(r"\s*\n\s*", " ", text))
        for title in cited:
            if title not in sections:
                problems.append(f'{rel}: names README, "{title}", which is not a section of README.md')
        if page.name != "index.md" and not cited:
            problems.append(f'{rel}: names no README section (README, "Title")')
    index = docs / "index.md"
    listed = SUBPAGE.findall(index.read_text(encoding="utf-8")) if index.exists() else []
    if not index.exists():
        problems.append("docs/index.md: missing (the main page)")
    for label in listed:
        if label not in labels:
            problems.append(f"docs/index.md: lists \\subpage {label}, which no page defines")
    for label, page in labels.items():
        if page != index and label not in listed:
            problems.append(f"{page.relative_to(root)}: not listed by docs/index.md (\\subpage {label})")
    for p in problems:
        print(p)
    print(f"{len(pages)} pages checked, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()))
