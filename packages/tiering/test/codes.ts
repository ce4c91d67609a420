import { expect } from 'vitest';
import { HydraError } from '../src/index.js';

/** The code of the HydraError `fn` throws (anything else fails the test), or 'none'. */
export function code(fn: () => unknown): string {
  try {
    fn();
  } catch (error) {
    expect(error).toBeInstanceOf(HydraError);
    return (error as HydraError).code;
  }
  return 'none';
}
