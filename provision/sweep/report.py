"""The sweep's report in the seed's shape: a markdown table, the same as CSV, a recommendation per workload, and a
plot (throughput per cell and config beside throughput against acceptance).

    | config | C=1 60 tok | C=1 1k | C=1 4k | C=32 60 tok | C=32 4k | accept | coding |

One row per config (the matrix's order), one column per grid cell: output tok/s, or "failed". `accept` is the
mean of the config's per-cell accept lengths; `coding` is passed/total from the config's record that has it. A
config run at a block size above its drafter's trained one (allow_untrained_depth) is marked UNTRAINED_MARK.

Workloads: per concurrency of the grid, its shortest input ("c1-short") and its longest ("c1-long"); a
concurrency with one input length is one workload ("c4"). The seed's grid gives c1-short, c1-long, c32-short and
c32-long. For each, the recommendation is the fastest config (output tok/s) among those that pass the coding gate,
with the `provision reconfigure` that switches to it and the inventory lines that keep it.
"""

from __future__ import annotations

import csv
import io
import os
import shlex
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from provision.files import write_atomic
from provision.sweep.matrix import GridCell, Matrix
from provision.sweep.results import CONFIG_LEVEL, Record

FAILED = "failed"
MISSING = "-"
UNTRAINED_MARK = " (untrained depth)"


def tokens_label(n: int) -> str:
    """The seed's spelling: 60 tok, 1k, 4k."""
    return f"{n // 1024}k" if n % 1024 == 0 else f"{n} tok"


def column_label(cell: GridCell, grid: list[GridCell]) -> str:
    """C=1 60 tok, C=32 4k; with the output length only where two cells would otherwise read the same."""
    label = f"C={cell.concurrency} {tokens_label(cell.input_tokens)}"
    twins = [c for c in grid if (c.concurrency, c.input_tokens) == (cell.concurrency, cell.input_tokens)]
    return label + (f" out{cell.output_tokens}" if len(twins) > 1 else "")


@dataclass
class Row:
    config: str
    throughput: dict[str, float | str]  # cell id -> output tok/s, FAILED or MISSING
    accept: float | None
    coding: str
    untrained: bool = False  # ran at a block size above the drafter's trained one
    passed: float | None = None  # share of the coding problems passed; None: not checked


def untrained(records: Iterable[Record]) -> bool:
    """Whether any of these records ran at a block size above the drafter's trained one."""
    return any(
        r.server_args is not None and r.trained_block_size is not None
        and int(r.server_args.get("block_size") or 0) > r.trained_block_size
        for r in records
    )  # fmt: skip


def _latest(records: Iterable[Record]) -> dict[tuple[str, str], Record]:
    # a rerun without --resume appends again: the last record of a (config, cell) is the one that counts
    return {(r.config, r.cell): r for r in records}


def summarize(records: Iterable[Record], matrix: Matrix) -> list[Row]:
    latest = _latest(records)
    rows: list[Row] = []
    for config in matrix.configs:
        name = config.name
        config_failed = (name, CONFIG_LEVEL) in latest and latest[(name, CONFIG_LEVEL)].status == "failed"
        throughput: dict[str, float | str] = {}
        accepts: list[float] = []
        for cell in matrix.grid:
            rec = latest.get((name, cell.id))
            if rec is None:
                throughput[cell.id] = FAILED if config_failed else MISSING
            elif rec.status == "failed" or not rec.result:
                throughput[cell.id] = FAILED
            else:
                throughput[cell.id] = float(rec.result["output_tok_s"])
                if rec.accept_length is not None:
                    accepts.append(rec.accept_length)
        mine = [r for (c, _), r in latest.items() if c == name]
        scored = [r for r in mine if r.coding is not None]
        if scored:
            coding = f"{scored[-1].coding.passed}/{scored[-1].coding.total}"  # type: ignore[union-attr]
        elif any(r.cell == "coding" and r.status == "failed" for r in mine) or config_failed:
            coding = FAILED
        else:
            coding = MISSING
        score = scored[-1].coding if scored else None
        passed = score.passed / score.total if score is not None and score.total else None
        rows.append(Row(name, throughput, sum(accepts) / len(accepts) if accepts else None, coding,
                        untrained(mine), passed))  # fmt: skip
    return rows


# ---- recommendations


@dataclass(frozen=True)
class Workload:
    name: str  # c1-short, c32-long, or c4 where a concurrency has one input length
    cell: GridCell


def workloads(grid: list[GridCell]) -> list[Workload]:
    out: list[Workload] = []
    for concurrency in sorted({c.concurrency for c in grid}):
        cells = sorted((c for c in grid if c.concurrency == concurrency), key=lambda c: c.input_tokens)
        if cells[0].input_tokens == cells[-1].input_tokens:
            out.append(Workload(f"c{concurrency}", cells[0]))
        else:
            out += [Workload(f"c{concurrency}-short", cells[0]), Workload(f"c{concurrency}-long", cells[-1])]
    return out


@dataclass
class Recommendation:
    workload: Workload
    best: str | None  # None: no config passed the gate with a measured cell
    tok_s: float | None
    runner_up: tuple[str, float] | None
    why_none: str = ""


def passes_gate(row: Row, matrix: Matrix) -> bool:
    if not matrix.coding.enabled:
        return True
    return row.passed is not None and row.passed >= matrix.coding.gate


def recommend(rows: list[Row], matrix: Matrix) -> list[Recommendation]:
    out: list[Recommendation] = []
    for workload in workloads(matrix.grid):
        measured = [(r.config, v) for r in rows if isinstance(v := r.throughput[workload.cell.id], float)]
        gated = sorted(((c, v) for c, v in measured if passes_gate(next(r for r in rows if r.config == c), matrix)),
                       key=lambda cv: -cv[1])  # fmt: skip
        if not gated:
            why = "no config passed the coding gate" if measured else "no config measured this cell"
            out.append(Recommendation(workload, None, None, None, why))
            continue
        out.append(Recommendation(workload, gated[0][0], gated[0][1], gated[1] if len(gated) > 1 else None))
    return out


def set_value(value: Any) -> str:
    """A value as `--set KEY=VALUE` reads it back (YAML: null, true, [a, b])."""
    if isinstance(value, str):
        return value
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def switch_command(config: Any, host: str) -> str:
    """The `provision reconfigure` that switches `host` to a matrix config (a SweepConfig)."""
    parts = ["provision", "reconfigure", "--host", host]
    for key, value in config.set.items():
        parts += ["--set", f"{key}={set_value(value)}"]
    if config.allow_untrained_depth:
        parts.append("--allow-untrained-depth")
    return shlex.join(parts)


def inventory_lines(config: Any) -> str:
    """The config as inventory YAML: the host's (or its group's) dflash_set, kept across `apply`."""
    return yaml.safe_dump({"dflash_set": config.overrides()}, sort_keys=False, default_flow_style=False).strip()


def recommendations_markdown(recs: list[Recommendation], rows: list[Row], matrix: Matrix, host: str) -> str:
    gate = (f"configs that passed at least {matrix.coding.gate:.0%} of the coding problems"
            if matrix.coding.enabled else "every config (the coding check is off)")  # fmt: skip
    lines = ["## Recommendation", "", f"Per workload, the fastest config (output tok/s) among {gate}.", ""]
    for rec in recs:
        cell = rec.workload.cell
        head = f"### {rec.workload.name}: {column_label(cell, matrix.grid)} ({cell.prompts} prompts)"
        if rec.best is None or rec.tok_s is None:
            lines += [head, "", f"None: {rec.why_none}.", ""]
            continue
        row = next(r for r in rows if r.config == rec.best)
        config = matrix.config(rec.best)
        accept = f"accept {row.accept:.2f}, " if row.accept is not None else ""
        margin = ""
        if rec.runner_up is not None:
            name, value = rec.runner_up
            margin = f"; next: {name} at {value:.1f} ({(rec.tok_s - value) / value:+.1%})"
        mark = f"{UNTRAINED_MARK}: block size above the drafter's trained one" if row.untrained else ""
        lines += [
            head, "",
            f"**{rec.best}**{mark}: {rec.tok_s:.1f} output tok/s ({accept}coding {row.coding}){margin}.", "",
            "Switch to it (lasts until the next `apply`):", "", "```", switch_command(config, host), "```", "",
            f"Keep it: in the inventory's `host_vars/{host}.yml` (or the group's `group_vars`), merged into any "
            "`dflash_set` already there (a second `dflash_set` replaces the first):", "",
            "```yaml", inventory_lines(config), "```", "",
        ]  # fmt: skip
    return "\n".join(lines)


def _header(matrix: Matrix) -> list[str]:
    return ["config", *(column_label(c, matrix.grid) for c in matrix.grid), "accept", "coding"]


def _cells(row: Row, matrix: Matrix, digits: int) -> list[str]:
    def number(value: float | str) -> str:
        return f"{value:.{digits}f}" if isinstance(value, float) else value

    accept = f"{row.accept:.2f}" if row.accept is not None else MISSING
    name = row.config + (UNTRAINED_MARK if row.untrained else "")
    return [name, *(number(row.throughput[c.id]) for c in matrix.grid), accept, row.coding]


def markdown(rows: list[Row], matrix: Matrix, host: str = "HOST") -> str:
    header = _header(matrix)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cells(row, matrix, 1)) + " |" for row in rows]
    outputs = " or ".join(str(n) for n in sorted({c.output_tokens for c in matrix.grid}))
    note = f"Cells: output tok/s ({outputs} output tokens a request); accept: mean accept length."
    if any(row.untrained for row in rows):
        note += (f"\n{UNTRAINED_MARK.strip()}: run at a block size above the drafter's trained one "
                 "(allow_untrained_depth: true), asking for depths it never trained on.")  # fmt: skip
    recs = recommendations_markdown(recommend(rows, matrix), rows, matrix, host)
    return "\n".join(lines) + "\n\n" + note + "\n\n" + recs


def to_csv(rows: list[Row], matrix: Matrix) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(_header(matrix))
    writer.writerows(_cells(row, matrix, 2) for row in rows)
    return buffer.getvalue()


def plot(records: Iterable[Record], matrix: Matrix, path: Path) -> None:
    """Left: output tok/s per grid cell, a bar per config (the table as a picture). Right: output tok/s against
    accept length, a series per cell (a color per concurrency, a marker per input length), labelled by config."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a control node; must precede pyplot
    import matplotlib.pyplot as plt

    records = list(records)
    latest = _latest(records)
    rows = summarize(records, matrix)
    fig, (bars, ax) = plt.subplots(1, 2, figsize=(15, 6))
    width = 0.8 / len(rows)
    for i, row in enumerate(rows):
        xs = [j + (i - (len(rows) - 1) / 2) * width for j in range(len(matrix.grid))]
        ys = [v if isinstance(v := row.throughput[c.id], float) else 0.0 for c in matrix.grid]
        bars.bar(xs, ys, width, label=row.config + (UNTRAINED_MARK if row.untrained else ""), color=f"C{i % 10}",
                 hatch="//" if row.untrained else None)  # fmt: skip
    bars.set_xticks(range(len(matrix.grid)), [column_label(c, matrix.grid) for c in matrix.grid])
    bars.set_ylabel("output throughput (tok/s)")
    bars.set_title("throughput per cell and config (0: failed or not run)")
    bars.grid(True, axis="y", which="both", alpha=0.3)
    heights = [p.get_height() for p in bars.patches if p.get_height() > 0]
    if heights and max(heights) / min(heights) > 10:  # C=1 and C=32 differ ~10x: a log axis shows both
        bars.set_yscale("log")
    bars.legend(fontsize=8)

    markers = "os^Dv<>Pp*"
    inputs = sorted({c.input_tokens for c in matrix.grid})
    concurrencies = sorted({c.concurrency for c in matrix.grid})
    colors = {c: f"C{i % 10}" for i, c in enumerate(concurrencies)}
    for cell in matrix.grid:
        points = []
        for config in matrix.configs:
            rec = latest.get((config.name, cell.id))
            if rec and rec.status == "ok" and rec.result and rec.accept_length is not None:
                points.append((rec.accept_length, float(rec.result["output_tok_s"]), config.name))
        if not points:
            continue
        xs, ys, names = zip(*points, strict=True)
        marker = markers[inputs.index(cell.input_tokens) % len(markers)]
        ax.scatter(xs, ys, color=colors[cell.concurrency], marker=marker, label=column_label(cell, matrix.grid))
        for i, (x, y, name) in enumerate(sorted(points)):
            # alternate above/below so configs with near-equal accept lengths stay readable
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4 if i % 2 else -9), fontsize=7)
    ax.set_xlabel("accept length (tokens per verify step, this run's requests)")
    ax.set_ylabel("output throughput (tok/s)")
    ax.set_title("throughput against acceptance")
    ax.grid(True, which="both", alpha=0.3)
    ys = [y for series in ax.collections for _, y in series.get_offsets()]
    if ys and min(ys) > 0 and max(ys) / min(ys) > 10:
        ax.set_yscale("log")
    if ax.collections:
        ax.legend(fontsize=8)
    fig.suptitle("DFlash / DDTree sweep")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".png")
    try:
        with os.fdopen(fd, "wb") as handle:
            fig.savefig(handle, format="png", dpi=120, bbox_inches="tight")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)


@dataclass
class ReportFiles:
    markdown: Path
    csv: Path
    png: Path


def write_report(records: Iterable[Record], matrix: Matrix, out_dir: Path, stem: str = "report",
                 host: str = "HOST") -> ReportFiles:  # fmt: skip
    """report.md, report.csv and report.png in `out_dir`, each written atomically; `host` goes in the commands."""
    records = list(records)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = summarize(records, matrix)
    files = ReportFiles(out_dir / f"{stem}.md", out_dir / f"{stem}.csv", out_dir / f"{stem}.png")
    write_atomic(files.markdown, markdown(rows, matrix, host), mode=0o644)
    write_atomic(files.csv, to_csv(rows, matrix), mode=0o644)
    plot(records, matrix, files.png)
    return files
