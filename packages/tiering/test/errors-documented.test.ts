import { readFileSync } from 'node:fs';
import { errorTableMismatch } from '@hydra-engine/errors';
import { expect, it } from 'vitest';
import { ERROR_CODES } from '../src/errors.js';

it("documents every declared code in README.md's error table, and declares every code it lists", () => {
  const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
  expect(errorTableMismatch(ERROR_CODES, readme)).toEqual({ undocumented: [], undeclared: [] });
});
