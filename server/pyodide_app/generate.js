// The page's text generation: a second compute worker (worker.js booted without `self`, so
// it joins no room and trains nothing) continues prompts with the model of a .pt file.
// Generating therefore never takes the training worker's time: a step of the group is not
// delayed by it, during a run or after. The live state reaches it as the .pt bytes the
// training worker copies out between its events (as "Download checkpoint" does).
//
// Booted on first use: Pyodide, numpy, pynode and the same start-up checks as the training
// worker (units, the exact GEMM gate, the kernel gate), then the same bytes as
// `python -m pynode generate` (pynode/run/generate.py).

export class PageGenerator {
  constructor(flags = {}) {
    this.flags = flags; // {backend}: as the training worker's
    this.worker = null;
    this.booted = null; // resolves once the worker's checks passed
    this.requests = new Map(); // id -> {resolve, reject, onText}
    this.nextId = 1;
  }

  boot() {
    if (this.booted) return this.booted;
    this.worker = new Worker("/app/worker.js");
    this.booted = new Promise((resolve, reject) => {
      this.worker.onmessage = (e) => this.onWorker(e.data, resolve, reject);
      this.worker.onerror = (e) => {
        const error = new Error(`the generation worker crashed: ${e.message}`);
        reject(error);
        for (const waiter of this.requests.values()) waiter.reject(error);
        this.requests.clear();
      };
    });
    this.worker.postMessage({ type: "boot", flags: this.flags });
    return this.booted;
  }

  onWorker(msg, resolve, reject) {
    if (msg.type === "checks") {
      if (msg.ready) resolve(msg);
      else reject(new Error("the generation worker's start-up checks failed"));
    } else if (msg.type === "state" && msg.state === "failed") {
      reject(new Error(`could not start Python for generation: ${msg.error}`));
    } else if (msg.type === "report" && msg.kind === "generated") {
      const waiter = this.requests.get(msg.fields.id);
      if (!waiter) return;
      waiter.onText(msg.fields.text);
      if (waiter.control?.stopped && !waiter.stopSent) { // a script's stop, set since
        waiter.stopSent = true;
        this.worker.postMessage({ type: "stop", ids: [msg.fields.id] });
      }
    } else if (msg.type === "started") {
      const waiter = this.requests.get(msg.id);
      this.requests.delete(msg.id);
      const { type, id, ...answer } = msg; // the caller's answer, not the worker's envelope
      if (waiter) (msg.ok ? waiter.resolve(answer) : waiter.reject(new Error(msg.error)));
    }
  }

  // The inference kit of the .pt bytes `data` (transferred): resolves to its HTML text.
  async kit(data) {
    await this.boot();
    return (await this.ask({ type: "kit", data }, [data])).html;
  }

  ask(msg, transfer = []) {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.requests.set(id, { resolve, reject, onText: () => {} });
      this.worker.postMessage({ ...msg, id }, transfer);
    });
  }

  // data: the .pt bytes (an ArrayBuffer, transferred); request: {prompt, tokens, temperature,
  // top_k, seed}; onText(piece) as whole characters come; control: {stopped}, set by whoever
  // stops it before it reached the worker (the page's Stop while the state is copied out).
  // Resolves to {bytes (hex), text, step, context, prompt_bytes, seconds, stopped}; rejects
  // with the reason (a bad file, ...).
  async generate(data, request, onText = () => {}, control = null) {
    await this.boot();
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.requests.set(id, { resolve, reject, onText, control });
      this.worker.postMessage({ type: "generate", id, data, request }, [data]);
      if (control?.stopped) this.worker.postMessage({ type: "stop", ids: [id] });
    });
  }

  // Ends the generations under way whose control says stopped (all of them without
  // controls) where they are: each resolves with what it made, stopped.
  stop() {
    const ids = [...this.requests].filter(([, r]) => r.control !== undefined
      && (r.control === null || r.control.stopped)).map(([id]) => id);
    if (ids.length) this.worker.postMessage({ type: "stop", ids });
  }
}
