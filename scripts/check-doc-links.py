#!/usr/bin/env python3
"""Check every relative markdown link in README.md, BENCHMARKS.md and docs/*.md.

A link must point at a file or directory that exists; a `#anchor` into a
markdown file must name one of its headings (GitHub's slugs). Links to
http(s):, mailto: and the like are not checked. Prints each broken link
and exits 1 if there is one. Run from anywhere: `scripts/check-doc-links.py`.
"""
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def strip_code(text):
    """The text without fenced code blocks and inline code spans."""
    out, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else re.sub(r"`[^`]*`", "", line))
    return out


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    seen, found = {}, set()
    fenced = False
    for line in open(path, encoding="utf-8").read().split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"#{1,6} (.*)", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else "%s-%d" % (base, n))
    return found


def main():
    files = [os.path.join(ROOT, f) for f in ("README.md", "BENCHMARKS.md")]
    files += sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    broken, checked = [], 0
    for f in files:
        if not os.path.exists(f):
            continue
        for n, line in enumerate(strip_code(open(f, encoding="utf-8").read()), 1):
            for target in LINK.findall(line):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):
                    continue
                checked += 1
                path, _, frag = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
                where = "%s:%d" % (os.path.relpath(f, ROOT), n)
                if not os.path.exists(dest):
                    broken.append("%s: %s: no such file" % (where, target))
                elif frag and dest.endswith(".md") and frag not in anchors(dest):
                    broken.append("%s: %s: no such heading" % (where, target))
    for b in broken:
        print(b)
    print("%d relative links checked, %d broken" % (checked, len(broken)))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
