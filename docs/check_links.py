#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Checks that every relative link of the docs points at a file or folder that
# exists: in README.md and docs/**/*.md, each [text](target), ![alt](target)
# and reference definition "[name]: target" is resolved against the folder of
# the page that holds it, and a #fragment (alone, or after a .md page) must name
# a heading of that page, spelled as GitHub makes its anchors (lower case,
# punctuation dropped, spaces as hyphens, -1, -2, ... after repeats). Links with
# a scheme (http:, https:, mailto:, ...) are not checked. Code (fenced blocks
# and `inline code`) is not read for links.
#
#   python3 docs/check_links.py [repository root]
#
# Prints each broken link as "file:line: target" and exits with status 1 when
# there is one.
import pathlib
import re
import sys
import urllib.parse

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)

pages = sorted((root / "docs").rglob("*.md"))
if (root / "README.md").exists():
    pages.insert(0, root / "README.md")

fence = re.compile(r"^\s*(```|~~~)")
inline_code = re.compile(r"(`+)(?:(?!\1).)+?\1")
# The target of [text](target) or ![alt](target), with an optional "title".
inline_link = re.compile(r"\]\(\s*(<[^>]*>|[^()\s]+)(?:\s+\"[^\"]*\")?\s*\)")
reference_definition = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
scheme = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def targets(line):
    text = inline_code.sub("", line)
    found = [m.group(1) for m in inline_link.finditer(text)]
    m = reference_definition.match(text)
    if m:
        found.append(m.group(1))
    return found


def prose_lines(page):
    """(line number, line) of a page outside its fenced code blocks."""
    in_code = None
    for number, line in enumerate(page.read_text(errors="replace").splitlines(), start=1):
        m = fence.match(line)
        if m:
            if in_code is None:
                in_code = m.group(1)
            elif m.group(1) == in_code:
                in_code = None
            continue
        if in_code is None:
            yield number, line


heading = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
markup_link = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")


def slug(text):
    text = markup_link.sub(r"\1", text).replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


anchor_cache = {}


def anchors(page):
    """The anchors GitHub gives the headings of a Markdown page."""
    if page not in anchor_cache:
        seen = {}
        found = set()
        for _, line in prose_lines(page):
            h = heading.match(line)
            if not h:
                continue
            base = slug(h.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        anchor_cache[page] = found
    return anchor_cache[page]


def broken(page, target):
    if target.startswith("<") and target.endswith(">"):
        target = target[1:-1]
    if not target or scheme.match(target):
        return False
    fragment = target.split("#", 1)[1] if "#" in target else ""
    path = urllib.parse.unquote(target.split("#", 1)[0].split("?", 1)[0])
    if not path:
        resolved = page
    elif path.startswith("/"):
        resolved = root / path.lstrip("/")
    else:
        resolved = page.parent / path
    if not resolved.exists():
        return True
    if fragment and resolved.suffix == ".md" and resolved.is_file():
        return urllib.parse.unquote(fragment).lower() not in anchors(resolved)
    return False


checked = bad = 0
for page in pages:
    for number, line in prose_lines(page):
        for target in targets(line):
            checked += 1
            if broken(page, target):
                bad += 1
                print(f"{page.relative_to(root)}:{number}: {target}")
print(f"{checked} link(s) checked, {bad} broken")
sys.exit(1 if bad else 0)
