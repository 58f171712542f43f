#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Checks that every C++ code block of the docs is built: each ```cpp block of
# docs/**/*.md and README.md must appear, line for line (leading and trailing
# spaces ignored, blank lines skipped), in a source file under examples/,
# tests/ or bench/, which CMake compiles (and ctest runs).
#
#   python3 docs/check_code_blocks.py [repository root]
#
# A block that is deliberately not code to compile (a declaration shown for
# reference) is skipped when the line just before its fence is
# "<!-- not compiled -->". Exit status 1 when a block is missing.
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)


def normalize(text):
    return [line.strip() for line in text.splitlines() if line.strip()]


corpus = []
for folder in ("examples", "tests", "bench"):
    for path in sorted((root / folder).rglob("*")):
        if path.suffix in (".cpp", ".hpp", ".h", ".cc") and path.is_file():
            lines = normalize(path.read_text(errors="replace"))
            corpus.append((path.relative_to(root), "\n" + "\n".join(lines) + "\n"))

pages = sorted((root / "docs").rglob("*.md"))
if (root / "README.md").exists():
    pages.append(root / "README.md")

fence = re.compile(r"^```(\w[\w+]*)?\s*$")
missing = checked = skipped = 0
for page in pages:
    lines = page.read_text(errors="replace").splitlines()
    i = 0
    while i < len(lines):
        m = fence.match(lines[i].strip())
        if not m:
            i += 1
            continue
        lang = (m.group(1) or "").lower()
        start = i
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        body = "\n".join(lines[start + 1:j])
        i = j + 1
        if lang not in ("cpp", "c++", "cxx"):
            continue
        if start > 0 and lines[start - 1].strip() == "<!-- not compiled -->":
            skipped += 1
            continue
        block = normalize(body)
        if not block:
            continue
        checked += 1
        needle = "\n" + "\n".join(block) + "\n"
        where = next((str(p) for p, text in corpus if needle in text), None)
        rel = page.relative_to(root)
        if where:
            print(f"ok       {rel}:{start + 1} -> {where}")
        else:
            missing += 1
            print(f"MISSING  {rel}:{start + 1}: this C++ block is in no file under examples/, tests/ or bench/")
print(f"{checked} C++ block(s) checked, {missing} not built, {skipped} marked not compiled")
sys.exit(1 if missing else 0)
