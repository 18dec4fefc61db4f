"""Writes the values of lua/constants.lua in place of their names in the Lua text on stdin,
in the code (not in comments or strings), as src/store/redis/lua_constants.rs does when the
stores assemble a script.

usage: cat lua/single.lua ... | python3 benches/scripts/inline_constants.py > script.lua
"""
import os
import re
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
values = {}
for line in open(os.path.join(root, "lua", "constants.lua")):
    m = re.match(r"local (\w+) = (.+)$", line.rstrip("\n"))
    if m:
        values[m.group(1)] = m.group(2)


def split_comment(line):
    quote, prev = None, None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "-" and prev == "-":
            return line[: i - 1], line[i - 1 :]
        prev = c
    return line, ""


def inline(code):
    out, word, quote = [], "", None
    for c in code:
        if quote is None and (c.isascii() and c.isalnum() or c == "_"):
            word += c
            continue
        out.append(values.get(word, word))
        word = ""
        if quote == c:
            quote = None
        elif quote is None and c in "'\"":
            quote = c
        out.append(c)
    out.append(values.get(word, word))
    return "".join(out)


for line in sys.stdin.read().splitlines(keepends=True):
    code, comment = split_comment(line)
    sys.stdout.write(inline(code) + comment)
