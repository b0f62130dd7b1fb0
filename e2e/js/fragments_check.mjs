// Checks server/pyodide_app/fragments.js under Node: round trips of many sizes, and refusals of
// fragment streams an ordered, reliable channel cannot produce. Prints one JSON line.
//   node e2e/js/fragments_check.mjs
import { readFile } from "node:fs/promises";

const source = await readFile(new URL("../../server/pyodide_app/fragments.js", import.meta.url), "utf8");
const F = await import(`data:text/javascript,${encodeURIComponent(source)}`);
const results = [];

function check(name, fn) {
  try {
    fn();
    results.push({ name, ok: true });
  } catch (err) {
    results.push({ name, ok: false, error: String(err && err.stack || err) });
  }
}

function expectThrow(fn, what) {
  try {
    fn();
  } catch (err) {
    if (err instanceof F.FragmentError) return;
    throw err;
  }
  throw new Error(`expected a FragmentError: ${what}`);
}

function message(n, seed) {
  const out = new Uint8Array(n);
  let x = seed >>> 0;
  for (let i = 0; i < n; i++) {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    out[i] = x >>> 24;
  }
  return out;
}

function fragmentsOf(bytes, id) {
  const count = F.fragmentCount(bytes.byteLength);
  return Array.from({ length: count }, (_, i) => F.fragment(bytes, id, i).buffer);
}

const FR = F.FRAGMENT_BYTES;
for (const n of [0, 1, FR - 1, FR, FR + 1, 3 * FR, (1 << 20) + 3]) {
  check(`round trip of ${n} bytes`, () => {
    const bytes = message(n, n + 7);
    const frags = fragmentsOf(bytes, 42);
    if (frags.some((f) => f.byteLength > FR + F.HEADER_BYTES)) throw new Error("fragment too big");
    const r = new F.Reassembler();
    let whole = null;
    frags.forEach((f, i) => {
      const got = r.push(f);
      if ((got !== null) !== (i === frags.length - 1)) throw new Error(`early/late message at ${i}`);
      whole = got ?? whole;
    });
    const out = new Uint8Array(whole);
    if (out.length !== n || out.some((v, i) => v !== bytes[i])) throw new Error("bytes differ");
  });
}

check("messages one after another", () => {
  const r = new F.Reassembler();
  const a = message(FR + 5, 1), b = message(10, 2);
  for (const f of fragmentsOf(a, 1).slice(0, -1)) r.push(f);
  const first = r.push(fragmentsOf(a, 1).at(-1));
  const second = r.push(fragmentsOf(b, 2)[0]);
  if (new Uint8Array(first).length !== a.length || new Uint8Array(second)[9] !== b[9]) {
    throw new Error("wrong messages");
  }
});

const big = message(3 * FR, 9);
check("a skipped fragment is refused", () => {
  const r = new F.Reassembler();
  const frags = fragmentsOf(big, 5);
  r.push(frags[0]);
  expectThrow(() => r.push(frags[2]), "skipped fragment");
});
check("a fragment of another message mid-way is refused", () => {
  const r = new F.Reassembler();
  r.push(fragmentsOf(big, 5)[0]);
  expectThrow(() => r.push(fragmentsOf(big, 6)[1]), "foreign id");
  const r2 = new F.Reassembler();
  r2.push(fragmentsOf(big, 5)[0]);
  expectThrow(() => r2.push(fragmentsOf(big, 6)[0]), "new message inside another");
});
check("a truncated fragment is refused", () => {
  const r = new F.Reassembler();
  const f = fragmentsOf(big, 5)[0];
  expectThrow(() => r.push(f.slice(0, f.byteLength - 1)), "short body");
  expectThrow(() => new F.Reassembler().push(new ArrayBuffer(3)), "short header");
});
check("a message over the size limit is refused before allocation", () => {
  const r = new F.Reassembler(1000);
  expectThrow(() => r.push(fragmentsOf(message(1001, 3), 1)[0]), "too large");
});
check("a count that does not fit the size is refused", () => {
  const f = new Uint8Array(fragmentsOf(message(10, 4), 1)[0]);
  new DataView(f.buffer).setUint32(8, 2, true);
  expectThrow(() => new F.Reassembler().push(f.buffer), "bad count");
});

console.log(JSON.stringify(results));
