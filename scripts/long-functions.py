#!/usr/bin/env python3
"""No function over 150 lines outside tests.

A function's length is counted from the line of its `fn` keyword to the line of its
closing brace, both included (its doc comment and attributes are not counted; a nested
function counts towards its parent too). Comments, strings and char literals are masked
before the braces are matched, so a `{` in a string or a comment does not count.

Scanned: every `.rs` file of the repository (library and binary sources, `examples/`
included: they are code users read and copy) except what only tests run:

- files under a `tests/` or `benches/` folder, and the `tests-ui` crate;
- items under `#[cfg(test)]` (or `#[cfg(all(test, ...))]`) and `#[test]` functions;
- a file declared by `#[cfg(test)] mod name;` (e.g. `coconet-macros/src/tests.rs`).

Functions that were long when the check was added and are still to be split are listed
in KNOWN (the list only shrinks): a long function not in it fails. A KNOWN entry whose
functions are all short again is reported, so that it can be removed.

Usage: scripts/long-functions.py [--all] [path ...]   (default: the whole repository)
  --all   list every long function, KNOWN ones included, longest first
"""
import os
import re
import sys

LIMIT = 150

# Long functions left to split: "path/from/repo/root.rs:fn_name". Remove an entry once
# its function is short (every function of that name in the file).
KNOWN = set()

SKIP_DIRS = {"target", "tests", "benches", "tests-ui"}


def mask(src):
    """The source with comments and literals' contents blanked (newlines kept)."""
    out = []
    i, n = 0, len(src)

    def blank(s):
        return "".join(c if c == "\n" else " " for c in s)

    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(src[i:j]))
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(src[i:j]))
            i = j
        elif c in "rbc" and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            # Raw strings (r"", r#""#, br"", cr""), byte and C strings (b"", c"").
            m = re.compile(r'(?:br|cr|r)(#*)"|[bc]"').match(src, i)
            if m is None:
                out.append(c)
                i += 1
                continue
            if m.group(0).endswith('"') and m.group(1) is not None:
                end = src.find('"' + m.group(1), m.end())
                j = n if end < 0 else end + 1 + len(m.group(1))
            else:
                j = string_end(src, m.end())
            out.append(m.group(0)[:1] + blank(src[i + 1 : j]))
            i = j
        elif c == '"':
            j = string_end(src, i + 1)
            out.append(blank(src[i:j]))
            i = j
        elif c == "'":
            # A char literal ('x', '\n', '\u{1F600}', '\''); otherwise a lifetime or label.
            if i + 1 < n and src[i + 1] == "\\":
                j = i + 1
                while j < n and src[j] != "'":
                    j += 2 if src[j] == "\\" else 1
                j += 1
            elif i + 2 < n and src[i + 2] == "'":
                j = i + 3
            else:
                out.append(c)
                i += 1
                continue
            out.append(blank(src[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def string_end(src, j):
    """The index just past the closing quote of a string whose contents start at j."""
    n = len(src)
    while j < n and src[j] != '"':
        j += 2 if src[j] == "\\" else 1
    return j + 1


def item_end(code, i):
    """The index just past the item starting at i: its `;` or its matching `}`."""
    depth, n = 0, len(code)
    while i < n:
        c = code[i]
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == ";" and depth == 0:
            return i + 1, False
        elif c == "{" and depth == 0:
            return block_end(code, i), True
        i += 1
    return n, False


def block_end(code, i):
    """The index just past the `}` matching the `{` at i."""
    depth, n = 0, len(code)
    while i < n:
        if code[i] == "{":
            depth += 1
        elif code[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


TEST_ATTR = re.compile(r"#\[\s*(?:test\s*\]|cfg\s*\(\s*(?:test|all\s*\([^\]]*\btest\b[^\]]*)\s*\)\s*\])")
ATTR = re.compile(r"\s*#!?\[")
FN = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")


def test_spans(code):
    """Spans of the items under a test attribute, and the modules `#[cfg(test)] mod x;` declares."""
    spans, files = [], []
    for m in TEST_ATTR.finditer(code):
        if "not" in m.group(0):
            continue
        i = m.end()
        # Skip the item's other attributes.
        while (a := ATTR.match(code, i)) is not None:
            i = code.index("]", a.end()) + 1
            depth = code.count("[", a.end() - 1, i) - code.count("]", a.end() - 1, i)
            while depth > 0:
                j = code.index("]", i)
                depth += code.count("[", i, j) - 1
                i = j + 1
        end, _ = item_end(code, i)
        decl = re.match(r"\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;", code[i:end])
        if decl:
            files.append(decl.group(1))
        spans.append((m.start(), end))
    return spans, files


def functions(path):
    """(name, first line, lines) of each function outside tests in the file, and its test modules."""
    with open(path, encoding="utf-8") as fh:
        code = mask(fh.read())
    spans, test_mods = test_spans(code)
    found = []
    for m in FN.finditer(code):
        if any(a <= m.start() < b for a, b in spans):
            continue
        end, body = item_end(code, m.end())
        if not body:
            continue  # a declaration (a trait's method, an extern fn)
        first = code.count("\n", 0, m.start()) + 1
        last = code.count("\n", 0, end - 1) + 1
        found.append((m.group(1), first, last - first + 1))
    return found, test_mods


def rust_files(roots):
    for root in roots:
        if os.path.isfile(root):
            yield root
            continue
        for dirpath, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
            for f in sorted(files):
                if f.endswith(".rs"):
                    yield os.path.join(dirpath, f)


def main():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    args = sys.argv[1:]
    show_all = "--all" in args
    roots = [a for a in args if a != "--all"] or [here]
    long, test_files = [], set()
    for path in rust_files(roots):
        found, test_mods = functions(path)
        # `#[cfg(test)] mod x;` in a/lib.rs, a/mod.rs or a/main.rs is a/x.rs; in a/b.rs, a/b/x.rs.
        stem = os.path.splitext(os.path.basename(path))[0]
        base = os.path.dirname(path)
        if stem not in ("lib", "mod", "main"):
            base = os.path.join(base, stem)
        for mod in test_mods:
            test_files.add(os.path.join(base, mod + ".rs"))
            test_files.add(os.path.join(base, mod, "mod.rs"))
        rel = os.path.relpath(path, here).replace(os.sep, "/")
        long += [(n, rel, path, name, line) for name, line, n in found if n > LIMIT]
    long = [f for f in long if f[2] not in test_files]
    long.sort(key=lambda f: (-f[0], f[1], f[4]))
    bad = known_left = 0
    seen = set()
    for n, rel, _, name, line in long:
        key = f"{rel}:{name}"
        seen.add(key)
        if key in KNOWN:
            known_left += 1
            if show_all:
                print(f"{rel}:{line}: fn {name}: {n} lines (known)")
            continue
        bad += 1
        print(f"{rel}:{line}: fn {name}: {n} lines (over {LIMIT}: split it into helpers)")
    for key in sorted(KNOWN - seen):
        print(f"{key}: in KNOWN but no longer over {LIMIT} lines: remove it from KNOWN")
    print(f"functions over {LIMIT} lines left from before the check: {known_left}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
