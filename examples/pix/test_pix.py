#!/usr/bin/env python3
"""Test of examples/pix (issue 17): runs the pipeline with `sluice run` in a copy of this folder and checks the
BR Code of every paid charge's event against an independent Python implementation written from the Pix
specification (EMV MPM TLVs, GUI br.gov.bcb.pix, CRC16-CCITT-FALSE); the CRC alone is checked against its
standard check value and the CRC of the published example of the BCB's BR Code manual.

Usage: test_pix.py SLUICE_BINARY   (ctest runs it as pix_example_test; needs node, npm and the npm registry)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))


def crc16_ccitt_false(data: bytes) -> int:
    crc = 0xFFFF
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc


def tlv(tag: str, value: str) -> str:
    assert len(value) <= 99, (tag, value)
    return f"{tag}{len(value):02d}{value}"


def ascii_upper(text: str, limit: int) -> str:
    decomposed = unicodedata.normalize("NFD", text)
    kept = "".join(ch for ch in decomposed if ch.isascii() and (ch.isalnum() or ch == " "))
    return kept.upper()[:limit]


def br_code(charge: dict) -> str:
    txid = "".join(ch for ch in charge["id"] if ch.isascii() and ch.isalnum())[:25] or "***"
    parts = [
        tlv("00", "01"),
        tlv("26", tlv("00", "br.gov.bcb.pix") + tlv("01", charge["pix_key"])),
        tlv("52", "0000"),
        tlv("53", "986"),
    ]
    if charge["amount"] > 0:
        parts.append(tlv("54", f"{charge['amount'] // 100}.{charge['amount'] % 100:02d}"))
    parts += [
        tlv("58", "BR"),
        tlv("59", ascii_upper(charge["merchant_name"], 25)),
        tlv("60", ascii_upper(charge["merchant_city"], 15)),
        tlv("62", tlv("05", txid)),
        "6304",
    ]
    payload = "".join(parts)
    return payload + f"{crc16_ccitt_false(payload.encode()):04X}"


def main() -> int:
    sluice = os.path.abspath(sys.argv[1])
    # The CRC alone: the standard check value of CRC-16/CCITT-FALSE, and the published example of the BR Code
    # manual (a static code for key 123e4567-e12b-12d1-a456-426655440000, "Fulano de Tal", BRASILIA).
    assert crc16_ccitt_false(b"123456789") == 0x29B1
    published = ("00020126580014br.gov.bcb.pix0136123e4567-e12b-12d1-a456-4266554400005204000053039865802BR"
                 "5913Fulano de Tal6008BRASILIA62070503***63041D3D")
    assert f"{crc16_ccitt_false(published[:-4].encode()):04X}" == published[-4:], "published example's CRC"

    work = tempfile.mkdtemp(prefix="sluice-pix-")
    try:
        for name in ("package.json", "package-lock.json", "pipeline.yaml"):
            shutil.copy(os.path.join(HERE, name), work)
        for name in ("domain", "data"):
            shutil.copytree(os.path.join(HERE, name), os.path.join(work, name))
        run = subprocess.run([sluice, "run", "pipeline.yaml"], cwd=work, capture_output=True, text=True, timeout=300)
        if run.returncode != 0:
            print(run.stdout[-4000:], run.stderr[-4000:])
            return 1
        changes = {}
        with open(os.path.join(work, "data", "charges.jsonl"), encoding="utf-8") as f:
            for line in f:
                c = json.loads(line)
                changes[c["source"]["position"]] = c
        events = []
        out = os.path.join(work, "out", "events")
        for name in sorted(os.listdir(out)):
            if name.startswith("part-"):
                with open(os.path.join(out, name), encoding="utf-8") as f:
                    events += [json.loads(line) for line in f]
        assert len(events) == len(changes), (len(events), len(changes))
        paid = 0
        for e in events:
            charge = changes[e["source"]["position"]]["after"]
            payload = e["payload"]
            assert payload["chargeId"] == charge["id"] and payload["amountCents"] == charge["amount"], e
            assert e["type"] == "charge." + charge["status"], e
            if charge["status"] == "paid":
                paid += 1
                expected = br_code(charge)
                assert payload.get("brCode") == expected, f"{charge['id']}: {payload.get('brCode')} != {expected}"
            else:
                assert "brCode" not in payload, e
        assert paid > 100, paid
        print(f"pix example: {len(events)} events, {paid} BR Codes equal the Python implementation's")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
