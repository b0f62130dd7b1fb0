// Messages of any size over a WebRTC data channel: 48 KiB fragments with a 16-byte header.
//
// Header (little-endian u32 each): message id, fragment index, fragment count, message bytes.
// The channel is ordered and reliable, so fragments of one message arrive in order and
// messages do not interleave; the header lets the receiver check that instead of trusting
// it. Pure (no DOM, no WebRTC): the same module runs in the page and under Node tests.

export const FRAGMENT_BYTES = 48 * 1024;
export const HEADER_BYTES = 16;
export const MAX_MESSAGE_BYTES = 1 << 30;

export class FragmentError extends Error {}

export function fragmentCount(total) {
  return Math.max(1, Math.ceil(total / FRAGMENT_BYTES));
}

// Fragment `index` of `message` (a Uint8Array): header + a copy of its slice, ready to send.
export function fragment(message, id, index) {
  const total = message.byteLength;
  const start = index * FRAGMENT_BYTES;
  const end = Math.min(start + FRAGMENT_BYTES, total);
  const out = new Uint8Array(HEADER_BYTES + (end - start));
  const head = new DataView(out.buffer);
  head.setUint32(0, id >>> 0, true);
  head.setUint32(4, index, true);
  head.setUint32(8, fragmentCount(total), true);
  head.setUint32(12, total, true);
  out.set(message.subarray(start, end), HEADER_BYTES);
  return out;
}

// Collects the fragments of one message at a time into a buffer of the announced size.
export class Reassembler {
  constructor(maxBytes = MAX_MESSAGE_BYTES) {
    this.maxBytes = maxBytes;
    this.current = null; // {id, count, total, next, bytes}
  }

  // Takes one fragment (ArrayBuffer); returns the whole message's ArrayBuffer when complete,
  // else null. Throws FragmentError on anything an ordered reliable channel cannot produce.
  push(buffer) {
    if (buffer.byteLength < HEADER_BYTES) throw new FragmentError("fragment shorter than its header");
    const head = new DataView(buffer, 0, HEADER_BYTES);
    const id = head.getUint32(0, true);
    const index = head.getUint32(4, true);
    const count = head.getUint32(8, true);
    const total = head.getUint32(12, true);
    const body = new Uint8Array(buffer, HEADER_BYTES);
    if (index === 0) {
      if (this.current) throw new FragmentError(`message ${id} began inside message ${this.current.id}`);
      if (total > this.maxBytes) throw new FragmentError(`message of ${total} bytes exceeds ${this.maxBytes}`);
      if (count !== fragmentCount(total)) throw new FragmentError(`message ${id}: ${count} fragments cannot hold ${total} bytes`);
      this.current = { id, count, total, next: 0, bytes: new Uint8Array(total) };
    }
    const cur = this.current;
    if (!cur || id !== cur.id || index !== cur.next || count !== cur.count || total !== cur.total) {
      throw new FragmentError(`unexpected fragment ${index}/${count} of message ${id}`);
    }
    const start = index * FRAGMENT_BYTES;
    if (body.byteLength !== Math.min(FRAGMENT_BYTES, total - start)) {
      throw new FragmentError(`fragment ${index} of message ${id} has ${body.byteLength} bytes`);
    }
    cur.bytes.set(body, start);
    cur.next += 1;
    if (cur.next < cur.count) return null;
    this.current = null;
    return cur.bytes.buffer;
  }
}
