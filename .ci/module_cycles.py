#!/usr/bin/env python3
"""Module cycles of the crate, from the paths its code names (unit tests left out).

Two checks, each printing the strongly connected components (the cycles) and the edges
inside them; the script exits with 1 when either finds one:

* between the top-level modules (`crate::<module>` paths);
* between the files of each folder in FOLDERS: the folder's entries other than `mod.rs`
  (a file `x.rs` and a folder `x/` are one entry), linked by `crate::<folder path>::<entry>`
  and `super::…::<entry>` paths, and by the names the folder's `mod.rs` re-exports from an
  entry (`crate::config::Plan` is a use of `schema`). Glob imports (`use super::*`) are not
  followed.

usage: python3 .ci/module_cycles.py [src]
"""
import os, re, sys

# The folders whose files must form no circle, relative to src. `store/redis` belongs here
# too, and joins the list once its files are arranged without circles.
FOLDERS = ['config', 'middleware', 'limiter', 'store/redis']

root = sys.argv[1] if len(sys.argv) > 1 else 'src'


def rs_files(path):
    if path.endswith('.rs'):
        yield path
        return
    for d, _, fs in os.walk(path):
        for f in fs:
            if f.endswith('.rs'):
                yield os.path.join(d, f)


def code(path):
    """The file's text without its unit tests and comment lines."""
    text = open(path).read()
    cut = text.find('#[cfg(test)]\nmod tests')
    if cut >= 0:
        text = text[:cut]
    return '\n'.join(l for l in text.split('\n') if not l.lstrip().startswith('//'))


def tarjan(edges):
    idx, low, on, st, out, n = {}, {}, set(), [], [], [0]

    def sc(v):
        idx[v] = low[v] = n[0]; n[0] += 1; st.append(v); on.add(v)
        for w in edges[v]:
            if w not in idx:
                sc(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = st.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in idx:
            sc(v)
    return [c for c in out if len(c) > 1]


def report(what, edges):
    """Prints the cycles of `edges`; true when there is one."""
    cycles = tarjan(edges)
    print(f'{what}: {len(edges)} modules, {sum(len(e) for e in edges.values())} edges, '
          + ('no cycles' if not cycles else f'{len(cycles)} cycle(s)'))
    for c in cycles:
        print('  cycle:', ' '.join(sorted(c)))
        for a in sorted(c):
            for b in sorted(edges[a]):
                if b in c:
                    print(f'    {a} -> {b}: {", ".join(sorted(edges[a][b]))}')
    return bool(cycles)


def entries(folder):
    """A folder's entries other than mod.rs, by name, each with its paths."""
    out = {}
    for entry in sorted(os.listdir(folder)):
        if entry in ('mod.rs', 'lib.rs', 'main.rs', 'bin'):
            continue
        path = os.path.join(folder, entry)
        if entry.endswith('.rs'):
            out.setdefault(entry[:-3], []).append(path)
        elif os.path.isdir(path):
            out.setdefault(entry, []).append(path)
    return out


def named_after(text, prefix):
    """The first path segment after each match of `prefix` in text: `prefix::x` gives x,
    `prefix::{x, y::z}` gives x and y."""
    out = []
    for m in re.finditer(prefix, text):
        rest = text[m.end():]
        if rest.startswith('{'):
            depth, group = 0, ''
            for ch in rest:
                depth += ch == '{'
                depth -= ch == '}'
                group += ch
                if depth == 0:
                    break
            top, depth = '', 0  # the group's top level only
            for ch in group[1:-1]:
                depth += ch == '{'
                if depth == 0:
                    top += ch
                depth -= ch == '}'
            out += re.findall(r'(?:^|,)\s*([A-Za-z_][A-Za-z0-9_]*)', top)
        else:
            ident = re.match(r'[A-Za-z_][A-Za-z0-9_]*', rest)
            if ident:
                out.append(ident.group(0))
    return out


def reexports(mod_rs, names):
    """What a folder's mod.rs re-exports from its entries: item name -> entry."""
    out = {}
    if not os.path.exists(mod_rs):
        return out
    text = code(mod_rs)
    for m in re.finditer(r'pub(?:\([^)]*\))?\s+use\s+(?:self::)?([a-z_][a-z0-9_]*)::', text):
        entry = m.group(1)
        if entry not in names:
            continue
        rest = text[m.end():]
        rest = rest[:rest.find(';')]
        if rest.startswith('{'):
            items = re.findall(r'([A-Za-z_][A-Za-z0-9_]*)\s*(?:[,}]|as\s)', rest)
        else:
            items = re.findall(r'([A-Za-z_][A-Za-z0-9_]*)\s*$', rest)
        for item in items:
            if item != 'self':
                out[item] = entry
    return out


def module_depth(path, folder):
    """How many `super::` lead from the module of the file `path` to the folder's module."""
    rel = os.path.relpath(path, folder).split(os.sep)
    return len(rel) - (rel[-1] == 'mod.rs')


def folder_edges(folder):
    rel = os.path.relpath(folder, root).replace(os.sep, '::')
    names = entries(folder)
    items = reexports(os.path.join(folder, 'mod.rs'), names)
    edges = {n: {} for n in names}
    for name, paths in names.items():
        for p in paths:
            for f in rs_files(p):
                if os.path.basename(f) == 'tests.rs':
                    continue  # a unit-test module may reach anywhere
                text = code(f)
                supers = r'\bsuper::' * module_depth(f, folder)
                targets = named_after(text, r'\bcrate::' + rel + '::')
                targets += named_after(text, r'(?<!super::)' + supers)
                for t in targets:
                    t = items.get(t, t)
                    if t in names and t != name:
                        edges[name].setdefault(t, set()).add(os.path.relpath(f, folder))
    return edges


def top_level_edges():
    mods = {}
    for entry in os.listdir(root):
        if entry in ('lib.rs', 'bin', 'main.rs'):
            continue
        name = entry[:-3] if entry.endswith('.rs') else entry
        mods[name] = os.path.join(root, entry)
    edges = {m: {} for m in mods}
    pat = re.compile(r'\bcrate::([a-z_]+)')
    use_group = re.compile(r'use crate::\{([^;]*)\}', re.S)
    for m, p in mods.items():
        for f in rs_files(p):
            text = code(f)
            targets = pat.findall(text)
            for g in use_group.findall(text):
                targets += re.findall(r'(?:^|[,{\s])([a-z_]+)(?=::|\s*[,}]|$)', g)
            for t in targets:
                if t in mods and t != m:
                    edges[m].setdefault(t, set()).add(os.path.relpath(f, root))
    return edges


failed = report('top-level modules', top_level_edges())
for folder in FOLDERS:
    failed |= report(f'files of {folder}/', folder_edges(os.path.join(root, folder)))
sys.exit(1 if failed else 0)
