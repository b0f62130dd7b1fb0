// Exact int8 GEMM on WebGPU for the compute worker (loaded with importScripts; sets
// self.daisyWebGPU). pynode/webgpu_gemm.py packs the operands and waits on these promises
// through Pyodide's run_sync (JSPI); this file only moves words and runs one kernel.
//
// Operands arrive packed: four int8 along K per u32 word, little-endian (byte j of word w is
// k = 4 w + j), K zero-padded to a multiple of 4. A is (B, M, K4) rows, B is given as its
// transpose (B, N, K4), so each output cell is a dot product of two contiguous word rows.
// The kernel sign-extends each byte with shifts on i32 and accumulates in i32: every
// product is at most 2^14 in size and K <= 131,071 keeps every partial sum inside int32
// (pynode/core/gemm/base.py), so the result is exact in any summation order. No float
// anywhere, and no dot4I8Packed (an optional feature, ~20 % faster on SwiftShader; see
// docs/BROWSER.md, "WebGPU").
//
//   await daisyWebGPU.init()   -> JSON {ok, adapter, maxBindingBytes, tile,
//                                 maxWorkgroups} or {ok: false, reason}
//   await daisyWebGPU.bmm(aWords, bWords, batch, m, n, k4)   -> Int32Array (B * M * N)

(() => {
  const GROUP = 8; // invocations per workgroup side
  const BLOCK = 4; // output rows and columns per invocation
  const TILE = GROUP * BLOCK; // output cells per workgroup side; tails are masked
  const lines = (f) => [...Array(BLOCK).keys()].map(f).join("\n");
  const cells = (f) => lines((i) => lines((j) => f(i, j)));
  const GEMM_WGSL = /* wgsl */ `
struct Dims { m: u32, n: u32, k4: u32, batch: u32 }
@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> a: array<u32>;        // (B, M, K4) packed int8
@group(0) @binding(2) var<storage, read> bt: array<u32>;       // (B, N, K4) packed int8
@group(0) @binding(3) var<storage, read_write> c: array<i32>;  // (B, M, N) int32

const SHIFTS = vec4<u32>(24u, 16u, 8u, 0u);

// The four int8 of a word, k order, sign-extended: each byte shifted to the top of an i32,
// then arithmetically back down.
fn unpack(w: u32) -> vec4<i32> {
  return (vec4<i32>(bitcast<i32>(w)) << SHIFTS) >> vec4<u32>(24u);
}

// One invocation: a ${BLOCK} x ${BLOCK} block of C (unrolled). Rows and columns past the edge
// read the last valid line and are never written.
@compute @workgroup_size(${GROUP}, ${GROUP}, 1)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
  let col0 = id.x * ${BLOCK}u;
  let row0 = id.y * ${BLOCK}u;
  let item = id.z;
  if (col0 >= dims.n || row0 >= dims.m || item >= dims.batch) {
    return;
  }
${lines((i) => `  let a${i} = (item * dims.m + min(row0 + ${i}u, dims.m - 1u)) * dims.k4;
  let b${i} = (item * dims.n + min(col0 + ${i}u, dims.n - 1u)) * dims.k4;`)}
  // Integer dot products: each term at most 2^14, each sum exact while K <= 131,071.
${cells((i, j) => `  var c${i}_${j}: i32 = 0;`)}
  for (var w: u32 = 0u; w < dims.k4; w = w + 1u) {
${lines((i) => `    let x${i} = unpack(a[a${i} + w]);
    let y${i} = unpack(bt[b${i} + w]);`)}
${cells((i, j) => `    c${i}_${j} = c${i}_${j} + dot(x${i}, y${j});`)}
  }
${cells((i, j) => `  if (row0 + ${i}u < dims.m && col0 + ${j}u < dims.n) { c[(item * dims.m + row0 + ${i}u) * dims.n + col0 + ${j}u] = c${i}_${j}; }`)}
}
`;

  let device = null;
  let pipeline = null;
  let lost = null; // why the device went away, once it has
  let ready = null; // init's answer once it succeeded

  function fail(reason) {
    return JSON.stringify({ ok: false, reason });
  }

  async function init() {
    if (ready) return ready;
    const gpu = self.navigator && self.navigator.gpu;
    if (!gpu) return fail("navigator.gpu is missing (no WebGPU here, or not a secure origin)");
    const adapter = await gpu.requestAdapter();
    if (!adapter) return fail("navigator.gpu.requestAdapter() found no adapter");
    const limit = Math.min(adapter.limits.maxStorageBufferBindingSize, adapter.limits.maxBufferSize);
    device = await adapter.requestDevice({
      requiredLimits: { maxStorageBufferBindingSize: limit, maxBufferSize: limit },
    });
    device.lost.then((info) => { lost = `WebGPU device lost: ${info.reason} ${info.message}`; });
    device.pushErrorScope("validation");
    const module = device.createShaderModule({ code: GEMM_WGSL });
    pipeline = device.createComputePipeline({ layout: "auto", compute: { module, entryPoint: "main" } });
    const error = await device.popErrorScope();
    if (error) {
      device.destroy();
      device = null;
      return fail(`the GEMM kernel did not compile: ${error.message}`);
    }
    const info = adapter.info || {};
    const name = [info.vendor, info.architecture, info.description].filter(Boolean).join(" ");
    ready = JSON.stringify({ ok: true, adapter: name || "unnamed adapter", maxBindingBytes: limit,
      tile: TILE, maxWorkgroups: device.limits.maxComputeWorkgroupsPerDimension });
    return ready;
  }

  function storage(bytes, usage) {
    return device.createBuffer({ size: Math.max(4, bytes), usage });
  }

  // aWords: Uint32Array (B * M * K4), bWords: Uint32Array (B * N * K4).
  async function bmm(aWords, bWords, batch, m, n, k4) {
    if (lost) throw new Error(lost);
    if (!device) throw new Error("daisyWebGPU.init() has not succeeded");
    const S = GPUBufferUsage.STORAGE;
    const outBytes = batch * m * n * 4;
    const dims = device.createBuffer({ size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
    const a = storage(aWords.byteLength, S | GPUBufferUsage.COPY_DST);
    const b = storage(bWords.byteLength, S | GPUBufferUsage.COPY_DST);
    const c = storage(outBytes, S | GPUBufferUsage.COPY_SRC);
    const read = storage(outBytes, GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST);
    try {
      device.pushErrorScope("out-of-memory");
      device.pushErrorScope("validation");
      device.queue.writeBuffer(dims, 0, new Uint32Array([m, n, k4, batch]));
      device.queue.writeBuffer(a, 0, aWords);
      device.queue.writeBuffer(b, 0, bWords);
      const group = device.createBindGroup({
        layout: pipeline.getBindGroupLayout(0),
        entries: [dims, a, b, c].map((buffer, binding) => ({ binding, resource: { buffer } })),
      });
      const encoder = device.createCommandEncoder();
      const pass = encoder.beginComputePass();
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(Math.ceil(n / TILE), Math.ceil(m / TILE), batch);
      pass.end();
      encoder.copyBufferToBuffer(c, 0, read, 0, outBytes);
      device.queue.submit([encoder.finish()]);
      const invalid = await device.popErrorScope();
      const oom = await device.popErrorScope();
      if (invalid || oom) throw new Error(`WebGPU refused the GEMM: ${(invalid || oom).message}`);
      await read.mapAsync(GPUMapMode.READ);
      if (lost) throw new Error(lost);
      return new Int32Array(read.getMappedRange().slice(0));
    } finally {
      for (const buffer of [dims, a, b, c, read]) buffer.destroy();
    }
  }

  self.daisyWebGPU = { init, bmm };
})();
