import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { REPO } from './engine.js';

/**
 * Every HYDRA_ERR_* code documented in the error-code tables of the workspace READMEs: the set a
 * reply to bad input may carry. Read at run time so codes added later count as documented.
 */
export function documentedCodes(): Set<string> {
  const codes = new Set<string>();
  for (const group of ['packages', 'apps']) {
    for (const name of readdirSync(join(REPO, group))) {
      let text: string;
      try {
        text = readFileSync(join(REPO, group, name, 'README.md'), 'utf8');
      } catch {
        continue;
      }
      for (const m of text.matchAll(/^\|\s*`(HYDRA_ERR_[A-Z0-9_]+)`/gm)) codes.add(m[1]!);
    }
  }
  return codes;
}
