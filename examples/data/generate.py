#!/usr/bin/env python3
"""Generates the bundled example change events (examples/data/payments/ and payments-with-bad-line/).

The data is what Sluice's Postgres CDC source would emit for a small payments database: a table
public.customers (id, name, email, country) read by an initial snapshot and then changed (sign-ups, email and
country updates, erasures under GDPR), and a table public.charges (id, customer_id, amount_cents, currency,
status, updated_at) whose rows move through created -> paid -> refunded, or created -> failed, one change per
transaction. Every line is one change-event envelope as docs/cdc.md describes it ({op, key, before, after,
source}); the tables have REPLICA IDENTITY FULL, so updates and deletes carry the whole old row in `before`.

Positions are commit LSNs ("0/16B3748", increasing with each transaction; one change per transaction), txn_id
increases with each transaction, sequence is the LSN of the change's own WAL record (as an integer; absent for
snapshot reads), ts_ms is the commit time (November 2026). Each file is ordered by position, so each entity's
events are in source order.

The output is deterministic (a fixed seed): running this script again rewrites the same bytes. The build runs it
(CMake target `example_data`, a dependency of `sluice`), so the files are not kept in git.
Usage: python3 examples/data/generate.py [--out DIR]   (DIR defaults to the folder of this script)
"""

import argparse
import datetime
import json
import os
import random

SEED = 20261102
T0_MS = int(datetime.datetime(2026, 11, 2, 8, 0, 0, tzinfo=datetime.timezone.utc).timestamp() * 1000)
WINDOW_MS = 7 * 24 * 3600 * 1000  # one week of activity after the snapshot
SNAPSHOT_CUSTOMERS = 190
SIGNUPS = 12
EMAIL_UPDATES = 30
COUNTRY_UPDATES = 14
ERASURES = 5
CHARGES = 5000
FIRST_LSN = 0x16B3748
FIRST_TXN = 7841

FIRST_NAMES = ["Ada", "Alan", "Amara", "Ana", "Arjun", "Beatriz", "Bruno", "Chen", "Chloe", "Dara", "David",
               "Elena", "Emeka", "Emma", "Farah", "Felix", "Grace", "Hana", "Hugo", "Ines", "Ivan", "Jonas",
               "Julia", "Kai", "Kenji", "Lars", "Leila", "Liam", "Lucia", "Maya", "Mateo", "Mei", "Nadia",
               "Noah", "Nora", "Olga", "Omar", "Priya", "Rafael", "Rosa", "Sami", "Sofia", "Tariq", "Tomas",
               "Uma", "Victor", "Wen", "Yara", "Yusuf", "Zoe"]
LAST_NAMES = ["Adeyemi", "Alvarez", "Andersen", "Bianchi", "Costa", "Dubois", "Eriksson", "Fischer", "Garcia",
              "Haddad", "Ivanova", "Jansen", "Kim", "Kowalski", "Larsen", "Lopez", "Meyer", "Moreau", "Nakamura",
              "Novak", "Okafor", "Olsen", "Patel", "Petrov", "Quinn", "Rossi", "Santos", "Schmidt", "Silva",
              "Tanaka", "Varga", "Wagner", "Wang", "Weber", "Yilmaz", "Zhang"]
MAIL_DOMAINS = ["example.com", "example.org", "example.net", "mail.example"]
COUNTRIES = [("US", 30), ("GB", 12), ("DE", 12), ("FR", 9), ("NL", 6), ("ES", 6), ("IT", 5), ("SE", 4),
             ("PL", 4), ("BR", 4), ("JP", 4), ("IN", 4)]
CURRENCY_OF = {"US": "usd", "GB": "gbp", "BR": "brl", "JP": "jpy", "IN": "inr", "SE": "sek", "PL": "pln"}
ALNUM = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def iso(ms):
    """A timestamp as Sluice's Value writes it: ISO-8601, six fraction digits, UTC."""
    t = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + "%06d" % ((ms % 1000) * 1000) + "Z"


def lsn_text(lsn):
    return "%X/%X" % (lsn >> 32, lsn & 0xFFFFFFFF)


class Generator:
    def __init__(self):
        self.rng = random.Random(SEED)
        self.changes = []  # (ts_ms, seq, table, op, key, before, after)
        self.seq = 0
        self.used_ids = set()

    def new_id(self, prefix, n):
        while True:
            i = prefix + "".join(self.rng.choice(ALNUM) for _ in range(n))
            if i not in self.used_ids:
                self.used_ids.add(i)
                return i

    def change(self, ts_ms, table, op, key, before, after):
        self.changes.append((ts_ms, self.seq, table, op, key, before, after))
        self.seq += 1

    def email(self, first, last):
        return "%s.%s%d@%s" % (first.lower(), last.lower(), self.rng.randint(1, 99),
                               self.rng.choice(MAIL_DOMAINS))

    def country(self):
        names, weights = zip(*COUNTRIES)
        return self.rng.choices(names, weights)[0]

    def new_customer(self):
        first, last = self.rng.choice(FIRST_NAMES), self.rng.choice(LAST_NAMES)
        return {"id": self.new_id("cus_", 14), "name": "%s %s" % (first, last), "email": self.email(first, last),
                "country": self.country()}

    def run(self):
        rng = self.rng
        snapshot_ms = T0_MS
        # Customers: the snapshot, then sign-ups spread over the week.
        customers = []  # [row (the latest state), active_from_ms, erased_at_ms, (update_ms, kind)...]
        snapshot_rows = []
        for _ in range(SNAPSHOT_CUSTOMERS):
            row = self.new_customer()
            customers.append([row, snapshot_ms, None])
            snapshot_rows.append(dict(row))
        for _ in range(SIGNUPS):
            row = self.new_customer()
            t = T0_MS + rng.randint(60_000, WINDOW_MS // 2)
            customers.append([row, t, None])
            self.change(t, "public.customers", "c", {"id": row["id"]}, None, dict(row))
        # Erasures (GDPR) in the last day, of customers from the snapshot.
        for c in rng.sample(customers[:SNAPSHOT_CUSTOMERS], ERASURES):
            c[2] = T0_MS + WINDOW_MS - rng.randint(3600_000, 20 * 3600_000)

        # Charges: created at a time the customer exists; then paid (most), failed, or still pending; some paid
        # charges are refunded later. Every step happens before the customer is erased.
        for _ in range(CHARGES):
            while True:
                cust, active_from, erased_at = rng.choice(customers)
                created = rng.randint(max(active_from, T0_MS) + 30_000, T0_MS + WINDOW_MS - 3600_000)
                if erased_at is None or created < erased_at - 3600_000:
                    break
            currency = CURRENCY_OF.get(cust["country"], "eur" if cust["country"] in
                                       ("DE", "FR", "NL", "ES", "IT") else "usd")
            if currency == "jpy":
                amount = rng.choice([500, 980, 1500, 3000, 4800, 9800, 12000])  # yen have no minor unit
            else:
                amount = rng.choice([499, 999, 1299, 1999, 2499, 4900, 9900, 14999]) if rng.random() < 0.7 \
                    else rng.randint(100, 50_000)
            row = {"id": self.new_id("ch_", 16), "customer_id": cust["id"], "amount_cents": amount,
                   "currency": currency, "status": "created", "updated_at": iso(created)}
            key = {"id": row["id"]}
            self.change(created, "public.charges", "c", key, None, dict(row))
            r = rng.random()
            if r < 0.86:
                nxt, t = "paid", created + rng.randint(800, 25_000)
            elif r < 0.97:
                nxt, t = "failed", created + rng.randint(1_500, 40_000)
            else:
                continue  # still pending at the end of the data
            before, row = dict(row), dict(row, status=nxt, updated_at=iso(t))
            self.change(t, "public.charges", "u", key, before, dict(row))
            if nxt == "paid" and rng.random() < 0.07:
                end = erased_at if erased_at is not None else T0_MS + WINDOW_MS
                t = min(t + rng.randint(600_000, 5 * 24 * 3600_000), end - 60_000)
                before, row = dict(row), dict(row, status="refunded", updated_at=iso(t))
                self.change(t, "public.charges", "u", key, before, dict(row))

        # Customer updates (email, country), at times the customer exists; then the erasures.
        for kind, n in (("email", EMAIL_UPDATES), ("country", COUNTRY_UPDATES)):
            for c in rng.sample(customers, n):
                lo = max(c[1], T0_MS) + 60_000
                hi = (c[2] or T0_MS + WINDOW_MS) - 60_000
                c.append((rng.randint(lo, hi), kind))
        for c in customers:
            row = c[0]
            for t, kind in sorted(c[3:]):
                before = dict(row)
                if kind == "email":
                    first, last = row["name"].split(" ", 1)
                    row = dict(row, email=self.email(first, last))
                else:
                    row = dict(row, country=rng.choice([n for n, _ in COUNTRIES if n != row["country"]]))
                c[0] = row
                self.change(t, "public.customers", "u", {"id": row["id"]}, before, dict(row))
            if c[2] is not None:
                self.change(c[2], "public.customers", "d", {"id": row["id"]}, dict(row), None)
        return snapshot_rows, snapshot_ms

    def envelopes(self):
        snapshot_rows, snapshot_ms = self.run()
        rng = self.rng
        lsn = FIRST_LSN
        out = {"public.customers": [], "public.charges": []}
        # The snapshot: op r, position = the slot's consistent point, ts_ms = the snapshot's start, no txn_id.
        for r in snapshot_rows:
            out["public.customers"].append({
                "op": "r", "key": {"id": r["id"]}, "before": None, "after": r,
                "source": {"connector": "postgres", "db": "payments", "collection": "public.customers",
                           "position": lsn_text(lsn), "ts_ms": snapshot_ms, "snapshot": True}})
        txn = FIRST_TXN
        for ts, seq, table, op, key, before, after in sorted(self.changes, key=lambda c: (c[0], c[1])):
            lsn += rng.randint(0x180, 0x2400)
            txn += rng.randint(1, 3)
            change_lsn = lsn - rng.randint(0x38, 0x160)  # the change's own WAL record precedes the commit record
            out[table].append({
                "op": op, "key": key, "before": before, "after": after,
                "source": {"connector": "postgres", "db": "payments", "collection": table,
                           "position": lsn_text(lsn), "ts_ms": ts, "snapshot": False, "txn_id": txn,
                           "sequence": change_lsn}})
        return out


def write_lines(path, events, extra=None):
    # Written to a temporary file and renamed, so an interrupted run never leaves half a file behind.
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for i, e in enumerate(events):
            if extra is not None and i == extra[0]:
                f.write(extra[1] + "\n")
            f.write(json.dumps(e, separators=(",", ":"), ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    args = ap.parse_args()
    out = Generator().envelopes()

    clean = os.path.join(args.out, "payments")
    os.makedirs(clean, exist_ok=True)
    write_lines(os.path.join(clean, "customers.jsonl"), out["public.customers"])
    write_lines(os.path.join(clean, "charges.jsonl"), out["public.charges"])

    # A small subset with one malformed line (a change event cut off mid-line, as a truncated copy leaves it),
    # for dead-letter demos and tests: 20 customers and the first 60 charge events, the bad line the 31st line.
    bad = os.path.join(args.out, "payments-with-bad-line")
    os.makedirs(bad, exist_ok=True)
    write_lines(os.path.join(bad, "customers.jsonl"), out["public.customers"][:20])
    charges = out["public.charges"][:60]
    cut = json.dumps(charges[30], separators=(",", ":"))
    write_lines(os.path.join(bad, "charges.jsonl"), charges, extra=(30, cut[:len(cut) * 2 // 3]))

    for table, events in out.items():
        ops = {}
        for e in events:
            ops[e["op"]] = ops.get(e["op"], 0) + 1
        print("%s: %d events %s" % (table, len(events), dict(sorted(ops.items()))))


if __name__ == "__main__":
    main()
