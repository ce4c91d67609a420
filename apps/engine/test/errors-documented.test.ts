import { readFileSync } from 'node:fs';
import { errorTableMismatch } from '@hydra-engine/errors';
import { describe, expect, it } from 'vitest';
import { ERROR_CODES, ERRORS, httpStatus } from '../src/errors.js';

const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');

describe('the error table', () => {
  it("documents every declared code in README.md's error table, and declares every code it lists", () => {
    expect(errorTableMismatch(ERROR_CODES, readme)).toEqual({ undocumented: [], undeclared: [] });
  });

  it("states in README.md's table the HTTP status each code is declared with", () => {
    const wrong: string[] = [];
    for (const m of readme.matchAll(/^\|\s*`(HYDRA_ERR_[A-Z0-9_]+)`\s*\|\s*([^|]*)\|/gm)) {
      const code = m[1] as keyof typeof ERRORS;
      const stated = /^\d{3}\b/.exec(m[2]!.trim())?.[0];
      if (ERRORS[code]?.status !== Number(stated))
        wrong.push(`${code}: README ${m[2]!.trim()}, declared ${ERRORS[code]?.status}`);
    }
    expect(wrong).toEqual([]);
  });

  it('gives the OpenAI and /control routes one status per code: the declared one, 500 when undeclared', () => {
    expect(httpStatus('HYDRA_ERR_QUEUE_FULL')).toBe(429);
    expect(httpStatus('HYDRA_ERR_SLOT_BUSY')).toBe(409);
    expect(httpStatus('HYDRA_ERR_UNKNOWN_MODEL')).toBe(400);
    expect(httpStatus('HYDRA_ERR_NOT_DECLARED_ANYWHERE')).toBe(500);
  });
});
