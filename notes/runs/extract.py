"""Print the lines of an executed notebook's outputs that contain any of the given keys.

    .venv/bin/python notes/runs/extract.py build/lab06-q1 capacity "goodput (req/s)"
"""
import sys
from pathlib import Path

import nbformat

root, keys = Path(sys.argv[1]), sys.argv[2:]
for path in sorted(root.rglob("*.ipynb")):
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            text = out.get("text") or out.get("data", {}).get("text/markdown") or out.get("data", {}).get("text/plain") or ""
            for line in text.splitlines():
                if any(k in line for k in keys):
                    print(f"[{i}] {line}")
