"""``bench run --plot OUT.png``: acceptance by draft position, and the speedup against concurrency.

Left: the share of generation steps that accepted each draft position (one line per concurrency;
with greedy decoding they coincide). Right: measured speculative / autoregressive throughput per
concurrency, the projection's curves when the report has one (dashed, labelled "model"), and the
break-even line at 1.0. matplotlib (the ``bench`` extra) with the Agg backend; written atomically.
"""

from __future__ import annotations

import io

from ..errors import MissingDependencyError


def pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependencyError("--plot needs matplotlib: pip install 'dflash2-trt[bench]'") from None
    return plt


def render_png(report: dict) -> bytes:
    plt = pyplot()
    fig, (ax_acc, ax_sp) = plt.subplots(1, 2, figsize=(11, 4.2))
    try:
        K = report["draft_len"]
        any_acc = no_steps = False
        for run in report["runs"]:
            acc = (run.get("speculative") or {}).get("acceptance") or {}
            pp = acc.get("per_position")
            if pp and acc.get("mean") is None:   # measured, but no request took a generation step
                no_steps = True
            elif pp:
                any_acc = True
                ax_acc.plot(range(1, K + 1), [float("nan") if v is None else v for v in pp], marker="o",
                            label=f"concurrency {run['concurrency']} (mean {acc['mean']:.2f} tokens/step)")
        ax_acc.set_title("acceptance by draft position")
        ax_acc.set_xlabel("draft position")
        ax_acc.set_ylabel("share of steps accepting it")
        ax_acc.set_ylim(0, 1.02)
        if any_acc:
            ax_acc.set_xticks(range(1, K + 1))
            ax_acc.legend(fontsize=8)
        else:
            ax_acc.text(0.5, 0.5, "no generation steps (every request ended on its first token)" if no_steps else
                        "not measured by this backend", ha="center", va="center", transform=ax_acc.transAxes)
        xs = [r["concurrency"] for r in report["runs"] if r.get("speedup") is not None]
        ys = [r["speedup"] for r in report["runs"] if r.get("speedup") is not None]
        if xs:
            ax_sp.plot(xs, ys, marker="o", label=f"measured ({report['backend']})")
        proj = report.get("projection")
        if proj:
            for g in proj["gpus"]:
                ax_sp.plot([p["concurrency"] for p in g["points"]], [p["speedup"] for p in g["points"]],
                           linestyle="--", marker=".", label=f"model: {g['gpu']['name']} ({proj['target']['name']})")
        ax_sp.axhline(1.0, color="grey", linewidth=1, linestyle=":")
        ax_sp.set_xscale("log", base=2)
        ticks = sorted({r["concurrency"] for r in report["runs"]}
                       | ({p["concurrency"] for g in proj["gpus"] for p in g["points"]} if proj else set()))
        ax_sp.set_xticks(ticks)
        ax_sp.set_xticklabels([str(t) for t in ticks])
        ax_sp.minorticks_off()
        ax_sp.set_title("speculative / autoregressive throughput")
        ax_sp.set_xlabel("concurrency")
        ax_sp.set_ylabel("speedup")
        ax_sp.set_ylim(bottom=0)
        if xs or proj:
            ax_sp.legend(fontsize=8)
        fig.suptitle(f"dflash2-trt bench: {report.get('target') or report['engine_dir']}, block {report['block_size']}, "
                     f"T = {report['settings']['temperature']}", fontsize=10)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        return buf.getvalue()
    finally:
        plt.close(fig)


def write_plot(report: dict, path) -> None:
    from .io import atomic_write_bytes

    atomic_write_bytes(path, render_png(report))
