"""Figure 9: the checksum algorithms side by side, and what each costs a save and a restart."""

from __future__ import annotations

from typing import Any

from bench.figure import Figure, fmt_x


def digest_figure(d: dict[str, Any]) -> Figure:
    gb = d["bytes"] / 1e9
    algorithms = [a for a in ("crc32c", "blake3", "sha256") if f"hash_{a}_GBps" in d]
    f = Figure(
        "9",
        f"integrity: restart load with crc32c (the default) vs `dcp.load` alone ({gb:.2f} GB, goal >= 0.8x)",
        f"{d['load_crc32c_s']:.2f} s",
        f"{d['dcp_load_s']:.2f} s",
        fmt_x(d["load_crc32c_vs_dcp"]),
        "",
    )
    rounds = d.get("save_crc32c_vs_dcp_rounds") or [d["save_crc32c_vs_dcp"]]
    f.rows.append(
        (
            f"integrity: `Store.save` with crc32c (hashed while writing, manifest, `_COMMIT`) vs `dcp.save` "
            f"alone, each after `os.sync()` (goal: median >= 0.9x, no round below 0.85x); the ratio per round "
            f"over {len(rounds)} rounds: median, lowest, highest; load average "
            + "/".join(f"{x:.1f}" for x in d.get("loadavg", [])),
            f"{d['save_crc32c_s']:.2f} s",
            f"{d['dcp_save_s']:.2f} s",
            f"{fmt_x(d.get('save_crc32c_vs_dcp_median', d['save_crc32c_vs_dcp']))} "
            f"({fmt_x(min(rounds))} .. {fmt_x(max(rounds))})",
        )
    )
    if "dcp_save_noise_rounds" in d:
        noise = d["dcp_save_noise_rounds"]
        f.rows.append(
            (
                "integrity: rounds of `Store.save` (crc32c) below 0.85x, and of those the rounds whose two "
                "`dcp.save`s differed by more than 15% (the machine moved); `dcp.save`'s own spread per "
                "round: median, highest",
                f"{d['save_crc32c_low_rounds']} of {len(rounds)}",
                f"{d['save_crc32c_low_rounds_noisy']} noisy",
                f"{100 * sorted(noise)[len(noise) // 2]:.0f}%, {100 * max(noise):.0f}%",
            )
        )
    for a in algorithms:
        f.rows.append(
            (
                f"integrity: {a}: checksum of the files in memory ({d['threads']} threads); load; save",
                f"{d[f'hash_{a}_GBps']:.2f} GB/s; {d[f'load_{a}_s']:.2f} s; {d[f'save_{a}_s']:.2f} s",
                f"dcp {d['dcp_load_s']:.2f} s; {d['dcp_save_s']:.2f} s",
                f"load {fmt_x(d[f'load_{a}_vs_dcp'])}, save {fmt_x(d[f'save_{a}_vs_dcp'])}",
            )
        )
    rates = ", ".join(f"{a} {d[f'hash_{a}_GBps']:.2f} GB/s" for a in algorithms)
    f.text = (
        f"The checksum of a checkpoint's data files, side by side over the same {gb:.2f} GB in memory: {rates}. "
        "The data files use crc32c by default (`checkpoint.digest`), `.metadata` always sha256, since it is "
        "unpickled and a forger can match a crc32c; `_COMMIT` holds the manifest's sha256. A restart's load "
        "hashes each file while DCP reads it (one pass); the save hashes while writing. The ratios are "
        "baton's path against DCP alone on the same files, in the same run. Each save round times `dcp.save` "
        "twice; their mean is the round's reference, and how far apart they are is the machine's noise in "
        "that round, so a low round says whether the machine or the integrity work moved."
    )
    return f
