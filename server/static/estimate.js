// What a run's config costs, shown live beside the sliders: pure functions, no page state.
// paramCount and memoryBytes follow pynode (core/gpt.py gpt_param_shapes, run/group.py
// memory_needed); tests/server/test_estimate.py checks them against it.

// Parameters of the byte-level GPT (vocab 256, tied embedding and head).
export function paramCount(cfg) {
  const d = cfg.width;
  const perLayer = 2 * d + 3 * d * d + d * d + 4 * d * d + 4 * d * d;
  return 256 * d + cfg.seq * d + cfg.layers * perLayer + d;
}

// Rough peak bytes of one peer: params, Adam moments, gradients, partials, activations.
export function memoryBytes(cfg) {
  const state = paramCount(cfg) * (4 * 4 + 8);
  const activations = cfg.microbatch_size * cfg.seq * cfg.width * cfg.layers * 4 * 24;
  const attention = cfg.microbatch_size * cfg.heads * cfg.seq * cfg.seq * 4 * 6 * cfg.layers;
  return state + activations + attention;
}

// What a tab may plan a run's memory against (pynode/platform.py PAGE_HEAP_BUDGET; keep
// the two equal): a config over it is refused at Start by every tab.
export const TAB_MEMORY_BUDGET = 3 * 2 ** 29;

// Bytes as a person reads them, as pynode's size_text says them in its refusals: 812.3 MiB,
// 14.0 TiB (not 14657961.6 MiB).
export function sizeText(count) {
  let [value, unit] = [count / 2 ** 20, "MiB"];
  for (const bigger of ["GiB", "TiB"]) {
    if (value < 1024) break;
    [value, unit] = [value / 1024, bigger];
  }
  return `${value.toFixed(1)} ${unit}`;
}

// Multiply-adds of one microbatch, forward and backward (3x the forward's GEMMs plus
// attention): the unit the measured microbatch times are scaled by.
export function microbatchWork(cfg) {
  const tokens = cfg.microbatch_size * cfg.seq;
  const attention = cfg.layers * cfg.microbatch_size * cfg.seq * cfg.seq * cfg.width * 2;
  return 3 * (tokens * (paramCount(cfg) - cfg.seq * cfg.width) + attention);
}

// Seconds of one step for the pool: each peer's measured microbatch time (on `measuredCfg`)
// scaled to `cfg`'s work, the microbatches shared in proportion to speed. null without a
// measurement.
export function stepSeconds(cfg, measuredCfg, microbatchSeconds) {
  const times = microbatchSeconds.filter((t) => t > 0);
  if (!measuredCfg || !times.length) return null;
  const scale = microbatchWork(cfg) / microbatchWork(measuredCfg);
  const speed = times.reduce((sum, t) => sum + 1 / (t * scale), 0); // microbatches per second
  return cfg.microbatches / speed;
}
