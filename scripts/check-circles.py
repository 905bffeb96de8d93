#!/usr/bin/env python3
"""Fails when files of src/ (the library) import each other in a circle.

Reads the `use` declarations of every library file (not src/bin/), resolves each path to
the deepest module file it names (`crate::core::host::Host` -> src/core/host.rs), and
looks for strongly connected components of that graph. A parent's `pub use` of its own
children (a re-export) and a file's own `mod tests` are not dependencies. Prints each
circle and exits 1; prints nothing and exits 0 when there is none.

Usage: python3 scripts/check-circles.py [SRC_DIR]
"""
import os
import re
import sys

SRC = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "src")
SRC = os.path.normpath(SRC)


def module_of(path):
    rel = os.path.relpath(path, SRC)[:-3].split(os.sep)
    if rel == ["lib"]:
        return []
    if rel[-1] == "mod":
        rel = rel[:-1]
    return rel


def file_of(mod):
    if not mod:
        return os.path.join(SRC, "lib.rs")
    base = os.path.join(SRC, *mod)
    for f in (base + ".rs", os.path.join(base, "mod.rs")):
        if os.path.isfile(f):
            return f
    return None


def expand(path):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e]."""
    path = re.sub(r"\s+", "", path)
    i = path.find("{")
    if i < 0:
        return [path]
    depth, j = 0, i
    for j in range(i, len(path)):
        depth += {"{": 1, "}": -1}.get(path[j], 0)
        if depth == 0:
            break
    head, inner, tail = path[:i], path[i + 1 : j], path[j + 1 :]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        if p:
            out += expand(head + p + tail)
    return out


def resolve(here, path):
    segs = [s for s in path.split("::") if s]
    segs = [re.sub(r"\bas\b.*$", "", s) for s in segs]
    if not segs:
        return None
    if segs[0] == "crate":
        mod, rest = [], segs[1:]
    elif segs[0] in ("super", "self"):
        mod = list(here)
        rest = segs
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super":
                mod = mod[:-1]
            rest = rest[1:]
    else:
        return None  # another crate, or a name in scope
    best = file_of(mod)
    if rest and file_of(mod + [rest[0]]) is None and mod == []:
        return None  # an item of the crate root, or a module kept elsewhere (#[path])
    for s in rest:
        mod = mod + [s]
        f = file_of(mod)
        if f is None:
            break
        best = f
    return best


def uses(path):
    """(module path of the use, is a pub use, the use's text) for each `use` of the file."""
    here = module_of(path)
    text = open(path, encoding="utf-8").read()
    stack = []  # (inline module name, brace depth at its opening)
    depth = 0
    out = []
    for m in re.finditer(r"(?m)^\s*(pub(?:\([^)]*\))?\s+)?(use\s+[^;]+;|mod\s+(\w+)\s*\{)|[{}]", text):
        tok = m.group(0).strip()
        if tok == "{":
            depth += 1
            continue
        if tok == "}":
            depth -= 1
            while stack and depth <= stack[-1][1]:
                stack.pop()
            continue
        if m.group(3):  # an inline module opens
            stack.append((m.group(3), depth))
            depth += 1
            continue
        body = m.group(2)[3:-1]
        inner = here + [name for name, _ in stack]
        out.append((inner, bool(m.group(1)), body, bool(stack)))
    return out


def main():
    files = []
    for root, dirs, names in os.walk(SRC):
        dirs[:] = [d for d in dirs if os.path.join(root, d) != os.path.join(SRC, "bin")]
        files += [os.path.join(root, n) for n in names if n.endswith(".rs")]
    edges = {f: set() for f in files}
    for f in files:
        fmod = module_of(f)
        for inner, public, body, in_inline in uses(f):
            if in_inline and any(s == "tests" for s in inner[len(fmod):]):
                continue
            for p in expand(body):
                target = resolve(inner, p)
                if not target or target == f or target not in edges:
                    continue
                tmod = module_of(target)
                if public and tmod[: len(fmod)] == fmod:
                    continue  # a parent re-exporting what its children define
                edges[f].add(target)
    # Tarjan's strongly connected components.
    index, low, on, stack, sccs, n = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    for comp in sccs:
        rel = [os.path.relpath(c, SRC) for c in comp]
        links = [
            f"{os.path.relpath(a, SRC)} -> {os.path.relpath(b, SRC)}"
            for a in comp
            for b in sorted(edges[a])
            if b in comp
        ]
        print(f"import circle among {', '.join(rel)}: " + "; ".join(links))
    sys.exit(1 if sccs else 0)


main()
