// Type definitions for Sluice functions (docs/functions.md). Import them in a function module:
//   import type { ChangeEvent, FunctionResult } from "<path to sluice>/runtime/node/sluice";
// (or copy this file next to the module). They describe what the Node.js worker passes to the function: the
// change-event envelope of docs/cdc.md in its JSON form, after the transform's filter and projection.

/** The kind of change: c(reate), u(pdate), d(elete), r(ead, an initial snapshot row). */
export type ChangeOp = "c" | "u" | "d" | "r";

/**
 * A value of a row image as JSON carries it: strings, numbers, booleans, null, arrays, objects. Sluice's own
 * kinds arrive as: timestamp -> ISO-8601 string ("2024-01-02T03:04:05.123456Z"); decimal -> a number (a
 * JavaScript number holds ~15-17 significant digits: beyond that, pass the column through CAST(... AS STRING)
 * in the projection); bytes -> base64 string; NaN / ±infinity -> "NaN", "Infinity", "-Infinity".
 */
export type JsonValue = string | number | boolean | null | JsonValue[] | { [field: string]: JsonValue };

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
