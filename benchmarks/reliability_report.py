"""The report of benchmarks/reliability.py: the markdown table of the soak, overload and disconnect runs (what was
tried, how much, what was lost) and the plot of the server's RSS over the soak."""

from __future__ import annotations

from pathlib import Path


def to_markdown(report: dict) -> str:
    """The markdown of a reliability report (its config and whichever of soak, overload, disconnects it holds)."""
    cfg = report["config"]
    lines = ["# Reliability runs", "", f"`{cfg['command']}`", "",
             f"Server: `cinq serve` ({cfg['model']}, {cfg['server_flags']}) on loopback; client on the same "
             f"machine ({cfg['machine']}).", "",
             "| run | what was tried | how much | completed | failed | aborted | preemptions | blocks free after "
             "| other |", "|---|---|---|---|---|---|---|---|---|"]
    s = report.get("soak")
    if s:
        rss = s["rss"]
        lines.append(
            f"| soak | mixed chat + completions, streaming, n=2, stops, logprobs, echo, shared prefixes, seeded "
            f"probes, {cfg['big_body_mb']} MB bodies every {cfg['big_every']} | {s['requests']} requests at "
            f"{s['concurrency']} concurrent, {s['duration_s']:.0f} s | {s['completed']} | {s['failed']} | 0 | "
            f"{s['preemptions']} | {s['free_blocks_after']}/{s['num_kv_blocks']} | RSS {rss['start_mib']:.0f} MiB at "
            f"start, {rss['after_warmup_mib']:.0f} after {cfg['warmup']} requests, max after "
            f"{rss['max_after_warmup_mib']:.0f}, end {rss['end_mib']:.0f} (**{rss['growth_after_warmup_pct']:+.1f}%** "
            f"after warm-up; bound 15%); seeded probes {s['probes_under_load']}, mismatches with solo "
            f"{s['probe_mismatches']} |")
    o = report.get("overload")
    if o:
        lines.append(f"| overload | {o['streams']} concurrent streams x {o['max_tokens']} tokens on "
                     f"{o['num_kv_blocks']} KV blocks (~{o['demand_x']:.1f}x capacity) | {o['streams']} streams, "
                     f"{o['duration_s']:.0f} s | {o['completed']} | {o['failed']} | 0 | {o['preemptions']} | "
                     f"{o['free_blocks_after']}/{o['num_kv_blocks']} | step failures {o['step_failures']} |")
    d = report.get("disconnects")
    if d:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(d["by_kind"].items()))
        lines.append(f"| disconnects | clients vanish mid-stream, before the answer, mid-body ({kinds}) | "
                     f"{d['clients']} clients in waves of 30 | - | - | {d['aborted']} | - | "
                     f"{d['free_blocks_after']}/{d['num_kv_blocks']} | slowest wave idle after "
                     f"{d['max_s_to_idle_after_wave']:.2f} s; running {d['running_after']}, waiting "
                     f"{d['waiting_after']} after |")
    lines += ["", "Failed: a non-200 answer, an error event in a stream, or a stream without `[DONE]`. Aborted: "
                  "requests the server aborted because their client vanished (a mid-body client never becomes a "
                  "request). Blocks free after: KV blocks not held by a live request once the run is over. "
                  "Mid-body clients count as aborted only if their request had started."]
    if s and s.get("errors"):
        lines += ["", "Soak errors: " + "; ".join(f"{k} x{v}" for k, v in s["errors"].items())]
    if cfg.get("note"):
        lines += ["", cfg["note"]]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    """The server's RSS against requests done over the soak, with the end of warm-up marked, as a PNG at ``path``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    samples = report["soak"]["rss_samples"]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([d for _, d, _ in samples], [r / 2**20 for _, _, r in samples], "-", lw=1)
    ax.axvline(report["config"]["warmup"], color="gray", ls=":", label="end of warm-up")
    ax.set_xlabel("requests done")
    ax.set_ylabel("server RSS (MiB)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=.3)
    ax.legend()
    ax.set_title(f"cinq serve RSS over a {report['soak']['requests']}-request mixed soak")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
