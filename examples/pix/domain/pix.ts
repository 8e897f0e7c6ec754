// The Pix BR Code ("copia e cola"): an EMV QR Code merchant-presented payload (EMV MPM) with the Pix GUI, as the
// Banco Central do Brasil's "Manual de Padrões para Iniciação do Pix" specifies. Every field is a TLV: a two-digit
// id, a two-digit length and the value; the payload closes with field 63, the CRC16-CCITT-FALSE (polynomial 0x1021,
// initial value 0xFFFF) over the whole payload including "6304", as four upper-case hex digits.
import { crc16ccitt } from "crc";

export interface PixCharge {
  /** the receiver's Pix key (e-mail, phone, CPF/CNPJ or random key) */
  key: string;
  /** amount in cents; omitted from the code when 0 (the payer types it) */
  amountCents: number;
  merchantName: string;
  merchantCity: string;
  /** the transaction id: up to 25 letters and digits; "***" when none */
  txid: string;
}

function field(id: string, value: string): string {
  if (value.length > 99) throw new RangeError(`BR Code field ${id} is ${value.length} characters long (max 99)`);
  return id + String(value.length).padStart(2, "0") + value;
}

/** Upper-case ASCII without accents, as payment apps expect in names and cities. */
function plain(text: string, max: number): string {
  return text
    .normalize("NFD")
    .replace(/[\u0300-\u036f]/g, "")
    .replace(/[^A-Za-z0-9 ]/g, "")
    .toUpperCase()
    .slice(0, max);
}

export function crc16(payload: string): string {
  return crc16ccitt(payload).toString(16).toUpperCase().padStart(4, "0");
}

export function brCode(c: PixCharge): string {
  const txid = c.txid.replace(/[^A-Za-z0-9]/g, "").slice(0, 25) || "***";
  let payload =
    field("00", "01") +
    field("26", field("00", "br.gov.bcb.pix") + field("01", c.key)) +
    field("52", "0000") +
    field("53", "986") +
    (c.amountCents > 0 ? field("54", (c.amountCents / 100).toFixed(2)) : "") +
    field("58", "BR") +
    field("59", plain(c.merchantName, 25)) +
    field("60", plain(c.merchantCity, 15)) +
    field("62", field("05", txid)) +
    "6304";
  return payload + crc16(payload);
}
