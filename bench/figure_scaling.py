"""Figure 8: how save and restart cost grow with the state, and the listing with the checkpoints."""

from __future__ import annotations

from typing import Any

from bench.figure import Figure, fmt_x


def scaling_figure(sc: dict[str, Any], overhead: dict[str, Any] | None) -> Figure:
    fits = sc["fits"]
    sizes = dict(sorted(sc["sizes"].items(), key=lambda kv: kv[1]["bytes"]))
    gb = [v["bytes"] / 1e9 for v in sizes.values()]

    def rate(side: str) -> str:
        r = fits[side]["GBps"]
        return "n/a" if r is None else f"{r:.2f} GB/s (+{fits[side]['intercept_s']:.2f} s)"

    def ratio(a: str, b: str) -> str:
        ra, rb = fits[a]["GBps"], fits[b]["GBps"]
        return "n/a" if not ra or not rb else fmt_x(ra / rb)

    sizes_txt = " / ".join(f"{x:.2f}" for x in gb)
    f = Figure(
        "8",
        f"scaling: save slope over {sizes_txt} GB, periodic `Store.save` vs raw write+fsync",
        rate("save"),
        rate("raw_write"),
        ratio("save", "raw_write"),
        "",
    )
    f.rows.append(
        (
            f"scaling: restart load slope over {sizes_txt} GB, `resolve_and_load` (hashing while "
            "loading) vs reading every file once",
            rate("load"),
            rate("raw_read"),
            ratio("load", "raw_read"),
        )
    )
    if "two_pass" in fits:
        f.rows.append(
            (
                "scaling: restart load slope, one pass (hash while loading) vs two (hash, then load)",
                rate("load"),
                rate("two_pass"),
                ratio("load", "two_pass"),
            )
        )
        f.rows.append(
            (
                f"scaling: restart load slope vs the data files' checksum (crc32c) of the same bytes in memory ({sizes_txt} GB)",
                rate("load"),
                rate("hash"),
                ratio("load", "hash"),
            )
        )
    big = list(sizes.values())[-1]
    if "load_read_x" in big:
        f.rows.append(
            (
                f"scaling: bytes a restart reads / the checkpoint's bytes ({big['bytes'] / 1e9:.2f} GB), "
                "one pass vs two",
                f"{big['load_read_x']:.2f}x",
                f"{big['two_pass_read_x']:.2f}x",
                "",
            )
        )
    for v in sizes.values():
        f.rows.append(
            (
                f"scaling: {v['bytes'] / 1e9:.2f} GB: save / raw write; load / raw read",
                f"{v['save_s']:.2f} s / {v['load_s']:.2f} s",
                f"{v['raw_write_s']:.2f} s / {v['raw_read_s']:.2f} s",
                f"{v['raw_write_s'] / v['save_s']:.2f}x / {v['raw_read_s'] / v['load_s']:.2f}x",
            )
        )
    lst = sc["listing_s"]
    f.rows.append(
        (
            "scaling: finding the newest checkpoint on local disk, 30 vs 3 committed",
            f"{lst['30'] * 1000:.1f} ms",
            f"{lst['3'] * 1000:.1f} ms",
            fmt_x(lst["30"] / lst["3"]),
        )
    )
    s3 = sc.get("listing_s3_s")
    if s3:
        f.rows.append(
            (
                "scaling: finding the newest checkpoint on the local S3 (moto), 30 vs 3 committed",
                f"{s3['30'] * 1000:.1f} ms",
                f"{s3['3'] * 1000:.1f} ms",
                fmt_x(s3["30"] / s3["3"]),
            )
        )
    if overhead:
        f.rows.append(
            (
                "scaling: loop overhead, world size 1 (figure 5)",
                f"{overhead['baton_steps_per_s']:.2f}/s",
                f"{overhead['plain_steps_per_s']:.2f}/s",
                fmt_x(overhead["baton_steps_per_s"] / overhead["plain_steps_per_s"]),
            )
        )
        p2, b2 = overhead.get("plain_ws2_steps_per_s"), overhead.get("baton_ws2_steps_per_s")
        if p2 and b2:
            f.rows.append(
                (
                    "scaling: loop overhead, world size 2 (figure 5)",
                    f"{b2:.2f}/s",
                    f"{p2:.2f}/s",
                    fmt_x(b2 / p2),
                )
            )
    lin = all(v["save_s"] > 0 for v in sizes.values())
    f.text = (
        f"Save and restart time against the state's size ({sizes_txt} GB of float32 tensors, local disk, "
        f"medians): a periodic save (hashed while writing, nothing read back) grows at {rate('save')}, "
        f"against {rate('raw_write')} for a raw write with fsync of the same bytes; a restart's load (the "
        f"listing, the manifest, every file hashed while DCP reads it into a staging copy) at "
        f"{rate('load')}, against {rate('raw_read')} for reading every file once"
        + (
            f", {rate('two_pass')} for the restart before this change (every file read and hashed, then "
            f"loaded: two reads) and {rate('hash')} for the data files' checksum (crc32c, the default) alone over the same bytes in memory"
            if "two_pass" in fits
            else ""
        )
        + ". The figure in brackets is the constant part (the fit's intercept). "
        + (
            f"The restart reads the checkpoint once: {big['load_read_x']:.2f}x its bytes, against "
            f"{big['two_pass_read_x']:.2f}x before (read to hash, then read to load). "
            if "load_read_x" in big
            else ""
        )
        + ("Each is a straight line in the bytes within the noise; " if lin else "")
        + f"finding the newest checkpoint is one listing: {lst['3'] * 1000:.1f} ms with 3 committed and "
        f"{lst['30'] * 1000:.1f} ms with 30 on local disk (there fsspec walks the folders, so it grows with "
        "the files, at a few ms)"
        + (
            f", and {s3['3'] * 1000:.1f} ms against {s3['30'] * 1000:.1f} ms on the local S3, where it is one "
            "request either way (a test counts them)"
            if s3
            else ""
        )
        + ". The loop's overhead at world size 1 and 2 is figure 5's, against a plain loop (and a plain "
        "FSDP2 loop at world size 2)."
    )
    return f
