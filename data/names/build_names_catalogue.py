"""Rebuild aip_assets/catalog/names.csv from the source files (docs/concepts/names.md).

Not run by the package or its tests: the catalogue is shipped built. This script records exactly
how each figure in it was computed from which file, so the catalogue can be checked and redone.

    python data/names/build_names_catalogue.py VALIDATED_NAMES_DIR SSA_NAMES_DIR aip_assets/catalog

writes names.csv (first and last names) and names_full.csv (the perception of each rated full name
built from two catalogue parts; draws skip those below the threshold).

VALIDATED_NAMES_DIR: a checkout of github.com/jaeyk/validated_names (read at commit
317afa40b1ba15418711c791bf295153608a1610), the data of Crabtree et al. 2023: the per-rating files
data_outputs/study-{1,2,3}-names.csv and Tzioumis's first-name file data/firstnames.xlsx.
SSA_NAMES_DIR: a folder of the SSA national baby-name files yob1880.txt ... yob2023.txt (read from
github.com/aramshiva/babies, names/, at commit 5cbb539a286b8c1e40cb1400bf7c43b5e5b31b25).

The rules (thresholds and the order of preference) are those in aip_assets/catalog/names.py.
"""

from __future__ import annotations

import collections
import csv
import glob
import os
import sys
import xml.etree.ElementTree as ET
import zipfile

PERCEPTION_MIN = 0.6  # share of ratings that name the group
COMPOSITION_MIN = 0.8  # share of bearers in the group
GENDER_MIN = 0.9  # share of SSA births of one sex
COMPOSITION_N_MIN = 30  # bearers in Tzioumis's data
FILL_TO = 8  # cells with fewer than 4 perception-measured first names are completed to this many
MIN_PER_CELL = 4

# Crabtree et al.'s identity labels -> the attribute catalogue's ethnicity ids. Their Asian set
# is left out: its perceived specific origin (Chinese/Korean/Japanese against Vietnamese,
# Filipino, Asian Indian, ...) is split, so no first name reaches the threshold as East Asian.
CRABTREE_GROUPS = {"White": "white", "Black or African American": "Black", "Hispanic": "Hispanic"}
TZIOUMIS_COLUMNS = {"white": "pctwhite", "Black": "pctblack", "Hispanic": "pcthispanic"}


def xlsx_rows(path: str, sheet: str) -> list[list[str]]:
    ns = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
    z = zipfile.ZipFile(path)
    shared = [
        "".join(t.text or "" for t in si.iter(ns + "t"))
        for si in ET.fromstring(z.read("xl/sharedStrings.xml")).findall(ns + "si")
    ]
    out = []
    for row in ET.fromstring(z.read(f"xl/worksheets/{sheet}.xml")).iter(ns + "row"):
        vals = []
        for c in row.findall(ns + "c"):
            v = c.find(ns + "v")
            x = v.text if v is not None and v.text is not None else ""
            vals.append(shared[int(x)] if c.get("t") == "s" else x)
        out.append(vals)
    return out


def ssa_sex_counts(folder: str) -> dict[str, list[int]]:
    counts: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    files = sorted(glob.glob(os.path.join(folder, "yob*.txt")))
    assert len(files) == 144, len(files)  # 1880..2023
    for f in files:
        for line in open(f, encoding="utf-8"):
            name, sex, n = line.strip().split(",")
            counts[name][0 if sex == "F" else 1] += int(n)
    return counts


def main(vn: str, ssa_dir: str, out: str) -> None:
    ssa = ssa_sex_counts(ssa_dir)

    def gender_of(first: str) -> tuple[str, float, int] | None:
        f, m = ssa.get(first, (0, 0))
        if f + m == 0:
            return None
        return ("woman", f / (f + m), f + m) if f >= m else ("man", m / (f + m), f + m)

    # Crabtree et al.: pool every rating of the full names that contain a part, within its group
    # (first names of their "Asian with white first name" design are not white-group names).
    pooled: dict[tuple[str, str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    full: dict[tuple[str, str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    for i in (1, 2, 3):
        for r in csv.DictReader(open(os.path.join(vn, f"data_outputs/study-{i}-names.csv"), encoding="utf-8")):
            group = CRABTREE_GROUPS.get(r["identity"])
            if group is None:
                continue
            f = full[(r["first"], r["last"], group)]
            f["_n"] += 1
            f[r["race"]] += 1
            for part, name in (("first", r["first"]), ("last", r["last"])):
                c = pooled[(part, name, group)]
                c["_n"] += 1
                c[r["race"]] += 1
    label = {v: k for k, v in CRABTREE_GROUPS.items()}
    rows: list[dict] = []
    measured_first: set[tuple[str, str]] = set()
    for (part, name, group), c in sorted(pooled.items()):
        share = c[label[group]] / c["_n"]
        if part == "first":
            measured_first.add((name, group))
        if share < PERCEPTION_MIN:
            continue
        row = {"part": part, "name": name, "ethnicity": group, "ethnicity_share": round(share, 3)}
        row |= {"ethnicity_n": c["_n"], "ethnicity_measure": "perception", "ethnicity_source": "crabtree2023"}
        if part == "first":
            g = gender_of(name)
            if g is None or g[1] < GENDER_MIN:
                continue
            row |= {"gender": g[0], "gender_share": round(g[1], 3), "gender_n": g[2]}
            row |= {"gender_measure": "composition", "gender_source": "ssa_national"}
        rows.append(row)

    # Tzioumis: completes the cells with fewer than MIN_PER_CELL perception-measured first names.
    table = xlsx_rows(os.path.join(vn, "data/firstnames.xlsx"), "sheet2")
    header = table[0]
    tz = [dict(zip(header, r)) for r in table[1:]]
    for group, col in TZIOUMIS_COLUMNS.items():
        for gender in ("woman", "man"):
            have = [r for r in rows if r["part"] == "first" and r["ethnicity"] == group and r["gender"] == gender]
            if len(have) >= MIN_PER_CELL:
                continue
            candidates = []
            for d in tz:
                name = d["firstname"].title()
                if (name, group) in measured_first:  # a perception measure, when there is one, decides
                    continue
                share, n = float(d[col]) / 100, int(d["obs"])
                g = gender_of(name)
                if share < COMPOSITION_MIN or n < COMPOSITION_N_MIN or g is None or g[0] != gender:
                    continue
                if g[1] < GENDER_MIN:
                    continue
                candidates.append((-n, -share, name, share, n, g))
            for _, _, name, share, n, g in sorted(candidates)[: FILL_TO - len(have)]:
                rows.append(
                    {
                        "part": "first",
                        "name": name,
                        "gender": gender,
                        "ethnicity": group,
                        "gender_share": round(g[1], 3),
                        "gender_n": g[2],
                        "gender_measure": "composition",
                        "gender_source": "ssa_national",
                        "ethnicity_share": round(share, 3),
                        "ethnicity_n": n,
                        "ethnicity_measure": "composition",
                        "ethnicity_source": "tzioumis2018",
                    }
                )

    fields = ["part", "name", "gender", "ethnicity", "gender_share", "gender_n", "gender_measure", "gender_source"]
    fields += ["ethnicity_share", "ethnicity_n", "ethnicity_measure", "ethnicity_source"]
    rows.sort(key=lambda r: (r["part"] != "first", r["ethnicity"], r.get("gender", ""), r["name"]))
    with open(os.path.join(out, "names.csv"), "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in fields})

    parts = {(r["part"], r["name"], r["ethnicity"]) for r in rows}
    with open(os.path.join(out, "names_full.csv"), "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["first", "last", "ethnicity", "ethnicity_share", "ethnicity_n", "ethnicity_source"])
        for (first, last, group), c in sorted(full.items()):
            if ("first", first, group) in parts and ("last", last, group) in parts:
                w.writerow([first, last, group, round(c[label[group]] / c["_n"], 3), c["_n"], "crabtree2023"])


if __name__ == "__main__":
    main(*sys.argv[1:4])
