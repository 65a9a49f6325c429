"""The C++ writer (backend/CompactEncoding.cpp) and compact.py's encoder give a reader the same values: the C++
encoding is compiled alone with a small driver, fed integer columns, and its text read by compact.py."""

from __future__ import annotations

import json
import subprocess

import pytest

import encoding_driver
from fr_backend import compact


DRIVER = r"""
#include <cstdint>
#include <iostream>
#include "CompactEncoding.hpp"
using namespace frnccl;
// stdin: lines of "<count> <v>...": one dump each, entry i {record_id: v_i, time_created_ns: 1000, time_gpu_started_ns: v_i}
int main() {
  size_t n = 0;
  while (std::cin >> n) {
    DumpValue d = DumpValue::dict();
    DumpValue entries = DumpValue::list();
    for (size_t i = 0; i < n; ++i) {
      long long v = 0;
      std::cin >> v;
      DumpValue e = DumpValue::dict();
      e.set("record_id", int64_t(v));
      e.set("time_created_ns", int64_t(1000));
      e.set("time_gpu_started_ns", int64_t(v));
      entries.push(std::move(e));
    }
    d.set("entries", std::move(entries));
    std::cout << CompactEncoding::toJson(d);
  }
}
"""

MIN, MAX = -(2**63), 2**63 - 1
CASES = [[0, 127, 0], [0, 128], [0, -128], [5, 5 + 32767], [5, 5 - 32768], [0, 2**31 - 1], [0, -(2**31)],
         [0, MAX], [872, 873, 0],  # offsets -128 (too wide for 2 digits with nulls) and -127
         [MIN, MAX], [-1, MAX], [MIN, 0], [1000 + MIN, 0]]  # differences past 64 bits; an offset equal to null


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return encoding_driver.build(tmp_path_factory.mktemp("driver"), DRIVER)


@pytest.mark.parametrize("vals", CASES, ids=[str(c) for c in CASES])
def test_cpp_writer_reads_back_as_written(driver, vals):
    text = subprocess.run([str(driver)], input=f"{len(vals)} {' '.join(map(str, vals))}\n", capture_output=True,
                          text=True, check=True, timeout=30).stdout
    obj = json.loads(text)
    obj["_inflated_bytes"] = len(text)
    rows = compact.to_rows(obj)["entries"]
    py = compact.to_rows(json.loads(compact.encode_json(
        {"entries": [{"record_id": v, "time_created_ns": 1000, "time_gpu_started_ns": v} for v in vals]})))["entries"]
    assert [r["record_id"] for r in py] == [r["time_gpu_started_ns"] for r in py] == vals  # the Python encoder
    cols = obj["entries"]["columns"]
    assert [r["record_id"] for r in rows] == vals, cols["record_id"]
    assert [r["time_gpu_started_ns"] for r in rows] == vals, cols["time_gpu_started_ns"]
