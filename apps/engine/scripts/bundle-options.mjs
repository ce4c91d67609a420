// esbuild settings shared by the single executable (build-sea.mjs) and the device bundles
// (benchmarks/gpu/bundle.mjs): CommonJS bundles that need no node_modules at run time.

/** Options every bundle uses. import.meta.url means nothing in CommonJS: each bundle gets its own file's URL. */
export const commonOptions = {
  bundle: true,
  platform: 'node',
  target: 'node20',
  format: 'cjs',
  define: { 'import.meta.url': '__hydra_meta_url' },
  external: ['msgpackr-extract', '@napi-rs/nice'],
  logLevel: 'warning',
  banner: {
    js: 'var __hydra_meta_url = require("node:url").pathToFileURL(typeof __filename === "string" && __filename ? __filename : process.execPath).href;',
  },
};
