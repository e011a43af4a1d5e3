#!/usr/bin/env python3
"""Draws docs/performance.svg from scripts/bench.sh results: one row per scenario, throughput
bars on the left, p99 latency bars on the right. Plain SVG, no plotting library needed.

Usage: scripts/chart.py RESULTS_TSV OUTPUT_SVG
RESULTS_TSV lines: scenario number, label, requests/s, p99 ms, p99.9 ms (tab-separated).
"""
import sys
from html import escape

ROW, TOP, LABEL_W, BAR_W, GAP = 26, 58, 300, 300, 40


def bars(rows, x0, column, maximum, unit, colour):
    out = []
    for i, row in enumerate(rows):
        value = float(row[column])
        y = TOP + i * ROW
        width = BAR_W * value / maximum if maximum else 0
        text = f"{value:,.0f}" if unit == "req/s" else f"{value:.2f}"
        out.append(f'<rect x="{x0}" y="{y}" width="{width:.1f}" height="{ROW - 8}" fill="{colour}"/>')
        out.append(f'<text x="{x0 + width + 4:.1f}" y="{y + ROW - 12}">{text}</text>')
    return out


def main(results, output):
    rows = [line.rstrip("\n").split("\t") for line in open(results) if line.strip()]
    if not rows:
        sys.exit(f"{results}: no results")
    height = TOP + ROW * len(rows) + 20
    width = LABEL_W + 2 * (BAR_W + 90) + GAP
    max_rps = max(float(r[2]) for r in rows)
    max_p99 = max(float(r[3]) for r in rows)
    x_rps, x_p99 = LABEL_W, LABEL_W + BAR_W + 90 + GAP
    svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        '<text x="10" y="22" font-size="15" font-weight="bold">sluice bench: throughput and p99 per scenario</text>',
        f'<text x="{x_rps}" y="{TOP - 10}" font-weight="bold">requests/s (higher is better)</text>',
        f'<text x="{x_p99}" y="{TOP - 10}" font-weight="bold">p99 latency, ms (lower is better)</text>',
    ]
    for i, row in enumerate(rows):
        svg.append(f'<text x="10" y="{TOP + i * ROW + ROW - 12}">{escape(row[0])}. {escape(row[1])}</text>')
    svg += bars(rows, x_rps, 2, max_rps, "req/s", "#4878a8")
    svg += bars(rows, x_p99, 3, max_p99, "ms", "#d08040")
    svg.append("</svg>")
    with open(output, "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
