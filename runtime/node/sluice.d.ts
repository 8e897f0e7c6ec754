// Type definitions for Sluice functions (docs/functions.md). Import them in a function module:
//   import type { ChangeEvent, FunctionResult } from "<path to sluice>/runtime/node/sluice";
// (or copy this file next to the module). They describe what the Node.js worker passes to the function: the
// change-event envelope of docs/cdc.md in its JSON form, after the transform's filter and projection.

/** The kind of change: c(reate), u(pdate), d(elete), r(ead, an initial snapshot row). */
export type ChangeOp = "c" | "u" | "d" | "r";

/**
 * An exact decimal (Sluice's decimal kind, e.g. a Postgres `numeric`: up to 38 significant digits, which a
 * JavaScript number cannot hold). The worker passes every decimal as a Decimal and sends a returned Decimal back
 * exactly. `text` (and `String(d)`) is the exact value, e.g. "12345678901234567890.123456789"; arithmetic and
 * comparisons (`d * 2`, `d > 1`) go through `valueOf()`, the nearest number, so compute exact results from `text`
 * (or with a decimal library) and return `new SluiceDecimal(text)`. Returning the plain object
 * `{ $decimal: "<digits>" }` is the same; an object whose only field is `$decimal` is reserved for this.
 */
export declare class Decimal {
  constructor(text: string);
  /** The exact value as a JSON number literal: "-123.4500", "1E+3". */
  readonly text: string;
  toString(): string;
  /** The nearest JavaScript number (inexact beyond ~15-17 significant digits). */
  valueOf(): number;
  toJSON(): { $decimal: string };
}

declare global {
  /** The worker's Decimal class (there is nothing to import at run time): `new SluiceDecimal("1.10")`. */
  // eslint-disable-next-line no-var
  var SluiceDecimal: typeof Decimal;
}

/**
 * A value of a row image: strings, numbers, booleans, null, arrays, objects, and exact decimals. Sluice's own
 * kinds arrive as: decimal -> Decimal (above); timestamp -> ISO-8601 string ("2024-01-02T03:04:05.123456Z");
 * bytes -> base64 string; NaN / ±infinity -> "NaN", "Infinity", "-Infinity". An int64 beyond ±2^53 arrives as
 * a number and loses digits (as in any JSON.parse): CAST it to STRING in the projection.
 */
export type JsonValue = string | number | boolean | null | Decimal | JsonValue[] | { [field: string]: JsonValue };

/** A row image: column (or document field) -> value. */
export type Row = { [field: string]: JsonValue };

/** Where the change comes from (docs/cdc.md "source"). */
export interface SourceInfo {
  /** "postgres" | "mongodb" | "kafka" | "files" | "datagen" */
  connector: string;
  /** the database */
  db: string;
  /** the table ("schema.table") or collection */
  collection: string;
  /** the source position of the change (an LSN, a resume token, "partition:offset" ...) */
  position: string;
  /** the source's commit time, ms since the epoch */
  ts_ms: number;
  /** true for rows of the initial snapshot */
  snapshot: boolean;
  /** the transaction id, when the source knows it */
  txn_id?: number | string | null;
  /** the change's index within its transaction or position */
  sequence?: number;
  [field: string]: JsonValue | undefined;
}

/** The change event a function receives (the envelope of docs/cdc.md). */
export interface ChangeEvent<After extends Row = Row, Before extends Row = Row> {
  op: ChangeOp;
  /** the key fields of the row or document */
  key: Row;
  /** the row before the change, when the source knows it (deletes; updates with full replica identity) */
  before: Before | null;
  /** the row after the change (null for deletes) */
  after: After | null;
  source: SourceInfo;
  [field: string]: JsonValue | undefined;
}

/**
 * What a function returns:
 *  - an object: one domain event; it becomes the event's payload (unless the transform sets `event.payload`) and
 *    is `result` in the transform's `key` and `event` expressions (e.g. `type: "result.type"`);
 *  - null (or undefined): no event for this change;
 *  - a list of objects: one event each, in list order.
 * A Promise of any of these is awaited. A thrown error is a bad record (the pipeline's dead-letter policy).
 */
export type FunctionResult = Row | null | undefined | Row[];

/** The shape of an exported function: `export function chargeEvent(change: ChangeEvent): FunctionResult`. */
export type SluiceFunction<After extends Row = Row, Before extends Row = Row> = (
  change: ChangeEvent<After, Before>,
) => FunctionResult | Promise<FunctionResult>;
