"""The program the code_repo environment runs in the code sandbox for a regex search (rewards/sandbox.py
`run_program`, stdio mode): a pattern could take exponential time, and only a process can be killed. The tests do
not run here: they run in the grader's process of a graded run (rewards/sandbox_grader.py, "suite"), out of the
repository code's reach. Self-contained on purpose: it runs inside the box with the standard library only.

Input (stdin, one JSON object): `mark` (a random token per run that starts every line the host reads back),
`files` ({relative path: base64 bytes}: the files to search), `pattern` (a regex), `max_matches`, `line_chars`.
Prints `<mark> match [path, line, text]` lines (the first max_matches), then `<mark> done {"total"}` with the number
of matching lines.
"""

import base64
import io
import json
import os
import re
import sys

REAL_OUT = sys.stdout
DUMPS = json.dumps


def emit(mark, kind, payload):
    REAL_OUT.write(f"{mark} {kind} {DUMPS(payload)}\n")
    REAL_OUT.flush()


def search(req):
    mark, cap, line_chars = req["mark"], int(req["max_matches"]), int(req["line_chars"])
    pattern = re.compile(req["pattern"])
    total = 0
    for rel in sorted(req["files"]):
        text = base64.b64decode(req["files"][rel]).decode("utf-8", errors="replace")
        for number, line in enumerate(text.split("\n"), 1):
            line = line.rstrip("\r")
            if pattern.search(line):
                total += 1
                if total <= cap:
                    emit(mark, "match", [rel, number, line[:line_chars]])
    emit(mark, "done", {"total": total})


def main():
    req = json.loads(sys.stdin.read())
    os.close(0)  # the request (and its mark) cannot be read again
    sys.stdin = io.StringIO("")
    search(req)


main()
REAL_OUT.flush()
os._exit(0)
