import { describe, expect, it } from 'vitest';
import { type ArgvShape, scanArgv } from '../src/argv.js';

const SHAPES: Record<string, ArgvShape> = {
  '--n': { takes: 'value' },
  '--on': { takes: 'none' },
  '--mode': { takes: 'optional', values: ['a', 'b'] },
};
const errors = {
  unknown: (name: string) => new Error(`unknown ${name}`),
  bad: (name: string, message: string) => new Error(`bad ${name}: ${message}`),
};
const scan = (argv: string[]) =>
  [
    ...scanArgv(
      argv,
      (name) => (name in SHAPES ? name : undefined),
      (f) => SHAPES[f]!,
      errors,
    ),
  ].map(({ name, raw }) => [name, raw]);

describe('scanArgv', () => {
  it('reads values after the flag or after =, a negative number as a value', () => {
    expect(scan(['--n', '3', '--n=-4', '--n', '-5', '--on'])).toEqual([
      ['--n', '3'],
      ['--n', '-4'],
      ['--n', '-5'],
      ['--on', undefined],
    ]);
  });

  it('an optional value is taken only from its list', () => {
    expect(scan(['--mode', 'a', '--mode', '--on'])).toEqual([
      ['--mode', 'a'],
      ['--mode', undefined],
      ['--on', undefined],
    ]);
    expect(() => scan(['--mode', 'c'])).toThrow('unknown c');
  });

  it("throws the caller's errors: unknown words, a missing value, a value for a switch", () => {
    expect(() => scan(['--x'])).toThrow('unknown --x');
    expect(() => scan(['--n', '--on'])).toThrow('bad --n: --n needs a value');
    expect(() => scan(['--n', '-x'])).toThrow('bad --n: --n needs a value');
    expect(() => scan(['--on=1'])).toThrow('bad --on: --on takes no value');
  });
});
