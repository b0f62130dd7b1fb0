// DaisyChain inference kit: the int8 forward of pynode/run/generate.py in plain JavaScript,
// bit for bit. Every float32 operation is a double operation rounded once by Math.fround
// (for + - * / and sqrt of float32 operands that is the correctly rounded float32 result);
// float64 kernels (exp, the GELU's erfcx, the softmax) are the same operations in the same
// order as pynode/core/fastmath.py; sums are detmath.psum's pairwise tree; the GEMMs are
// exact integer sums; sampling draws from the project RNG (BLAKE2b key, Philox4x32-10).
"use strict";

const fr = Math.fround;
const EPS = fr(1e-5);
const TINY = fr(2 ** -149);
const LN2_HI = 6.93147180369123816490e-01;
const LN2_LO = 1.90821492927058770002e-10;
const INV_LN2 = 1.44269504088896338700e00;
const EXP_TAYLOR = [1, 1, 1 / 2, 1 / 6, 1 / 24, 1 / 120, 1 / 720, 1 / 5040, 1 / 40320];
const ERFCX_P = 0.4;
const ERFCX_T0 = 0.5757575757575757;
const ERFCX = [0.27336487884048205, 0.9143783942422475, 1.2566485830126335, 1.1995715805774807,
  0.6710284967800975, 0.039083649605887526, -0.2164488676838597, -0.06489697154639869,
  0.08704013753596564, 0.027821544842338747, -0.032855826106540253];
const SQRT1_2 = 0.70710678118654752440;
const SAMPLE_PURPOSE = 0x5a3d;
const POW2 = new Map(); // 2**k, k integer, exact

function pow2(k) {
  if (!POW2.has(k)) {
    let v = 1;
    for (let i = 0; i < Math.abs(k); i++) v = k < 0 ? v / 2 : v * 2;
    POW2.set(k, v);
  }
  return POW2.get(k);
}

function rint(x) { // round half to even, as numpy's rint
  const f = Math.floor(x);
  const d = x - f;
  if (d < 0.5) return f;
  if (d > 0.5) return f + 1;
  return f % 2 === 0 ? f : f + 1;
}

function psum(values, f32) { // detmath.psum: element i += element i + ceil(n/2), level by level
  const t = Array.from(values);
  let n = t.length;
  if (n === 0) return 0;
  while (n > 1) {
    const half = (n + 1) >> 1;
    for (let i = 0; i < n - half; i++) t[i] = f32 ? fr(t[i] + t[i + half]) : t[i] + t[i + half];
    n = half;
  }
  return t[0];
}

function hornerFast(z, c) { // fastmath._horner
  let acc = z * c[c.length - 1];
  acc += c[c.length - 2];
  for (let i = c.length - 3; i >= 0; i--) {
    acc *= z;
    acc += c[i];
  }
  return acc;
}

function expNeg(y) { // fastmath._exp_neg, y <= 0 finite
  y = Math.max(y, -110.0);
  const k = rint(y * INV_LN2);
  let r = y - k * LN2_HI;
  r -= k * LN2_LO;
  return hornerFast(r, EXP_TAYLOR) * pow2(k);
}

function gelu(x) { // fastmath._gelu_chunk's value, rounded to float32
  let halfSq = x * x;
  halfSq *= -0.5;
  const e = expNeg(halfSq);
  let b = Math.abs(x);
  b *= SQRT1_2;
  let t = b * ERFCX_P;
  t += 1.0;
  t = 1.0 / t;
  t -= ERFCX_T0;
  let tail = hornerFast(t, ERFCX);
  tail *= e;
  tail *= 0.5;
  const cdf = x > 0.0 ? 1.0 - tail : tail;
  return fr(cdf * x);
}

// Softmax of float32 values over the entries where `keep` is true (others exactly 0), the
// sum over all n entries: fastmath.softmax_rows of one row.
function softmaxRow(row, keep) {
  let top = -Infinity;
  for (let i = 0; i < row.length; i++) if (keep(i) && row[i] > top) top = row[i];
  const e = new Float64Array(row.length);
  for (let i = 0; i < row.length; i++) e[i] = keep(i) ? expNeg(row[i] - top) : 0;
  const total = psum(e, false);
  return Float32Array.from(e, (v) => v / total);
}

// ---------------------------------------------------------------- int8 products

function scaleOf(absmax) {
  if (absmax === 0) return 1;
  const s = fr(absmax / 127);
  return s === 0 ? TINY : s;
}

function quantize(get, count, length) { // `count` vectors of `length`: get(i, j) -> float32
  const q = new Int8Array(count * length);
  const s = new Float32Array(count);
  for (let i = 0; i < count; i++) {
    let absmax = 0;
    for (let j = 0; j < length; j++) absmax = Math.max(absmax, Math.abs(get(i, j)));
    const scale = scaleOf(absmax);
    s[i] = scale;
    for (let j = 0; j < length; j++) {
      const t = Math.min(127, Math.max(-127, fr(get(i, j) / scale)));
      q[i * length + j] = rint(t);
    }
  }
  return { q, s };
}

// rows (M x K) times the quantized columns {q: N x K, s: N}; -> M x N float32
function product(a, m, k, cols, n, colScale = null) {
  const qa = quantize((i, j) => a[i * k + j], m, k);
  const out = new Float32Array(m * n);
  for (let i = 0; i < m; i++) {
    for (let j = 0; j < n; j++) {
      let acc = 0;
      for (let t = 0; t < k; t++) acc += qa.q[i * k + t] * cols.q[j * k + t];
      out[i * n + j] = fr(fr(fr(acc) * qa.s[i]) * (colScale ? colScale[j] : cols.s[j]));
    }
  }
  return out;
}

// ---------------------------------------------------------------- the model

class Model {
  constructor(config, weights) {
    this.c = config;
    this.p = weights;
    this.dh = config.width / config.heads;
    this.colsCache = new Map();
  }

  cols(name, transposed = false) { // a weight's columns quantized once (the same bits each call)
    const key = name + (transposed ? ".T" : "");
    if (!this.colsCache.has(key)) {
      const [rows, cols] = this.c.shapes[name];
      const w = this.p[name];
      this.colsCache.set(key, transposed ? quantize((i, j) => w[i * cols + j], rows, cols)
        : quantize((i, j) => w[j * cols + i], cols, rows));
    }
    return this.colsCache.get(key);
  }

  linear(x, m, name) {
    const [k, n] = this.c.shapes[name];
    return product(x, m, k, this.cols(name), n);
  }

  rmsnorm(x, m, name) {
    const d = this.c.width;
    const g = this.p[name];
    const out = new Float32Array(m * d);
    for (let i = 0; i < m; i++) {
      const sq = [];
      for (let j = 0; j < d; j++) sq.push(fr(x[i * d + j] * x[i * d + j]));
      const r = fr(1 / Math.sqrt(fr(fr(psum(sq, true) / d) + EPS)));
      for (let j = 0; j < d; j++) out[i * d + j] = fr(fr(x[i * d + j] * r) * g[j]);
    }
    return out;
  }

  reset() {
    const { layers, heads, seq } = this.c;
    this.length = 0;
    // per (layer, head): keys quantized per position (int8, scale), values as float32
    this.keys = Array.from({ length: layers * heads },
      () => ({ q: new Int8Array(seq * this.dh), s: new Float32Array(seq) }));
    this.values = Array.from({ length: layers * heads }, () => new Float32Array(seq * this.dh));
  }

  feed(tokens) { // append tokens to the window; the logits of the last one (V,) float32
    const { width: d, layers, vocab } = this.c;
    const n = tokens.length;
    const start = this.length;
    let x = new Float32Array(n * d);
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < d; j++) {
        x[i * d + j] = fr(this.p.wte[tokens[i] * d + j] + this.p.wpe[(start + i) * d + j]);
      }
    }
    for (let l = 0; l < layers; l++) x = this.block(l, x, n, start);
    this.length = start + n;
    const h = this.rmsnorm(x.subarray((n - 1) * d), 1, "lnf.g");
    return product(h, 1, d, this.cols("wte", true), vocab);
  }

  block(l, x, n, start) {
    const d = this.c.width;
    const pre = `h.${l}.`;
    const qkv = this.linear(this.rmsnorm(x, n, pre + "ln1.g"), n, pre + "attn.qkv");
    const a = this.attend(l, qkv, n, start);
    const y = this.linear(a, n, pre + "attn.proj");
    const x2 = Float32Array.from(x, (v, i) => fr(v + y[i]));
    const u = this.linear(this.rmsnorm(x2, n, pre + "ln2.g"), n, pre + "mlp.fc");
    const y2 = this.linear(u.map(gelu), n, pre + "mlp.proj");
    return Float32Array.from(x2, (v, i) => fr(v + y2[i]));
  }

  attend(l, qkv, n, start) {
    const { width: d, heads, seq } = this.c;
    const dh = this.dh;
    const end = start + n;
    const scale = fr(1 / Math.sqrt(dh));
    const out = new Float32Array(n * d);
    for (let h = 0; h < heads; h++) {
      const cache = this.keys[l * heads + h];
      const values = this.values[l * heads + h];
      for (let i = 0; i < n; i++) { // the new keys (quantized per key) and values
        const k = quantize((_, j) => qkv[i * 3 * d + d + h * dh + j], 1, dh);
        cache.q.set(k.q, (start + i) * dh);
        cache.s[start + i] = k.s[0];
        for (let j = 0; j < dh; j++) {
          values[(start + i) * dh + j] = qkv[i * 3 * d + 2 * d + h * dh + j];
        }
      }
      const q = new Float32Array(n * dh);
      for (let i = 0; i < n; i++) {
        for (let j = 0; j < dh; j++) q[i * dh + j] = qkv[i * 3 * d + h * dh + j];
      }
      const keyCols = { q: cache.q.subarray(0, end * dh), s: cache.s.subarray(0, end) };
      const scores = product(q, n, dh, keyCols, end);
      const v = quantize((i, j) => values[i * dh + j], end, dh); // per key position
      const vCols = { q: new Int8Array(dh * end), s: null };
      for (let t = 0; t < end; t++) {
        for (let j = 0; j < dh; j++) vCols.q[j * end + t] = v.q[t * dh + j];
      }
      for (let i = 0; i < n; i++) {
        const row = new Float32Array(seq);
        for (let t = 0; t < end; t++) row[t] = fr(scores[i * end + t] * scale);
        const p = softmaxRow(row, (t) => t <= start + i);
        const pv = new Float32Array(end);
        for (let t = 0; t < end; t++) pv[t] = fr(p[t] * v.s[t]);
        const o = product(pv, 1, end, vCols, dh, new Float32Array(dh).fill(1));
        for (let j = 0; j < dh; j++) out[i * d + h * dh + j] = o[j];
      }
    }
    return out;
  }
}

// ---------------------------------------------------------------- the project RNG

const M64 = (1n << 64n) - 1n;
const BLAKE_IV = [0x6a09e667f3bcc908n, 0xbb67ae8584caa73bn, 0x3c6ef372fe94f82bn,
  0xa54ff53a5f1d36f1n, 0x510e527fade682d1n, 0x9b05688c2b3e6c1fn, 0x1f83d9abfb41bd6bn,
  0x5be0cd19137e2179n];
const SIGMA = [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
  [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3], [11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4],
  [7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8], [9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13],
  [2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9], [12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11],
  [13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10], [6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5],
  [10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0]];

function word64(bytes, at) {
  let w = 0n;
  for (let i = 7; i >= 0; i--) w = (w << 8n) | BigInt(bytes[at + i] ?? 0);
  return w;
}

function rotr(x, n) {
  return ((x >> BigInt(n)) | (x << BigInt(64 - n))) & M64;
}

function blake2b(data, outLength, personal) { // no key, no salt
  const h = BLAKE_IV.slice();
  h[0] ^= 0x01010000n ^ BigInt(outLength);
  const person = new Uint8Array(16);
  person.set(personal);
  h[6] ^= word64(person, 0);
  h[7] ^= word64(person, 8);
  const blocks = Math.max(1, Math.ceil(data.length / 128));
  for (let b = 0; b < blocks; b++) {
    const block = new Uint8Array(128);
    block.set(data.subarray(b * 128, b * 128 + 128));
    const m = Array.from({ length: 16 }, (_, i) => word64(block, 8 * i));
    const v = [...h, ...BLAKE_IV];
    v[12] ^= BigInt(Math.min(data.length, (b + 1) * 128));
    if (b === blocks - 1) v[14] ^= M64;
    const g = (a, bb, c, d, x, y) => {
      v[a] = (v[a] + v[bb] + x) & M64; v[d] = rotr(v[d] ^ v[a], 32);
      v[c] = (v[c] + v[d]) & M64; v[bb] = rotr(v[bb] ^ v[c], 24);
      v[a] = (v[a] + v[bb] + y) & M64; v[d] = rotr(v[d] ^ v[a], 16);
      v[c] = (v[c] + v[d]) & M64; v[bb] = rotr(v[bb] ^ v[c], 63);
    };
    for (let r = 0; r < 12; r++) {
      const s = SIGMA[r % 10];
      g(0, 4, 8, 12, m[s[0]], m[s[1]]); g(1, 5, 9, 13, m[s[2]], m[s[3]]);
      g(2, 6, 10, 14, m[s[4]], m[s[5]]); g(3, 7, 11, 15, m[s[6]], m[s[7]]);
      g(0, 5, 10, 15, m[s[8]], m[s[9]]); g(1, 6, 11, 12, m[s[10]], m[s[11]]);
      g(2, 7, 8, 13, m[s[12]], m[s[13]]); g(3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
    for (let i = 0; i < 8; i++) h[i] ^= v[i] ^ v[i + 8];
  }
  const out = new Uint8Array(outLength);
  for (let i = 0; i < outLength; i++) out[i] = Number((h[i >> 3] >> BigInt(8 * (i & 7))) & 0xffn);
  return out;
}

function canonicalKey(key) { // rng._canonical_key
  const bytes = [];
  const le8 = (n) => {
    for (let i = 0; i < 8; i++) bytes.push(Number((BigInt(n) >> BigInt(8 * i)) & 0xffn));
  };
  le8(key.length);
  for (const part of key) {
    let v = BigInt(part);
    const raw = [];
    while (v > 0n) { raw.push(Number(v & 0xffn)); v >>= 8n; }
    le8(raw.length);
    bytes.push(...raw);
  }
  return new Uint8Array(bytes);
}

function mul32(a, b) { // [hi, lo] of a * b, 32-bit words
  const p = BigInt(a) * BigInt(b);
  return [Number(p >> 32n), Number(p & 0xffffffffn)];
}

function firstBits64(key) { // rng.bits64(key, 1)[0] as a BigInt
  const d = blake2b(canonicalKey(key), 16, new TextEncoder().encode("daisychain.rng1"));
  const w = [0, 4, 8, 12].map(
    (i) => (d[i] | (d[i + 1] << 8) | (d[i + 2] << 16) | (d[i + 3] << 24)) >>> 0);
  let [k0, k1] = [w[0], w[1]];
  let [c0, c1, c2, c3] = [0, 0, w[2], w[3]];
  for (let round = 0; round < 10; round++) {
    if (round) {
      k0 = (k0 + 0x9e3779b9) >>> 0;
      k1 = (k1 + 0xbb67ae85) >>> 0;
    }
    const [h0, l0] = mul32(c0, 0xd2511f53);
    const [h1, l1] = mul32(c2, 0xcd9e8d57);
    [c0, c1, c2, c3] = [(h1 ^ c1 ^ k0) >>> 0, l1 >>> 0, (h0 ^ c3 ^ k1) >>> 0, l0 >>> 0];
  }
  return (BigInt(c0) << 32n) | BigInt(c1);
}

function randint(key, high) { // rng.randint(key, 1, high)[0]: Lemire's multiply-shift
  return Number((firstBits64(key) * BigInt(high)) >> 64n);
}

// ---------------------------------------------------------------- sampling and the window

function sampleToken(logits, s, position) { // pynode.run.generate.sample_token
  if (s.temperature === 0) {
    let best = 0;
    for (let i = 1; i < logits.length; i++) if (logits[i] > logits[best]) best = i;
    return best;
  }
  const order = Array.from(logits.keys()).sort((a, b) => (logits[b] - logits[a]) || (a - b));
  const k = s.top_k === 0 ? logits.length : Math.min(s.top_k, logits.length);
  const kept = order.slice(0, k).sort((a, b) => a - b);
  const t = fr(s.temperature);
  const scaled = kept.map((i) => fr(logits[i] / t));
  if (!scaled.every(Number.isFinite)) {
    throw new Error(`temperature ${s.temperature} is too small for this model: the logits ` +
      "divided by it overflow float32 (use 0 for greedy, or a larger one)");
  }
  const probs = softmaxRow(scaled, () => true);
  const cumulative = [];
  let total = 0;
  for (const p of probs) cumulative.push(total += Math.floor(p * 2147483648));
  const draw = randint([s.seed, position, SAMPLE_PURPOSE], total);
  return kept[cumulative.findIndex((c) => c > draw)];
}

const TEMPERATURE_MIN = 1.1754943508222875e-38; // generate.TEMPERATURE_MIN: float32's tiny
const TEMPERATURE_MAX = 3.4028234663852886e38; // and its largest

function checkSampling(s) { // Sampling's refusals, in its words (an empty field: NaN)
  for (const name of ["tokens", "top_k", "seed"]) {
    if (!Number.isSafeInteger(s[name]) || s[name] < 0) {
      throw new Error(`${name} must be an integer from 0 to ${Number.MAX_SAFE_INTEGER}, got ${s[name]}`);
    }
  }
  const t = s.temperature;
  if (typeof t !== "number" || !Number.isFinite(t) || t < 0) {
    throw new Error(`temperature must be a finite number >= 0, got ${t}`);
  }
  if (t !== 0 && !(t >= TEMPERATURE_MIN && t <= TEMPERATURE_MAX)) { // a float32 of its own
    throw new Error(`temperature must be 0 (greedy) or a float32 from 1.2e-38 to 3.4e38, got ${t}`);
  }
}

function* generate(model, prompt, s) { // Generator.generate: bytes one by one
  checkSampling(s);
  if (!prompt.length) throw new Error("the prompt is empty: give at least one byte to continue");
  const seq = model.c.seq;
  const keep = Math.max(1, seq >> 1);
  const history = Array.from(prompt);
  model.reset();
  let logits = model.feed(history.slice(-seq));
  for (let produced = 0; produced < s.tokens; produced++) {
    const token = sampleToken(logits, s, history.length);
    history.push(token);
    yield token;
    if (produced + 1 === s.tokens) return;
    if (model.length === seq) {
      model.reset();
      logits = model.feed(history.slice(-keep));
    } else {
      logits = model.feed([token]);
    }
  }
}
