#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Checks that every relative link of the docs points at a file or folder that
# exists: in README.md and docs/**/*.md, each [text](target), ![alt](target)
# and reference definition "[name]: target" is resolved against the folder of
# the page that holds it. Links with a scheme (http:, https:, mailto:, ...) and
# pure #anchors are not checked; a #fragment is cut off before the lookup.
# Code (fenced blocks and `inline code`) is not read for links.
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


def broken(page, target):
    if target.startswith("<") and target.endswith(">"):
        target = target[1:-1]
    if not target or target.startswith("#") or scheme.match(target):
        return False
    path = urllib.parse.unquote(target.split("#", 1)[0].split("?", 1)[0])
    if not path:
        return False
    if path.startswith("/"):
        resolved = root / path.lstrip("/")
    else:
        resolved = page.parent / path
    return not resolved.exists()


checked = bad = 0
for page in pages:
    in_code = None
    for number, line in enumerate(page.read_text(errors="replace").splitlines(), start=1):
        m = fence.match(line)
        if m:
            if in_code is None:
                in_code = m.group(1)
            elif m.group(1) == in_code:
                in_code = None
            continue
        if in_code is not None:
            continue
        for target in targets(line):
            checked += 1
            if broken(page, target):
                bad += 1
                print(f"{page.relative_to(root)}:{number}: {target}")
print(f"{checked} link(s) checked, {bad} broken")
sys.exit(1 if bad else 0)
