#!/usr/bin/env python3
"""Top-level module graph of the crate from `crate::<module>` paths (unit tests left out);
prints the strongly connected components, that is the cycles, and the edges inside them.

usage: python3 .ci/module_cycles.py [src]
"""
import os, re, sys
root = sys.argv[1] if len(sys.argv) > 1 else 'src'
mods = {}
for entry in os.listdir(root):
    if entry in ('lib.rs', 'bin', 'main.rs'): continue
    name = entry[:-3] if entry.endswith('.rs') else entry
    mods[name] = os.path.join(root, entry)
def files(path):
    if path.endswith('.rs'): yield path; return
    for d, _, fs in os.walk(path):
        for f in fs:
            if f.endswith('.rs'): yield os.path.join(d, f)
edges = {m: {} for m in mods}
pat = re.compile(r'\bcrate::([a-z_]+)')
use_group = re.compile(r'use crate::\{([^;]*)\}', re.S)
for m, p in mods.items():
    for f in files(p):
        text = open(f).read()
        # ignore unit tests: they may reach anywhere
        cut = text.find('#[cfg(test)]\nmod tests')
        if cut >= 0: text = text[:cut]
        text = '\n'.join(l for l in text.split('\n') if not l.lstrip().startswith(('//', '///', '//!')))
        targets = pat.findall(text)
        for g in use_group.findall(text):
            targets += re.findall(r'(?:^|[,{\s])([a-z_]+)(?=::|\s*[,}]|$)', g)
        for t in targets:
            if t in mods and t != m:
                edges[m].setdefault(t, set()).add(os.path.relpath(f, root))
# Tarjan
idx, low, on, st, out, n = {}, {}, set(), [], [], [0]
def sc(v):
    idx[v] = low[v] = n[0]; n[0] += 1; st.append(v); on.add(v)
    for w in edges[v]:
        if w not in idx: sc(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        out.append(comp)
sys.setrecursionlimit(10000)
for v in sorted(edges):
    if v not in idx: sc(v)
cycles = [c for c in out if len(c) > 1]
print(f'{len(mods)} top-level modules, {sum(len(e) for e in edges.values())} edges')
if not cycles: print('no cycles')
for c in cycles:
    print('cycle:', ' '.join(sorted(c)))
    for a in sorted(c):
        for b in sorted(edges[a]):
            if b in c: print(f'  {a} -> {b}: {", ".join(sorted(edges[a][b]))}')
