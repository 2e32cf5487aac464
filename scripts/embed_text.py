#!/usr/bin/env python3
"""embed_text.py IN OUT NAME MARKER - writes a C header with the text of IN
as two string constants, NAME_head (before the line MARKER) and NAME_tail
(after it), so that a page template ships inside the binary."""
import sys

src, out, name, marker = sys.argv[1:5]
text = open(src, encoding="utf-8").read()
head, sep, tail = text.partition(marker + "\n")
if not sep:
    sys.exit(f"embed_text.py: {src} has no line {marker}")


def c_string(s):
    lines = []
    for line in s.splitlines(keepends=True):
        esc = line.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        lines.append(f'    "{esc}"')
    return "\n".join(lines) if lines else '    ""'


with open(out, "w") as f:
    f.write(f"/* generated from {src.split('/')[-1]} by scripts/embed_text.py */\n")
    f.write(f"static const char {name}_head[] =\n{c_string(head)};\n")
    f.write(f"static const char {name}_tail[] =\n{c_string(tail)};\n")
