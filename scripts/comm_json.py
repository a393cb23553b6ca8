"""Reading comm-bench's comm_ops_benchmark.json for the table scripts."""
import json
import sys


def times_us(path, strict=True):
    """{(method, count): median time in us} of the rows that passed. Skipped rows (a method outside its size range or
    mode) are left out; with `strict`, any other row that did not pass its checks ends the script, naming it."""
    out = {}
    for row in json.load(open(path))["rows"]:
        if row["status"] == "passed":
            out[(row["method"], row["count"])] = row["time_ms"] * 1000
        elif strict and row["status"] != "skipped":
            sys.exit(f"{path}: {row['method']} at {row['count']} elements: {row['status']}")
    return out
