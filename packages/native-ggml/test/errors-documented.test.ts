import { readFileSync } from 'node:fs';
import { undocumentedCodes } from '@hydra-engine/errors';
import { expect, it } from 'vitest';
import { ERROR_CODES } from '../src/errors.js';

it('documents every error code in README.md', () => {
  const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
  expect(undocumentedCodes(ERROR_CODES, readme)).toEqual([]);
});
