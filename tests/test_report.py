"""`python -m launch.report`: the self-contained HTML page of a run's metrics.

The unit tests build pages from small metrics.jsonl files written here (no browser). The browser tests open pages
in headless Chromium (Debian's `chromium` package; .ci/run installs it; skipped, with the reason, where none is
found): a page of synthetic runs in the default selection, and the page of a real run (the README's main job, the
session's `quick_start_run`, shared with the end-to-end tests) in the slow one. A page passes when every chart
has an <svg> with a drawn line of at least two points, laid out with a size and no overlapping tick labels (read
back from the rendered page's DOM), and its screenshot shows coloured chart lines.
"""

import json
import math
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from launch import report
from launch.report import PANEL_GROUPS, group_keys, load_run, main, series, write_report
from launch.tracking import Tracker, format_summary

# The charts the issue asks for; a real run of the embedded default must draw every one of them.
REQUIRED_GROUPS = ["reward per domain", "response length per domain", "KL", "OPSM masked fraction", "mismatch",
                   "entropy", "clip fraction", "throughput", "time per phase", "eval"]


def write_run(run_dir: Path, rows: list, extra_lines: tuple = ()) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r) if isinstance(r, dict) else r for r in rows] + list(extra_lines)
    (run_dir / "metrics.jsonl").write_text("".join(ln + "\n" for ln in lines))
    return run_dir


def figures(page: str) -> dict[str, str]:
    """data-group -> the figure's markup."""
    return {m.group(1): m.group(0) for m in re.finditer(r'<figure class="panel" data-group="([^"]*)".*?</figure>',
                                                        page, re.S)}


def paths(fig: str) -> list[int]:
    """Points in each drawn line (<path d="M x,y L x,y ...">) of a figure."""
    return [len(re.findall(r"-?[\d.]+,-?[\d.]+", d)) for d in re.findall(r'<path d="([^"]*)"', fig)]


def test_patterns_match_within_one_part_of_a_key():
    keys = {"reward/mean", "reward/math/mean", "reward/math/length", "reward/a/b/mean", "kl/code", "loss/kl",
            "eval/math/pass@4", "eval/math/prompts", "perf/train_tflops_per_gpu", "perf/micro_batches"}
    assert group_keys(PANEL_GROUPS["reward per domain"], keys) == ["reward/mean", "reward/math/mean"]
    assert group_keys(PANEL_GROUPS["KL"], keys) == ["kl/code", "loss/kl"]
    assert group_keys(PANEL_GROUPS["eval"], keys) == ["eval/math/pass@4"]
    assert group_keys(PANEL_GROUPS["perf (TFLOPs, MFU)"], keys) == ["perf/train_tflops_per_gpu"]


def test_nulls_are_gaps_non_finite_and_torn_lines_are_skipped(tmp_path):
    vals = [0.1, 0.2, None, 0.4, 0.5, float("nan"), 0.7]
    rows = [{"step": i + 1, "reward/mean": 0.0, "reward/math/mean": v} for i, v in enumerate(vals)]
    for r in rows:
        if r["step"] in (3, 6):
            r["eval/math/pass@4"] = r["step"] / 10  # a key that only some steps have: a line between them
    run = write_run(tmp_path / "run", rows, extra_lines=['{"step": 8, "reward/mean": 0.', "not json", "[1]"])
    loaded = load_run(run)
    assert len(loaded.rows) == 7 and loaded.skipped == 3
    # null -> a gap (None); NaN -> left out, the line goes on from step 5 to 7
    assert series(loaded, "reward/math/mean") == [(1, 0.1), (2, 0.2), None, (4, 0.4), (5, 0.5), (7, 0.7)]
    out = write_report([run])
    assert out == run / "report.html"
    page = out.read_text()
    figs = figures(page)
    assert set(figs) == {"reward per domain", "eval"}
    reward = re.search(r'<g class="series" data-key="reward/math/mean".*?</g>', figs["reward per domain"], re.S)[0]
    assert paths(reward) == [2, 3]  # two lines: steps 1-2 and 4-5-7
    assert paths(figs["eval"]) == [2]
    assert "3 unreadable lines skipped" in page
    assert "<script" not in page and not re.search(r"(src|href)=[\"']?(https?:|//)", page)  # self-contained


def test_several_runs_are_overlaid(tmp_path, capsys):
    a = write_run(tmp_path / "a", [{"step": s, "reward/mean": s / 10, "time/step": 1.0} for s in range(1, 6)])
    b = write_run(tmp_path / "b", [{"step": s, "reward/mean": 1 - s / 10} for s in range(1, 9)])
    out = tmp_path / "cmp" / "both.html"
    assert main([str(a), str(b), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    figs = figures(out.read_text())
    keys = re.findall(r'<g class="series" data-key="([^"]*)"', figs["reward per domain"])
    assert keys == ["a: reward/mean", "b: reward/mean"]
    assert paths(figs["reward per domain"]) == [5, 8]
    assert 'stroke-dasharray="7 4"' in figs["reward per domain"]  # the second run's line style
    assert re.findall(r'data-key="([^"]*)"', figs["time per phase"]) == ["a: time/step"]
    # several dirs without --out: the first one's report.html
    assert main([str(a), str(b)]) == 0 and (a / "report.html").exists()


def test_an_empty_run_gives_a_page_that_says_so(tmp_path, capsys):
    empty = write_run(tmp_path / "empty", [])
    page = write_report([empty]).read_text()
    assert 'id="no-steps"' in page and "<svg class=\"chart\"" not in page
    assert "No summary.json" in page
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    assert 'id="no-steps"' in write_report([nothing]).read_text()  # no metrics.jsonl at all
    assert main([str(tmp_path / "missing")]) == 2 and "not a directory" in capsys.readouterr().err


def test_ticks_are_round_and_their_labels_distinct():
    for lo, hi in [(1.9e-7, 2.3e-7), (0.0, 1.0), (-0.1, 0.6), (1, 12), (3.2, 3.2), (1234.0, 98765.0)]:
        ticks = report.nice_ticks(lo, hi)
        assert ticks[0] <= lo and ticks[-1] >= hi and 3 <= len(ticks) <= 12
        labels = [report.tick_label(t, ticks[1] - ticks[0]) for t in ticks]
        assert len(set(labels)) == len(labels), labels
    assert report.nice_ticks(1, 12, 6, integer=True) == [0, 2, 4, 6, 8, 10, 12]


def test_numbers_past_float_range_are_skipped_and_the_rest_is_drawn(tmp_path):
    """Reliability round 4, item 8: an int past float range (10**400, as a value or a step), subnormals and a
    series spanning -1e308..1e308 used to end the report with a traceback (OverflowError / ValueError)."""
    huge = 10 ** 400
    rows = ['{"step": 1, "reward/mean": 0.1, "kl/code": 5e-324, "grad_norm": -1e308, "entropy/mean": 1.0}',
            '{"step": 2, "reward/mean": %d, "kl/code": 0, "grad_norm": 1e308, "entropy/mean": 1.0000000000000002}'
            % huge,
            '{"step": 3, "reward/mean": 0.3, "kl/code": 1e-323, "grad_norm": 1.7e308, "entropy/mean": 1.0}',
            '{"step": 4, "reward/mean": 0.4, "kl/code": 0, "grad_norm": -1.7e308, "entropy/mean": 1.0}',
            '{"step": %d, "reward/mean": 0.5}' % huge]  # a step past float range: an unreadable line
    run = write_run(tmp_path / "run", rows)
    loaded = load_run(run)
    assert len(loaded.rows) == 4 and loaded.skipped == 1
    # the unrepresentable value is left out; the rest of the series stays
    assert series(loaded, "reward/mean") == [(1, 0.1), (3, 0.3), (4, 0.4)]
    figs = figures(write_report([run]).read_text())
    for group, n in [("reward per domain", 3), ("KL", 4), ("grad norm", 4), ("entropy", 4)]:
        assert paths(figs[group]) == [n], group
        coords = [float(c) for c in re.findall(r"-?[\d.]+", re.search(r'<path d="([^"]*)"', figs[group])[1])]
        assert all(math.isfinite(c) and -1 <= c <= report.W + 1 for c in coords), (group, coords)
    # steps far apart (x spans -1e308..1e308) draw too
    wide = write_run(tmp_path / "wide", [{"step": -1e308, "reward/mean": 0.1}, {"step": 0, "reward/mean": 0.2},
                                         {"step": 1.7e308, "reward/mean": 0.3}])
    assert paths(figures(write_report([wide]).read_text())["reward per domain"]) == [3]


def test_ticks_cover_extreme_and_tiny_ranges():
    for lo, hi in [(-1e308, 1e308), (-1.7e308, 1.7e308), (0.0, 5e-324), (5e-324, 1e-323), (0.0, 1e-13),
                   (1.0, 1.0000000000000002), (1.7e308, 1.7e308), (-1.7e308, -1.7e308)]:
        ticks = report.nice_ticks(lo, hi)
        assert all(math.isfinite(t) for t in ticks) and ticks == sorted(set(ticks)) and len(ticks) >= 2, (lo, hi)
        assert ticks[0] <= lo and ticks[-1] >= hi, (lo, hi, ticks)
        [report.tick_label(t, ticks[1] - ticks[0]) for t in ticks]


def test_a_symlink_planted_at_the_temporary_path_is_not_followed(tmp_path):
    """Item 8: the page used to be written through `report.html.tmp`, a predictable name: a symlink planted there
    had its target overwritten. The page must land in report.html and the link's target stay as it was."""
    run = write_run(tmp_path / "run", [{"step": 1, "reward/mean": 0.1}, {"step": 2, "reward/mean": 0.2}])
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    for name in ("report.html.tmp", ".report.html.tmp"):
        (run / name).symlink_to(victim)
    out = write_report([run])
    assert victim.read_text() == "precious\n"
    assert out == run / "report.html" and not out.is_symlink() and out.read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in run.iterdir()) == [".report.html.tmp", "metrics.jsonl", "report.html",
                                                      "report.html.tmp"]  # no temporary file is left behind
    assert os.stat(out).st_mode & 0o444 == 0o444  # readable like a page written by write_text


def test_the_summary_names_the_report_and_its_command(tmp_path):
    cfg = {"logger": {"mode": "disabled", "progress_bar": False, "save_rollouts": False}}
    tracker = Tracker(cfg, tmp_path / "run", total_steps=2, start_step=0, resume=False)
    tracker.log({"step": 1, "reward/mean": 0.5})
    summary = tracker.close()
    cmd = summary["outputs"]["report"]
    assert f"python -m launch.report {tmp_path / 'run'}" in cmd and str(tmp_path / "run" / "report.html") in cmd
    assert f"  report: {cmd}" in format_summary(summary)


# --- in a browser -----------------------------------------------------------------------------------------------

def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    pytest.skip("no chromium binary on PATH (Debian: apt-get install chromium; .ci/run installs it)")


# Runs in the page after it is laid out: each chart's size, its lines' drawn lengths, labels that overlap each other
# or stick out of the chart.
LAYOUT_PROBE = """<script>
const res = [...document.querySelectorAll('figure.panel')].map(f => {
  const svg = f.querySelector('svg.chart'), r = svg.getBoundingClientRect();
  const boxes = [...svg.querySelectorAll('text')].map(t => t.getBoundingClientRect());
  let overlaps = 0;
  boxes.forEach((a, i) => boxes.slice(i + 1).forEach(b => {
    if (a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1) overlaps++; }));
  const outside = boxes.filter(b => b.left < r.left - 1 || b.right > r.right + 1 || b.top < r.top - 1
                                    || b.bottom > r.bottom + 1).length;
  return {group: f.dataset.group, width: r.width, height: r.height, overlaps, outside,
          lines: [...svg.querySelectorAll('path')].map(p => p.getTotalLength())};
});
const pre = document.createElement('pre'); pre.id = 'layout'; pre.textContent = JSON.stringify(res);
document.body.appendChild(pre);
</script>"""


def browse(page: Path, tmp_path: Path, *args: str) -> str:
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'chromium-profile'}", *args, page.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def png_pixels(path: Path) -> np.ndarray:
    """An 8-bit RGB(A), non-interlaced PNG (what Chromium writes) as a (h, w, channels) array; no Pillow."""
    data, pos, idat = path.read_bytes(), 8, b""
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk, pos = data[pos + 8:pos + 8 + n], pos + 12 + n
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
            assert depth == 8 and ctype in (2, 6) and interlace == 0
        elif kind == b"IDAT":
            idat += chunk
    bpp = 3 if ctype == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, 1 + w * bpp)
    out = np.zeros((h, w * bpp), np.uint8)
    prev = np.zeros(w * bpp, np.uint8)
    for y in range(h):
        f, line = raw[y, 0], raw[y, 1:]
        if f == 0:
            cur = line.copy()
        elif f == 1:  # Sub: a running sum along each channel
            cur = (np.cumsum(line.reshape(w, bpp).astype(np.int64), axis=0) % 256).astype(np.uint8).reshape(-1)
        elif f == 2:
            cur = line + prev
        else:  # Average and Paeth depend on the byte just decoded: byte by byte
            cur, lb, pb = bytearray(line.tobytes()), line.tobytes(), prev.tobytes()
            for x in range(w * bpp):
                a = cur[x - bpp] if x >= bpp else 0
                b = pb[x]
                if f == 3:
                    cur[x] = (lb[x] + (a + b) // 2) & 255
                else:
                    c = pb[x - bpp] if x >= bpp else 0
                    p = a + b - c
                    pa, pbb, pc = abs(p - a), abs(p - b), abs(p - c)
                    cur[x] = (lb[x] + (a if pa <= pbb and pa <= pc else b if pbb <= pc else c)) & 255
            cur = np.frombuffer(bytes(cur), np.uint8)
        out[y], prev = cur, cur
    return out.reshape(h, w, bpp)[:, :, :3]


def check_in_browser(page: Path, tmp_path: Path, expected: list[str], height: int) -> np.ndarray:
    """Every expected chart drawn, in the DOM and in a screenshot; returns the screenshot's pixels."""
    html_text = page.read_text()
    figs = figures(html_text)
    for group in expected:  # the served DOM: an <svg> with a line of >= 2 points
        assert group in figs, f"no chart for {group!r}"
        assert "<svg" in figs[group] and max(paths(figs[group]), default=0) >= 2, group
    probe = tmp_path / "probe.html"  # the same page and a probe that reads back the layout
    probe.write_text(html_text.replace("</body>", LAYOUT_PROBE + "</body>"))
    dom = browse(probe, tmp_path, "--dump-dom")
    layout = {f["group"]: f for f in json.loads(re.search(r'<pre id="layout">(.*?)</pre>', dom, re.S)[1])}
    assert set(figs) == set(layout)
    for group in expected:
        f = layout[group]
        assert f["width"] > 300 and f["height"] > 120, f
        assert max(f["lines"], default=0) > 20, f  # a visible line, px long
        assert f["overlaps"] == 0 and f["outside"] == 0, f"labels overlap or stick out in {group}: {f}"
    shot = tmp_path / "report.png"
    browse(page, tmp_path, f"--screenshot={shot}", f"--window-size=1400,{height}", "--hide-scrollbars")
    px = png_pixels(shot).astype(int)
    non_white = (px.min(axis=2) < 235).mean()
    coloured = (px.max(axis=2) - px.min(axis=2) > 80).sum()  # chart lines; the text and grid are grey
    assert non_white > 0.01, f"screenshot looks blank ({non_white:.2%} non-white)"
    assert coloured > 500 * len(expected), f"only {coloured} coloured pixels for {len(expected)} charts"
    return px


def test_a_page_of_several_runs_renders_in_chromium(tmp_path):
    rows = [{"step": s, "reward/mean": math.sin(s / 3), "reward/math/mean": None if s % 5 == 0 else s / 20,
             "kl/code": 1e-4 * s, "time/train": 2 + s % 3, "time/rollout": 5.0} for s in range(1, 31)]
    a = write_run(tmp_path / "a", rows)
    b = write_run(tmp_path / "b", [{**r, "reward/mean": r["reward/mean"] + 0.2} for r in rows[:20]])
    page = write_report([a, b], tmp_path / "page.html")
    check_in_browser(page, tmp_path, ["reward per domain", "KL", "time per phase"], height=1400)


@pytest.mark.slow
def test_the_report_of_a_real_run_renders_in_chromium(quick_start_run, tmp_path):
    """The README's main job (shared with the end-to-end tests): the command its end summary prints, run as printed
    where the run was started, makes the page, which draws every chart the run has data for."""
    named = re.search(r"report: (python -m launch\.report (\S+)) \(writes (\S+)\)", quick_start_run.stdout)
    assert named, "the end summary does not name the report"
    assert (quick_start_run.cwd / named[2]).resolve() == quick_start_run.run_dir.resolve()
    root = str(Path(__file__).resolve().parents[1])
    proc = subprocess.run([sys.executable, *shlex.split(named[1])[1:]], cwd=quick_start_run.cwd, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": root}, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == named[3], proc.stderr
    page = quick_start_run.cwd / named[3]
    loaded = load_run(quick_start_run.run_dir)
    drawable = [g for g, pats in PANEL_GROUPS.items()
                if any(sum(p is not None for p in series(loaded, k)) >= 2 for k in group_keys(pats, loaded.keys))]
    assert set(REQUIRED_GROUPS) <= set(drawable), set(REQUIRED_GROUPS) - set(drawable)
    check_in_browser(page, tmp_path, drawable, height=4400)
    text = page.read_text()
    assert "<summary>config.yaml of" in text and "steps_averaged" in text  # config and summary.json are there
