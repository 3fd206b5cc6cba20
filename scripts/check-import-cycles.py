#!/usr/bin/env python3
"""Fails when the server's top-level modules import each other in a circle.

    scripts/check-import-cycles.py [SRC_DIR]     (default: src)
    scripts/check-import-cycles.py --self-test   (it finds a cycle it is shown)

lib.rs says calls go one way, from the top of its layout list down; a
cycle (a uses b, b uses a, directly or through others) is a sign that a
leaf hides inside one of them. A module is a file or folder directly under
SRC_DIR (`hub/` with everything in it is one); it depends on every other
module it names as `crate::<module>` outside comments and `#[cfg(test)]`
blocks. `conn/` is the exception: it is the connection pipeline, whose
steps sit at different heights (its socket, TLS and head-reading layers are
used by the Stream actor, its accept loop uses the Stream actor), so each
of its files is a module of its own (`conn::tls`, named as
`crate::conn::tls`), and `conn/mod.rs` is `conn`. The binaries under
`bin/` and `lib.rs` itself are not modules here.
Prints each cycle and the edges inside it, then exits 1; exits 0 with
"no import cycles" otherwise. `.ci/run` runs it.
"""

import collections
import os
import re
import sys

# Folders whose files are each a module of their own (see the docstring).
LAYERED = ("conn",)


def modules(src):
    """Module name -> its source files."""
    found = collections.defaultdict(list)
    for folder, _, files in os.walk(src):
        for name in files:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(folder, name)
            parts = os.path.relpath(path, src).split(os.sep)
            top = parts[0][:-3] if parts[0].endswith(".rs") else parts[0]
            if top in LAYERED and len(parts) > 1 and parts[1] != "mod.rs":
                inner = parts[1][:-3] if parts[1].endswith(".rs") else parts[1]
                top = f"{top}::{inner}"
            if top not in ("bin", "lib"):
                found[top].append(path)
    return found


def code_of(path):
    """The file's code: comments and test modules removed."""
    text = open(path, encoding="utf-8").read()
    # A test module runs to the end of the file in this code base.
    text = re.sub(r"#\[cfg\(test\)\]\s*mod \w+ \{.*", "", text, flags=re.S)
    return re.sub(r"//.*", "", text)


def grouped(code):
    """(outer, inner) for each name at the top of a grouped import,
    `crate::conn::{socket, tls::X}`: ("conn", "socket"), ("conn", "tls");
    `self` names the outer module itself ("")."""
    for m in re.finditer(r"\bcrate::(\w+)::\{", code):
        depth, start, items = 1, m.end(), []
        i = start
        while i < len(code) and depth:
            if code[i] == "{":
                depth += 1
            elif code[i] == "}":
                depth -= 1
            elif code[i] == "," and depth == 1:
                items.append(code[start:i])
                start = i + 1
            i += 1
        items.append(code[start : i - 1])
        for item in items:
            first = re.match(r"\s*(\w+)", item)
            if first:
                yield m.group(1), "" if first.group(1) == "self" else first.group(1)


def graph(found):
    edges = collections.defaultdict(set)
    for module, paths in found.items():
        for path in paths:
            code = code_of(path)
            named = re.findall(r"\bcrate::(\w+)(?:::(\w+))?", code) + list(grouped(code))
            for outer, inner in named:
                used = f"{outer}::{inner}" if f"{outer}::{inner}" in found else outer
                if used in found and used != module:
                    edges[module].add(used)
    return edges


def cycles(nodes, edges):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return found


def self_test():
    """Runs the check on two small trees: one with a cycle through a folder
    module (a -> b/ -> c -> a, hidden behind a comment and a test module
    that must not count), one without; exits 1 unless it tells them apart."""
    import tempfile

    files = {
        "lib.rs": "mod a; mod b; mod c;",
        "a.rs": "use crate::b::x;\n// crate::c is only named in a comment\n",
        "b/mod.rs": "mod inner;",
        "b/inner.rs": "pub(crate) fn f() { crate::c::g() }",
        "c.rs": "use crate::a;\n#[cfg(test)]\nmod tests {\n    use crate::b;\n}\n",
    }
    with tempfile.TemporaryDirectory() as root:
        for name, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
            with open(os.path.join(root, name), "w", encoding="utf-8") as f:
                f.write(text)
        found = modules(root)
        with_cycle = cycles(found, graph(found))
        with open(os.path.join(root, "c.rs"), "w", encoding="utf-8") as f:
            f.write("pub(crate) fn g() {}\n")
        found = modules(root)
        without = cycles(found, graph(found))
    if with_cycle != [["a", "b", "c"]] or without:
        print(f"self-test failed: with a cycle {with_cycle}, without one {without}")
        sys.exit(1)
    print("self-test: the cycle a -> b/ -> c -> a is found, and none once c.rs no longer uses a")

    # conn/: its top step may use s while s uses its low step; once the
    # low step uses s too, that is a cycle.
    files = {
        "lib.rs": "mod conn; mod s;",
        "conn/mod.rs": "pub(crate) mod low; pub(crate) mod top;",
        "conn/low.rs": "pub(crate) fn f() {}",
        "conn/top.rs": "use crate::s::g;",
        "s.rs": "use crate::conn::low::f;\npub(crate) fn g() {}",
    }
    with tempfile.TemporaryDirectory() as root:
        for name, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
            with open(os.path.join(root, name), "w", encoding="utf-8") as f:
                f.write(text)
        found = modules(root)
        layered = cycles(found, graph(found))
        with open(os.path.join(root, "conn/low.rs"), "w", encoding="utf-8") as f:
            f.write("use crate::s::g;\n")
        found = modules(root)
        layered_cycle = cycles(found, graph(found))
        # The same cycle when s names the low step in a grouped import.
        with open(os.path.join(root, "s.rs"), "w", encoding="utf-8") as f:
            f.write("use crate::conn::{self, low::f};\npub(crate) fn g() {}")
        found = modules(root)
        grouped_cycle = cycles(found, graph(found))
    if layered or layered_cycle != [["conn::low", "s"]] or grouped_cycle != [["conn::low", "s"]]:
        print(
            f"self-test failed: conn/ layered {layered}, with a cycle {layered_cycle}, "
            f"through a grouped import {grouped_cycle}"
        )
        sys.exit(1)
    print(
        "self-test: conn/top -> s -> conn/low is no cycle; conn/low -> s -> conn/low is found, "
        "also when s names it in a grouped import"
    )


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    src = sys.argv[1] if len(sys.argv) > 1 else "src"
    found = modules(src)
    edges = graph(found)
    bad = cycles(found, edges)
    for component in bad:
        print("import cycle: " + ", ".join(component))
        for module in component:
            inside = sorted(d for d in edges[module] if d in component)
            print(f"  {module} uses {', '.join(inside)}")
    if bad:
        sys.exit(1)
    print(f"no import cycles among the {len(found)} modules of {src}/")


if __name__ == "__main__":
    main()
