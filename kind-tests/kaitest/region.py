"""Where libvgpu's shared-region fields lie, from the description the Rust
layout is checked against (services/region/layout.json, generated and
checked by services/region/tests/layout_json.rs): no offset is copied here."""
import json
import os
import struct

LAYOUT_JSON = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "services", "region", "layout.json")


class Layout:
    """One layout ("v1", HAMi-core 1.x, or "v0") of services/region/src/layout.rs."""

    def __init__(self, version="v1", path=LAYOUT_JSON):
        with open(path) as f:
            doc = json.load(f)
        self.fields = doc[version]
        self.used = doc["used"]

    def limit(self, device=0):
        """Offset of `limit[device]` (u64 bytes)."""
        return self.fields["limit"] + 8 * device

    def slot(self, i):
        """Offset of process slot `i`."""
        return self.fields["procs"] + i * self.fields["proc_size"]

    def slot_pid(self, i):
        """Offset of process slot `i`'s pid (i32)."""
        return self.slot(i) + self.fields["slot_pid"]

    def procs(self):
        """Offset of the process slots: every field before it is the header."""
        return self.fields["procs"]


def read_u64(path, offset):
    with open(path, "rb") as f:
        f.seek(offset)
        return struct.unpack("<Q", f.read(8))[0]


def write(path, offset, fmt, value):
    """Writes `value` packed as struct format `fmt` (little-endian) at `offset`."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(struct.pack("<" + fmt, value))


def replace_u64(path, old, new, start):
    """Replaces the one 8-aligned u64 equal to `old` at or after `start` (a
    slot's usage total) with `new`; asserts there is exactly one."""
    with open(path, "rb") as f:
        data = f.read()
    hits = [i for i in range(start, len(data) - 7, 8) if struct.unpack_from("<Q", data, i)[0] == old]
    assert len(hits) == 1, f"{path}: {len(hits)} slots hold {old}"
    write(path, hits[0], "Q", new)
