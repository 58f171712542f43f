# SPDX-License-Identifier: MIT
"""Writes golden records in the format tests/support/golden.hpp reads:
one line per record, `<name> <count> <v0> <v1> ...`, values as %.17g."""
import os

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def write_golden(filename, records, header=""):
    """records: iterable of (name, sequence of numbers)."""
    os.makedirs(DATA_DIR, exist_ok=True)
    path = os.path.join(DATA_DIR, filename)
    with open(path, "w") as f:
        for line in header.splitlines():
            f.write("# " + line + "\n")
        for name, values in records:
            vals = [float(v) for v in values]
            f.write(name + " " + str(len(vals)) + " " + " ".join("%.17g" % v for v in vals) + "\n")
    return path
