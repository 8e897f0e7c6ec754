// The charge-events function of examples/pix: the domain event of a charge, with the Pix BR Code of a paid one.
import type { ChangeEvent, FunctionResult } from "../../../runtime/node/sluice";
import { brCode } from "./pix";

interface Charge {
  id: string;
  customer_id: string;
  status: string;
  amount: number; // cents
  pix_key: string;
  merchant_name: string;
  merchant_city: string;
}

export function chargeEvent(change: ChangeEvent): FunctionResult {
  const charge = (change.op === "d" ? change.before : change.after) as unknown as Charge | null;
  if (charge === null) return null;
  const event: Record<string, string | number> = {
    chargeId: charge.id,
    customerId: charge.customer_id,
    status: charge.status,
    amountCents: charge.amount,
  };
  if (change.op !== "d" && charge.status === "paid") {
    event.brCode = brCode({
      key: charge.pix_key,
      amountCents: charge.amount,
      merchantName: charge.merchant_name,
      merchantCity: charge.merchant_city,
      txid: charge.id,
    });
  }
  return event;
}
