// Shared by the engine's benchmark scripts: a figure from raw samples, and a free loopback port.

/** Median, p99 and mean of `samples`, with the ratio to `anchor`'s median when one is given. */
export function summary(name, unit, samples, anchor) {
  const s = [...samples].sort((a, b) => a - b);
  const q = (p) => s[Math.min(s.length - 1, Math.floor(p * s.length))];
  const mean = s.reduce((x, y) => x + y, 0) / s.length;
  const fig = { name, unit, samples: s.length, median: q(0.5), p99: q(0.99), mean, anchor: null };
  if (anchor)
    fig.anchor = {
      name: anchor.name,
      median: anchor.median,
      p99: anchor.p99,
      ratio: fig.median / anchor.median,
    };
  return fig;
}

export { freeLoopbackPort as freePort } from '../dist/index.js';
