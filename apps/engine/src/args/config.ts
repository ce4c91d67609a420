import { readFileSync } from 'node:fs';
import { ModelRegistry } from '@hydra-engine/resolver';
import { normalize, type Params } from '@hydra-engine/tiering';
import { parse as parseYaml } from 'yaml';
import { HydraError } from '../errors.js';

function configError(file: string, message: string, cause?: unknown): HydraError {
  return new HydraError('HYDRA_ERR_CONFIG_INVALID', `${file}: ${message}`, { keys: [file], cause });
}

/** Reads the `--config` YAML: common_params keys (nested or dotted), `models:` and `hydra:`. */
export function readConfigFile(file: string): {
  params: Params;
  registry: ModelRegistry | undefined;
  hydra: Record<string, unknown>;
} {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw configError(file, `cannot read: ${(err as Error).message}`, err);
  }
  let doc: unknown;
  try {
    doc = parseYaml(text) ?? {};
  } catch (err) {
    throw configError(file, (err as Error).message, err);
  }
  if (typeof doc !== 'object' || doc === null || Array.isArray(doc))
    throw configError(file, 'the top level must be a map');
  const { models, hydra, ...rest } = doc as Record<string, unknown>;
  let registry: ModelRegistry | undefined;
  if (models !== undefined) {
    try {
      registry = ModelRegistry.parse(text, file);
    } catch (err) {
      throw configError(file, (err as Error).message, err);
    }
  }
  if (hydra !== undefined && (typeof hydra !== 'object' || hydra === null || Array.isArray(hydra))) {
    throw configError(file, 'hydra: must be a map');
  }
  let params: Params;
  try {
    params = normalize(rest, { allowT4: true });
  } catch (err) {
    const e = err as HydraError;
    throw new HydraError('HYDRA_ERR_CONFIG_INVALID', `${file}: ${e.message}`, {
      keys: e.keys ?? [],
      cause: err,
    });
  }
  return { params, registry, hydra: (hydra as Record<string, unknown>) ?? {} };
}
