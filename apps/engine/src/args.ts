// `hydra-engine serve`'s command line: flags (args/flags.ts over the table in args/table.ts),
// LLAMA_ARG_* variables, the `--config` file (args/config.ts) and the engine's own settings
// (args/settings.ts), merged into the startup configuration layer.
import type { ModelRegistry } from '@hydra-engine/resolver';
import { ConfigLayers, normalize, type Params } from '@hydra-engine/tiering';
import { readConfigFile } from './args/config.js';
import { parseFlags } from './args/flags.js';
import { applySetting, defaultSettings, type ServeSettings } from './args/settings.js';
import { FLAGS } from './args/table.js';
import { HydraError } from './errors.js';

export { readConfigFile } from './args/config.js';
export { parseFlags } from './args/flags.js';
export type { ServeSettings } from './args/settings.js';
export { FLAGS, type FlagSpec } from './args/table.js';
export { usage } from './args/usage.js';

export interface ServeArgs {
  layers: ConfigLayers;
  registry: ModelRegistry | undefined;
  settings: ServeSettings;
  help: boolean;
  version: boolean;
  /** Startup keys taken from the registry entry of the `-m` alias, as `key -> registry:ALIAS`. */
  defaultsApplied: Record<string, string>;
}

/**
 * Parses `hydra-engine serve` flags and the `--config` file into the startup configuration layer
 * (CLI flags win over the file) and the engine's own settings. Every error is a HydraError with
 * `HYDRA_ERR_BAD_ARGUMENT` or `HYDRA_ERR_CONFIG_INVALID` (the CLI exits 2 on both).
 */
export function parseServeArgs(
  argv: readonly string[],
  env: Readonly<Record<string, string | undefined>> = process.env,
): ServeArgs {
  const flags = parseFlags(argv, env);
  const settings = defaultSettings();
  const file = flags.get('@config') as string | undefined;
  let fromFile: Params = {};
  let registry: ModelRegistry | undefined;
  if (file !== undefined) {
    const cfg = readConfigFile(file);
    fromFile = cfg.params;
    registry = cfg.registry;
    for (const [k, v] of Object.entries(cfg.hydra)) applySetting(settings, k, v, `${file}: hydra`);
  }
  const fromCli: Record<string, unknown> = {};
  for (const [k, v] of flags) {
    if (k === '@config' || k === '@help' || k === '@version') continue;
    // llama-server's --reranking: --embedding with --pooling rank.
    if (k === '@reranking') {
      if (v === true) Object.assign(fromCli, { embedding: true, pooling_type: 'rank' });
      continue;
    }
    if (k.startsWith('@')) applySetting(settings, k, v, 'flags');
    else fromCli[k] = v;
  }
  // llama-server's -np auto: 4 slots over one unified KV buffer.
  if (fromCli.n_parallel === -1) {
    fromCli.n_parallel = 4;
    fromCli.kv_unified ??= true;
  }
  let cli: Params;
  try {
    cli = normalize(fromCli, { allowT4: true });
  } catch (err) {
    const e = err as HydraError;
    const keys = (e.keys ?? []).map((k) => FLAGS.find((f) => f.key === k)?.names.at(-1) ?? k);
    throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', `bad flag value: ${e.message}`, { keys, cause: err });
  }
  // The merged port is off unless asked for (the registry's default is llama.cpp's 50052).
  const startup: Params = { rpc_port: 0, ...fromFile, ...cli };
  // A model chosen by alias brings its registry defaults: above the file's own keys, below flags.
  const entry = registry && typeof startup.model === 'string' ? registry.get(startup.model) : undefined;
  const defaultsApplied: Record<string, string> = {};
  for (const [key, value] of Object.entries(entry?.defaults ?? {})) {
    if (value === undefined || key in cli) continue;
    startup[key] = Array.isArray(value) ? [...value] : value;
    defaultsApplied[key] = `registry:${entry!.alias}`;
  }
  return {
    layers: new ConfigLayers(startup),
    registry,
    defaultsApplied,
    settings,
    help: flags.has('@help'),
    version: flags.has('@version'),
  };
}
