#!/usr/bin/env python3
"""Readiness probe of scripts/services/mongodb: one real wire round trip (OP_MSG {isMaster: 1} on admin).

Usage: probe.py PORT [CA.pem]. With CA.pem the round trip is over TLS, the server's certificate verified against
that CA (for a server started with SLUICE_MONGODB_TLS_CERT). Exits 0 when the server answers with ok: 1.0, else 1.
Standard library only.
"""
import socket
import ssl
import struct
import sys


def bson_doc(items):
    body = b""
    for name, value in items:
        key = name.encode() + b"\x00"
        if isinstance(value, int):
            body += b"\x10" + key + struct.pack("<i", value)
        else:
            raw = value.encode() + b"\x00"
            body += b"\x02" + key + struct.pack("<i", len(raw)) + raw
    return struct.pack("<i", len(body) + 5) + body + b"\x00"


def main():
    port = int(sys.argv[1])
    doc = bson_doc([("isMaster", 1), ("$db", "admin")])
    payload = struct.pack("<I", 0) + b"\x00" + doc  # flagBits, section kind 0 (body)
    header = struct.pack("<iiii", 16 + len(payload), 1, 0, 2013)  # OP_MSG
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        s = raw
        if len(sys.argv) > 2:
            s = ssl.create_default_context(cafile=sys.argv[2]).wrap_socket(raw, server_hostname="127.0.0.1")
        s.sendall(header + payload)
        data = b""
        while len(data) < 4 or len(data) < struct.unpack("<i", data[:4])[0]:
            chunk = s.recv(65536)
            if not chunk:
                return 1
            data += chunk
    # ok: 1.0 as a double element
    return 0 if b"\x01ok\x00" + struct.pack("<d", 1.0) in data else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except OSError:
        sys.exit(1)
