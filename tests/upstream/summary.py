#!/usr/bin/env python3
"""Upstream's e2e specs, one Markdown table row each, from ginkgo's JSON report.

Usage: summary.py REPORT.json REF NODES
Prints: a table (state, seconds, API version, spec, where it failed) and a line of totals.
Specs the focus left out (state "skipped" without having run) are counted, not listed.
"""

import json
import re
import sys


def api_version(location):
    match = re.search(r"/apps/(v1alpha1|v1beta1)/", location.get("FileName", ""))
    return match.group(1) if match else "-"


def one_line(text, limit=160):
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def main():
    path, ref, nodes = sys.argv[1:4]
    with open(path) as f:
        reports = json.load(f)
    rows, counts, not_run, total_seconds = [], {}, 0, 0.0
    for report in reports:
        for spec in report.get("SpecReports") or []:
            if spec.get("LeafNodeType") != "It":
                # Suite setup and teardown: shown only when they failed.
                if spec.get("State") not in ("passed", "skipped"):
                    rows.append((spec.get("State"), spec.get("RunTime", 0) / 1e9, "-",
                                 spec.get("LeafNodeType", "?"), spec))
                continue
            state = spec.get("State")
            if state == "skipped" and not spec.get("RunTime"):
                not_run += 1
                continue
            seconds = spec.get("RunTime", 0) / 1e9
            total_seconds += seconds
            counts[state] = counts.get(state, 0) + 1
            name = " ".join(spec.get("ContainerHierarchyTexts") or []) + " " + spec.get("LeafNodeText", "")
            rows.append((state, seconds, api_version(spec.get("LeafNodeLocation", {})), name.strip(), spec))
    rows.sort(key=lambda r: (r[2], r[3]))
    print(f"Upstream OpenKruise {ref} e2e specs against kruise-rs, {nodes} real nodes\n")
    print("| result | s | API | spec | failure |")
    print("|---|---:|---|---|---|")
    for state, seconds, version, name, spec in rows:
        failure = ""
        if state != "passed":
            fail = spec.get("Failure") or {}
            loc = fail.get("Location") or {}
            where = f"{loc.get('FileName', '').split('/test/e2e/')[-1]}:{loc.get('LineNumber', '')}"
            failure = one_line(f"{where} {fail.get('Message', '')}").replace("|", "\\|")
        print(f"| {state} | {seconds:.0f} | {version} | {name} | {failure} |")
    ran = sum(counts.values())
    summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    print(f"\n{ran} specs ran ({summary}) in {total_seconds:.0f} s of spec time; {not_run} not in focus.")


if __name__ == "__main__":
    main()
