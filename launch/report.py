"""A run you can look at without W&B: `python -m launch.report RUN_DIR [RUN_DIR ...] [--out PAGE.html]` writes one
self-contained HTML page (inline SVG, no script, no network) from each run's `metrics.jsonl`, with its
`summary.json` and `config.yaml`. Several run dirs are overlaid on the same charts.

`PANEL_GROUPS` is the one list of charts: a title and the metric keys it draws, as patterns in which `*` stands for
any text within one `/`-separated part of a key. The README's "Metrics" section names the same groups as the
panels to make in W&B (whose workspace makes one section per key prefix before the first `/`).
"""

from __future__ import annotations

import argparse
import datetime
import html
import json
import math
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

PANEL_GROUPS: dict[str, list[str]] = {
    "reward per domain": ["reward/mean", "reward/*/mean"],
    "response length per domain": ["response_length/mean", "response_length/*/mean"],
    "KL": ["kl/*", "loss/kl"],
    "OPSM masked fraction": ["opsm/masked_frac", "opsm/*/masked_frac"],
    "mismatch": ["mismatch/*"],
    "entropy": ["entropy/*"],
    "clip fraction": ["clip_frac", "tis/clip_frac"],
    "policy loss": ["loss/pg"],
    "grad norm": ["grad_norm"],
    "throughput": ["throughput/*"],
    "perf (TFLOPs, MFU)": ["perf/*tflops*", "perf/mfu"],
    "time per phase": ["time/*"],
    "eval": ["eval/*/mean@*", "eval/*/pass@*"],
    "reward failures, zero-variance groups": ["reward/failed_frac", "reward/with_reason_frac",
                                              "advantage/zero_variance_group_frac"],
    "rollout (staleness, kept-set cut, truncation)": ["rollout/*", "response_length/truncated_frac"],
    "samples per domain": ["samples/*"],
    "agent episodes (success, turns)": ["episode/*/success", "episode/*/turns", "episode/*/tool_calls"],
    "agent episode endings": ["episode/*/termination/*"],
    "memory (GiB)": ["memory/*"],
}

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf", "#393b79", "#637939", "#ad494a", "#8c6d31"]
DASHES = ["", "7 4", "2 3", "9 3 2 3"]  # one per run dir
W, H, ML, MR, MT, MB = 660, 290, 70, 16, 12, 40  # chart size and margins (px)
MAX_POINTS = 1500  # per line; longer ones keep each bucket's min and max


def pattern_regex(pattern: str) -> re.Pattern:
    return re.compile("".join("[^/]*" if c == "*" else re.escape(c) for c in pattern) + r"\Z")


def group_keys(patterns: list[str], keys) -> list[str]:
    """The keys the patterns match, in pattern order, each key once."""
    out: list[str] = []
    for p in patterns:
        rx = pattern_regex(p)
        out += [k for k in sorted(keys) if rx.match(k) and k not in out]
    return out


@dataclass
class Run:
    dir: Path
    name: str
    rows: list[dict] = field(default_factory=list)
    skipped: int = 0  # lines that were torn, not JSON or had no step
    summary: dict | None = None
    config: str | None = None
    note: str = ""
    columns: dict[str, list] = field(default_factory=dict)  # key -> [(step, value as logged)], rows' order

    @property
    def keys(self) -> set[str]:
        return set(self.columns)


def number(v) -> float | None:
    """A finite number, else None (bools and strings are not metrics; nor is an int past float range)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        try:
            f = float(v)
        except OverflowError:  # e.g. 10**400 in a metrics line
            return None
        return f if math.isfinite(f) else None
    return None


def load_run(run_dir: Path, name: str | None = None) -> Run:
    run = Run(Path(run_dir), name or Path(run_dir).name or str(run_dir))
    path = run.dir / "metrics.jsonl"
    if not path.exists():
        run.note = f"no {path}"
    by_step: dict[float, dict] = {}
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict) or number(row.get("step")) is None:
            run.skipped += bool(line.strip())
            continue
        by_step[row["step"]] = row  # a redone step (resume) counts once: its last line
    run.rows = [by_step[s] for s in sorted(by_step)]
    for r in run.rows:
        for k, v in r.items():
            if k != "step":
                run.columns.setdefault(k, []).append((r["step"], v))
    try:
        run.summary = json.loads((run.dir / "summary.json").read_text())
    except (OSError, ValueError):
        pass
    try:
        run.config = (run.dir / "config.yaml").read_text(errors="replace")
    except OSError:
        pass
    return run


def series(run: Run, key: str) -> list[tuple[float, float] | None]:
    """(step, value) where the key is logged; None (a gap) where it is null; steps without it and non-finite values
    are left out (the line goes on across them)."""
    out: list[tuple[float, float] | None] = []
    for step, v in run.columns.get(key, ()):
        if v is None:
            if out and out[-1] is not None:
                out.append(None)
        elif (y := number(v)) is not None:
            out.append((float(step), y))
    return out


def segments(points: list) -> list[list[tuple[float, float]]]:
    segs, cur = [], []
    for p in points + [None]:
        if p is None:
            if cur:
                segs.append(cur)
            cur = []
        else:
            cur.append(p)
    return segs


def thin(seg: list[tuple[float, float]], budget: int) -> list[tuple[float, float]]:
    """At most ~budget points: each bucket's lowest and highest point, in step order (spikes stay visible)."""
    if len(seg) <= budget:
        return seg
    size = math.ceil(len(seg) / max(1, budget // 2))
    out = []
    for i in range(0, len(seg), size):
        b = seg[i:i + size]
        out += sorted({min(b, key=lambda p: p[1]), max(b, key=lambda p: p[1])})
    return out


def nice_ticks(lo: float, hi: float, n: int = 5, integer: bool = False) -> list[float]:
    """Round tick values (1, 2, 2.5 or 5 times a power of ten) covering [lo, hi]. Any finite lo, hi: a range too
    narrow for its magnitude (or subnormal) is drawn as flat, and where round ticks would pass the float range
    (a range near +-1.8e308) the ticks split [lo, hi] evenly instead."""
    lo, hi = float(lo), float(hi)
    big = max(abs(lo), abs(hi))
    if hi - lo <= 16 * math.ulp(big) or hi - lo < 1e-300:  # flat (or only float noise / subnormals apart)
        pad = big * 0.1 if big > 1e-299 else 1.0
        lo, hi = max(lo - pad, -sys.float_info.max), min(hi + pad, sys.float_info.max)
    raw = (hi - lo) / n if math.isfinite(hi - lo) else hi / n - lo / n  # the latter: no overflow
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), 10 * mag)
    if integer:
        step = float(max(1.0, round(step)))
    start = math.floor(lo / step + 1e-9) * step
    digits = max(12, 2 - math.floor(math.log10(step)))  # rounding off float noise; tiny steps keep their digits
    ticks: list[float] = []
    while len(ticks) < 50:
        if len(ticks) >= 2 and ticks[-1] >= hi - step * 0.001:
            break
        ticks.append(round(start + len(ticks) * step, digits))
    if (not all(map(math.isfinite, ticks)) or ticks[0] > lo + step * 1e-6 or ticks[-1] < hi - step * 0.0011
            or any(b <= a for a, b in zip(ticks, ticks[1:]))):  # past the float range: not round, but drawable
        ticks = sorted({lo / n * (n - i) + hi / n * i for i in range(1, n)} | {lo, hi})
    return ticks


def span_frac(v: float, a: float, b: float) -> float:
    """Where v lies between a and b (0..1), also where b - a overflows."""
    if math.isinf(b - a):
        return (v / 2 - a / 2) / (b / 2 - a / 2)
    return (v - a) / (b - a)


def fmt(v: float) -> str:
    """A value label: short, no float noise."""
    return "0" if v == 0 else f"{v:.4g}"


def tick_label(v: float, step: float) -> str:
    """A tick label with just the digits that tell ticks `step` apart."""
    if v == 0:
        return "0"
    if not (step > 0 and math.isfinite(step)):
        return fmt(v)
    e = math.floor(math.log10(step) + 1e-9)
    extra = 1 if 10.0 ** e > 0 and round(step / 10.0 ** e, 6) == 2.5 else 0
    if abs(v) >= 1e5 or step < 1e-3:
        return f"{v:.{max(0, math.floor(math.log10(abs(v)) + 1e-9) - e + extra)}e}"
    return f"{v:.{max(0, extra - e)}f}"


def svg_chart(lines: list[dict], title: str, xrange: tuple[float, float] | None = None) -> str:
    """One line chart: `lines` are dicts of label, color, dash, points (list of (x, y) or None for a gap); x spans
    `xrange` (all runs' steps: the charts line up) or the points'."""
    pts = [p for ln in lines for p in ln["points"] if p is not None]
    if not pts:
        return ""
    xs, ys = [p[0] for p in pts] + list(xrange or ()), [p[1] for p in pts]
    xt = nice_ticks(min(xs), max(xs), 6, integer=all(x == int(x) for x in xs))
    yt = nice_ticks(min(ys), max(ys), 5)
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]
    pw, ph = W - ML - MR, H - MT - MB

    def px(x):
        return ML + span_frac(x, x0, x1) * pw

    def py(y):
        return MT + ph - span_frac(y, y0, y1) * ph

    out = [f'<svg class="chart" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
           f'aria-label="{html.escape(title)}" xmlns="http://www.w3.org/2000/svg">',
           f'<rect x="{ML}" y="{MT}" width="{pw}" height="{ph}" fill="#fff" stroke="#bbb"/>']
    for t in yt:
        out.append(f'<line class="grid" x1="{ML}" x2="{ML + pw}" y1="{py(t):.1f}" y2="{py(t):.1f}"/>'
                   f'<text class="tick" x="{ML - 6}" y="{py(t) + 4:.1f}" text-anchor="end">'
                   f'{tick_label(t, yt[1] - yt[0])}</text>')
    every = math.ceil(len(xt) / 8)
    for i, t in enumerate(xt):
        out.append(f'<line class="grid" x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{MT}" y2="{MT + ph}"/>')
        if i % every == 0:
            out.append(f'<text class="tick" x="{px(t):.1f}" y="{MT + ph + 16}" text-anchor="middle">'
                       f'{tick_label(t, xt[1] - xt[0])}</text>')
    out.append(f'<text class="axis" x="{ML + pw / 2}" y="{H - 4}" text-anchor="middle">step</text>')
    for ln in lines:
        segs = [thin(s, MAX_POINTS) for s in segments(ln["points"])]
        n = sum(len(s) for s in segs)
        dash = f' stroke-dasharray="{ln["dash"]}"' if ln["dash"] else ""
        label = html.escape(ln["label"])
        out.append(f'<g class="series" data-key="{label}" stroke="{ln["color"]}" fill="{ln["color"]}">'
                   f'<title>{label}</title>')
        for s in segs:
            if len(s) > 1:
                d = "M" + " L".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s)
                out.append(f'<path d="{d}" fill="none" stroke-width="1.8"{dash}/>')
        for s in segs:  # markers: on every point of a short line, on a lone point always (it has no line)
            for x, y in s if (n <= 60 or len(s) == 1) else []:
                out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.6" stroke="none">'
                           f'<title>{label}, step {fmt(x)}: {fmt(y)}</title></circle>')
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)


def legend(lines: list[dict]) -> str:
    items = []
    for ln in lines:
        last = next((p[1] for p in reversed(ln["points"]) if p is not None), None)
        dash = f' stroke-dasharray="{ln["dash"]}"' if ln["dash"] else ""
        items.append(f'<li><svg width="26" height="10"><line x1="0" y1="5" x2="26" y2="5" stroke="{ln["color"]}" '
                     f'stroke-width="2.5"{dash}/></svg> {html.escape(ln["label"])}'
                     f'<span class="last">{"" if last is None else "last " + fmt(last)}</span></li>')
    return '<ul class="legend">' + "".join(items) + "</ul>"


def charts(runs: list[Run]) -> tuple[list[str], set[str]]:
    """One figure per panel group that has data; and the keys that were drawn."""
    figs, drawn = [], set()
    many = len(runs) > 1
    steps = [r["step"] for run in runs for r in run.rows]
    xrange = (min(steps), max(steps)) if steps else None
    for title, patterns in PANEL_GROUPS.items():
        lines = []
        keys = group_keys(patterns, set().union(*(run.keys for run in runs)))
        for ki, key in enumerate(keys):  # a key has one colour; a run dir one line style
            for ri, run in enumerate(runs):
                pts = series(run, key)
                if any(p is not None for p in pts):
                    lines.append({"label": f"{run.name}: {key}" if many else key, "points": pts,
                                  "color": COLORS[ki % len(COLORS)], "dash": DASHES[ri % len(DASHES)]})
                    drawn.add(key)
        svg = svg_chart(lines, title, xrange)
        if svg:
            gid = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
            figs.append(f'<figure class="panel" data-group="{html.escape(title)}" id="{gid}"><figcaption>'
                        f'{html.escape(title)} <code>{html.escape(" ".join(patterns))}</code></figcaption>'
                        f'{svg}{legend(lines)}</figure>')
    return figs, drawn


def cell(v) -> str:
    return "" if v is None else fmt(v) if isinstance(v, float) else html.escape(str(v))


def table(title: str, rows: list[str], cols: list[str], get) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join(f"<tr><th>{html.escape(r)}</th>" + "".join(f"<td>{cell(get(r, c))}</td>" for c in cols)
                   + "</tr>" for r in rows)
    return f'<table class="summary"><caption>{html.escape(title)}</caption><tr><th></th>{head}</tr>{body}</table>'


def summary_tables(runs: list[Run]) -> str:
    """summary.json as small tables: its plain values; each dict of values (e.g. outputs) with a column per run;
    each dict of dicts (e.g. reward: domain -> first, last) as a grid, its columns per run."""
    sums = [(r.name, r.summary) for r in runs if isinstance(r.summary, dict)]
    if not sums:
        return "<p>No summary.json (the run has not ended).</p>"
    many = len(runs) > 1
    plain = list(dict.fromkeys(k for _, s in sums for k, v in s.items() if not isinstance(v, dict)))
    out = [table("run", plain, [n for n, _ in sums], lambda r, c: dict(sums)[c].get(r))] if plain else []
    for key in dict.fromkeys(k for _, s in sums for k, v in s.items() if isinstance(v, dict)):
        parts = [(n, s[key] if isinstance(s.get(key), dict) else {}) for n, s in sums]
        if all(isinstance(v, dict) for _, d in parts for v in d.values()):  # a grid: rows x leaf keys (per run)
            rows = list(dict.fromkeys(r for _, d in parts for r in d))
            cols = [(n, leaf) for n, d in parts for leaf in dict.fromkeys(x for v in d.values() for x in v)]
            names = [f"{n}: {leaf}" if many else leaf for n, leaf in cols]
            look = dict(zip(names, cols))
            out.append(table(key, rows, names, lambda r, c: (dict(parts)[look[c][0]].get(r) or {}).get(look[c][1])))
        else:
            rows = list(dict.fromkeys(r for _, d in parts for r in d))
            out.append(table(key, rows, [n for n, _ in parts], lambda r, c: dict(parts)[c].get(r)))
    return '<div class="tables">' + "".join(out) + "</div>"


CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:20px;color:#222;background:#f6f6f4}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:22px 0 8px} .meta{color:#666}
.grid{stroke:#eee} .tick{font-size:11px;fill:#555} .axis{font-size:12px;fill:#333}
.panels{display:grid;grid-template-columns:repeat(auto-fill,minmax(600px,1fr));gap:14px}
figure.panel{margin:0;padding:10px;background:#fff;border:1px solid #ddd;border-radius:6px;min-width:0}
figcaption{font-weight:600;margin-bottom:4px} figcaption code{font-weight:400;color:#888;font-size:11px}
svg.chart{max-width:100%;height:auto;display:block}
ul.legend{list-style:none;padding:0;margin:6px 0 0;columns:2;font-size:12px}
ul.legend li{break-inside:avoid;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
ul.legend svg{vertical-align:middle} .last{color:#888;margin-left:6px}
.tables{display:flex;flex-wrap:wrap;gap:14px;align-items:flex-start} caption{text-align:left;font-weight:600}
table.summary{border-collapse:collapse;background:#fff;font-size:12px}
table.summary td,table.summary th{border:1px solid #ddd;padding:3px 8px;text-align:left}
table.summary td{font-variant-numeric:tabular-nums} .empty{padding:20px;background:#fff3cd;border:1px solid #e0c36b}
details{margin:6px 0} pre{background:#fff;border:1px solid #ddd;padding:8px;overflow:auto;font-size:12px}
"""


def render(runs: list[Run]) -> str:
    title = "RL run report: " + ", ".join(r.name for r in runs)
    figs, drawn = charts(runs)
    notes = []
    for ri, r in enumerate(runs):
        dash = DASHES[ri % len(DASHES)]
        style = f' (line style <svg width="30" height="8"><line x1="0" y1="4" x2="30" y2="4" stroke="#333" ' \
                f'stroke-width="2" stroke-dasharray="{dash}"/></svg>)' if len(runs) > 1 else ""
        extra = f", {r.skipped} unreadable lines skipped" if r.skipped else ""
        last = f", last step {fmt(r.rows[-1]['step'])}" if r.rows else ""
        notes.append(f"<li><b>{html.escape(r.name)}</b>{style}: <code>{html.escape(str(r.dir))}</code>, "
                     f"{len(r.rows)} steps{last}{extra}{'; ' + html.escape(r.note) if r.note else ''}</li>")
    parts = [f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
             f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>",
             f'<p class="meta">made by <code>python -m launch.report</code> at '
             f'{datetime.datetime.now().strftime("%Y-%m-%d %H:%M")}; x = the metric <code>step</code>; '
             f'hover a line for its key, a marker for its value</p><ul>{"".join(notes)}</ul>']
    if not any(r.rows for r in runs):
        parts.append('<p class="empty" id="no-steps">No steps logged yet: metrics.jsonl has no readable line.</p>')
    elif not figs:
        parts.append('<p class="empty" id="no-charts">None of the logged keys belongs to a chart.</p>')
    parts.append(f'<h2>Summary</h2>{summary_tables(runs)}')
    if figs:
        parts.append(f'<h2>Metrics</h2><div class="panels">{"".join(figs)}</div>')
    rest = sorted(set().union(*(r.keys for r in runs)) - drawn)
    if rest:
        parts.append(f"<details><summary>{len(rest)} logged keys not in a chart</summary><pre>"
                     f"{html.escape(chr(10).join(rest))}</pre></details>")
    for r in runs:
        if r.config is not None:
            parts.append(f"<details><summary>config.yaml of {html.escape(r.name)}</summary>"
                         f"<pre>{html.escape(r.config)}</pre></details>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_report(run_dirs: list[Path | str], out: Path | str | None = None) -> Path:
    """The page for these run dirs, written to `out` (default: the first run dir's report.html)."""
    dirs = [Path(d) for d in run_dirs]
    names = [d.resolve().name for d in dirs]
    runs = [load_run(d, n if names.count(n) == 1 else f"{d.resolve().parent.name}/{n}") for d, n in zip(dirs, names)]
    path = Path(out) if out else dirs[0] / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    page = render(runs).encode("utf-8")
    # a fresh temporary file of an unpredictable name (O_CREAT|O_EXCL: never a planted file or symlink), renamed
    # over the page at once: a reader sees the old page or the new one, and a link at the path is replaced, not
    # followed
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)  # mkstemp makes it 0600; a page is for reading
            f.write(page)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m launch.report", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dirs", nargs="+", type=Path, help="run dirs (with metrics.jsonl); several are overlaid")
    ap.add_argument("--out", type=Path, help="the HTML file (default: RUN_DIR/report.html of the first run dir)")
    args = ap.parse_args(argv)
    missing = [str(d) for d in args.run_dirs if not d.is_dir()]
    if missing:
        print(f"not a directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    print(write_report(args.run_dirs, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
