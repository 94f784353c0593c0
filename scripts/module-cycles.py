#!/usr/bin/env python3
"""No module imports a sibling that imports it back, and no file is on an import cycle.

For every crate's `src/`, each `crate::…`, `super::…` and `self::…` path outside
comments (and a parent's `child::…` path to a module it declares) is an edge from the
module that writes it to the module it names.

- Sibling check: edges lifted to the two siblings under their common parent
  (`cpu/exec` naming `cpu/kernel` is an edge exec → kernel; `cpu/process/tcp` naming
  `launch/store` is cpu → launch). A strongly connected set of siblings is a cycle.
- File check: the edges as they are, parent ↔ child included (a `mod.rs` that re-exports
  its children and defines a type they import is on a cycle with them). Cycles that were
  there when the check began are listed in KNOWN (to be taken apart; the list only
  shrinks): a cycle that is not within one of them fails.

Every cycle found is printed; the exit status is 1 if a sibling cycle or a new file
cycle exists.

Usage: scripts/module-cycles.py [crate-src-dir ...]   (default: every crate here)
"""
import os
import re
import sys

PATH = r"((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)"


def modules(root):
    mods = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, root)[:-3].split(os.sep)
            if rel[-1] in ("mod", "lib", "main"):
                rel = rel[:-1]
            with open(path) as fh:
                code = [l for l in fh.read().split("\n") if not l.strip().startswith("//")]
            mods[tuple(rel)] = "\n".join(code)
    return mods


def named_paths(me, src):
    out = set()
    for m in re.finditer(r"\bcrate::" + PATH, src):
        out.add(tuple(m.group(1).split("::")))
    for m in re.finditer(r"(?<!::)\bsuper::" + PATH, src):
        parts = m.group(1).split("::")
        base = me[:-1]
        # `super::super::x`: one level up per `super`.
        while parts and parts[0] == "super":
            parts, base = parts[1:], base[:-1]
        out.add(base + tuple(parts))
    for m in re.finditer(r"\bself::" + PATH, src):
        out.add(me + tuple(m.group(1).split("::")))
    for m in re.finditer(r"\buse (crate|super)::\{([^}]*)\}", src, re.S):
        base = () if m.group(1) == "crate" else me[:-1]
        for part in m.group(2).split(","):
            head = part.strip().split("::")[0]
            if head:
                out.add(base + (head,))
    return out


def sibling_edges(mods):
    edges = {}
    for me, src in mods.items():
        for path in named_paths(me, src):
            target = next((path[:k] for k in range(len(path), 0, -1) if path[:k] in mods), None)
            if target is None:
                continue
            i = 0
            while i < min(len(me), len(target)) and me[i] == target[i]:
                i += 1
            if i >= len(me) or i >= len(target):
                continue  # a module naming its own ancestor or descendant
            edges.setdefault(me[: i + 1], set()).add(target[: i + 1])
    return edges


def file_edges(mods):
    edges = {}
    for me, src in mods.items():
        paths = set(named_paths(me, src))
        for child in (m for m in mods if len(m) == len(me) + 1 and m[:-1] == me):
            if re.search(r"(?<![:\w])" + child[-1] + r"::", src):
                paths.add(child)
        for path in paths:
            target = next((path[:k] for k in range(len(path), 0, -1) if path[:k] in mods), None)
            if target is not None and target != me:
                edges.setdefault(me, set()).add(target)
    return edges


# File-level cycles present when the file check was added (issue 50): crate src dir ->
# the modules of each cycle. Remove an entry once its cycle is taken apart.
KNOWN = {}


def cycles(edges):
    """Tarjan's strongly connected components of more than one module."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
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
                found.append(sorted(comp))

    for v in sorted(set(edges) | {w for ws in edges.values() for w in ws}):
        if v not in index:
            visit(v)
    return found


def main():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    roots = sys.argv[1:] or sorted(
        os.path.join(here, d, "src")
        for d in ["."] + os.listdir(here)
        if os.path.isfile(os.path.join(here, d, "Cargo.toml"))
        and os.path.isdir(os.path.join(here, d, "src"))
    )
    bad = 0
    known_left = 0
    for root in roots:
        crate = os.path.relpath(os.path.dirname(root), here)
        mods = modules(root)
        for comp in cycles(sibling_edges(mods)):
            bad += 1
            names = ", ".join("/".join(m) for m in comp)
            print(f"{os.path.relpath(root, here)}: modules importing each other: {names}")
        for comp in cycles(file_edges(mods)):
            names = {"/".join(m) for m in comp}
            if any(names <= k for k in KNOWN.get(crate, [])):
                known_left += 1
                continue
            bad += 1
            print(f"{os.path.relpath(root, here)}: files on an import cycle: {', '.join(sorted(names))}")
    print(f"file-level import cycles left from before the check: {known_left}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
